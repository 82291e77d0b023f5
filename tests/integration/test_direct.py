"""``hashq._io.direct`` against the real broker: deliveries of every size, bodies of one frame
and of several, empty ones, with the channel's replies arriving among them, are handed over
whole and in the queue's order, in the connection's reader or, behind a frame still queued for
the channel (a backlog streaming in behind the reply to ``basic.consume``), in the channel's."""

from __future__ import annotations

import asyncio
import uuid

import aiormq
from aiormq.abc import DeliveredMessage

from hashq._io.direct import deliver_directly
from hashq.settings import Settings
from tools.polling import eventually

SIZES = (0, 10, 1_000, 200_000, 300_001)  # frame_max is 131,072: the last two take several
MESSAGES = 300
GROUP = 10  # published, then waited for
BACKLOG = 100  # published before the consumer starts


async def test_deliveries_are_handed_over_whole_and_in_order(settings: Settings) -> None:
    connection = await aiormq.connect(settings.amqp_url)
    try:
        publisher = await connection.channel()
        queue = f"direct-{uuid.uuid4().hex[:8]}"
        await publisher.queue_declare(queue, auto_delete=True)
        got: list[tuple[bytes, str]] = []

        def take(message: DeliveredMessage) -> None:
            task = asyncio.current_task()
            reader = getattr(task.get_coro(), "__qualname__", "") if task else ""
            got.append((message.body, reader))

        bodies = [_body(n) for n in range(MESSAGES)]
        for body in bodies[:BACKLOG]:  # queued before: they follow the reply to the consume
            await publisher.basic_publish(body, routing_key=queue)
        consumer = await connection.channel()
        assert deliver_directly(consumer, take)
        await consumer.basic_consume(queue, _not_called, no_ack=True)
        async with asyncio.timeout(30):
            await eventually(lambda: len(got) >= BACKLOG, 10)
            for first in range(BACKLOG, MESSAGES, GROUP):
                for n, body in enumerate(bodies[first : first + GROUP]):
                    await publisher.basic_publish(body, routing_key=queue)
                    if n == GROUP // 2:  # a reply to the channel among its deliveries
                        await consumer.basic_qos(prefetch_count=GROUP)
                await eventually(lambda: len(got) >= first + GROUP, 10)  # noqa: B023
        assert [body for body, _ in got] == bodies
        readers = {reader for _, reader in got}
        # The groups come to an idle channel: read in the connection's reader. Which reader took
        # the backlog depends on where the socket's reads fall: both happen.
        assert "Connection.__reader" in readers, readers
        assert readers <= {"Connection.__reader", "Channel._reader"}, readers
    finally:
        await connection.close()


async def _not_called(message: DeliveredMessage) -> None:
    raise AssertionError("aiormq's task per delivery was used")


def _body(n: int) -> bytes:
    size = SIZES[n % len(SIZES)]
    return (f"{n:06d}".encode() * (size // 6 + 1))[:size]
