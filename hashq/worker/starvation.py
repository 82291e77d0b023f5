"""Buckets the broker does not feed: a lease that consumes and holds nothing, with no delivery
for ``STARVED_AFTER`` seconds, while its queue has messages ready.

Nothing in the protocol leaves a lease so: a granted bucket's queue (single active consumer) is
consumed by its owner alone once the previous owner released or was fenced. It was seen once,
in the second 30-minute chaos run (seed 23): a bucket whose channel ``consumer_timeout`` had
closed was subscribed again, the broker confirmed the consumer, and nothing was delivered for
46 s, until the bucket was revoked, while the same worker's other buckets ran. The cause is not
known, so the worker does not act on it: it says so, once, in an error line, in
``hashq_buckets_starved`` and in its readiness, and says when it ends. A queue that does not
deliver to its only consumer is the broker's to explain; the line gives its counts.

Each quiet lease costs one passive declare per ``STARVED_AFTER`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from hashq.worker.bucket_lease import BucketLease

log = logging.getLogger(__name__)

STARVED_AFTER = 10.0  # seconds without a delivery, holding nothing, before the queue is asked
CHECK_EVERY = 1.0
# After an answer with messages ready, this long with no delivery before it is told: a message
# published as the queue was asked may be on its way.
TOLD_AFTER = 2.0


class StarvationWatch:
    """Which buckets are starved now (bucket -> what their queue said)."""

    def __init__(self) -> None:
        self.starved: dict[int, str] = {}
        # Each lease's last answer: when its queue was asked, its messages ready, its consumers.
        self._answers: dict[BucketLease, tuple[float, int, int]] = {}

    async def run(self, leases: Callable[[], Iterable[BucketLease]]) -> None:
        while True:
            await asyncio.sleep(CHECK_EVERY)
            await self.check(list(leases()), time.monotonic())

    async def check(self, leases: list[BucketLease], now: float) -> None:
        """Starved: holding nothing, its queue had messages ready when last asked, and nothing
        was delivered since (for ``TOLD_AFTER`` seconds, the first time). A lease is asked after
        ``STARVED_AFTER`` quiet seconds, and again after as many more."""
        self._answers = {lease: self._answers[lease] for lease in leases if lease in self._answers}
        starving: set[int] = set()
        for lease in leases:
            if not lease.holds_nothing:
                continue
            asked_at, ready, consumers = self._answers.get(lease, (0.0, 0, 0))
            if now - max(lease.delivered_at, asked_at) >= STARVED_AFTER:
                asked_at, (ready, consumers) = now, await self._ask(lease)
                self._answers[lease] = (asked_at, ready, consumers)
            told = lease.bucket in self.starved
            if ready and lease.delivered_at < asked_at and (told or now - asked_at >= TOLD_AFTER):
                starving.add(lease.bucket)
                if not told:
                    self._report(lease, now - lease.delivered_at, ready, consumers)
        for bucket in sorted(set(self.starved) - starving):
            log.info("bucket %d: delivered to again, or its queue is empty", bucket)
            del self.starved[bucket]

    async def _ask(self, lease: BucketLease) -> tuple[int, int]:
        """The queue's messages ready and active consumers; none if the channel went (its close
        is reported on its own)."""
        try:
            return await lease.queue_counts()
        except Exception as exc:
            log.debug("bucket %d: passive declare: %r", lease.bucket, exc)
            return 0, 0

    def _report(self, lease: BucketLease, quiet: float, ready: int, consumers: int) -> None:
        # A single-active-consumer queue counts its active consumer only: ours, or another
        # (a previous owner not fenced yet); the count cannot tell which.
        text = f"{ready} messages ready, {consumers} active consumer(s)"
        self.starved[lease.bucket] = text
        log.error(
            "bucket %d epoch %d: nothing delivered for %.0fs although its queue has %s: the "
            "broker feeds another consumer or none; readiness stays false until it feeds this one",
            lease.bucket,
            lease.epoch,
            quiet,
            text,
            extra=lease.log_fields,
        )
