"""The limit hashq is measured against: a plain aiormq publisher and consumer on the same
topology (the ``hashq.<app>`` exchange and its bucket queues), with no ordering logic and
acknowledgements batched (``multiple`` every ``ACK_EVERY`` deliveries, or when idle).

``python -m tools.bench.raw`` runs the consumer until SIGTERM, recording through
``tools.bench.probe.Stats``, shaped as ``HASHQ_BENCH_RAW_SHAPE`` says (``Shape``): by default as
a plain aiormq client would consume.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Iterable
from dataclasses import dataclass

import aiormq
from aiormq.abc import DeliveredMessage
from pamqp import commands as spec

from hashq._io.direct import deliver_directly
from hashq.settings import Settings, load_settings
from hashq.topology import Topology
from tools.bench.probe import Stats

ACK_EVERY = 100
ACK_IDLE = 0.05  # seconds after which a batch not full yet is acknowledged
PREFETCH = 1000
SHAPE_VARIABLE = "HASHQ_BENCH_RAW_SHAPE"
IN_FLIGHT = 1000


async def publish_raw(settings: Settings, messages: Iterable[tuple[str, bytes]]) -> int:
    """Publish with confirms, ``IN_FLIGHT`` at a time; returns how many were confirmed."""
    connection = await aiormq.connect(settings.amqp_urls[0])
    exchange = Topology.from_settings(settings).exchange
    confirmed = 0
    try:
        channel = await connection.channel(publisher_confirms=True)
        assert isinstance(channel, aiormq.Channel)  # for basic_publish(wait=False)
        properties = spec.Basic.Properties(delivery_mode=2)
        window: list[tuple[str, bytes]] = []
        for message in messages:
            window.append(message)
            if len(window) == IN_FLIGHT:
                confirmed += await _publish_window(channel, exchange, properties, window)
                window = []
        confirmed += await _publish_window(channel, exchange, properties, window)
    finally:
        await connection.close()
    return confirmed


async def _publish_window(
    channel: aiormq.Channel,
    exchange: str,
    properties: spec.Basic.Properties,
    window: list[tuple[str, bytes]],
) -> int:
    outcomes = await asyncio.gather(
        *(
            channel.basic_publish(
                body, exchange=exchange, routing_key=key, properties=properties, wait=False
            )
            for key, body in window
        )
    )
    return sum(1 for outcome in outcomes if isinstance(outcome, spec.Basic.Ack))


@dataclass(frozen=True)
class Shape:
    """How the raw consumer meets the broker. By default as a plain client would: one channel
    for every bucket queue, a prefetch of ``PREFETCH``, ``multiple`` acks every ``ACK_EVERY``
    deliveries (and what is left after ``ACK_IDLE`` seconds). ``per_bucket``: a channel per
    bucket queue, as a hashq worker has (then ``prefetch`` and ``ack_every`` are each
    channel's). ``direct``: deliveries handed over in the channel's reader, without aiormq's
    task each (``hashq._io.direct``), as a worker's are. ``tools.bench.shapes`` compares them."""

    per_bucket: bool = False
    prefetch: int = PREFETCH
    ack_every: int = ACK_EVERY
    direct: bool = False

    def environment(self) -> dict[str, str]:
        channels = "bucket" if self.per_bucket else "one"
        return {SHAPE_VARIABLE: f"{channels},{self.prefetch},{self.ack_every},{int(self.direct)}"}

    @classmethod
    def from_environment(cls) -> Shape:
        told = os.environ.get(SHAPE_VARIABLE)
        if not told:
            return cls()
        channels, prefetch, ack_every, direct = told.split(",")
        return cls(channels == "bucket", int(prefetch), int(ack_every), direct == "1")


class _Acks:
    """One channel's acknowledgements: ``multiple`` up to the last tag, in batches."""

    def __init__(self, channel: aiormq.abc.AbstractChannel, every: int) -> None:
        self.channel, self._every = channel, every
        self._unacked = self._last_tag = 0
        self._idle: asyncio.TimerHandle | None = None

    def count(self, tag: int) -> bool:
        """One more delivery done; True when a batch is due (else the idle timer sends it)."""
        self._last_tag = max(self._last_tag, tag)
        self._unacked += 1
        if self._unacked >= self._every:
            return True
        if self._idle is None:
            self._idle = asyncio.get_running_loop().call_later(
                ACK_IDLE, lambda: asyncio.ensure_future(self.ack())
            )
        return False

    async def ack(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self._unacked:
            self._unacked = 0
            await self.channel.basic_ack(self._last_tag, multiple=True)


class RawConsumer:
    """Consumes every bucket queue with no ordering logic, as ``shape`` says."""

    def __init__(self, settings: Settings, stats: Stats, shape: Shape) -> None:
        self._settings = settings
        self._stats = stats
        self._shape = shape
        self._acking: set[asyncio.Task[None]] = set()
        self._consumers: dict[str, tuple[int, _Acks]] = {}  # consumer tag -> bucket, acks

    async def run(self, stop: asyncio.Event) -> None:
        connection = await aiormq.connect(self._settings.amqp_urls[0])
        channels: list[_Acks] = []
        for bucket, queue in enumerate(Topology.from_settings(self._settings).bucket_queues()):
            if self._shape.per_bucket or not channels:
                channels.append(await self._channel(connection))
            result = await channels[-1].channel.basic_consume(queue, self._on_message)
            self._consumers[result.consumer_tag or ""] = (bucket, channels[-1])
        await stop.wait()
        for acks in channels:
            await acks.ack()
        self._stats.flush()
        await connection.close()

    async def _channel(self, connection: aiormq.abc.AbstractConnection) -> _Acks:
        channel = await connection.channel(publisher_confirms=False)
        await channel.basic_qos(prefetch_count=self._shape.prefetch)
        if self._shape.direct:
            deliver_directly(channel, self._on_message_now)
        return _Acks(channel, self._shape.ack_every)

    def _on_message_now(self, message: DeliveredMessage) -> None:
        """``_on_message`` in the channel's reader: an ack due is sent from a task."""
        acks = self._count(message)
        if acks is not None:
            task = asyncio.ensure_future(acks.ack())
            self._acking.add(task)
            task.add_done_callback(self._acking.discard)

    async def _on_message(self, message: DeliveredMessage) -> None:
        acks = self._count(message)
        if acks is not None:
            await acks.ack()

    def _count(self, message: DeliveredMessage) -> _Acks | None:
        """Record ``message``; its channel's acks when a batch is due."""
        frame = message.delivery
        assert isinstance(frame, spec.Basic.Deliver)
        bucket, acks = self._consumers.get(frame.consumer_tag or "", (-1, None))
        self._stats.add(bucket, message.body)
        if acks is not None and acks.count(frame.delivery_tag or 0):
            return acks
        return None


async def main_async(settings: Settings) -> int:
    stats = Stats(os.environ.get("HASHQ_BENCH_STATS"), os.environ.get("HASHQ_WORKER_ID", "raw"))
    stop = asyncio.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(number, stop.set)
    await RawConsumer(settings, stats, Shape.from_environment()).run(stop)
    return 0


if __name__ == "__main__":
    from hashq._io.command import run_loop

    chosen = load_settings()
    sys.exit(run_loop(main_async(chosen), chosen.event_loop))
