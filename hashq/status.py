"""What ``hashq status`` shows: the recorded topology and each bucket's depth.

Depths come from passive queue declarations over AMQP, which are exact and immediate (the
management API's figures lag by its statistics interval).
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from typing import Any

from aio_pika.abc import AbstractConnection
from aiormq.exceptions import ChannelNotFoundEntity

from hashq.amqp import connect_amqp, connection_name
from hashq.errors import TopologyMismatch
from hashq.provision import read_record
from hashq.settings import Settings
from hashq.topology import Topology
from hashq.zk import close_zk, connect_zk


@dataclass(frozen=True)
class QueueState:
    name: str
    messages: int
    consumers: int


@dataclass(frozen=True)
class AppStatus:
    topology: Topology
    buckets: list[QueueState]
    dead_letters: QueueState

    @property
    def total_messages(self) -> int:
        return sum(bucket.messages for bucket in self.buckets)

    def to_json(self) -> dict[str, Any]:
        return {
            "app": self.topology.app,
            "topology": asdict(self.topology),
            "exchange": self.topology.exchange,
            "total_messages": self.total_messages,
            "dead_letters": self.dead_letters.messages,
            "buckets": [
                {"index": index, **asdict(state)} for index, state in enumerate(self.buckets)
            ],
        }


async def gather_status(settings: Settings) -> AppStatus:
    zk = await asyncio.to_thread(connect_zk, settings)
    try:
        recorded = await asyncio.to_thread(read_record, zk, Topology.from_settings(settings))
    finally:
        await asyncio.to_thread(close_zk, zk)
    if recorded is None:
        raise TopologyMismatch(f"app {settings.app!r} has no topology yet: run 'hashq init'")
    connection = await connect_amqp(settings, connection_name("status"))
    async with connection:
        buckets = [await _queue_state(connection, name) for name in recorded.bucket_queues()]
        dead = await _queue_state(connection, recorded.dead_letter_queue)
    return AppStatus(recorded, buckets, dead)


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
    topology = status.topology
    lines = [
        f"app {topology.app}: exchange {topology.exchange}, {topology.buckets} "
        f"{topology.queue_type} buckets, {status.total_messages:,} messages queued, "
        f"{status.dead_letters.messages:,} dead-lettered",
        f"{'bucket':>6}  {'queue':<28} {'messages':>10} {'consumers':>9}",
    ]
    for index, state in enumerate(status.buckets):
        messages = "missing" if state.messages < 0 else f"{state.messages:,}"
        lines.append(f"{index:>6}  {state.name:<28} {messages:>10} {state.consumers:>9}")
    return "\n".join(lines)
