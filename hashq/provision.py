"""Creating or validating an app's topology in RabbitMQ and ZooKeeper, idempotently, and
rebuilding the transient ring after a broker restart.

Order matters. The ZooKeeper record is written last, so its presence means the durable broker
side was completed once; then the durable side is only checked, never declared again. The ring
(see ``hashq.topology``) is built when it is missing: declared, bound to every bucket queue in
index order (binding an existing binding again is a no-op, so a half-built ring is completed in
the same order), and only then bound to the entry exchange. A ring that exists is left as it
is once the app exists: bindings added to a ring the entry exchange routes through would route
keys by a ring of some size in between (``hashq.resizing``).

The ring's size is the app's bucket queues, 0..Q-1, found on the broker (``ring_count``): a
resize declares its new queues from the highest down, so once the first new one exists all do,
and a process whose ``HASHQ_BUCKETS`` is older than a resize builds the grown ring (and says
so) instead of a smaller one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq.exceptions import AMQPError, ChannelNotFoundEntity, ChannelPreconditionFailed
from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from hashq._io.amqp import connect_amqp, connection_name
from hashq._io.management import Management
from hashq._io.zk import acl, close_zk, connect_zk
from hashq.errors import ServiceUnavailable, TopologyMismatch
from hashq.records import Paths
from hashq.resizing import SWITCH_SETTLE_SECONDS
from hashq.settings import Settings
from hashq.topology import BUCKET_WEIGHT, Topology

log = logging.getLogger(__name__)


async def ensure_topology(
    settings: Settings, *, check_bindings: bool = True, exact_count: bool = False
) -> Topology:
    """Create the app's topology, or check that the existing one matches ``settings``; make sure
    the ring exists. Returns the app's topology: with the recorded bucket count, which a resize
    may have changed since ``settings`` were written (said as a warning), unless
    ``exact_count`` (``hashq init``: a count asked for and not there is refused).

    Raises ``TopologyMismatch`` (nothing changed) or ``ServiceUnavailable``.
    """
    topology = Topology.from_settings(settings)
    zk = await asyncio.to_thread(connect_zk, settings, "coordinator")
    try:
        recorded = await asyncio.to_thread(read_record, zk, topology)
        if recorded is not None and exact_count:
            _require_count(topology, recorded)
        if recorded is not None:
            topology = topology.adopt(recorded)
        management = Management(settings)
        if recorded is None and check_bindings:
            # Only a half-done creation (a prefix of our bindings) may be completed.
            await asyncio.to_thread(verify_bindings, management, topology, partial_ok=True)
        connection = await connect_amqp(settings, connection_name("admin"))
        async with connection:
            if recorded is None:
                await _declare_durable(connection, topology)
                await ensure_ring(connection, topology)
            else:
                await _verify_durable(connection, topology)
                if not await ring_exists(connection, topology):
                    await ensure_ring(connection, topology)
        if check_bindings:
            await asyncio.to_thread(verify_bindings, management, topology)
        if recorded is None:
            await asyncio.to_thread(write_record, zk, topology)
            log.info("created topology of app %r with %d buckets", topology.app, topology.buckets)
        await asyncio.to_thread(ensure_folders, zk, settings)
    finally:
        await asyncio.to_thread(close_zk, zk)
    return topology


def _require_count(topology: Topology, recorded: Topology) -> None:
    if recorded.buckets != topology.buckets:
        raise TopologyMismatch(
            f"app {topology.app!r} already exists with {recorded.buckets} buckets, not "
            f"{topology.buckets}; it was left untouched. To grow it: hashq resize --buckets "
            f"{topology.buckets}"
        )


def read_record(zk: KazooClient, topology: Topology) -> Topology | None:
    try:
        data, _ = zk.get(topology.zk_topology)
    except NoNodeError:
        return None
    return Topology.from_record(data)


def ensure_folders(zk: KazooClient, settings: Settings) -> None:
    """The app's folders in ZooKeeper, with their ACLs (see ``hashq._io.zk``): made once, by
    ``hashq init``, since with ACLs only coordinators' credentials may make them."""
    paths = Paths(settings.app)
    for path in (paths.assignments, paths.buckets, paths.election):
        zk.ensure_path(path, acl=acl(settings, "coordinators"))
    for path in (paths.workers, paths.releases, paths.parked):
        zk.ensure_path(path, acl=acl(settings, "shared"))


