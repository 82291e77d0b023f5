"""The one way the tests and the tools empty a queue to read it back: by consuming (quorum queues
with single-active-consumer refuse ``basic.get``), acknowledging each message, until as many
as the queue held have come or none has come for a while."""

from __future__ import annotations

import asyncio

from aio_pika.abc import AbstractIncomingMessage, AbstractQueue

from hashq._io.amqp import connect_amqp, connection_name
from hashq.settings import Settings

QUIET_SECONDS = 3.0  # no message for this long: the queue held fewer than it said


async def take_all(settings: Settings, queue: str) -> list[AbstractIncomingMessage]:
    """Every message in ``queue`` now, taken off it (acknowledged), in queue order."""
    connection = await connect_amqp(settings, connection_name("take-all"))
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=500)
        declared = await channel.declare_queue(queue, passive=True)
        return await _consume(declared, declared.declaration_result.message_count or 0)


async def _consume(queue: AbstractQueue, expected: int) -> list[AbstractIncomingMessage]:
    taken: list[AbstractIncomingMessage] = []
    if expected == 0:
        return taken
    arrived = asyncio.Event()

    async def take(message: AbstractIncomingMessage) -> None:
        taken.append(message)  # before the first await: callbacks begin in delivery order
        arrived.set()
        await message.ack()

    tag = await queue.consume(take)
    while len(taken) < expected:
        arrived.clear()
        try:
            await asyncio.wait_for(arrived.wait(), QUIET_SECONDS)
        except TimeoutError:
            break
    await queue.cancel(tag)
    return taken
