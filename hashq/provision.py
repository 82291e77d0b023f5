"""Creating or validating an app's topology in RabbitMQ and ZooKeeper, idempotently.

Order matters. The ZooKeeper record is written last, so its presence means the broker side was
completed once. When it exists, nothing is declared or bound again: the broker side is only
checked. When it does not, queues are declared and bound in index order; binding an existing
binding again is a no-op for the consistent-hash exchange, so a crash half-way is repaired by
running ``init`` again without moving any key.
"""

from __future__ import annotations

import asyncio
import logging

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange
from aiormq.exceptions import ChannelNotFoundEntity, ChannelPreconditionFailed
from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from hashq.amqp import connect_amqp, connection_name
from hashq.errors import ServiceUnavailable, TopologyMismatch
from hashq.management import Management
from hashq.settings import Settings
from hashq.topology import BUCKET_WEIGHT, Topology
from hashq.zk import close_zk, connect_zk

log = logging.getLogger(__name__)


async def ensure_topology(settings: Settings, *, check_bindings: bool = True) -> Topology:
    """Create the app's topology, or check that the existing one matches ``settings``.

    Raises ``TopologyMismatch`` (nothing changed) or ``ServiceUnavailable``.
    """
    topology = Topology.from_settings(settings)
    zk = await asyncio.to_thread(connect_zk, settings)
    try:
        recorded = await asyncio.to_thread(read_record, zk, topology)
        if recorded is not None:
            topology.require_same(recorded)
        management = Management(settings)
        if recorded is None and check_bindings:
            # Only a half-done creation (a prefix of our bindings) may be completed.
            await asyncio.to_thread(verify_bindings, management, topology, partial_ok=True)
        connection = await connect_amqp(settings, connection_name("admin"))
        async with connection:
            if recorded is None:
                await _declare(connection, topology)
            else:
                await verify_broker(connection, topology)
        if check_bindings:
            await asyncio.to_thread(verify_bindings, management, topology)
        if recorded is None:
            await asyncio.to_thread(write_record, zk, topology)
            log.info("created topology of app %r with %d buckets", topology.app, topology.buckets)
    finally:
        await asyncio.to_thread(close_zk, zk)
    return topology


def read_record(zk: KazooClient, topology: Topology) -> Topology | None:
    try:
        data, _ = zk.get(topology.zk_topology)
    except NoNodeError:
        return None
    return Topology.from_record(data)


def write_record(zk: KazooClient, topology: Topology) -> None:
    """Write the record; if another process won the race, require that it wrote the same."""
    try:
        zk.create(topology.zk_topology, topology.to_record(), makepath=True)
    except NodeExistsError:
        recorded = read_record(zk, topology)
        assert recorded is not None
        topology.require_same(recorded)


async def _declare(connection: AbstractConnection, topology: Topology) -> None:
    async with _refusals_as_mismatch(topology):
        channel = await connection.channel()
        dlx = await channel.declare_exchange(
            topology.dead_letter_exchange, aio_pika.ExchangeType.FANOUT, durable=True
        )
        dead = await channel.declare_queue(
            topology.dead_letter_queue, durable=True, arguments=topology.dead_letter_arguments()
        )
        await dead.bind(dlx)
        exchange = await channel.declare_exchange(
            topology.exchange, aio_pika.ExchangeType.X_CONSISTENT_HASH, durable=True
        )
        await _declare_buckets(channel, exchange, topology)


async def _declare_buckets(
    channel: AbstractChannel, exchange: AbstractExchange, topology: Topology
) -> None:
    # Bound one by one in index order: the exchange hands out ring positions in binding order.
    for name in topology.bucket_queues():
        queue = await channel.declare_queue(
            name, durable=True, arguments=topology.bucket_arguments()
        )
        await queue.bind(exchange, routing_key=BUCKET_WEIGHT)


async def verify_broker(connection: AbstractConnection, topology: Topology) -> None:
    """Check (passively) that the exchange and every queue exist."""
    names = [topology.dead_letter_queue, *topology.bucket_queues()]
    async with _refusals_as_mismatch(topology):
        channel = await connection.channel()
        await channel.declare_exchange(topology.exchange, passive=True)
        await channel.declare_exchange(topology.dead_letter_exchange, passive=True)
        for name in names:
            await channel.declare_queue(name, passive=True)


def verify_bindings(
    management: Management, topology: Topology, *, partial_ok: bool = False
) -> None:
    """Check through the management API that the exchange is bound to exactly the bucket queues,
    each once with weight 1 (with ``partial_ok``: to the first k of them, k >= 0). Skipped,
    with a warning, when the API cannot be reached."""
    try:
        bindings = management.bindings_from(topology.exchange)
    except ServiceUnavailable as exc:
        log.warning("bindings of %s not checked: %s", topology.exchange, exc)
        return
    found = sorted((b["destination"], b["routing_key"]) for b in bindings)
    expected = [(name, BUCKET_WEIGHT) for name in topology.bucket_queues()]
    if partial_ok and found == expected[: len(found)]:
        if found:
            log.warning("completing the half-created topology of app %r", topology.app)
        return
    if found != expected:
        extra = sorted(set(found) - set(expected))[:3]
        missing = sorted(set(expected) - set(found))[:3]
        raise TopologyMismatch(
            f"exchange {topology.exchange} has {len(found)} bindings, expected {len(expected)} "
            f"(unexpected: {extra}, missing: {missing}); bindings were changed by hand, which "
            "remaps keys: see docs/design.md, 'What never to do by hand'"
        )


class _refusals_as_mismatch:
    """Turn the broker's refusals (missing entity, inequivalent arguments) into one-line errors."""

    def __init__(self, topology: Topology) -> None:
        self._topology = topology

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind: object, exc: BaseException | None, tb: object) -> bool:
        if isinstance(exc, ChannelNotFoundEntity):
            raise TopologyMismatch(
                f"app {self._topology.app!r} is recorded in ZooKeeper but RabbitMQ lacks part of "
                f"it ({_reply_text(exc)}); see docs/design.md, 'What never to do by hand'"
            ) from None
        if isinstance(exc, ChannelPreconditionFailed):
            raise TopologyMismatch(
                f"RabbitMQ holds an exchange or queue of app {self._topology.app!r} declared "
                f"differently ({_reply_text(exc)}); it was left untouched"
            ) from None
        return False


def _reply_text(exc: BaseException) -> str:
    args = getattr(exc, "args", ())
    text = args[1] if len(args) > 1 else str(exc)
    return str(text).splitlines()[0]
