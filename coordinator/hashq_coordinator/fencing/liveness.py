"""Whether a worker incarnation still has an AMQP connection, asked of the broker itself.

Each connection of a worker incarnation holds an exclusive queue (``Topology.liveness_queue``)
from before it is named in ZooKeeper until it closes, however it closes. A passive declare
answers at once, with no listing lag and without the management API: NOT_FOUND means no
connection of the incarnation holds it now, and one that takes it later reads its assignment
afresh before consuming, or cannot announce itself at all once its registration is gone.
RESOURCE_LOCKED (another connection's exclusive queue) means one lives. A coordinator whose
management API does not answer can still move a dead worker's buckets this way; a worker that
is alive but stuck must still be closed through the API.

The same connection asks a bucket queue whether it has taken back everything a fenced owner
held (``holds_nothing``), so that the bucket can be granted before ``RETURN_GRACE_SECONDS``.
"""

from __future__ import annotations

import asyncio
import logging

from aio_pika.abc import AbstractConnection
from aiormq.exceptions import ChannelNotFoundEntity

from hashq._io.amqp import (
    close_quietly,
    connect_amqp,
    connection_name,
    connection_usable,
    declare_passive,
)
from hashq.records import queue_holds_nothing
from hashq.settings import Settings
from hashq.topology import Topology

log = logging.getLogger(__name__)


class Liveness:
    """Asks the broker, on a connection of its own, whether an incarnation is connected."""

    def __init__(self, settings: Settings, topology: Topology) -> None:
        self._settings = settings
        self._topology = topology
        self._connection: AbstractConnection | None = None
        # Questions are asked concurrently (the leader's suspects, fences): one connects, so
        # that no connection opened by another is dropped without being closed.
        self._connecting = asyncio.Lock()

    async def gone(self, worker_id: str, incarnation: str) -> bool:
        """True only if the broker says no connection of the incarnation exists now; False if
        one does, or if the broker cannot be asked."""
        try:
            queue = self._topology.liveness_queue(worker_id, incarnation)
            await declare_passive(await self._connect(), queue)
        except ChannelNotFoundEntity:
            return True
        except Exception as exc:  # RESOURCE_LOCKED: held by the worker's connection
            log.debug("liveness of %s %s: %r", worker_id, incarnation, exc)
        return False

    async def holds_nothing(self, bucket: int) -> bool:
        """True only if the bucket queue's answer to a passive declare proves that no consumer
        holds any of its messages (``hashq.records.queue_holds_nothing``); False otherwise, or if
        the broker cannot be asked."""
        try:
            queue = self._topology.queue_name(bucket)  # a resize's new buckets too
            answer = await declare_passive(await self._connect(), queue)
        except Exception as exc:
            log.debug("bucket %d: no word from its queue: %r", bucket, exc)
            return False
        return queue_holds_nothing(*answer)

    async def _connect(self) -> AbstractConnection:
        async with self._connecting:
            if not connection_usable(self._connection):
                if self._connection is not None:
                    await close_quietly(self._connection)
                self._connection = await connect_amqp(
                    self._settings, connection_name("coordinator")
                )
            return self._connection

    async def close(self) -> None:
        if self._connection is not None:
            connection, self._connection = self._connection, None
            await close_quietly(connection)