def write_record(zk: KazooClient, topology: Topology) -> None:
    """Write the record; if another process won the race, require that it wrote the same."""
    try:
        zk.create(topology.zk_topology, topology.to_record(), makepath=True)
    except NodeExistsError:
        data, _ = zk.get(topology.zk_topology)  # records are never deleted by hashq
        topology.require_same(Topology.from_record(data))


async def ensure_ring(connection: AbstractConnection, topology: Topology) -> Topology:
    """Declare the ring, bind it to every bucket queue in index order, then bind the entry
    exchange to it; returns the topology it was built for. Safe to run from many processes at
    once: each adds bindings in the same order, and the entry binding comes only after all of
    them exist. Meant for a ring that is missing, or that the entry exchange is not bound to
    (a returned message says so): see the module's docstring.

    Built over the app's bucket queues as the broker has them (``ring_count``), which may be
    more than ``topology`` names (a resize since), never fewer: it fails on the first missing
    one. Just before the entry binding it checks again that no queue lies beyond, so that a
    resize that began meanwhile is never undone by a ring of the old size."""
    topology = await ring_count(connection, topology)
    async with _refusals_as_mismatch(topology), _channel(connection) as channel:
        ring = await channel.declare_exchange(
            topology.ring_exchange,
            aio_pika.ExchangeType.X_CONSISTENT_HASH,
            durable=False,
            internal=True,
        )
        for name in topology.bucket_queues():
            queue = await channel.declare_queue(name, passive=True)
            await queue.bind(ring, routing_key=BUCKET_WEIGHT)
        if await _queue_exists(connection, topology.queue_beyond):
            raise TopologyMismatch(
                f"a resize of app {topology.app!r} began while its ring was built over "
                f"{topology.buckets} buckets: the entry exchange was left unbound"
            )
        await ring.bind(topology.exchange)
    return topology


async def ring_count(connection: AbstractConnection, topology: Topology) -> Topology:
    """``topology`` with the bucket count the app's queues have on the broker
    (``broker_count``); more than ``topology`` says after a resize, which is logged: the
    process's ``HASHQ_BUCKETS`` is out of date."""
    found = await broker_count(connection, topology)
    if found == topology.buckets:
        return topology
    log.warning(
        "app %r has %d bucket queues, more than the %d of this process's HASHQ_BUCKETS (it "
        "was resized): its ring is built over %d; set HASHQ_BUCKETS=%d",
        topology.app,
        found,
        topology.buckets,
        found,
        found,
    )
    return replace(topology, buckets=found)


async def broker_count(connection: AbstractConnection, topology: Topology) -> int:
    """Q, where bucket queues 0..Q-1 exist and Q does not, for an app that has at least
    ``topology.buckets`` of them; found by doubling, then halving."""
    if not await _queue_exists(connection, topology.queue_beyond):
        return topology.buckets
    low, step = topology.buckets + 1, 1  # queue low-1 exists
    while await _queue_exists(connection, topology.queue_name(low - 1 + step)):
        low, step = low + step, step * 2
    high = low + step  # queue high-1 does not exist
    while high - low > 1:
        middle = (low + high) // 2
        if await _queue_exists(connection, topology.queue_name(middle - 1)):
            low = middle
        else:
            high = middle
    return low


async def _queue_exists(connection: AbstractConnection, name: str) -> bool:
    async with _channel(connection) as channel:
        try:
            await channel.declare_queue(name, passive=True)
        except ChannelNotFoundEntity:
            return False
    return True


async def switch_ring(connection: AbstractConnection, old: Topology, new: Topology) -> None:
    """A resize's switch (``hashq.resizing``): the new bucket queues, highest first; a settle;
    then the entry exchange unbound from the ring (a publish meanwhile is returned), the ring
    bound to the new queues in index order, and the entry exchange bound again. Running it
    again after any part of it is safe."""
    async with _refusals_as_mismatch(new), _channel(connection) as channel:
        for index in reversed(range(old.buckets, new.buckets)):
            await channel.declare_queue(
                new.queue_name(index), durable=True, arguments=new.bucket_arguments()
            )
    await asyncio.sleep(SWITCH_SETTLE_SECONDS)
    if await ring_exists(connection, old):
        async with _refusals_as_mismatch(new), _channel(connection) as channel:
            ring = await channel.get_exchange(old.ring_exchange, ensure=False)
            await ring.unbind(old.exchange)
    await ensure_ring(connection, new)


async def ring_exists(connection: AbstractConnection, topology: Topology) -> bool:
    """Whether the ring exchange exists: one round trip instead of a rebuild's 2N + 2. A ring
    left half-built (its builder died) has no entry binding yet, so it returns messages,
    and a returned message makes the publisher rebuild it."""
    async with _channel(connection) as channel:
        try:
            await channel.declare_exchange(topology.ring_exchange, passive=True)
        except ChannelNotFoundEntity:
            return False
    return True


