"""Buckets the broker does not feed: a lease that consumes and holds nothing, with no delivery
for ``STARVED_AFTER`` seconds, while its queue has messages ready.

Nothing in the protocol leaves a lease so: a granted bucket's queue (single active consumer) is
consumed by its owner alone once the previous owner released or was fenced. It was seen in the
30-minute chaos runs (seed 23): a bucket whose channel ``consumer_timeout`` had closed was
subscribed again, the broker confirmed the consumer, and nothing was delivered for 46 s, until
the bucket was revoked, while the same worker's other buckets ran. The cause, found since: aiormq
had dropped its answer to the broker's close, so the old channel lived on as the queue's active
consumer (``hashq._io.amqp.answer_every_close``, which fixes it). Any other cause would look the
same, so the worker still says so, once, in an error line, in ``hashq_buckets_starved`` and in
its readiness, and says when it ends; the line gives the queue's counts.

Each quiet lease costs one passive declare per ``STARVED_AFTER`` seconds, on a channel of the
watch's own (``QueueCounts``), so that an error there (a 404, a timeout) closes no bucket's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from aio_pika.abc import AbstractChannel, AbstractConnection

from hashq.worker.bucket_lease import BucketLease

log = logging.getLogger(__name__)

STARVED_AFTER = 10.0  # seconds without a delivery, holding nothing, before the queue is asked
CHECK_EVERY = 1.0
# After an answer with messages ready, this long with no delivery before it is told: a message
# published as the queue was asked may be on its way.
TOLD_AFTER = 2.0
ASK_WITHIN = 5.0  # seconds a passive declare may take

Ask = Callable[[str], Awaitable[tuple[int, int]]]  # a queue -> (messages ready, consumers)


class QueueCounts:
    """Passive declares on a channel of their own (one the watch may lose without touching a
    bucket's), opened again on the worker's current connection when needed."""

    def __init__(self, connection: Callable[[], AbstractConnection | None]) -> None:
        self._connection = connection
        self._channel: AbstractChannel | None = None
        self._opened_on: AbstractConnection | None = None

    async def __call__(self, queue: str) -> tuple[int, int]:
        """Its messages ready and active consumers; (0, 0) if it cannot be asked now."""
        try:
            channel = await self._open()
            if channel is None:
                return 0, 0
            declared = await asyncio.wait_for(
                channel.declare_queue(queue, passive=True), ASK_WITHIN
            )
        except Exception as exc:  # a 404, a timeout, a closed channel: the next ask opens anew
            log.debug("passive declare of %s: %r", queue, exc)
            self._channel = None
            return 0, 0
        result = declared.declaration_result
        return result.message_count or 0, result.consumer_count or 0

    async def _open(self) -> AbstractChannel | None:
        connection = self._connection()
        if connection is None or connection.is_closed:
            return None
        if self._channel is None or self._channel.is_closed or self._opened_on is not connection:
            self._channel = await asyncio.wait_for(connection.channel(), ASK_WITHIN)
            self._opened_on = connection
        return self._channel


class StarvationWatch:
    """Which buckets are starved now (bucket -> what their queue said)."""

    def __init__(self) -> None:
        self.starved: dict[int, str] = {}
        # Each lease's last answer: when its queue was asked, its messages ready, its consumers.
        self._answers: dict[BucketLease, tuple[float, int, int]] = {}
        self._failing = False

    async def run(
        self,
        leases: Callable[[], Iterable[BucketLease]],
        connection: Callable[[], AbstractConnection | None],
    ) -> None:
        ask = QueueCounts(connection)
        while True:
            await asyncio.sleep(CHECK_EVERY)
            try:
                await self.check(list(leases()), time.monotonic(), ask)
            except Exception as exc:  # a bug: said once, and the watch goes on
                if not self._failing:
                    log.error("the starvation watch failed: %r", exc, exc_info=exc)
                self._failing = True
            else:
                self._failing = False

    async def check(self, leases: list[BucketLease], now: float, ask: Ask) -> None:
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
                began = time.monotonic()
                ready, consumers = await ask(lease.queue)
                asked_at = now + time.monotonic() - began  # when it answered
                self._answers[lease] = (asked_at, ready, consumers)
            told = lease.bucket in self.starved
            if ready and lease.delivered_at < asked_at and (told or now - asked_at >= TOLD_AFTER):
                starving.add(lease.bucket)
                if not told:
                    self._report(lease, now - lease.delivered_at, ready, consumers)
        for bucket in sorted(set(self.starved) - starving):
            log.info("bucket %d: delivered to again, or its queue is empty", bucket)
            del self.starved[bucket]

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
