"""One granted bucket inside a worker: its channel, the order of its deliveries, its key lanes,
and the drain that ends it.

A bucket lease goes CONSUMING -> DRAINING -> CLOSED, each state documented by what it allows.
Deliveries are consumed on a channel of their own, so closing that channel hands every
unacknowledged message back to the queue, in order, and touches no other bucket. Its parked keys
(``hashq.worker.parking``) have channels of their own, which close with it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable

import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq.abc import DeliveredMessage

from hashq._io.amqp import connection_usable
from hashq._io.direct import deliver_directly
from hashq.errors import ServiceUnavailable
from hashq.resizing import marker_of
from hashq.worker.acks import Acker
from hashq.worker.jobs import Job, deliver_frame
from hashq.worker.machine.lease import LeaseCore, LeaseState
from hashq.worker.machine.parking import Fate
from hashq.worker.parking import LeaseParking, ParkingSite
from hashq.worker.prepared import open_consumer_channel

log = logging.getLogger(__name__)

ACK_FLUSH_WITHIN = 1.0  # seconds a closing lease waits to send the acknowledgements it owes
MARKER_RETRY_SECONDS = 0.5  # a resize marker whose pass could not be written, again after this


__all__ = ["BucketLease", "LeaseState"]


def is_consumer_timeout(reason: str) -> bool:
    """Whether a channel's close reason is RabbitMQ's ``consumer_timeout`` ("delivery
    acknowledgement on channel N timed out")."""
    return "acknowledgement" in reason and "timed out" in reason


class BucketLease:
    """The worker's hold on one bucket at one epoch (``hashq.worker.jobs.Lease`` to its jobs)."""

    def __init__(
        self,
        bucket: int,
        epoch: int,
        queue: str,
        dispatch: Callable[[Job], None],
        ack_batch: int = 1,
        on_closed: Callable[[], None] | None = None,
        parking: ParkingSite | None = None,
        hot_after: int = 0,
        prefetch: int = 0,
        say_passed: Callable[[int, int], Awaitable[None]] | None = None,
    ) -> None:
        """``parking``: what its parked keys' edge shares with the worker's other leases; None
        (tests): no key is parked, and the bucket's records are not read. ``hot_after``:
        messages of one key in hand from which it steps aside (0: never). ``say_passed(bucket,
        new)`` writes that the bucket passed its marker of a resize (``hashq.resizing``)."""
        self.bucket = bucket
        self._on_closed = on_closed  # told when the channel closes, by either side
        self.epoch = epoch
        self.queue = queue
        self._core: LeaseCore[Job] = LeaseCore(
            bucket, epoch, parks=parking is not None, hot_after=hot_after, window=prefetch
        )
        self._parking = (
            LeaseParking(self, self._core, parking, self._note_progress)
            if parking is not None
            else None
        )
        self._mover = parking.mover if parking is not None else None
        self._dispatch = dispatch
        self._say_passed = say_passed
        self._prefetch = prefetch
        self._passing: set[asyncio.Task[None]] = set()
        self._channel: aiormq.abc.AbstractChannel | None = None
        self._ack_batch = ack_batch
        self._acker: Acker | None = None
        self._consumer_tag: str | None = None
        # Waits until a condition of the core holds (idle, settled): looked at after every
        # change only while someone waits, which is seldom (a drain, a close).
        self._waits: list[tuple[Callable[[], bool], asyncio.Future[None]]] = []
        self.close_reason = ""  # why the broker closed the channel, if it did
        self._connection: AbstractConnection | None = None
        # Whether the broker is known to have closed the channel: it closed it, or answered
        # our close, on a connection still alive. If the connection died instead, the broker
        # may hold the channel (and what it delivered) until it notices.
        self.close_confirmed = True
        self.delivered_at = time.monotonic()  # the last delivery (``hashq.worker.starvation``)

    @property
    def state(self) -> LeaseState:
        return self._core.state

    def __repr__(self) -> str:
        return f"<bucket {self.bucket} epoch {self.epoch} {self.state.value}>"

    # ------------------------------------------------------------ consuming
    async def open(
        self, connection: AbstractConnection, prefetch: int, ready: AbstractChannel | None = None
    ) -> None:
        """Consume the bucket queue on ``ready`` (a channel of ``connection`` opened for it
        with this prefetch: ``hashq.worker.prepared``), or on a channel opened now."""
        self._connection = connection
        if self._parking is not None:  # read its parked keys while it subscribes
            self._parking.start(connection)
        channel = ready if ready is not None else await open_consumer_channel(connection, prefetch)
        self._channel = await channel.get_underlay_channel()
        self._channel.closing.add_done_callback(self._note_close)
        self._acker = Acker(self._channel, self._ack_batch, self.bucket)
        deliver_directly(self._channel, self.deliver)
        result = await self._channel.basic_consume(self.queue, self._delivered, no_ack=False)
        self._consumer_tag = result.consumer_tag
        self.delivered_at = time.monotonic()  # consuming since: no delivery is owed before

    def _note_close(self, closed: asyncio.Future[object]) -> None:
        if not closed.cancelled() and closed.exception() is not None:
            self.close_reason = str(closed.exception())
        if self._on_closed is not None:
            self._on_closed()

    @property
    def consumer_timed_out(self) -> bool:
        """The broker closed the channel because a delivery stayed unacknowledged longer than
        its ``consumer_timeout``: every message held went back and counts as a delivery."""
        return is_consumer_timeout(self.close_reason)

    async def _delivered(self, delivery: DeliveredMessage) -> None:
        """aiormq's consumer callback, in a task of its own: only if ``deliver_directly``
        could not hand deliveries over at once."""
        self.deliver(delivery)

    def deliver(self, delivery: DeliveredMessage) -> None:
        """A delivery on the bucket's channel: into its key's lane, and on to the runners if
        its turn has come. Never waits (``hashq._io.direct``)."""
        self.delivered_at = time.monotonic()
        # Callbacks may run out of order; the core restores the queue's order by delivery tag.
        frame = deliver_frame(delivery)
        marker = marker_of(delivery.header.properties.headers)
        ready = self._core.deliver(
            frame.delivery_tag or 0, Job(self, delivery, frame.routing_key or "", marker=marker)
        )
        for job in ready:
            self._dispatch(job)
        if marker:
            self._pass_markers()  # else when what came before it finishes

    def _act(self) -> None:
        """Carry out what its parked keys asked for; pass the resize markers that may pass."""
        if self._parking is not None and self._core.asks:
            self._parking.act()
        if self._core.markers_held:
            self._pass_markers()

    def _pass_markers(self) -> None:
        for marker in self._core.passable():
            task = asyncio.ensure_future(self._pass(marker))
            self._passing.add(task)
            task.add_done_callback(self._passing.discard)

    async def _pass(self, marker: Job) -> None:
        """Everything before ``marker`` is finished: its acknowledgements reach the broker,
        then ZooKeeper hears that the bucket passed, then the marker is acknowledged. If the
        channel goes first, the marker goes back with it, and the next owner passes it."""
        if self._acker is None or self._say_passed is None:
            return
        for attempt in itertools.count():
            if self.state is LeaseState.CLOSED:
                return
            try:
                await self._acker.sync(self._prefetch)
                await self._say_passed(self.bucket, marker.marker)
            except Exception as exc:  # said once; the resize shows the bucket as waiting
                level = logging.WARNING if attempt == 0 else logging.DEBUG
                log.log(level, "bucket %d: its resize marker did not pass: %r", self.bucket, exc)
                await asyncio.sleep(MARKER_RETRY_SECONDS)
                continue
            if self.ack(marker):
                self.finished(marker)
            return

    def may_start(self, job: Job) -> bool:
        return job.lease is self and self._core.may_start()

    def fate(self, job: Job) -> Fate:
        fate = self._core.fate(job)
        self._act()
        return fate

    def started(self, job: Job, fate: Fate = Fate.RUN) -> None:
        self._core.started(job, fate)

    def park(self, job: Job, reason: str, since: float) -> None:
        self._core.park(job, reason, since)
        self._note_progress()
        self._act()

    async def move(self, job: Job) -> None:
        if self._mover is None:
            raise ServiceUnavailable("this lease parks no key")
        await self._mover.move(job)

    def finished(self, job: Job) -> None:
        """``job`` was acknowledged or dead-lettered: hand its key's next delivery on."""
        following = self._core.finished(job)
        self._note_progress()
        for ready in following:
            self._dispatch(ready)
        self._act()

    def dropped(self, job: Job) -> None:
        """``job`` will not finish here (its handler was cut off); it goes back to the queue."""
        self._core.dropped(job)
        self._note_progress()
        self._act()

    def _note_progress(self) -> None:
        if self._waits:
            for condition, until in self._waits:
                if not until.done() and condition():
                    until.set_result(None)

    async def _until(self, condition: Callable[[], bool], within: float | None) -> bool:
        """Wait (at most ``within`` seconds; None: for as long as it takes) until
        ``condition()``; whether it holds."""
        if condition():
            return True
        wait = (condition, asyncio.get_running_loop().create_future())
        self._waits.append(wait)
        try:
            async with asyncio.timeout(within):
                await wait[1]
        except TimeoutError:
            return condition()  # it may have come true as the time ran out
        finally:
            self._waits.remove(wait)
        return True

    async def settled(self, within: float | None) -> bool:
        """Wait (at most ``within`` seconds; None: for as long as it takes) until no handler of
        this lease runs any more (threads included)."""
        return await self._until(lambda: self._core.settled, within)

    def ack(self, job: Job) -> bool:
        """Count ``job`` as done; its acknowledgement goes out with the next batch (see
        ``hashq.worker.acks``). False if the lease is closed or the channel is gone: the message
        went back to the queue."""
        if self.state is LeaseState.CLOSED or self._acker is None or not self.channel_alive:
            return False
        if job.from_parking:
            return self._parking is not None and self._parking.ack(job)
        self._acker.complete(job.tag)
        return True

    # ------------------------------------------------------------ ending
    async def drain(self, within: float) -> bool:
        """Stop deliveries, finish what was delivered (at most ``within`` seconds), then close.
        True if everything delivered was finished, or if the lease was closed meanwhile (cut
        off: what it held went back to the queue, and was not left behind by the drain).

        Finishing the delivered messages, rather than handing them back, matters for quorum
        queues: every message returned by a closed channel counts toward the delivery limit, so
        a bucket moved many times would otherwise dead-letter healthy messages.
        """
        if self.state is LeaseState.CLOSED:
            return self._core.idle
        self._core.drain()
        self._act()
        await self._cancel_consumer()
        if self._parking is not None:
            await self._parking.cancel()
        clean = await self._until(
            lambda: self._core.idle or self.state is LeaseState.CLOSED, within
        )
        if not clean:
            log.warning(
                "bucket %d epoch %d: %d messages not finished within the drain timeout of %gs; "
                "they go back to the queue",
                self.bucket,
                self.epoch,
                self._core.held,
                within,
                extra=self.log_fields,
            )
        await self.close()
        return clean

    async def close(self) -> None:
        """Close the channel now: unacknowledged messages return to the queue, in order (once
        the broker closes it: see ``close_confirmed``)."""
        for job in self._core.close():
            job.cut_off()
        self._note_progress()  # a drain waiting for it to be idle ends
        if self._parking is not None:
            await self._parking.close()
        if self._acker is not None:  # what was finished is acknowledged, not done again
            await self._acker.flush(ACK_FLUSH_WITHIN)
        channel, self._channel = self._channel, None
        if channel is None:
            return
        confirmed = True  # closed by the broker, if the connection still lives
        if not channel.is_closed:
            try:
                await channel.close()
            except Exception as exc:
                log.debug("bucket %d: closing channel: %r", self.bucket, exc)
                confirmed = False
        self.close_confirmed = confirmed and connection_usable(self._connection)

    def say_handlers_outlive_it(self) -> None:
        log.warning(
            "bucket %d epoch %d: %d handler(s) still run after the bucket's channel closed; "
            "it waits for them before it is consumed again or released",
            self.bucket,
            self.epoch,
            self.running,
            extra=self.log_fields,
        )

    async def _cancel_consumer(self) -> None:
        if self._channel is None or self._consumer_tag is None:
            return
        try:
            await self._channel.basic_cancel(self._consumer_tag)
        except Exception as exc:
            log.debug("bucket %d: cancel: %r", self.bucket, exc)

    @property
    def log_fields(self) -> dict[str, int]:
        """For ``extra=``: the JSON log format shows them as fields."""
        return {"bucket": self.bucket, "epoch": self.epoch}

    @property
    def parked_keys(self) -> int:
        return len(self._core.parked.keys)

    @property
    def markers_held(self) -> int:
        """Resize markers delivered and not acknowledged yet (``hashq.resizing``)."""
        return self._core.markers_held

    @property
    def parking_unread(self) -> str | None:
        """Why its parked keys could not be read yet, if so: nothing of the bucket starts."""
        return self._parking.unread if self._parking is not None else None

    @property
    def running(self) -> int:
        return self._core.running

    @property
    def waiting(self) -> int:
        return self._core.waiting

    @property
    def channel_alive(self) -> bool:
        return self._channel is not None and not self._channel.is_closed

    @property
    def consumer_cancelled(self) -> bool:
        """The broker cancelled the consumer (``basic.cancel``: the queue was deleted, for
        instance) while the channel lives on: nothing arrives any more."""
        consumers = getattr(self._channel, "consumers", None)  # aiormq's, by consumer tag
        return (
            self.state is LeaseState.CONSUMING
            and consumers is not None
            and self._consumer_tag is not None
            and self._consumer_tag not in consumers
        )

    @property
    def holds_nothing(self) -> bool:
        """Consuming (its consumer confirmed, not cancelled by the broker), with nothing
        delivered left unacknowledged: the broker owes it what its queue has ready."""
        return (
            self.state is LeaseState.CONSUMING
            and self._core.idle
            and self.channel_alive
            and self._consumer_tag is not None
            and not self.consumer_cancelled
        )
