"""``hashq.testing``: a handler run in-process by the worker's own runners, lanes and outcomes,
no servers. These are tests of that code as much as of the harness: per-key order, one message
of a key at a time, keys in parallel, retries, dead letters and the prefetch window."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import threading
import time
from collections import defaultdict

import pytest

import hashq
from hashq.message import Message
from hashq.publisher import Outgoing
from hashq.settings import WorkerSettings
from hashq.testing import Result, Unfinished, run, run_sync


def _workload(keys: int, per_key: int) -> list[tuple[str, bytes]]:
    """Messages of many keys interleaved at random, each key's numbered 0, 1, ... in order."""
    rng = random.Random(7)
    pending = {f"user-{k}": 0 for k in range(keys)}
    messages = []
    while pending:
        key = rng.choice(sorted(pending))
        messages.append((key, str(pending[key]).encode()))
        pending[key] += 1
        if pending[key] == per_key:
            del pending[key]
    return messages


def _no_key_ran_twice_at_once(result: Result) -> bool:
    by_key = defaultdict(list)
    for execution in result.executions:
        by_key[execution.key].append((execution.started, execution.ended))
    for spans in by_key.values():
        spans.sort()
        if any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans)):
            return False
    return True


async def test_each_key_runs_in_order_one_at_a_time_while_keys_run_together() -> None:
    async def handle(msg: Message) -> None:
        await asyncio.sleep(random.uniform(0, 0.002))

    messages = _workload(keys=50, per_key=20)
    result = await run(handle, messages, WorkerSettings(concurrency=16, buckets=4, prefetch=64))
    for k in range(50):
        assert result.done(f"user-{k}") == [str(n).encode() for n in range(20)]
    assert _no_key_ran_twice_at_once(result)
    assert 1 < result.most_at_once <= 16


def test_a_plain_function_runs_in_threads_at_most_as_many_as_there_are() -> None:
    def handle(msg: Message) -> None:
        time.sleep(random.uniform(0, 0.002))

    result = run_sync(handle, _workload(keys=20, per_key=10), WorkerSettings(threads=3))
    assert all(result.done(f"user-{k}") == [str(n).encode() for n in range(10)] for k in range(20))
    assert _no_key_ran_twice_at_once(result)
    assert 1 < result.most_at_once <= 3


@pytest.mark.parametrize(("prefetch", "k0_starts"), [(4, "after"), (16, "second")])
async def test_a_key_with_a_full_window_of_messages_holds_up_its_bucket(
    prefetch: int, k0_starts: str
) -> None:
    """One bucket: five messages of a slow key, then other keys. With a window of 4 the slow
    key's messages fill it, so the others wait for it to move on (the broker delivers nothing
    more); with 16 they run beside it at once. As RabbitMQ's prefetch does with the worker."""
    started: list[str] = []

    async def handle(msg: Message) -> None:
        started.append(msg.key)
        if msg.key == "slow":
            await asyncio.sleep(0.02)

    messages = [*(("slow", str(n)) for n in range(5)), *((f"k{n}", "0") for n in range(10))]
    await run(handle, messages, WorkerSettings(buckets=1, prefetch=prefetch, concurrency=8))
    if k0_starts == "second":
        assert started[:2] == ["slow", "k0"]
    else:
        assert started.index("k0") > started.index("slow", 1)


async def test_failures_retry_then_dead_letter_while_the_key_waits() -> None:
    async def handle(msg: Message) -> None:
        if msg.body == b"bad":
            raise ValueError("cannot")

    settings = WorkerSettings(max_attempts=3)
    result = await run(handle, [("k", b"ok-0"), ("k", b"bad"), ("k", b"ok-1")], settings)
    assert [(e.message.body, e.message.attempt) for e in result.of("k")] == [
        (b"ok-0", 1),
        (b"bad", 1),
        (b"bad", 2),
        (b"bad", 3),
        (b"ok-1", 1),
    ]
    (dead,) = result.dead_letters
    assert (dead.key, dead.body, dead.reason) == ("k", b"bad", "handler-failed")
    assert dead.headers["x-hashq-attempts"] == 3
    assert dead.headers["x-hashq-error-type"] == "ValueError"
    assert len(result.retry_delays) == 2


