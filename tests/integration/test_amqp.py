"""The AMQP edge (``hashq._io.amqp``) against the real broker: a channel the broker closes while
the connection's write queue is full is still closed on the broker, so its queue's next consumer
is fed.

aiormq answers a broker's ``Channel.Close`` with ``put_nowait`` on a write queue of 10 frames
and drops the answer when it is full; frames sent without waiting for the socket (acknowledgements
and publishes, as hashq sends them) fill it. Unanswered, the channel lived on as the quorum
queue's single active consumer, holding what it had been delivered: the chaos run's bucket that
started nothing for 48.6 s after a ``consumer_timeout``. Without ``answer_every_close``, 7 of
10 such closes went unanswered in a probe of this shape."""

from __future__ import annotations

import asyncio
import uuid

import aiormq
from aio_pika.abc import AbstractConnection
from aiormq.abc import DeliveredMessage
from pamqp.common import FieldValue

from hashq._io.amqp import close_quietly, connect_amqp
from hashq.settings import Settings
from tools.polling import eventually

SENDERS = 12  # channels sending without waiting, as many buckets' acknowledgements do
HELD = 5  # the prefetch window of the channel the broker closes
PUBLISHED = 20
ROUNDS = 5
Counts = tuple[int, int]  # a queue's messages ready, its consumers


async def test_a_channel_the_broker_closes_is_closed_on_the_broker_while_frames_queue(
    settings: Settings,
) -> None:
    admin = await aiormq.connect(settings.amqp_url)
    try:
        rounds = [await _one_round(settings, await admin.channel()) for _ in range(ROUNDS)]
    finally:
        await admin.close()
    # The broker dropped the channel each time: what it held went back, nobody consumes.
    assert [counts for counts, _ in rounds] == [(PUBLISHED, 0)] * ROUNDS
    assert max(most for _, most in rounds) > 10, "the write queue never held more than 10"


async def _one_round(settings: Settings, setup: aiormq.abc.AbstractChannel) -> tuple[Counts, int]:
    """A fresh quorum queue of PUBLISHED messages, a consumer of it closed by the broker while
    frames queue (on a connection of its own): the queue's counts then, and the most frames
    the write queue held."""
    queue = f"close-answered-{uuid.uuid4().hex[:8]}"
    arguments: dict[str, FieldValue] = {"x-queue-type": "quorum", "x-single-active-consumer": True}
    await setup.queue_declare(queue, durable=True, arguments=arguments)
    for n in range(PUBLISHED):
        await setup.basic_publish(str(n).encode(), routing_key=queue)
    connection = await connect_amqp(settings, "hashq-test-close-answered")
    try:
        most = await _close_a_consumer_while_frames_queue(connection, queue)
        counts = await eventually(
            lambda: _counts(setup, queue),
            10,
            until=lambda counts: counts == (PUBLISHED, 0),
            or_last=True,
        )
    finally:
        await close_quietly(connection)
    await setup.queue_delete(queue)
    return counts, most


async def _close_a_consumer_while_frames_queue(connection: AbstractConnection, queue: str) -> int:
    """Consume ``queue`` on one channel, keep the write queue busy from SENDERS others, and make
    the broker close the first (an acknowledgement of an unknown tag). The most frames the
    write queue held meanwhile."""
    assert connection.transport is not None
    underlay = connection.transport.connection
    assert isinstance(underlay, aiormq.Connection)
    consumer = await underlay.channel()
    await consumer.basic_qos(prefetch_count=HELD)
    delivered = asyncio.Event()

    async def arrived(_: DeliveredMessage) -> None:
        delivered.set()

    await consumer.basic_consume(queue, arrived, no_ack=False)
    await asyncio.wait_for(delivered.wait(), 10)
    senders = [await underlay.channel(publisher_confirms=False) for _ in range(SENDERS)]
    most = 0
    stop = asyncio.Event()

    async def send(channel: aiormq.abc.AbstractChannel) -> None:
        assert isinstance(channel, aiormq.Channel)  # for basic_publish(wait=False)
        nonlocal most
        while not stop.is_set():
            await channel.basic_publish(b"x", routing_key="nowhere", wait=False)
            most = max(most, underlay.write_queue.qsize())
            await asyncio.sleep(0)  # as hashq's senders do: an acknowledgement, then a wait

    sending = [asyncio.ensure_future(send(channel)) for channel in senders]
    await asyncio.sleep(0.2)
    await consumer.basic_ack(10**6, wait=False)  # unknown: the broker closes the channel
    await eventually(lambda: consumer.is_closed, 10, what="the broker to close the channel")
    stop.set()
    _, stuck = await asyncio.wait(sending, timeout=5)
    for task in stuck:  # its frame waits for room in a queue the writer no longer empties
        task.cancel()
    return most


async def _counts(channel: aiormq.abc.AbstractChannel, queue: str) -> Counts:
    declared = await channel.queue_declare(queue, passive=True)
    return declared.message_count or 0, declared.consumer_count or 0
