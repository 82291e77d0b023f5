"""The runners, without a broker: a plain-function handler runs in a thread that cannot be
stopped, and its job must count as running until the thread returns."""

from __future__ import annotations

import asyncio
import threading

import pytest

from hashq.message import Message
from hashq.settings import Settings
from hashq.topology import Topology
from hashq.worker.dead_letter import DeadLetters
from hashq.worker.metrics import WorkerMetrics
from hashq.worker.retry import RetryPolicy
from hashq.worker.runners import Runners


async def test_a_thread_handler_cut_off_twice_is_waited_for_until_it_returns() -> None:
    """A lease closed twice (a drain timing out, then the connection dropping) cancels the
    runner twice. The second cancellation used to end the wait for the thread, so the job
    counted as finished, and its bucket could be subscribed again, while the thread still ran
    its message."""
    release = threading.Event()

    def handler(message: Message) -> None:
        release.wait(10)

    runners = Runners(
        handler,
        concurrency=1,
        threads=1,
        policy=RetryPolicy(),
        dead_letters=DeadLetters(Topology.from_settings(Settings()), "w1"),  # never used here
        codec="raw",
        metrics=WorkerMetrics(["running"]),
    )
    message = Message("k", b"", {}, "m", bucket=0, epoch=1, redelivered=False, attempt=1)
    call = asyncio.ensure_future(runners._call(message))
    await asyncio.sleep(0.1)
    for _ in range(2):  # cut off, and cut off again
        call.cancel()
        await asyncio.sleep(0.1)
    assert not call.done(), "the job stopped counting as running while its thread ran"
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await call
    await runners.close()
