"""Keeping a worker's ``BrokerContact`` (``hashq.worker.machine.contact``) on its connection: a
``basic.qos`` round trip on a channel of its own (it needs no queue and no permission), the next
one ``RENEW_SECONDS`` after the previous was sent or as soon as it was answered if that took
longer; runners start a delivered message only while the contact is fresh.

One keeper serves the worker's current connection. That is enough because a lease of an earlier
connection can start nothing any more: the machine cuts every lease off (``CutOff``) before it
asks for a new connection (``Reconnect``, ``BeginIncarnation``), and a closing lease refuses new
starts before its first await (``BucketLease``)."""

from __future__ import annotations

import asyncio
import logging
import math
import time

from aio_pika.abc import AbstractConnection

from hashq._io.amqp import close_quietly, connection_usable
from hashq.worker.machine.contact import RENEW_SECONDS, BrokerContact

log = logging.getLogger(__name__)

# A connection that looks usable but has answered nothing for this long is closed, so that the
# worker reconnects rather than starting nothing for ever.
SILENT_LIMIT_SECONDS = 10.0


class ContactKeeper:
    """The contact of the worker's current connection, and the task that keeps it.

    A contact that lapses while the broker answers, only late, holds every start until the next
    answer: the worker says so once in its log, and counts it (``round_trip_seconds``,
    ``lapsed_seconds``, in its metrics). The usual cause is the worker's own backlog: the
    broker's answer is read after every delivery sent before it, so with more deliveries in
    flight (``HASHQ_PREFETCH`` times the buckets held) than the worker handles in
    ``BROKER_CONTACT_SECONDS - RENEW_SECONDS``, each answer comes too late (docs/operations.md).
    """

    def __init__(self) -> None:
        self._contact = BrokerContact()
        self._renewed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._answered_at = time.monotonic()  # when the last round trip was answered
        self.round_trip_seconds = 0.0  # the last one's
        self._lapsed = 0.0  # seconds with starts held, counted up to ``_counted_to``
        self._counted_to = -math.inf
        self._said = False

    def start(self, connection: AbstractConnection) -> None:
        """Keep a fresh contact on ``connection`` (the previous one's is forgotten)."""
        self.stop()
        self._contact, self._answered_at = BrokerContact(), time.monotonic()
        self._task = asyncio.ensure_future(self._keep(connection, self._contact))

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def heard(self) -> bool:
        """Whether a delivered message may start now."""
        return self._contact.fresh(time.monotonic())

    def lapsed_seconds(self) -> float:
        """Seconds in which the contact had lapsed while the worker waited for an answer, the
        current lapse included (for ``hashq_broker_contact_lapsed_seconds``): never less than
        before, since a lapse cut short by the connection's end is counted up to that end."""
        if self._task is None or self._task.done():  # no connection: no answer to wait for
            return self._lapsed
        return self._lapsed + self._uncounted(self._contact, time.monotonic())

    def _count_lapse(self, contact: BrokerContact, now: float) -> float:
        """Count the current lapse up to ``now``; the part newly counted."""
        lapse = self._uncounted(contact, now)
        self._lapsed += lapse
        self._counted_to = now
        return lapse

    def _uncounted(self, contact: BrokerContact, now: float) -> float:
        """The part of the current lapse not counted yet: an answer to a request sent long
        before may leave the contact lapsed still."""
        return min(contact.lapsed(now), now - self._counted_to)

    async def heard_again(self) -> None:
        """Until the broker answers the next round trip."""
        self._renewed.clear()
        await self._renewed.wait()

    async def _keep(self, connection: AbstractConnection, contact: BrokerContact) -> None:
        try:
            await self._keep_while_open(connection, contact)
        finally:  # stopped, or the connection ended: a lapse so far is counted
            self._count_lapse(contact, time.monotonic())

    async def _keep_while_open(
        self, connection: AbstractConnection, contact: BrokerContact
    ) -> None:
        while connection_usable(connection):
            if time.monotonic() - self._answered_at > SILENT_LIMIT_SECONDS:
                log.warning(
                    "RabbitMQ answered nothing on this worker's connection for %.0fs while it "
                    "looked open; closing it to connect again",
                    SILENT_LIMIT_SECONDS,
                )
                await close_quietly(connection)
                return
            try:
                await self._round_trips(connection, contact)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the channel failed: open another, if the link lives
                log.debug("broker contact: %r", exc)
                await asyncio.sleep(RENEW_SECONDS)

    async def _round_trips(self, connection: AbstractConnection, contact: BrokerContact) -> None:
        """Round trips until one fails (its exception), each noted in ``contact``."""
        channel = await connection.channel()
        while True:
            sent = time.monotonic()
            await channel.set_qos(prefetch_count=0)
            self._answered(contact, sent, time.monotonic())
            await asyncio.sleep(max(0.0, sent + RENEW_SECONDS - time.monotonic()))

    def _answered(self, contact: BrokerContact, sent: float, now: float) -> None:
        lapse = self._count_lapse(contact, now)
        contact.answered(sent)
        self._answered_at, self.round_trip_seconds = now, now - sent
        self._renewed.set()
        if lapse and not self._said:
            self._said = True
            log.warning(
                "RabbitMQ answered this worker %.2fs after it asked: no delivered message "
                "could start for %.2fs (counted in hashq_broker_contact_lapsed_seconds, not said "
                "again). If the worker is busy, the answer waited behind deliveries not read "
                "yet: fewer in flight (HASHQ_PREFETCH times the buckets held) shorten the wait",
                now - sent,
                lapse,
            )
