"""Hearing of crashes from the broker: RabbitMQ's event exchange (the ``rabbitmq_event_exchange``
plugin) publishes ``connection.closed`` within milliseconds of a connection ending, however it
ends: a killed process's socket closing, a forced close, a heartbeat timeout. A worker names each
AMQP connection after its incarnation, so the event says whose it was.

The feed only tells the coordinator's machine (``ConnectionClosed``); what follows is decided
there: after the crash grace, whether any connection of the incarnation is left is asked of the
broker (its liveness queue), and only if none is, the worker is expelled. An event missed (the
feed down, a RabbitMQ node killed, which sends none) costs only speed: the worker's buckets then
move when its ZooKeeper session expires, as without the plugin.

The exchange lives in one vhost (``rabbitmq_event_exchange.vhost``, "/" by default) and carries
every vhost's events; ``HASHQ_EVENTS_VHOST`` names it. Without the plugin, or without the right
to read that vhost, the coordinator says so once, at ERROR, and the gauge
``hashq_coordinator_crash_detection`` is 0: crashes are then found by session expiry alone.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from urllib.parse import quote, urlsplit, urlunsplit

from aio_pika.abc import AbstractChannel, AbstractIncomingMessage
from aiormq.exceptions import ChannelAccessRefused, ChannelNotFoundEntity

from hashq._io.amqp import close_quietly, connect_amqp, connection_name
from hashq.records import parse_worker_connection_name
from hashq_coordinator.machine.events import ConnectionClosed
from hashq_coordinator.settings import CoordinatorSettings

log = logging.getLogger(__name__)

EVENT_EXCHANGE = "amq.rabbitmq.event"
CLOSED = "connection.closed"
RETRY_SECONDS = 1.0  # after a lost connection
UNAVAILABLE_RETRY_SECONDS = 30.0  # after the broker said the exchange is missing or refused


class FeedState(enum.Enum):
    OFF = "off"
    """``HASHQ_EVENTS_VHOST`` is empty: not listening; crashes wait for session expiry."""
    CONNECTING = "connecting"
    """Opening its connection and subscribing; events sent meanwhile are not heard."""
    LISTENING = "listening"
    """Subscribed: every ``connection.closed`` of the broker's nodes reaches the machine."""
    UNAVAILABLE = "unavailable"
    """The broker has no event exchange in that vhost (the plugin is not enabled) or refuses
    access to it: said once at ERROR, asked again every 30 s."""
    DISCONNECTED = "disconnected"
    """Its connection was lost: reconnecting every second."""


def events_url(url: str, vhost: str) -> str:
    """``url`` with its vhost replaced by ``vhost``."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + quote(vhost, safe="")))


class CrashFeed:
    """Subscribes to ``connection.closed`` and tells ``on_closed`` which worker connection it
    was (the name, and the incarnation the name gives)."""

    def __init__(
        self, settings: CoordinatorSettings, on_closed: Callable[[ConnectionClosed], None]
    ) -> None:
        self._settings = settings.model_copy(
            update={
                "amqp_url": ",".join(
                    events_url(url, settings.events_vhost) for url in settings.amqp_urls
                )
            }
        )
        self._on_closed = on_closed
        self._vhost = settings.events_vhost
        self.state = FeedState.OFF if not settings.events_vhost else FeedState.CONNECTING

    @property
    def listening(self) -> bool:
        return self.state is FeedState.LISTENING

    async def run(self) -> None:
        """Listen until cancelled, reconnecting whatever fails."""
        if self.state is FeedState.OFF:
            log.warning(
                "HASHQ_EVENTS_VHOST is empty: a crashed worker's buckets move only once its "
                "ZooKeeper session expires"
            )
            return
        while True:
            try:
                await self._listen_until_lost()
                self._become(FeedState.DISCONNECTED, "its connection was lost")
            except (ChannelNotFoundEntity, ChannelAccessRefused) as exc:
                self._become(FeedState.UNAVAILABLE, str(exc))
                await asyncio.sleep(UNAVAILABLE_RETRY_SECONDS - RETRY_SECONDS)
            except Exception as exc:  # any failure: reconnect
                self._become(FeedState.DISCONNECTED, repr(exc))
            await asyncio.sleep(RETRY_SECONDS)

    async def _listen_until_lost(self) -> None:
        connection = await connect_amqp(self._settings, connection_name("events"))
        lost = asyncio.Event()
        connection.close_callbacks.add(lambda *_: lost.set())
        try:
            channel = await connection.channel()
            channel.close_callbacks.add(lambda *_: lost.set())  # a channel gone is deaf too
            await self._listen(channel)
            await lost.wait()
        finally:
            await close_quietly(connection)

    async def _listen(self, channel: AbstractChannel) -> None:
        exchange = await channel.get_exchange(EVENT_EXCHANGE, ensure=True)
        queue = await channel.declare_queue("", exclusive=True, auto_delete=True)
        await queue.bind(exchange, CLOSED)
        await queue.consume(self._heard, no_ack=True)
        self._become(FeedState.LISTENING, "")

    async def _heard(self, message: AbstractIncomingMessage) -> None:
        name = message.headers.get("user_provided_name")
        if isinstance(name, bytes):
            name = name.decode(errors="replace")
        if not isinstance(name, str):
            return
        incarnation = parse_worker_connection_name(name)
        if incarnation is not None:  # one line a close: a node going down names its workers
            log.info("crash detection: RabbitMQ says %s closed", name)
            self._on_closed(ConnectionClosed(incarnation, name))

    def _become(self, state: FeedState, why: str) -> None:
        """Log a change of state once (not every retry)."""
        if state is self.state:
            return
        before, self.state = self.state, state
        if state is FeedState.LISTENING:
            log.info("crash detection: listening to RabbitMQ's %s", EVENT_EXCHANGE)
        elif state is FeedState.UNAVAILABLE:
            log.error(
                "crash detection unavailable: RabbitMQ's %s in vhost %r cannot be read (%s); "
                "enable the rabbitmq_event_exchange plugin (docs/operations.md). Until then a "
                "crashed worker's buckets move only once its ZooKeeper session expires",
                EVENT_EXCHANGE,
                self._vhost,
                why,
            )
        elif before is FeedState.LISTENING:
            log.warning("crash detection: %s; reconnecting", why)
        elif before is FeedState.CONNECTING:  # never listened: say so once, as loudly
            log.error(
                "crash detection unavailable: cannot subscribe to RabbitMQ's %s in vhost %r "
                "(%s); retrying every %gs. Until then a crashed worker's buckets move only once "
                "its ZooKeeper session expires",
                EVENT_EXCHANGE,
                self._vhost,
                why,
                RETRY_SECONDS,
            )