async def test_retry_and_reject_are_the_handler_s_decisions() -> None:
    async def handle(msg: Message) -> None:
        if msg.body == b"later" and msg.attempt == 1:
            raise hashq.Retry(after=30)
        if msg.body == b"never":
            raise hashq.Reject("no such order")

    began = time.monotonic()
    result = await run(handle, [("a", b"later"), ("a", b"next"), ("b", b"never"), ("b", b"x")])
    assert time.monotonic() - began < 5  # retries run at once unless wait_for_retries
    assert result.retry_delays == [30]
    assert result.done("a") == [b"later", b"next"]
    assert result.done("b") == [b"x"]
    (dead,) = result.dead_letters
    assert (dead.body, dead.reason, dead.headers["x-hashq-error"]) == (
        b"never",
        "rejected",
        "no such order",
    )


async def test_a_key_that_fails_for_good_is_parked_in_order_while_its_bucket_goes_on() -> None:
    async def handle(msg: Message) -> None:
        if msg.body == b"bad":
            raise ValueError("cannot")

    settings = WorkerSettings(max_attempts=2, on_failure="park", buckets=1, prefetch=4)
    cold = [(f"c{n}", b"x") for n in range(50)]
    poisoned = [("k", b"ok"), ("k", b"bad"), ("k", b"after-1"), ("k", b"after-2")]
    result = await run(handle, [*poisoned[:3], *cold, poisoned[3]], settings)
    assert result.done("k") == [b"ok"]
    assert result.parked("k") == [b"bad", b"after-1", b"after-2"]
    assert all(result.done(key) == [b"x"] for key, _ in cold)  # one bucket, a window of 4
    assert result.dead_letters == []


async def test_a_handler_parks_its_key_at_once() -> None:
    async def handle(msg: Message) -> None:
        if msg.body == b"stop":
            raise hashq.Park("waiting for the fix")

    result = await run(handle, [("k", b"stop"), ("k", b"next"), ("j", b"go")])
    assert result.parked("k") == [b"stop", b"next"]
    assert [e.message.attempt for e in result.of("k")] == [1]
    assert result.done("j") == [b"go"]


async def test_retries_may_wait_as_they_would_in_production() -> None:
    async def handle(msg: Message) -> None:
        if msg.attempt == 1:
            raise hashq.Retry(after=0.3)

    began = time.monotonic()
    await run(handle, [("a", b"x")], wait_for_retries=True)
    assert time.monotonic() - began >= 0.3


async def test_a_body_the_codec_cannot_decode_is_dead_lettered_without_a_call() -> None:
    seen: list[object] = []

    async def handle(msg: Message) -> None:
        seen.append(msg.data)

    messages = [Outgoing("k", b'{"n": 1}'), Outgoing("k", b"not json"), Outgoing("k", b"[2]")]
    result = await run(handle, messages, WorkerSettings(codec="json"))
    assert seen == [{"n": 1}, [2]]
    assert [dead.reason for dead in result.dead_letters] == ["undecodable"]


async def test_a_handler_that_never_returns_is_reported_not_waited_for() -> None:
    release = threading.Event()

    def handle(msg: Message) -> None:
        release.wait(5)

    with pytest.raises(Unfinished, match=r"1 messages not done within 0\.3 s"):
        await run(handle, [("k", b"x")], within=0.3)
    release.set()


async def test_a_handler_that_returns_before_its_work_is_done_breaks_order_and_shows() -> None:
    """The docs' example (README, "Testing a handler"): the work is handed to a task and the
    handler returns at once, so the worker goes on to the key's next message while the work of
    the last is still running. Order is the handler's to keep."""
    saved: dict[str, list[int]] = defaultdict(list)
    tasks = []

    async def save(key: str, n: int) -> None:
        await asyncio.sleep((5 - n) / 1000)  # later messages happen to be quicker
        saved[key].append(n)

    async def handle(msg: Message) -> None:
        tasks.append(asyncio.ensure_future(save(msg.key, json.loads(msg.body))))

    await run(handle, [("user-1", str(n)) for n in range(5)])
    await asyncio.gather(*tasks)
    assert saved["user-1"] != [0, 1, 2, 3, 4]
