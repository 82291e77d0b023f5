"""The confirmed publisher: ``await publish(key, body)`` returns only once the broker confirmed.

Many publishes may be in flight at once on one channel (pipelined confirms, bounded by
``max_in_flight``). Every message is published persistent and mandatory, so each outcome is
explicit: confirmed, nacked, returned as unroutable, or unconfirmed because the connection,
the channel or the confirm timeout gave out. A message is never reported confirmed unless the
broker acknowledged it. After a connection loss the next publish opens a new connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq.exceptions import AMQPError, ChannelNotFoundEntity, DeliveryError
from aiormq.exceptions import PublishError as ReturnedError
from pamqp import commands as spec

from hashq._io.amqp import close_quietly, connect_amqp, connection_name, connection_usable
from hashq.errors import (
    BatchPublishError,
    HashqError,
    InvalidMessage,
    MessageNacked,
    MessageUnroutable,
    PublishError,
    PublishUnconfirmed,
    ServiceUnavailable,
    TopologyMismatch,
)
from hashq.inflight import InFlight, Prepared
from hashq.payloads import encode
from hashq.provision import ensure_ring, ring_exists
from hashq.routing import TYPE_HEADER
from hashq.settings import Settings
from hashq.topology import Topology
from hashq.tracing import Tracing, tracing_for

log = logging.getLogger(__name__)

MAX_KEY_BYTES = 255  # AMQP short string: the routing key's limit
RETIRE_INTERVAL = 1.0  # seconds: at most one channel replaced after nacks in this time


@dataclass(frozen=True)
class Outgoing:
    """One message to publish: the entity key, its body (bytes, str, or a value sent as JSON:
    ``hashq.payloads``) and optional headers, id and job type (``hashq.App``)."""

    key: str
    body: Any
    headers: Mapping[str, Any] = field(default_factory=dict)
    message_id: str | None = None
    job_type: str | None = None


def check_key(key: object) -> str:
    """The key if it can be a routing key, else ``InvalidMessage``."""
    if not isinstance(key, str) or not key:
        raise InvalidMessage("the key must be a non-empty string")
    if len(key.encode()) > MAX_KEY_BYTES:
        raise InvalidMessage(f"the key is longer than {MAX_KEY_BYTES} bytes in UTF-8")
    return key


class Publisher:
    """Publishes jobs to ``hashq.<app>`` with the entity key as routing key.

    Use as ``async with Publisher(settings) as publisher: await publisher.publish(key, body)``.
    """

    def __init__(self, settings: Settings, *, max_in_flight: int = 1000) -> None:
        self._settings = settings
        self._topology = Topology.from_settings(settings)
        self._tracing = tracing_for(settings.tracing, self._topology.exchange)
        self._window = asyncio.Semaphore(max_in_flight)
        self._connect_lock = asyncio.Lock()
        self._ring_lock = asyncio.Lock()
        self._ring_checked_at = -1.0
        self._connection: AbstractConnection | None = None
        self._raw_channel: aiormq.Channel | None = None
        self._batches: set[InFlight] = set()  # publishes waiting for their confirms
        self._retired: set[aiormq.Channel] = set()  # replaced after a nack, closed later
        self._retired_at = -RETIRE_INTERVAL
        self._closing: set[asyncio.Future[None]] = set()
        self.connection_name = connection_name("publisher")

    async def __aenter__(self) -> Publisher:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Open the connection and check the exchange exists (does nothing if already open)."""
        await self._ensure_channel()

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        self._raw_channel = None
        for closing in list(self._closing):  # the connection's close closes them
            closing.cancel()
        if connection is not None and not connection.is_closed:
            await close_quietly(connection)

    async def publish(
        self,
        key: str,
        body: object,
        *,
        headers: Mapping[str, Any] | None = None,
        message_id: str | None = None,
        job_type: str | None = None,
    ) -> str:
        """Publish one message; returns its message id once the broker confirmed it. ``body``:
        bytes, str, or a value sent as JSON (a pydantic model, a dict, ...); ``job_type``: the
        handler of a ``hashq.App`` it is for."""
        with self._sending():
            outgoing = Outgoing(key, body, headers or {}, message_id, job_type)
            prepared = prepare(outgoing, self._tracing)
            try:
                (confirmed,) = await self._publish_prepared([prepared])
            except BatchPublishError as exc:
                raise exc.failures[0].error from None
        return confirmed

    async def publish_many(
        self,
        messages: Iterable[Outgoing],
        *,
        on_confirmed: Callable[[int], None] | None = None,
    ) -> list[str]:
        """Publish a batch, pipelined; returns the message ids in batch order.

        The iterable is read lazily, so it may be a long stream. If any message is not confirmed,
        the rest still go out and then ``BatchPublishError`` names exactly the failed ones.
        ``on_confirmed(n)`` is called with the running count of confirmed messages.
        """
        with self._sending():
            return await self._publish_prepared(messages, on_confirmed)

    def _sending(self) -> contextlib.AbstractContextManager[object]:
        """A producer span while a publish or a batch goes out (``hashq.tracing``)."""
        if self._tracing is None or not self._tracing.active:
            return contextlib.nullcontext()
        return self._tracing.sending()

    async def _publish_prepared(
        self,
        messages: Iterable[Outgoing | Prepared],
        on_confirmed: Callable[[int], None] | None = None,
    ) -> list[str]:
        batch = InFlight(self._window, self._settings.confirm_timeout, on_confirmed)
        self._batches.add(batch)
        try:
            for index, message in enumerate(messages):
                try:
                    prepared = (
                        message if isinstance(message, tuple) else prepare(message, self._tracing)
                    )
                except InvalidMessage as exc:
                    key = str(getattr(message, "key", ""))
                    batch.refused(index, PublishError(str(exc), key=key, message_id="-"))
                    continue
                await self._window.acquire()
                batch.track(index, prepared, asyncio.ensure_future(self._send(prepared)))
        except asyncio.CancelledError:
            batch.cancel()
            raise
        finally:
            # Also when the input itself failed: what was sent gets its confirm before we return.
            await batch.settled()
            self._batches.discard(batch)
        return batch.outcome()

    def _channel_closed(self, channel: aiormq.Channel) -> None:
        retired = channel in self._retired
        self._retired.discard(channel)
        if retired and connection_usable(self._connection):
            return  # closed by _close_later, when nothing on it could still be waiting
        for batch in list(self._batches):
            batch.abandon("connection lost before the confirm")

    def _retire(self, channel: aiormq.Channel) -> None:
        """After a nack, send on a fresh channel (at most once a second), and close this one
        once nothing sent on it can still be waiting for its confirm.

        RabbitMQ 3.10 rejects every publish, for as long as the channel lives, on a channel
        whose first publish to a quorum queue came while the queue's leader node was down (a
        publisher reconnecting at once after its node died); a new channel works as soon as the
        queue has a new leader. A nack for another reason (a full queue) costs one channel a
        second at most.
        """
        now = time.monotonic()
        if channel is not self._raw_channel or now - self._retired_at < RETIRE_INTERVAL:
            return
        self._retired_at = now
        self._raw_channel = None
        self._retired.add(channel)
        closing = asyncio.ensure_future(self._close_later(channel))
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    async def _close_later(self, channel: aiormq.Channel) -> None:
        await asyncio.sleep(self._settings.confirm_timeout + RETIRE_INTERVAL)
        with contextlib.suppress(Exception):
            await channel.close()

    async def _send(self, prepared: Prepared) -> str | PublishError:
        """Send one message and wait for its confirm (its batch keeps the time); the outcome as
        a value, never raised, so that a batch of thousands does not pay for thousands of
        exceptions."""
        key, body, properties = prepared
        message_id = str(properties.message_id)
        channel = self._raw_channel
        if channel is None or channel.is_closed:
            try:
                channel = await self._ensure_channel()
            except ServiceUnavailable as exc:
                return PublishUnconfirmed(str(exc), key=key, message_id=message_id)
        sent_at = time.monotonic()
        try:
            await channel.basic_publish(
                body,
                exchange=self._topology.exchange,
                routing_key=key,
                properties=properties,
                mandatory=True,
                wait=False,  # no wait for the socket write: the confirm is what counts
            )
        except Exception as exc:
            return await self._failure(exc, channel, key, message_id, sent_at)
        return message_id

    async def _failure(
        self, exc: Exception, channel: aiormq.Channel, key: str, message_id: str, sent_at: float
    ) -> PublishError:
        if isinstance(exc, ReturnedError):
            await self._repair_ring(sent_at)
            return MessageUnroutable(
                f"exchange {self._topology.exchange} routed the message to no queue (the ring is "
                "rebuilt after a broker restart; publishing again is safe)",
                key=key,
                message_id=message_id,
            )
        if isinstance(exc, DeliveryError):
            self._retire(channel)
            return MessageNacked("the broker refused the message", key=key, message_id=message_id)
        # Whatever broke between send and confirm, the outcome is unknown to us.
        self._raw_channel = None
        reason = f"connection lost before the confirm ({type(exc).__name__})"
        return PublishUnconfirmed(reason, key=key, message_id=message_id)

    async def _ensure_channel(self) -> aiormq.Channel:
        """The open publishing channel, after opening a connection if there is none.

        Messages go out on aio-pika's underlying aiormq channel: aio-pika's message and
        exchange objects cost more per message than the rest of the publish path together.
        """
        async with self._connect_lock:
            channel = self._raw_channel
            if channel is not None and not channel.is_closed:
                return channel
            if not connection_usable(self._connection):
                await self.close()
                self._connection = await connect_amqp(self._settings, self.connection_name)
            try:
                underlay = await asyncio.wait_for(
                    self._open_channel(self._connection), self._settings.connect_timeout
                )
            except TimeoutError:
                await self.close()  # a node that accepts connections but cannot serve them
                raise ServiceUnavailable(
                    "RabbitMQ did not open a publishing channel within "
                    f"{self._settings.connect_timeout:g}s"
                ) from None
            except (AMQPError, ConnectionError) as exc:
                await self.close()  # the connection went while the channel was opening
                raise ServiceUnavailable(
                    f"RabbitMQ did not open a publishing channel: {type(exc).__name__}"
                ) from None
            # A send in flight when the channel goes may never end by itself (aiormq can block
            # it behind a frame write that will not happen): its batch ends it at once.
            underlay.closing.add_done_callback(lambda _: self._channel_closed(underlay))
            self._raw_channel = underlay
            return underlay

    async def _open_channel(self, connection: AbstractConnection) -> aiormq.Channel:
        opened = await connection.channel(publisher_confirms=True, on_return_raises=True)
        await self._passive_exchange(opened)
        if not await ring_exists(connection, self._topology):
            try:
                await self._repair_ring(time.monotonic(), refuse_mismatch=True)
            except TopologyMismatch:
                await self.close()  # settings that disagree with the app: refuse, build nothing
                raise
        underlay = await opened.get_underlay_channel()
        assert isinstance(underlay, aiormq.Channel)  # for basic_publish(wait=False)
        return underlay

    async def _repair_ring(self, since: float, *, refuse_mismatch: bool = False) -> None:
        """Rebuild the ring unless that was done after ``since``: after a broker restart the
        ring is gone, and the first returned message brings it back for the next publish. The
        message itself is not re-sent here, since that could overtake later messages of its key.
        With ``refuse_mismatch``, settings that disagree with the app's queues raise
        ``TopologyMismatch`` instead of being logged."""
        async with self._ring_lock:
            if self._ring_checked_at > since or self._connection is None:
                return
            try:
                await ensure_ring(self._connection, self._topology)
            except TopologyMismatch as mismatch:
                if refuse_mismatch:
                    raise
                log.error("the ring of %s was not rebuilt: %s", self._topology.exchange, mismatch)
            except HashqError as exc:
                log.warning("could not rebuild the ring of %s: %s", self._topology.exchange, exc)
            except Exception as exc:
                log.warning("could not rebuild the ring of %s: %r", self._topology.exchange, exc)
            self._ring_checked_at = time.monotonic()

    async def _passive_exchange(self, channel: AbstractChannel) -> None:
        try:
            await channel.declare_exchange(self._topology.exchange, passive=True)
        except ChannelNotFoundEntity:
            await self.close()
            raise TopologyMismatch(
                f"exchange {self._topology.exchange} does not exist: run 'hashq init' first"
            ) from None


def prepare(message: Outgoing, tracing: Tracing | None = None) -> Prepared:
    """What goes on the wire for ``message``, or ``InvalidMessage`` before anything is sent;
    with ``tracing``, its headers carry the current trace context."""
    key = check_key(message.key)
    body, content_type = encode(message.body)
    properties = spec.Basic.Properties(
        delivery_mode=2,  # persistent
        message_id=message.message_id or f"{random.getrandbits(128):032x}",  # 128 random bits
        headers=_headers(message, tracing),
        content_type=content_type,
    )
    return key, body, properties


def _headers(message: Outgoing, tracing: Tracing | None) -> dict[str, Any] | None:
    headers = dict(message.headers)
    if message.job_type is not None:
        headers[TYPE_HEADER] = message.job_type
    if tracing is not None and tracing.active:
        tracing.inject(headers)
    return headers or None
