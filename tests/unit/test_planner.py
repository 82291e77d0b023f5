"""The planner, exhaustively with hypothesis: balanced, sticky, deterministic. No broker."""

from __future__ import annotations

import os
import random
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from hashq_coordinator.machine.planner import moves, plan, quotas

# Examples per property: 300 in make test (2,000 took two of its twenty minutes); set
# HASHQ_PLANNER_EXAMPLES for a deeper search
EXAMPLES = int(os.environ.get("HASHQ_PLANNER_EXAMPLES", "300"))
worker_ids = st.text(alphabet="abcdefgh", min_size=1, max_size=3)


@st.composite
def situations(draw: st.DrawFn) -> tuple[int, dict[str, int], dict[int, str | None]]:
    buckets = draw(st.integers(min_value=1, max_value=300))
    workers = draw(st.dictionaries(worker_ids, st.integers(1, 5), max_size=12))
    former = sorted(set(workers) | draw(st.sets(worker_ids, max_size=4)))
    if not former:
        return buckets, workers, {}
    drawn = draw(st.lists(st.sampled_from([None, *former]), min_size=buckets, max_size=buckets))
    return buckets, workers, dict(enumerate(drawn))


@settings(max_examples=EXAMPLES, deadline=None)
@given(situations())
def test_every_bucket_goes_to_a_live_worker(
    case: tuple[int, dict[str, int], dict[int, str | None]],
) -> None:
    buckets, workers, owners = case
    target = plan(buckets, workers, owners)
    assert sorted(target) == list(range(buckets))
    if workers:
        assert all(owner in workers for owner in target.values())
    else:
        assert all(owner is None for owner in target.values())


@settings(max_examples=EXAMPLES, deadline=None)
@given(situations())
def test_balanced_by_capacity(case: tuple[int, dict[str, int], dict[int, str | None]]) -> None:
    buckets, workers, owners = case
    target = plan(buckets, workers, owners)
    counts = {w: sum(1 for owner in target.values() if owner == w) for w in workers}
    total = sum(workers.values())
    for worker, count in counts.items():
        share = buckets * workers[worker] / total
        assert share - 1 < count < share + 1, (worker, count, share)
    if workers and len(set(workers.values())) == 1:
        assert max(counts.values()) - min(counts.values()) <= 1


@settings(max_examples=EXAMPLES, deadline=None)
@given(situations())
def test_sticky_moves_only_what_it_must(
    case: tuple[int, dict[str, int], dict[int, str | None]],
) -> None:
    buckets, workers, owners = case
    target = plan(buckets, workers, owners)
    held = {w: sum(1 for b in range(buckets) if owners.get(b) == w) for w in workers}
    quota = quotas(buckets, workers, held)
    for bucket, owner in owners.items():
        if owner in workers and held[owner] <= quota[owner]:
            assert target[bucket] == owner, "a bucket left an owner that was within its quota"
    orphans = sum(1 for b in range(buckets) if owners.get(b) not in workers)
    excess = sum(max(0, held[w] - quota[w]) for w in workers)
    assert moves({b: owners.get(b) for b in range(buckets)}, target) == (
        orphans + excess if workers else sum(1 for b in range(buckets) if owners.get(b))
    )


@settings(max_examples=EXAMPLES, deadline=None)
@given(situations(), st.randoms())
def test_deterministic_whatever_the_order(
    case: tuple[int, dict[str, int], dict[int, str | None]], rng: random.Random
) -> None:
    buckets, workers, owners = case
    shuffled_workers = dict(rng.sample(list(workers.items()), len(workers)))
    shuffled_owners = dict(rng.sample(list(owners.items()), len(owners)))
    assert plan(buckets, workers, owners) == plan(buckets, shuffled_workers, shuffled_owners)


@settings(max_examples=500, deadline=None)
@given(situations())
def test_a_plan_is_stable(case: tuple[int, dict[str, int], dict[int, str | None]]) -> None:
    """Planning again from the plan's own result moves nothing: no flapping."""
    buckets, workers, owners = case
    target = plan(buckets, workers, owners)
    assert plan(buckets, workers, target) == target


def test_a_joining_worker_takes_only_its_share() -> None:
    before = plan(64, {"a": 1, "b": 1}, {})
    after = plan(64, {"a": 1, "b": 1, "c": 1}, before)
    assert moves(before, after) == 21
    assert sum(1 for owner in after.values() if owner == "c") == 21


def test_4096_buckets_over_500_workers_in_milliseconds() -> None:
    rng = random.Random(1)
    workers = {f"w{n:03d}": rng.randint(1, 4) for n in range(500)}
    owners = {b: f"w{rng.randrange(520):03d}" for b in range(4096)}
    started = time.perf_counter()
    for _ in range(10):
        plan(4096, workers, owners)
    elapsed_ms = (time.perf_counter() - started) * 100
    print(f"plan(4096 buckets, 500 workers): {elapsed_ms:.1f} ms")
    assert elapsed_ms < 200  # generous for a loaded 2-core machine; typically a few ms
