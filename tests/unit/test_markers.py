"""A bucket lease passing a resize's marker at the edge (``BucketLease._pass``): the
acknowledgements of everything before it must be in the broker (a request on the bucket's
channel answered after them) before ZooKeeper hears that the bucket passed, and the marker is
acknowledged last. A message acknowledged but still in flight when the channel died would come
back and run after the key's new bucket started."""

from __future__ import annotations

from aiormq.abc import DeliveredMessage
from pamqp import commands as spec
from pamqp.header import ContentHeader

from hashq.resizing import MARKER_HEADER, marker_of
from hashq.worker.bucket_lease import BucketLease
from hashq.worker.jobs import Job


class Acker:
    """Records what the lease asks of its channel's acknowledgements."""

    def __init__(self, calls: list[str], fails: int = 0) -> None:
        self.calls, self.fails = calls, fails

    async def sync(self, prefetch: int) -> None:
        if self.fails:
            self.fails -= 1
            raise ConnectionError("the channel went")
        self.calls.append("acks ahead of it in the broker")

    def complete(self, tag: int) -> None:
        self.calls.append(f"ack {tag}")

    async def flush(self, within: float) -> None:
        self.calls.append("acks flushed as the lease closes")


class Channel:
    is_closed = False


def _lease(calls: list[str], fails: int = 0) -> tuple[BucketLease, Job]:
    async def say_passed(bucket: int, new: int) -> None:
        calls.append(f"bucket {bucket} passed its marker of {new}")

    lease = BucketLease(3, 1, "hashq.t.b0003", lambda job: None, say_passed=say_passed)
    lease._acker = Acker(calls, fails)  # type: ignore[assignment]
    lease._channel = Channel()  # type: ignore[assignment]
    properties = spec.Basic.Properties(headers={MARKER_HEADER: 16})
    frame = spec.Basic.Deliver(delivery_tag=1, routing_key="hashq.t.b0003")
    delivery = DeliveredMessage(frame, ContentHeader(properties=properties), b"", None)  # type: ignore[arg-type]
    marker = Job(lease, delivery, "", marker=marker_of(properties.headers))
    lease._core.deliver(1, marker)
    return lease, marker


async def test_a_marker_passes_after_the_acks_ahead_of_it_are_in_and_is_acknowledged_last() -> None:
    calls: list[str] = []
    lease, marker = _lease(calls)
    assert lease.markers_held == 1  # the gauge hashq_resize_markers_held counts it
    assert lease._core.passable() == [marker]
    await lease._pass(marker)
    assert calls == [
        "acks ahead of it in the broker",
        "bucket 3 passed its marker of 16",
        "ack 1",
    ]
    assert lease._core.idle and lease.markers_held == 0


async def test_a_marker_whose_channel_went_is_not_said_passed() -> None:
    calls: list[str] = []
    lease, marker = _lease(calls, fails=1)
    await lease.close()  # the channel went: the marker goes back to the queue with it
    await lease._pass(marker)
    assert not any("passed" in call for call in calls)
