"""``hashq resize --buckets M``: grow a running app's bucket count, keeping every key's order
(``hashq.resizing`` says the steps and why; ``docs/protocol.md``, "Resizing"). Each round reads
the topology record, the resize record and the passed nodes, asks ``next_step`` what to do, and
does it; a write that finds the record changed (another resizer) only starts the next round.
Killed at any point, the command run again goes on from the records.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import aio_pika
from aio_pika.abc import AbstractConnection
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from hashq._io.amqp import connect_amqp, connection_name
from hashq._io.zk import acl, close_zk, connect_zk
from hashq.admin.parked import readable_records
from hashq.errors import TopologyMismatch
from hashq.placement import bucket_of
from hashq.provision import switch_ring
from hashq.records import Paths
from hashq.resizing import (
    MARKER_HEADER,
    ResizePhase,
    ResizeRecord,
    Step,
    next_step,
    passed_buckets,
)
from hashq.settings import Settings
from hashq.topology import Topology

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5  # how often the passed nodes are read while old buckets finish
REMARK_SECONDS = 30.0  # an old bucket not passed by then gets its marker again
SAY_EVERY = 10.0  # a line on the old buckets still waited for, at most this often


@dataclass(frozen=True)
class Read:
    """What one round read from ZooKeeper."""

    topology: Topology
    topology_version: int
    record: ResizeRecord | None
    version: int  # of the resize record (-1: none)
    children: tuple[str, ...]


def _say(line: str) -> None:
    print(line, flush=True)


async def resize(settings: Settings, say: Callable[[str], None] = _say) -> Topology:
    """Grow the app to ``settings.buckets`` buckets; returns its topology once it has them.
    Raises ``TopologyMismatch`` if the app cannot be grown to that count (``next_step``)."""
    zk = await asyncio.to_thread(connect_zk, settings, "coordinator")
    try:
        connection = await connect_amqp(settings, connection_name("admin"))
        async with connection:
            return await _Resizer(settings, zk, connection, say).run()
    finally:
        await asyncio.to_thread(close_zk, zk)


class _Resizer:
    def __init__(
        self,
        settings: Settings,
        zk: KazooClient,
        connection: AbstractConnection,
        say: Callable[[str], None],
    ) -> None:
        self.settings, self.zk, self.connection, self.say = settings, zk, connection, say
        self.wanted = settings.buckets
        self.paths = Paths(settings.app)
        self.marked_at: float | None = None
        self.said: tuple[tuple[int, ...], float] = ((), 0.0)

    async def run(self) -> Topology:
        while True:
            read = await asyncio.to_thread(self._read)
            passed = passed_buckets(list(read.children), self.wanted)
            decision = next_step(self.wanted, read.topology.buckets, read.record, passed)
            if decision.step is Step.REFUSE:
                raise TopologyMismatch(f"app {self.settings.app!r}: {decision.why}")
            if decision.step is Step.DONE:
                self.say(f"app {read.topology.app} has {read.topology.buckets} buckets")
                return read.topology
            with contextlib.suppress(BadVersionError, NodeExistsError, NoNodeError):
                await self._carry_out(decision.step, read, decision.buckets)

    async def _carry_out(self, step: Step, read: Read, waiting: tuple[int, ...]) -> None:
        old = read.record.old if read.record is not None else read.topology.buckets
        if step is Step.BEGIN:
            await asyncio.to_thread(self._refuse_moving_parked_keys)
            await asyncio.to_thread(self._begin, read)
            self.say(f"resize of app {read.topology.app} from {old} to {self.wanted} buckets begun")
        elif step is Step.SWITCH:
            await self._switch(read, old)
        elif step is Step.MARK:
            await self._mark(read, waiting)
        elif step is Step.COMMIT:
            await asyncio.to_thread(self._commit, read)
            self.say(f"committed: the leader grants buckets {old}..{self.wanted - 1} now")

    # ------------------------------------------------------------ ZooKeeper
    def _read(self) -> Read:
        data, stat = self.zk.get(self.paths.topology)
        topology = Topology.from_record(data)
        try:
            data, resize_stat = self.zk.get(self.paths.resize)
            children = tuple(self.zk.get_children(self.paths.resize))
        except NoNodeError:
            return Read(topology, stat.version, None, -1, ())
        record = ResizeRecord.decode(data)
        return Read(topology, stat.version, record, resize_stat.version, children)

    def _refuse_moving_parked_keys(self) -> None:
        """A key parked in a bucket the new count routes it away from would hold that bucket's
        marker until it is released or dropped: refused before anything begins."""
        moving = [
            record.key
            for record in readable_records(self.zk, self.paths)
            if bucket_of(record.key, self.wanted) != record.bucket
        ]
        if moving:
            raise TopologyMismatch(
                f"{len(moving)} parked keys would move to a new bucket ({', '.join(moving[:5])}): "
                "release or drop them first (hashq parked release KEY), then resize"
            )

    def _begin(self, read: Read) -> None:
        record = ResizeRecord(read.topology.buckets, self.wanted).encode()
        if read.version < 0:
            self.zk.create(self.paths.resize, record, acl=acl(self.settings, "shared"))
        else:
            self.zk.set(self.paths.resize, record, version=read.version)

    def _barrier(self, read: Read, old: int) -> None:
        record = ResizeRecord(old, self.wanted, ResizePhase.BARRIER)
        self.zk.set(self.paths.resize, record.encode(), version=read.version)

    def _commit(self, read: Read) -> None:
        """One transaction: the topology record's new count, the resize DONE, the passed nodes
        gone; each write checked against the version read."""
        assert read.record is not None
        grown = replace(read.topology, buckets=self.wanted)
        done = replace(read.record, phase=ResizePhase.DONE)
        transaction = self.zk.transaction()
        transaction.set_data(self.paths.resize, done.encode(), version=read.version)
        transaction.set_data(self.paths.topology, grown.to_record(), version=read.topology_version)
        for name in read.children:
            transaction.delete(f"{self.paths.resize}/{name}")
        failed = [r for r in transaction.commit() if isinstance(r, Exception)]
        if failed:
            raise BadVersionError(f"the resize was not committed: {failed[0]!r}; reading again")

    # ------------------------------------------------------------ RabbitMQ
    async def _switch(self, read: Read, old: int) -> None:
        self.say(
            f"declaring bucket queues {old}..{self.wanted - 1}, then switching the routing "
            "(a publish in the switch is returned to its publisher)"
        )
        before = replace(read.topology, buckets=old)
        await switch_ring(self.connection, before, replace(before, buckets=self.wanted))
        await asyncio.to_thread(self._barrier, read, old)
        self.say(f"the routing is over {self.wanted} buckets")

    async def _mark(self, read: Read, waiting: tuple[int, ...]) -> None:
        now = time.monotonic()
        if self.marked_at is None or now - self.marked_at >= REMARK_SECONDS:
            await self._publish_markers(read.topology, waiting)
            self.marked_at = now
            self.say(f"markers sent into {len(waiting)} old buckets")
        shown, at = self.said
        if waiting != shown or now - at >= SAY_EVERY:
            self.said = (waiting, now)
            listed = ", ".join(map(str, waiting[:12])) + (", ..." if len(waiting) > 12 else "")
            self.say(f"{len(waiting)} old buckets still finish what came before: {listed}")
        await asyncio.sleep(POLL_SECONDS)

    async def _publish_markers(self, topology: Topology, buckets: tuple[int, ...]) -> None:
        """A marker straight into each old bucket queue (the default exchange), confirmed."""
        channel = await self.connection.channel(publisher_confirms=True, on_return_raises=True)
        async with channel:
            for bucket in buckets:
                marker = aio_pika.Message(
                    b"",
                    headers={MARKER_HEADER: self.wanted},
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    message_id=f"resize-{self.wanted}-{bucket}",
                )
                queue = topology.queue_name(bucket)
                await channel.default_exchange.publish(marker, queue, mandatory=True)
