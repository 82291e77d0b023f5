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
import time

from aio_pika.abc import AbstractConnection

from hashq._io.amqp import close_quietly, connection_usable
from hashq.worker.machine.contact import RENEW_SECONDS, BrokerContact

log = logging.getLogger(__name__)

# A connection that looks usable but has answered nothing for this long is closed, so that the
# worker reconnects rather than starting nothing for ever.
SILENT_LIMIT_SECONDS = 10.0


class ContactKeeper:
    """The contact of the worker's current connection, and the task that keeps it."""

    def __init__(self) -> None:
        self._contact = BrokerContact()
        self._renewed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._answered_at = time.monotonic()  # when the last round trip was answered

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

    async def heard_again(self) -> None:
        """Until the broker answers the next round trip."""
        self._renewed.clear()
        await self._renewed.wait()

    async def _keep(self, connection: AbstractConnection, contact: BrokerContact) -> None:
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
            contact.answered(sent)
            self._answered_at = time.monotonic()
            self._renewed.set()
            await asyncio.sleep(max(0.0, sent + RENEW_SECONDS - time.monotonic()))
