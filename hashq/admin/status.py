"""What ``hashq status`` shows: the topology, the leader, the live workers and, for each
bucket, its owner, epoch, state and depth, whether a handover is in progress, and a resize
under way (``hashq.resizing``) with the old buckets it waits for.

Depths come from passive queue declarations over AMQP, which are exact and immediate (the
management API's figures lag by its statistics interval). Ownership comes from ZooKeeper.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import asdict, dataclass, field
from typing import Any

from aio_pika.abc import AbstractConnection
from aiormq.exceptions import ChannelNotFoundEntity
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from hashq._io.amqp import connect_amqp, connection_name
from hashq._io.zk import close_zk, connect_zk
from hashq.errors import TopologyMismatch
from hashq.provision import read_record
from hashq.records import BucketRecord, BucketState, Leadership, Paths, Registration
from hashq.resizing import ResizePhase, ResizeRecord, passed_buckets
from hashq.settings import Settings
from hashq.topology import Topology


@dataclass(frozen=True)
class QueueState:
    name: str
    messages: int
    consumers: int


@dataclass(frozen=True)
class Ownership:
    """What ZooKeeper says about who works on what."""

    leader: Leadership | None = None
    workers: dict[str, Registration] = field(default_factory=dict)
    records: dict[int, BucketRecord] = field(default_factory=dict)
    resize: ResizeRecord | None = None  # the app's last resize
    passed: frozenset[int] = frozenset()  # its old buckets past their marker

    @property
    def resize_waits_for(self) -> list[int]:
        """The old buckets a resize under way waits for (all of them before its markers)."""
        resize = self.resize
        if resize is None or resize.phase is not ResizePhase.BARRIER:
            return []
        return [b for b in resize.old_buckets() if b not in self.passed]


@dataclass(frozen=True)
class AppStatus:
    topology: Topology
    buckets: list[QueueState]
    dead_letters: QueueState
    ownership: Ownership = field(default_factory=Ownership)

    @property
    def total_messages(self) -> int:
        return sum(max(bucket.messages, 0) for bucket in self.buckets)

    def record(self, bucket: int) -> BucketRecord:
        return self.ownership.records.get(bucket, BucketRecord())

    @property
    def in_transit(self) -> list[int]:
        return [b for b in range(len(self.buckets)) if self.record(b).moving]

    def held_by(self, worker: str) -> list[int]:
        return [
            b
            for b in range(len(self.buckets))
            if self.record(b).state is BucketState.GRANTED and self.record(b).owner == worker
        ]

    def to_json(self) -> dict[str, Any]:
        leader = self.ownership.leader
        return {
            "app": self.topology.app,
            "topology": asdict(self.topology),
            "exchange": self.topology.exchange,
            "leader": asdict(leader) if leader else None,
            "workers": {
                worker: {**asdict(registration), "buckets": self.held_by(worker)}
                for worker, registration in sorted(self.ownership.workers.items())
            },
            "resize": self._resize_json(),
            "handover_in_progress": bool(self.in_transit),
            "in_transit": self.in_transit,
            "total_messages": self.total_messages,
            "dead_letters": self.dead_letters.messages,
            "buckets": [
                {"index": index, **asdict(state), **_ownership_json(self.record(index))}
                for index, state in enumerate(self.buckets)
            ],
        }

    def _resize_json(self) -> dict[str, Any] | None:
        resize = self.ownership.resize
        if resize is None:
            return None
        return {
            "old": resize.old,
            "new": resize.new,
            "phase": resize.phase.value,
            "waits_for": self.ownership.resize_waits_for,
        }

    def resize_line(self) -> str:
        resize = self.ownership.resize
        if resize is None or not resize.under_way:
            return "resize under way: no"
        line = f"resize under way: {resize.old} -> {resize.new} buckets, {resize.phase.value}"
        waiting = self.ownership.resize_waits_for
        if waiting:
            line += f", waiting for old buckets {_ranges(waiting)} to finish what came before"
        return line


def _ownership_json(record: BucketRecord) -> dict[str, Any]:
    return {
        "state": record.state.value,
        "owner": record.owner,
        "epoch": record.epoch,
        "target": record.target,
    }


async def gather_status(settings: Settings) -> AppStatus:
    zk = await asyncio.to_thread(connect_zk, settings, "coordinator")
    try:
        recorded = await asyncio.to_thread(read_record, zk, Topology.from_settings(settings))
        if recorded is None:
            raise TopologyMismatch(f"app {settings.app!r} has no topology yet: run 'hashq init'")
        ownership = await asyncio.to_thread(read_ownership, zk, recorded)
    finally:
        await asyncio.to_thread(close_zk, zk)
    connection = await connect_amqp(settings, connection_name("status"))
    async with connection:
        buckets = [await _queue_state(connection, name) for name in recorded.bucket_queues()]
        dead = await _queue_state(connection, recorded.dead_letter_queue)
    return AppStatus(recorded, buckets, dead, ownership)


def read_ownership(zk: KazooClient, topology: Topology) -> Ownership:
    paths = Paths(topology.app)
    leader = None
    with contextlib.suppress(NoNodeError, ValueError, TypeError):
        leader = Leadership.decode(zk.get(paths.leader)[0])
    workers = {}
    with contextlib.suppress(NoNodeError):
        for name in zk.get_children(paths.workers):
            with contextlib.suppress(NoNodeError, ValueError, TypeError):
                workers[name] = Registration.decode(zk.get(paths.worker(name))[0])
    records = {}
    for bucket in range(topology.buckets):
        with contextlib.suppress(NoNodeError, ValueError, TypeError):
            records[bucket] = BucketRecord.decode(zk.get(paths.bucket(bucket))[0])
    resize, passed = None, frozenset[int]()
    with contextlib.suppress(NoNodeError, ValueError):
        resize = ResizeRecord.decode(zk.get(paths.resize)[0])
        passed = passed_buckets(zk.get_children(paths.resize), resize.new)
    return Ownership(leader, workers, records, resize, passed)


async def _queue_state(connection: AbstractConnection, name: str) -> QueueState:
    channel = await connection.channel()
    try:
        queue = await channel.declare_queue(name, passive=True)
    except ChannelNotFoundEntity:
        return QueueState(name, -1, -1)
    result = queue.declaration_result
    await channel.close()
    return QueueState(name, result.message_count or 0, result.consumer_count or 0)


def render_table(status: AppStatus) -> str:
    topology, ownership = status.topology, status.ownership
    leader = ownership.leader
    transit = status.in_transit
    lines = [
        f"app {topology.app}: exchange {topology.exchange}, {topology.buckets} "
        f"{topology.queue_type} buckets, {status.total_messages:,} messages queued, "
        f"{status.dead_letters.messages:,} dead-lettered",
        f"leader: {leader.leader} (leader epoch {leader.epoch})" if leader else "leader: none",
        f"handover in progress: buckets {transit}" if transit else "handover in progress: no",
        status.resize_line(),
        f"workers: {len(ownership.workers)}",
    ]
    for worker in sorted(ownership.workers):
        held = status.held_by(worker)
        lines.append(f"  {worker:<28} {len(held):>4} buckets  {_ranges(held)}")
    lines.append(
        f"{'bucket':>6}  {'state':<10} {'owner':<24} {'epoch':>5} {'messages':>10} "
        f"{'consumers':>9}  queue"
    )
    for index, state in enumerate(status.buckets):
        record = status.record(index)
        owner = str(record.owner or "-") + (f" -> {record.target}" if record.target else "")
        messages = "missing" if state.messages < 0 else f"{state.messages:,}"
        lines.append(
            f"{index:>6}  {record.state.value:<10} {owner:<24} {record.epoch:>5} {messages:>10} "
            f"{state.consumers:>9}  {state.name}"
        )
    return "\n".join(lines)


def _ranges(buckets: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    parts: list[str] = []
    for bucket in buckets:
        if parts and parts[-1].split("-")[-1] == str(bucket - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{bucket}"
        else:
            parts.append(str(bucket))
    return ",".join(parts) or "-"


def render_where(status: AppStatus, keys: list[str]) -> str:
    """Each key's bucket, its queue and who holds it (``hashq where``)."""
    lines = []
    for key in keys:
        bucket = status.topology.bucket_of(key)
        record, queue = status.record(bucket), status.buckets[bucket]
        if record.target:
            holder = f"moving from {record.owner or '-'} to {record.target}"
        elif record.owner:
            holder = f"{record.state.value} to {record.owner} at epoch {record.epoch}"
        else:
            holder = record.state.value
        lines.append(f"{key}: bucket {bucket} ({queue.name}, {queue.messages:,} queued), {holder}")
    return "\n".join(lines)
