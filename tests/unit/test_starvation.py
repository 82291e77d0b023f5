"""Which buckets the worker reports as starved, on made-up times, without a broker (the real
case, a queue serving another consumer, is in tests/integration/test_metrics.py)."""

from __future__ import annotations

from typing import Any, cast

from hashq.worker.bucket_lease import BucketLease
from hashq.worker.starvation import STARVED_AFTER, TOLD_AFTER, StarvationWatch


class _Lease:
    """As much of a bucket lease as the watch reads; its queue has ``ready`` messages."""

    epoch, log_fields = 1, {"bucket": 0}

    def __init__(self, bucket: int, ready: int) -> None:
        self.bucket = bucket
        self.queue = f"q{bucket}"
        self.ready = ready
        self.holds_nothing = True
        self.delivered_at = 0.0
        self.asked = 0


async def _at(watch: StarvationWatch, now: float, *leases: _Lease) -> list[int]:
    by_queue = {lease.queue: lease for lease in leases}

    async def ask(queue: str) -> tuple[int, int]:  # the broker's answer to a passive declare
        by_queue[queue].asked += 1
        return by_queue[queue].ready, 1

    await watch.check(cast(list[BucketLease], list(leases)), now, ask)
    return sorted(watch.starved)


async def test_a_quiet_lease_of_a_full_queue_is_told_once_a_delivery_is_overdue() -> None:
    watch, fed, starved, empty = StarvationWatch(), _Lease(1, 5), _Lease(2, 5), _Lease(3, 0)
    assert await _at(watch, STARVED_AFTER - 1, fed, starved, empty) == []
    assert (fed.asked, starved.asked, empty.asked) == (0, 0, 0), "asked before it was quiet"
    assert await _at(watch, STARVED_AFTER, fed, starved, empty) == []  # asked; not told yet
    fed.delivered_at = STARVED_AFTER + 0.5  # what was ready when asked was on its way
    # (+ 0.1 below: an answer counts from when it came, a little after the check began)
    assert await _at(watch, STARVED_AFTER + TOLD_AFTER + 0.1, fed, starved, empty) == [2]
    asked = starved.asked
    for second in range(1, int(STARVED_AFTER - TOLD_AFTER)):  # told once, not asked each second
        assert await _at(watch, STARVED_AFTER + TOLD_AFTER + second, starved) == [2]
    assert starved.asked == asked


async def test_a_starved_bucket_is_no_longer_told_once_fed_or_gone() -> None:
    watch, lease = StarvationWatch(), _Lease(4, 5)
    await _at(watch, STARVED_AFTER, lease)
    assert await _at(watch, STARVED_AFTER + TOLD_AFTER + 0.1, lease) == [4]
    lease.delivered_at = STARVED_AFTER + TOLD_AFTER + 0.5
    assert await _at(watch, STARVED_AFTER + TOLD_AFTER + 1, lease) == []
    again = 2 * STARVED_AFTER + TOLD_AFTER + 1  # quiet once more, and still not fed
    await _at(watch, again, lease)
    assert await _at(watch, again + TOLD_AFTER + 0.1, lease) == [4]
    assert await _at(watch, again + TOLD_AFTER + 1) == [], "a lease gone is still told"
    assert cast(Any, watch)._answers == {}
