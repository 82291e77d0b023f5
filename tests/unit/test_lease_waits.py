"""A bucket lease's waits (``BucketLease._until``): a drain ends once what was delivered is
finished, or the lease is closed meanwhile, or its time is up; ``settled`` once no handler
runs. They are looked at only when something changes, so each change must reach them."""

from __future__ import annotations

import asyncio

from aiormq.abc import DeliveredMessage
from pamqp import commands as spec
from pamqp.header import ContentHeader

from hashq.worker.bucket_lease import BucketLease, LeaseState
from hashq.worker.jobs import Job


class _Acker:
    def __init__(self) -> None:
        self.completed: list[int] = []

    def complete(self, tag: int) -> None:
        self.completed.append(tag)

    async def flush(self, within: float) -> None:
        return None


class _Channel:
    is_closed = False

    async def close(self) -> None:
        self.is_closed = True


def _lease() -> tuple[BucketLease, list[Job]]:
    ready: list[Job] = []
    lease = BucketLease(3, 1, "hashq.t.b0003", ready.append)
    lease._acker = _Acker()  # type: ignore[assignment]
    lease._channel = _Channel()  # type: ignore[assignment]
    for tag, key in ((1, "a"), (2, "b")):
        frame = spec.Basic.Deliver("ctag", tag, False, "hashq.t", key)
        lease.deliver(DeliveredMessage(frame, ContentHeader(), b"", None))  # type: ignore[arg-type]
    for job in ready:
        lease.started(job)
    return lease, ready


def _finish(lease: BucketLease, job: Job) -> None:
    assert lease.ack(job)
    lease.finished(job)


async def test_a_drain_ends_when_the_last_delivered_message_is_finished() -> None:
    lease, (first, second) = _lease()
    drain = asyncio.ensure_future(lease.drain(within=5))
    await asyncio.sleep(0.01)
    _finish(lease, first)
    await asyncio.sleep(0.01)
    assert not drain.done()  # the second is still running
    _finish(lease, second)
    assert await asyncio.wait_for(drain, 1) is True
    assert lease.state is LeaseState.CLOSED


async def test_a_drain_ends_when_the_lease_is_closed_meanwhile() -> None:
    lease, jobs = _lease()
    drain = asyncio.ensure_future(lease.drain(within=5))
    await asyncio.sleep(0.01)
    await lease.close()  # cut off: what it held went back to the queue
    assert await asyncio.wait_for(drain, 1) is True
    assert all(job.was_cut_off is False for job in jobs)  # not running in a runner here


async def test_a_drain_whose_time_is_up_says_so_and_closes() -> None:
    lease, _ = _lease()
    assert await lease.drain(within=0.05) is False
    assert lease.state is LeaseState.CLOSED


async def test_settled_waits_for_the_running_handlers_and_no_longer() -> None:
    lease, (first, second) = _lease()
    assert await lease.settled(within=0.02) is False
    waiting = asyncio.ensure_future(lease.settled(within=5))
    _finish(lease, first)
    lease.dropped(second)  # cut off: it does not finish here
    assert await asyncio.wait_for(waiting, 1) is True
    assert lease._waits == []  # nothing left behind to look at on every change
