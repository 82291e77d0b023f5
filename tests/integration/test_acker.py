"""Batched acknowledgements against a real broker: they settle exactly the handled messages
(an invalid one would make the broker close the channel), and a connection closed by the
server holds nothing up."""

from __future__ import annotations

import asyncio
import random
import time

import aiormq
from aiormq.abc import DeliveredMessage

from hashq._io.management import Management
from hashq.settings import Settings
from hashq.worker.acks import Acker
from tests.support.helpers import close_connection_named, wait_for_connection
from tools.queues import take_all

QUEUE = "acker-test"


async def _delivered(
    settings: Settings, count: int, name: str
) -> tuple[aiormq.Channel, list[DeliveredMessage]]:
    """A channel holding ``count`` unacknowledged deliveries of QUEUE, and those deliveries."""
    connection = await aiormq.connect(
        settings.amqp_url, client_properties={"connection_name": name}
    )
    channel = await connection.channel()
    assert isinstance(channel, aiormq.Channel)
    await channel.queue_declare(QUEUE)
    for n in range(count):
        await channel.basic_publish(str(n).encode(), routing_key=QUEUE)
    await channel.basic_qos(prefetch_count=count)
    arrived: asyncio.Queue[DeliveredMessage] = asyncio.Queue()
    await channel.basic_consume(QUEUE, arrived.put, no_ack=False)
    return channel, [await asyncio.wait_for(arrived.get(), 10) for _ in range(count)]


async def _left_in_queue(settings: Settings) -> list[bytes]:
    return [message.body for message in await take_all(settings, QUEUE)]


async def test_acks_in_any_order_settle_exactly_the_handled_messages(settings: Settings) -> None:
    channel, deliveries = await _delivered(settings, 300, "acker-order")
    order = deliveries[:]
    rng = random.Random(7)
    rng.shuffle(order)
    stuck = order.pop()  # a message whose handler never finishes
    acker = Acker(channel, batch=25, bucket=0)
    for delivery in order:
        acker.complete(delivery.delivery_tag or 0)
        if rng.random() < 0.2:
            await asyncio.sleep(rng.choice([0, 0.002, 0.01]))
    await acker.flush(within=5)
    assert not channel.is_closed, "the broker closed the channel: an acknowledgement was invalid"
    await channel.connection.close()  # hands back whatever was not acknowledged
    assert await _left_in_queue(settings) == [stuck.body]


async def test_a_connection_closed_by_the_server_holds_up_neither_handlers_nor_close(
    settings: Settings, management: Management
) -> None:
    channel, deliveries = await _delivered(settings, 200, "acker-forced")
    acker = Acker(channel, batch=1000, bucket=0)  # nothing due yet: all still owed at the close
    await wait_for_connection(management, "acker-forced")
    await close_connection_named(management, "acker-forced")
    started = time.monotonic()
    for delivery in deliveries:
        acker.complete(delivery.delivery_tag or 0)  # never waits
    await acker.flush(within=1)
    assert time.monotonic() - started < 2
    assert sorted(await _left_in_queue(settings)) == sorted(d.body for d in deliveries)
