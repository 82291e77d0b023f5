"""Channels made ready for the buckets on their way to this worker (``Assignment.incoming``):
opened, their prefetch set, nothing consumed. A grant of such a bucket then costs one round trip
(``basic.consume``) rather than three, while the old owner is still draining. Only a cache: a
bucket granted without one opens its channel as before, and one that does not come is closed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection

from aio_pika.abc import AbstractChannel, AbstractConnection

from hashq._io.amqp import connection_usable

log = logging.getLogger(__name__)


async def open_consumer_channel(connection: AbstractConnection, prefetch: int) -> AbstractChannel:
    """A channel for consuming one bucket queue: it publishes nothing, so no publisher confirms
    (one round trip fewer)."""
    channel = await connection.channel(publisher_confirms=False)
    await channel.set_qos(prefetch_count=prefetch)
    return channel


class PreparedChannels:
    """Per bucket, a channel being opened (or open) on one connection."""

    def __init__(self, prefetch: int) -> None:
        self._prefetch = prefetch
        self._ready: dict[int, tuple[AbstractConnection, asyncio.Task[AbstractChannel]]] = {}
        self._closing: set[asyncio.Task[None]] = set()  # referenced until done
        self._discarded: set[asyncio.Task[AbstractChannel]] = set()  # opening, to be closed

    def expect(
        self,
        connection: AbstractConnection | None,
        incoming: Collection[int],
        keep: Collection[int],
    ) -> None:
        """Get ``incoming`` ready on ``connection``; keep those of ``keep`` (granted, about to
        be consumed); close the rest."""
        for bucket, (opened_on, task) in list(self._ready.items()):
            wanted = bucket in incoming or bucket in keep
            if not wanted or opened_on is not connection:
                del self._ready[bucket]
                self._discard(task)
        if connection is None or not connection_usable(connection):
            return
        for bucket in incoming:
            if bucket not in self._ready:
                task = asyncio.ensure_future(open_consumer_channel(connection, self._prefetch))
                self._ready[bucket] = (connection, task)

    async def take(self, connection: AbstractConnection, bucket: int) -> AbstractChannel | None:
        """``bucket``'s ready channel on ``connection``, if there is one that opened."""
        entry = self._ready.pop(bucket, None)
        if entry is None:
            return None
        opened_on, task = entry
        if opened_on is not connection:
            self._discard(task)
            return None
        try:
            channel = await task
        except Exception as exc:
            log.debug("bucket %d: preparing its channel failed: %r", bucket, exc)
            return None
        return None if channel.is_closed else channel

    def close_all(self) -> None:
        for _, task in self._ready.values():
            self._discard(task)
        self._ready.clear()

    def _discard(self, task: asyncio.Task[AbstractChannel]) -> None:
        """Close the channel ``task`` opens, whenever it has (the task is kept till then:
        the loop holds tasks only weakly)."""
        self._discarded.add(task)
        task.add_done_callback(self._close_opened)

    def _close_opened(self, task: asyncio.Task[AbstractChannel]) -> None:
        self._discarded.discard(task)
        if task.cancelled() or task.exception() is not None:
            return
        channel = task.result()
        if not channel.is_closed:
            closing = asyncio.ensure_future(_close_quietly(channel))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)


async def _close_quietly(channel: AbstractChannel) -> None:
    with contextlib.suppress(Exception):
        await channel.close()
