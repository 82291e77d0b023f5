"""``hashq apps delete``: remove an app from RabbitMQ and ZooKeeper, once nothing runs on it.

It deletes the app's bucket queues, its dead-letter queue, the parking queues of its parked
keys, its three exchanges and its ZooKeeper subtree. It refuses while a worker or a coordinator
of the app is registered (a running process would recreate what it uses, or fail on what
vanished), and asks first, since the messages in the queues go with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import urllib.parse
from dataclasses import replace

from kazoo.exceptions import NoNodeError

from hashq._io.amqp import connect_amqp, connection_name
from hashq._io.management import Management
from hashq._io.zk import close_zk, connect_zk
from hashq.admin.parked import readable_records
from hashq.admin.status import gather_status
from hashq.errors import ConfigError
from hashq.provision import broker_count
from hashq.records import Paths
from hashq.settings import Settings
from hashq.topology import Topology


async def delete_app(settings: Settings, confirmed: bool) -> int:
    """Delete the app of ``settings`` after saying what goes; 1 if the user did not confirm."""
    status = await gather_status(settings)  # TopologyMismatch if there is no such app
    await _refuse_if_running(settings)
    topology = status.topology
    print(
        f"app {settings.app!r}: {len(status.buckets)} bucket queues holding "
        f"{status.total_messages:,} messages, {max(status.dead_letters.messages, 0):,} dead "
        f"letters, exchange {topology.exchange} and its ring, ZooKeeper {topology.zk_root}",
        file=sys.stderr,
    )
    if not confirmed:
        print("delete all of it? type 'yes': ", end="", file=sys.stderr, flush=True)
        if sys.stdin.readline().strip() != "yes":
            print("nothing deleted", file=sys.stderr)
            return 1
        await _refuse_if_running(settings)  # one may have started while we asked
    await remove_app(settings)
    print(f"deleted app {settings.app!r}")
    return 0


async def _refuse_if_running(settings: Settings) -> None:
    running = await asyncio.to_thread(_running_processes, settings)
    if running:
        raise ConfigError(
            f"app {settings.app!r} still has {', '.join(running)} running: stop them first"
        )


def _running_processes(settings: Settings) -> list[str]:
    """The registered workers, by id, and how many coordinators are in the election (its
    nodes are the lock recipe's, named by no coordinator's id)."""
    paths = Paths(settings.app)
    zk = connect_zk(settings, "coordinator")
    try:
        running, coordinators = [], []
        with contextlib.suppress(NoNodeError):
            running = [f"worker {name}" for name in sorted(zk.get_children(paths.workers))]
        with contextlib.suppress(NoNodeError):
            coordinators = zk.get_children(paths.election)
        if coordinators:
            running.append(f"{len(coordinators)} coordinator(s)")
        return running
    finally:
        close_zk(zk)


async def remove_app(settings: Settings) -> None:
    """Delete a hashq app: its queues (as many bucket queues as the broker has: a resize,
    even one not committed, may have added some), exchanges and ZooKeeper state."""
    connection = await connect_amqp(settings, connection_name("cleanup"))
    async with connection:
        topology = Topology.from_settings(settings)
        topology = replace(topology, buckets=await broker_count(connection, topology))
    parking = await asyncio.to_thread(_parking_queues, settings, topology)
    await remove(
        settings,
        [*topology.bucket_queues(), topology.dead_letter_queue, *parking],
        [topology.exchange, topology.ring_exchange, topology.dead_letter_exchange],
        topology.zk_root,
    )


def _parking_queues(settings: Settings, topology: Topology) -> list[str]:
    """The app's parking queues: those the management API lists (a key parked once keeps its
    empty queue after its release), and those of the keys parked now."""
    prefix = f"hashq.{settings.app}.parked."
    listed: set[str] = set()
    with contextlib.suppress(Exception):  # no management API: the parked keys' queues only
        vhost = urllib.parse.quote(settings.vhost, safe="")
        queues = Management(settings).request("GET", f"/api/queues/{vhost}?columns=name") or []
        listed = {q["name"] for q in queues if str(q.get("name", "")).startswith(prefix)}
    parked = {topology.parking_queue(key) for key in _parked_keys(settings)}
    return sorted(listed | parked)


def _parked_keys(settings: Settings) -> list[str]:
    """The keys parked in the app."""
    zk = connect_zk(settings, "coordinator")
    try:
        return [record.key for record in readable_records(zk, Paths(settings.app))]
    finally:
        close_zk(zk)


async def remove(settings: Settings, queues: list[str], exchanges: list[str], zk_path: str) -> None:
    """Delete ``queues``, ``exchanges`` and the ZooKeeper subtree ``zk_path``."""
    connection = await connect_amqp(settings, connection_name("cleanup"))
    async with connection:
        channel = await connection.channel()
        for queue in queues:
            await channel.queue_delete(queue)
        for exchange in exchanges:
            await channel.exchange_delete(exchange)
    zk = await asyncio.to_thread(connect_zk, settings, "coordinator")
    try:
        await asyncio.to_thread(zk.delete, zk_path, recursive=True)
    finally:
        await asyncio.to_thread(close_zk, zk)
