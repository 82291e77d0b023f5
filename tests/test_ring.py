"""The key-to-bucket mapping is fixed: it survives re-running init and restarting the broker."""

from __future__ import annotations

import asyncio

import pytest

from hashq.provision import ensure_topology
from hashq.publisher import Outgoing, Publisher
from hashq.settings import Settings
from tests.helpers import key_buckets
from tests.services import Endpoints

KEYS = [f"entity-{n}" for n in range(2_000)]


async def _mapping(settings: Settings) -> dict[str, int]:
    async with Publisher(settings) as publisher:
        await publisher.publish_many(Outgoing(key, b"x") for key in KEYS)
    mapping = await key_buckets(settings)
    assert set(mapping) == set(KEYS)
    return mapping


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
    await ensure_topology(settings)
    after = await _mapping(settings)
    moved = sum(1 for key in KEYS if before[key] != after[key])
    assert moved == 0, f"{moved} of {len(KEYS)} keys moved to another bucket after a restart"
