"""Channels made ready for the buckets on their way to a worker (``hashq.worker.prepared``)
against the real broker: a ready channel has its prefetch set, one not wanted any more is
closed, and one of an earlier connection is never handed out."""

from __future__ import annotations

import asyncio
import uuid
from urllib.parse import quote

import aio_pika
from aio_pika.abc import AbstractConnection

from hashq._io.amqp import close_quietly, connect_amqp
from hashq._io.management import Management
from hashq.settings import Settings
from hashq.topology import Topology
from hashq.worker.prepared import PreparedChannels
from tests.support.grants import Grants
from tests.support.helpers import wait_for_connection
from tests.support.workers import StartWorker
from tools.polling import eventually

PREFETCH = 3


def _open_channels(connection: AbstractConnection) -> int:
    assert connection.transport is not None
    channels = connection.transport.connection.channels.values()
    return len([channel for channel in channels if channel is not None and not channel.is_closed])


async def test_a_ready_channel_consumes_within_its_prefetch(settings: Settings) -> None:
    connection = await connect_amqp(settings, "t-prepared")
    try:
        queue = f"t-prepared-{uuid.uuid4().hex[:6]}"
        setup = await connection.channel()
        await setup.declare_queue(queue, auto_delete=True)
        for n in range(10):
            await setup.default_exchange.publish(aio_pika.Message(b"%d" % n), routing_key=queue)
        prepared = PreparedChannels(PREFETCH)
        prepared.expect(connection, incoming=[0], keep=[])
        ready = await prepared.take(connection, 0)
        assert ready is not None and not ready.is_closed
        held: list[aio_pika.abc.AbstractIncomingMessage] = []

        async def hold(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            held.append(message)

        await (await ready.get_queue(queue)).consume(hold)
        await asyncio.sleep(0.3)
        assert len(held) == PREFETCH  # nothing acknowledged: the window is full
    finally:
        await close_quietly(connection)


async def test_a_channel_not_wanted_any_more_is_closed_and_none_crosses_connections(
    settings: Settings,
) -> None:
    first = await connect_amqp(settings, "t-prepared-1")
    second = await connect_amqp(settings, "t-prepared-2")
    try:
        before = _open_channels(first)
        prepared = PreparedChannels(PREFETCH)
        prepared.expect(first, incoming=[0, 1, 2], keep=[])
        await eventually(lambda: _open_channels(first) == before + 3, within=5)
        prepared.expect(first, incoming=[1], keep=[2])  # 0 no longer comes; 2 was granted
        await eventually(lambda: _open_channels(first) == before + 2, within=5)
        assert await prepared.take(second, 1) is None  # made ready on another connection
        assert await prepared.take(first, 0) is None
        assert await prepared.take(first, 2) is not None
        prepared.close_all()
        await eventually(lambda: _open_channels(first) == before + 1, within=5)  # 2's is taken
    finally:
        await close_quietly(first)
        await close_quietly(second)


async def test_a_worker_opens_the_channels_of_its_incoming_buckets_before_their_grant(
    initialized: Settings, grants: Grants, start_worker: StartWorker, management: Management
) -> None:
    start_worker("w1")
    (w1,) = grants.wait_for_workers(1)
    await wait_for_connection(management, w1.connection)
    await eventually(lambda: _channels_listed(management, w1.connection), within=15)
    await asyncio.sleep(2.5)  # counted once its own channels are all open (every second)
    before = _channels_listed(management, w1.connection)
    assert before is not None
    grants.assign(w1, {}, incoming=(0, 1, 2))
    await eventually(
        lambda: _channels_listed(management, w1.connection),
        within=15,
        until=lambda now: now >= before + 3,
        what="three channels made ready",
    )
    grants.assign(w1, {0: 1, 1: 1, 2: 1})
    queues = {Topology.from_settings(initialized).bucket_queue(b) for b in (0, 1, 2)}
    await eventually(
        lambda: _consumed(management, queues), within=15, what="the three buckets consumed"
    )
    await asyncio.sleep(2.5)  # the management API counts channels every second
    # Consumed on the ready channels, not on three more (a starvation check may open one).
    count = _channels_listed(management, w1.connection)
    assert count is not None and before + 3 <= count <= before + 4, (before, count)


def _channels_listed(management: Management, name: str) -> int | None:
    """The channels the management API counts on connection ``name`` (1 s statistics)."""
    for connection in management.connections():
        if connection.get("client_properties", {}).get("connection_name") == name:
            return int(connection.get("channels", 0))
    return None


def _consumed(management: Management, queues: set[str]) -> bool:
    """Every one of ``queues`` has a consumer."""
    listed = management.request("GET", f"/api/consumers/{quote(management.vhost, safe='')}")
    return queues <= {str(consumer["queue"]["name"]) for consumer in listed}
