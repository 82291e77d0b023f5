"""The pure lanes and retry policy, exhaustively with hypothesis: no broker."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from hashq.worker.machine.lanes import InOrder, Lanes
from hashq.worker.retry import OnFailure, RetryPolicy

streams = st.lists(st.integers(min_value=0, max_value=12), min_size=0, max_size=200)


@settings(max_examples=500)
@given(keys=streams, seed=st.integers())
def test_lanes_run_each_key_in_order_one_at_a_time(keys: list[int], seed: int) -> None:
    """Simulate a stream through lanes with finishes in random order."""
    rng = random.Random(seed)
    lanes: Lanes[tuple[str, int]] = Lanes()
    active: list[tuple[str, int]] = []
    started: dict[str, list[int]] = {}
    pending = [(f"k{key}", n) for n, key in enumerate(keys)]

    def start(item: tuple[str, int]) -> None:
        key = item[0]
        assert key not in {a[0] for a in active}, "two items of one key active at once"
        active.append(item)
        started.setdefault(key, []).append(item[1])

    while pending or active:
        if pending and (not active or rng.random() < 0.6):
            item = pending.pop(0)
            if lanes.add(item[0], item):
                start(item)
        else:
            finished = active.pop(rng.randrange(len(active)))
            following = lanes.done(finished[0])
            if following is not None:
                start(following)
    for key, numbers in started.items():
        assert numbers == sorted(numbers), key
    assert sum(len(numbers) for numbers in started.values()) == len(keys)
    assert lanes.active_keys == 0, "a key kept state after its last item"


def test_idle_keys_leave_no_state() -> None:
    lanes: Lanes[int] = Lanes()
    for n in range(100_000):
        assert lanes.add(f"key-{n}", n)
        assert lanes.done(f"key-{n}") is None
    assert lanes.active_keys == 0


@given(order=st.permutations(list(range(1, 60))))
def test_in_order_releases_by_sequence_number(order: list[int]) -> None:
    buffer: InOrder[int] = InOrder()
    released = [item for number in order for item in buffer.push(number, number)]
    assert released == sorted(order)
    assert len(buffer) == 0


@given(attempt=st.integers(min_value=1, max_value=100), seed=st.integers())
def test_retry_delays_grow_within_bounds(attempt: int, seed: int) -> None:
    policy = RetryPolicy(max_attempts=1000, base_delay=0.1, max_delay=5.0)
    delay = policy.next_delay(attempt, random.Random(seed))
    assert delay is not None
    ceiling = min(5.0, 0.1 * 2 ** (attempt - 1))
    assert ceiling / 2 <= delay <= ceiling


def test_attempts_run_out_unless_blocking() -> None:
    policy = RetryPolicy(max_attempts=3)
    assert policy.next_delay(2) is not None
    assert policy.next_delay(3) is None
    blocking = RetryPolicy(max_attempts=3, on_failure=OnFailure.BLOCK)
    assert blocking.next_delay(50) is not None
