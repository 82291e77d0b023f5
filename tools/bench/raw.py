"""The limit hashq is measured against: a plain aiormq publisher and consumer on the same
topology (the ``hashq.<app>`` exchange and its bucket queues), with no ordering logic and
acknowledgements batched (``multiple`` every ``ACK_EVERY`` deliveries, or when idle).

``python -m tools.bench.raw`` runs the consumer until SIGTERM, recording through
``tools.bench.probe.Stats``. With ``HASHQ_BENCH_RAW_DIRECT=1`` its deliveries are handed over in
the channel's reader, without aiormq's task per delivery, as a hashq worker's are
(``hashq._io.direct``): no plain aiormq client does that, but it shows what hashq costs beyond
the same trick.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Iterable

import aiormq
from aiormq.abc import DeliveredMessage
from pamqp import commands as spec

from hashq._io.direct import deliver_directly
from hashq.settings import Settings, load_settings
from hashq.topology import Topology
from tools.bench.probe import Stats

ACK_EVERY = 100
PREFETCH = 1000
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


class RawConsumer:
    """One channel consuming every bucket queue; acks ``multiple`` in batches."""

    def __init__(self, settings: Settings, stats: Stats, direct: bool = False) -> None:
        self._settings = settings
        self._stats = stats
        self._direct = direct
        self._acking: set[asyncio.Task[None]] = set()
        self._buckets: dict[str, int] = {}
        self._unacked = 0
        self._last_tag = 0
        self._idle_ack: asyncio.TimerHandle | None = None
        self._channel: aiormq.abc.AbstractChannel

    async def run(self, stop: asyncio.Event) -> None:
        connection = await aiormq.connect(self._settings.amqp_urls[0])
        self._channel = await connection.channel()
        await self._channel.basic_qos(prefetch_count=PREFETCH)
        if self._direct:
            deliver_directly(self._channel, self._on_message_now)
        for bucket, queue in enumerate(Topology.from_settings(self._settings).bucket_queues()):
            result = await self._channel.basic_consume(queue, self._on_message)
            self._buckets[result.consumer_tag or ""] = bucket
        await stop.wait()
        await self._ack()
        self._stats.flush()
        await connection.close()

    def _on_message_now(self, message: DeliveredMessage) -> None:
        """``_on_message`` in the channel's reader: an ack due is sent from a task."""
        if self._count(message):
            task = asyncio.ensure_future(self._ack())
            self._acking.add(task)
            task.add_done_callback(self._acking.discard)

    async def _on_message(self, message: DeliveredMessage) -> None:
        if self._count(message):
            await self._ack()

    def _count(self, message: DeliveredMessage) -> bool:
        """Record ``message``; True when an ack is due."""
        frame = message.delivery
        assert isinstance(frame, spec.Basic.Deliver)
        self._stats.add(self._buckets.get(frame.consumer_tag or "", -1), message.body)
        self._last_tag = max(self._last_tag, frame.delivery_tag or 0)
        self._unacked += 1
        if self._unacked >= ACK_EVERY:
            return True
        if self._idle_ack is None:
            self._idle_ack = asyncio.get_running_loop().call_later(
                0.05, lambda: asyncio.ensure_future(self._ack())
            )
        return False

    async def _ack(self) -> None:
        if self._idle_ack is not None:
            self._idle_ack.cancel()
            self._idle_ack = None
        if self._unacked:
            self._unacked = 0
            await self._channel.basic_ack(self._last_tag, multiple=True)


async def main_async(settings: Settings) -> int:
    stats = Stats(os.environ.get("HASHQ_BENCH_STATS"), os.environ.get("HASHQ_WORKER_ID", "raw"))
    stop = asyncio.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(number, stop.set)
    direct = os.environ.get("HASHQ_BENCH_RAW_DIRECT") == "1"
    await RawConsumer(settings, stats, direct).run(stop)
    return 0


if __name__ == "__main__":
    from hashq._io.command import run_loop

    chosen = load_settings()
    sys.exit(run_loop(main_async(chosen), chosen.event_loop))
