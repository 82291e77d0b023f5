"""The confirmed publisher: ``await publish(key, body)`` returns only once the broker confirmed.

Many publishes may be in flight at once on one channel (pipelined confirms, bounded by
``max_in_flight``). Every message is published persistent and mandatory, so each outcome is
explicit: confirmed, nacked, returned as unroutable, or unconfirmed because the connection,
the channel or the confirm timeout gave out. A message is never reported confirmed unless the
broker acknowledged it. After a connection loss the next publish opens a new connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange
from aio_pika.exceptions import DeliveryError
from aio_pika.exceptions import PublishError as ReturnedError
from aiormq.exceptions import ChannelNotFoundEntity

from hashq.amqp import connect_amqp, connection_name
from hashq.errors import (
    BatchPublishError,
    Failure,
    HashqError,
    InvalidMessage,
    MessageNacked,
    MessageUnroutable,
    PublishError,
    PublishUnconfirmed,
    ServiceUnavailable,
    TopologyMismatch,
)
from hashq.provision import ensure_ring
from hashq.settings import Settings
from hashq.topology import Topology

log = logging.getLogger(__name__)

MAX_KEY_BYTES = 255  # AMQP short string: the routing key's limit


@dataclass(frozen=True)
class Outgoing:
    """One message to publish: the entity key, its body and optional headers and id."""

    key: str
    body: bytes
    headers: Mapping[str, Any] = field(default_factory=dict)
    message_id: str | None = None


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
        self._window = asyncio.Semaphore(max_in_flight)
        self._max_in_flight = max_in_flight
        self._connect_lock = asyncio.Lock()
        self._ring_lock = asyncio.Lock()
        self._ring_checked_at = -1.0
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._exchange: AbstractExchange | None = None
        self.connection_name = connection_name("publisher")

    async def __aenter__(self) -> Publisher:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Open the connection and check the exchange exists (does nothing if already open)."""
        await self._ensure_exchange()

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        self._channel = self._exchange = None
        if connection is not None and not connection.is_closed:
            await connection.close()

    async def publish(
        self,
        key: str,
        body: bytes | str,
        *,
        headers: Mapping[str, Any] | None = None,
        message_id: str | None = None,
    ) -> str:
        """Publish one message; returns its message id once the broker confirmed it."""
        return await self._publish(Outgoing(key, _as_bytes(body), headers or {}, message_id))

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
        results: dict[int, str] = {}
        failures: list[Failure] = []
        pending: set[asyncio.Task[tuple[int, str | PublishError]]] = set()
        unexpected: list[BaseException] = []
        slots = asyncio.Semaphore(self._max_in_flight)

        def finished(task: asyncio.Task[tuple[int, str | PublishError]]) -> None:
            pending.discard(task)
            slots.release()
            if task.cancelled():
                return
            if task.exception() is not None:
                unexpected.append(task.exception())  # type: ignore[arg-type]
                return
            index, outcome = task.result()
            if isinstance(outcome, PublishError):
                failures.append(Failure(index, outcome))
            else:
                results[index] = outcome
                if on_confirmed is not None:
                    on_confirmed(len(results))

        try:
            for index, message in enumerate(messages):
                await slots.acquire()
                task = asyncio.ensure_future(self._outcome(index, message))
                pending.add(task)
                task.add_done_callback(finished)
        except asyncio.CancelledError:
            for task in pending:
                task.cancel()
            raise
        finally:
            # Also when the input itself failed: what was sent gets its confirm before we return.
            if pending:
                await asyncio.wait(pending)
        if unexpected:
            raise unexpected[0]
        if failures:
            failures.sort(key=lambda failure: failure.index)
            raise BatchPublishError(failures, [results[i] for i in sorted(results)])
        return [results[i] for i in sorted(results)]

    async def _outcome(self, index: int, message: Outgoing) -> tuple[int, str | PublishError]:
        try:
            return index, await self._publish(message)
        except PublishError as exc:
            return index, exc
        except InvalidMessage as exc:
            return index, PublishError(str(exc), key=str(message.key), message_id="-")

    async def _publish(self, message: Outgoing) -> str:
        key = check_key(message.key)
        message_id = message.message_id or uuid.uuid4().hex
        amqp_message = aio_pika.Message(
            body=message.body,
            headers=dict(message.headers),
            message_id=message_id,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        async with self._window:
            try:
                exchange = await self._ensure_exchange()
            except ServiceUnavailable as exc:
                raise PublishUnconfirmed(str(exc), key=key, message_id=message_id) from None
            await self._send(exchange, amqp_message, key, message_id)
        return message_id

    async def _send(
        self, exchange: AbstractExchange, message: aio_pika.Message, key: str, message_id: str
    ) -> None:
        sent_at = time.monotonic()
        try:
            await exchange.publish(
                message, routing_key=key, mandatory=True, timeout=self._settings.confirm_timeout
            )
        except ReturnedError:
            await self._repair_ring(sent_at)
            raise MessageUnroutable(
                f"exchange {self._topology.exchange} routed the message to no queue (the ring is "
                "rebuilt after a broker restart; publishing again is safe)",
                key=key,
                message_id=message_id,
            ) from None
        except DeliveryError:
            raise MessageNacked(
                "the broker refused the message", key=key, message_id=message_id
            ) from None
        except TimeoutError:
            raise PublishUnconfirmed(
                f"no confirm within {self._settings.confirm_timeout:g}s",
                key=key,
                message_id=message_id,
            ) from None
        except Exception as exc:
            # Whatever broke between send and confirm, the outcome is unknown to us.
            self._forget_channel()
            raise PublishUnconfirmed(
                f"connection lost before the confirm ({type(exc).__name__})",
                key=key,
                message_id=message_id,
            ) from None

    async def _ensure_exchange(self) -> AbstractExchange:
        if self._exchange is not None and self._channel_open():
            return self._exchange
        async with self._connect_lock:
            if self._exchange is not None and self._channel_open():
                return self._exchange
            await self.close()
            self._connection = await connect_amqp(self._settings, self.connection_name)
            self._channel = await self._connection.channel(
                publisher_confirms=True, on_return_raises=True
            )
            self._exchange = await self._passive_exchange(self._channel)
            await self._repair_ring(time.monotonic())
            return self._exchange

    async def _repair_ring(self, since: float) -> None:
        """Rebuild the ring unless that was done after ``since``: after a broker restart the
        ring is gone, and the first returned message brings it back for the next publish. The
        message itself is not re-sent here, since that could overtake later messages of its key.
        """
        async with self._ring_lock:
            if self._ring_checked_at > since or self._connection is None:
                return
            try:
                await ensure_ring(self._connection, self._topology)
            except HashqError as exc:
                log.warning("could not rebuild the ring of %s: %s", self._topology.exchange, exc)
            except Exception as exc:
                log.warning("could not rebuild the ring of %s: %r", self._topology.exchange, exc)
            self._ring_checked_at = time.monotonic()

    async def _passive_exchange(self, channel: AbstractChannel) -> AbstractExchange:
        try:
            return await channel.declare_exchange(self._topology.exchange, passive=True)
        except ChannelNotFoundEntity:
            await self.close()
            raise TopologyMismatch(
                f"exchange {self._topology.exchange} does not exist: run 'hashq init' first"
            ) from None

    def _channel_open(self) -> bool:
        connection, channel = self._connection, self._channel
        return (
            connection is not None
            and not connection.is_closed
            and channel is not None
            and not channel.is_closed
        )

    def _forget_channel(self) -> None:
        self._exchange = None


def _as_bytes(body: bytes | str) -> bytes:
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    raise InvalidMessage(f"the body must be bytes or str, not {type(body).__name__}")
