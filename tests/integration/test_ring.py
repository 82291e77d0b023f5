"""The key-to-bucket mapping is fixed: it survives re-running init and restarting the broker."""

from __future__ import annotations

import asyncio

import pytest
from aio_pika import Message
from aio_pika.exceptions import PublishError

from hashq._io.amqp import connect_amqp
from hashq.provision import ensure_topology
from hashq.publisher import Outgoing, Publisher
from hashq.settings import Settings
from hashq.topology import Topology
from tests.support.helpers import key_buckets
from tests.support.services import Endpoints

KEYS = [f"entity-{n}" for n in range(2_000)]


async def _mapping(settings: Settings) -> dict[str, int]:
    async with Publisher(settings) as publisher:
        await publisher.publish_many(Outgoing(key, b"x") for key in KEYS)
    mapping = await key_buckets(settings)
    assert set(mapping) == set(KEYS)
    return mapping


async def _raw_publish_is_returned(settings: Settings) -> bool:
    """Publish as a plain AMQP client would (mandatory, confirmed); True if it came back."""
    connection = await connect_amqp(settings, "test-raw")
    async with connection:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        exchange = await channel.get_exchange("hashq.t")
        try:
            await exchange.publish(Message(b"x", message_id="raw"), "entity-1", mandatory=True)
        except PublishError:
            return True
    return False


async def test_the_client_side_twin_says_where_every_key_lands(initialized: Settings) -> None:
    """``hashq.placement`` against the real ring: 2,000 keys published, each found in the
    bucket the twin names (hashq where)."""
    mapping = await _mapping(initialized)
    topology = Topology.from_settings(initialized)
    assert mapping == {key: topology.bucket_of(key) for key in KEYS}


async def test_mapping_survives_init_and_broker_restart(
    endpoints: Endpoints, settings: Settings
) -> None:
    if endpoints.restart is None:
        pytest.skip(f"servers from {endpoints.source} cannot be restarted by the tests")
    await ensure_topology(settings)
    before = await _mapping(settings)

    counts = [list(before.values()).count(bucket) for bucket in range(settings.buckets)]
    mean = len(KEYS) / settings.buckets
    assert max(counts) / mean < 1.3, f"keys spread unevenly over buckets: {counts}"

    await ensure_topology(settings)
    assert await _mapping(settings) == before, "re-running init moved keys"

    await asyncio.to_thread(endpoints.restart, "rabbitmq")
    assert await _raw_publish_is_returned(settings), "after a restart a stale ring routed a message"
    after = await _mapping(settings)  # the publisher rebuilds the ring when it connects
    moved = sum(1 for key in KEYS if before[key] != after[key])
    assert moved == 0, f"{moved} of {len(KEYS)} keys moved to another bucket after a restart"
