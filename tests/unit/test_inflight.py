"""A batch's confirm deadline, without a broker: the messages unconfirmed after the timeout
are reported unconfirmed by index, the others keep their outcome, and every window slot
comes back."""

from __future__ import annotations

import asyncio

import pytest
from pamqp import commands as spec

from hashq.errors import BatchPublishError, PublishError, PublishUnconfirmed
from hashq.inflight import InFlight, Prepared


def _prepared(n: int) -> Prepared:
    return f"key-{n}", b"", spec.Basic.Properties(message_id=f"m-{n}")


async def _track(
    batch: InFlight, window: asyncio.Semaphore, count: int
) -> list[asyncio.Future[str | PublishError]]:
    """``count`` messages sent, their outcomes left for the test to set."""
    sending: list[asyncio.Future[str | PublishError]] = []
    for n in range(count):
        await window.acquire()
        sending.append(asyncio.get_running_loop().create_future())
        batch.track(n, _prepared(n), sending[n])
    return sending


async def test_only_the_messages_past_the_deadline_are_unconfirmed() -> None:
    window = asyncio.Semaphore(10)
    batch = InFlight(window, confirm_timeout=30, on_confirmed=None)
    loop = asyncio.get_running_loop()
    sending = await _track(batch, window, 5)
    sending[1].set_result("m-1")
    sending[3].set_result(PublishUnconfirmed("connection lost", key="key-3", message_id="m-3"))
    batch.expire(loop.time() + 10)  # not yet
    assert not any(s.cancelled() for s in sending)
    batch.expire(loop.time() + 31)
    await batch.settled()
    with pytest.raises(BatchPublishError) as raised:
        batch.outcome()
    failures = {f.index: f.error for f in raised.value.failures}
    assert sorted(failures) == [0, 2, 3, 4]
    assert "no confirm within 30s" in str(failures[0])
    assert failures[4].message_id == "m-4"
    assert "connection lost" in str(failures[3])
    assert raised.value.confirmed == ["m-1"]
    for _ in range(10):  # every slot came back
        await asyncio.wait_for(window.acquire(), 0.1)


async def test_the_deadline_is_kept_by_the_batch_itself() -> None:
    window = asyncio.Semaphore(10)
    batch = InFlight(window, confirm_timeout=0.2, on_confirmed=None)
    await window.acquire()
    batch.track(0, _prepared(0), asyncio.get_running_loop().create_future())
    await asyncio.wait_for(batch.settled(), 2)
    with pytest.raises(BatchPublishError, match=r"no confirm within 0\.2s"):
        batch.outcome()


async def test_abandoned_sends_are_unconfirmed_at_once_and_confirmed_ones_stay() -> None:
    window = asyncio.Semaphore(10)
    batch = InFlight(window, confirm_timeout=30, on_confirmed=None)
    sending = await _track(batch, window, 4)
    sending[2].set_result("m-2")
    batch.abandon("connection lost before the confirm")
    await asyncio.wait_for(batch.settled(), 1)  # not the 30 s deadline
    with pytest.raises(BatchPublishError) as raised:
        batch.outcome()
    failures = {f.index: f.error for f in raised.value.failures}
    assert sorted(failures) == [0, 1, 3]
    assert all(isinstance(error, PublishUnconfirmed) for error in failures.values())
    assert "connection lost before the confirm" in str(failures[3])
    assert raised.value.confirmed == ["m-2"]
    for _ in range(10):
        await asyncio.wait_for(window.acquire(), 0.1)