async def _declare_durable(connection: AbstractConnection, topology: Topology) -> None:
    async with _refusals_as_mismatch(topology), _channel(connection) as channel:
        dlx = await channel.declare_exchange(
            topology.dead_letter_exchange, aio_pika.ExchangeType.FANOUT, durable=True
        )
        dead = await channel.declare_queue(
            topology.dead_letter_queue, durable=True, arguments=topology.dead_letter_arguments()
        )
        await dead.bind(dlx)
        await channel.declare_exchange(
            topology.exchange, aio_pika.ExchangeType.FANOUT, durable=True
        )
        for name in topology.bucket_queues():
            await channel.declare_queue(name, durable=True, arguments=topology.bucket_arguments())


async def _verify_durable(connection: AbstractConnection, topology: Topology) -> None:
    """Check (passively) that the durable exchanges and every queue exist."""
    async with _refusals_as_mismatch(topology), _channel(connection) as channel:
        await channel.declare_exchange(topology.exchange, passive=True)
        await channel.declare_exchange(topology.dead_letter_exchange, passive=True)
        for name in [topology.dead_letter_queue, *topology.bucket_queues()]:
            await channel.declare_queue(name, passive=True)


def verify_bindings(
    management: Management, topology: Topology, *, partial_ok: bool = False
) -> None:
    """Check through the management API that the ring is bound to exactly the bucket queues,
    each once with weight 1 (with ``partial_ok``: to the first k of them), and the entry exchange
    to the ring alone. Skipped, with a warning, when the API cannot be reached."""
    try:
        ring = management.bindings_from(topology.ring_exchange)
        entry = management.bindings_from(topology.exchange)
    except ServiceUnavailable as exc:
        log.warning("bindings of %s not checked: %s", topology.exchange, exc)
        return
    found = sorted((b["destination"], b["routing_key"]) for b in ring)
    expected = [(name, BUCKET_WEIGHT) for name in topology.bucket_queues()]
    complete = found == expected
    if not complete and not (partial_ok and found == expected[: len(found)]):
        extra = sorted(set(found) - set(expected))[:3]
        missing = sorted(set(expected) - set(found))[:3]
        raise TopologyMismatch(
            f"exchange {topology.ring_exchange} has {len(found)} bindings, expected "
            f"{len(expected)} (unexpected: {extra}, missing: {missing}); bindings were changed "
            "by hand, which remaps keys: see docs/design.md, 'What never to do by hand'"
        )
    destinations = sorted(b["destination"] for b in entry)
    if destinations not in ([], [topology.ring_exchange]):
        raise TopologyMismatch(
            f"exchange {topology.exchange} is bound to {destinations[:3]}, expected only "
            f"{topology.ring_exchange}: see docs/design.md, 'What never to do by hand'"
        )


@asynccontextmanager
async def _channel(connection: AbstractConnection) -> AsyncIterator[AbstractChannel]:
    channel = await connection.channel()
    try:
        yield channel
    finally:
        if not channel.is_closed:
            await channel.close()


@asynccontextmanager
async def _refusals_as_mismatch(topology: Topology) -> AsyncIterator[None]:
    """Turn the broker's refusals (missing entity, inequivalent arguments) into one-line errors."""
    try:
        yield
    except ChannelNotFoundEntity as exc:
        raise TopologyMismatch(
            f"RabbitMQ lacks part of app {topology.app!r} ({_reply_text(exc)}): run 'hashq init'; "
            "if the app was initialised before, see docs/design.md, 'What never to do by hand'"
        ) from None
    except ChannelPreconditionFailed as exc:
        raise TopologyMismatch(
            f"RabbitMQ holds an exchange or queue of app {topology.app!r} declared differently "
            f"({_reply_text(exc)}); it was left untouched"
        ) from None
    except AMQPError as exc:  # e.g. a cluster still forming: "feature flag is disabled"
        raise ServiceUnavailable(
            f"RabbitMQ could not declare part of app {topology.app!r} ({_reply_text(exc)}); "
            "what was declared stays, and running the command again completes it"
        ) from None


def _reply_text(exc: BaseException) -> str:
    """The broker's reply text of a channel error: its second argument, else the message."""
    args: tuple[object, ...] = tuple(getattr(exc, "args", ()))
    text = args[1] if len(args) > 1 else str(exc)
    return str(text).splitlines()[0]
