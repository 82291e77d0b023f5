"""``hashq init`` against a real RabbitMQ and ZooKeeper: creation, idempotence, refusals."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import pytest

from hashq._io.amqp import connect_amqp
from hashq._io.management import Management
from hashq.errors import TopologyMismatch
from hashq.provision import ensure_topology
from hashq.settings import Settings
from hashq.topology import Topology
from tests.support.helpers import open_zk


def _queues(management: Management) -> dict[str, dict[str, Any]]:
    listed = management.request("GET", f"/api/queues/{quote(management.vhost, safe='')}")
    return {queue["name"]: queue for queue in listed}


def _bindings(management: Management, topology: Topology) -> list[tuple[str, str]]:
    bindings = management.bindings_from(topology.ring_exchange)
    return sorted((b["destination"], b["routing_key"]) for b in bindings)


def _record(settings: Settings) -> Topology | None:
    client = open_zk(settings.zk_hosts)
    try:
        if not client.exists("/hashq/t/topology"):
            return None
        return Topology.from_record(client.get("/hashq/t/topology")[0])
    finally:
        client.stop()
        client.close()


async def test_init_creates_the_whole_topology(settings: Settings, management: Management) -> None:
    topology = await ensure_topology(settings)

    vhost = quote(settings.vhost, safe="")
    entry = management.request("GET", f"/api/exchanges/{vhost}/hashq.t")
    assert (entry["type"], entry["durable"]) == ("fanout", True)
    ring = management.request("GET", f"/api/exchanges/{vhost}/hashq.t.ring")
    assert (ring["type"], ring["durable"], ring["internal"]) == ("x-consistent-hash", False, True)
    assert [b["destination"] for b in management.bindings_from("hashq.t")] == ["hashq.t.ring"]
    queues = _queues(management)
    for index in range(8):
        queue = queues[f"hashq.t.b{index:04d}"]
        assert queue["durable"] is True
        assert queue["arguments"]["x-queue-type"] == "quorum"
        assert queue["arguments"]["x-single-active-consumer"] is True
        assert queue["arguments"]["x-delivery-limit"] == settings.delivery_limit
        assert queue["arguments"]["x-dead-letter-exchange"] == "hashq.t.dlx"
    assert "hashq.t.dead" in queues
    assert _bindings(management, topology) == [(f"hashq.t.b{i:04d}", "1") for i in range(8)]
    dead_bindings = management.bindings_from("hashq.t.dlx")
    assert [b["destination"] for b in dead_bindings] == ["hashq.t.dead"]
    assert _record(settings) == topology


async def test_classic_queues(settings: Settings, management: Management) -> None:
    classic = settings.model_copy(update={"queue_type": "classic"})
    await ensure_topology(classic)
    queue = _queues(management)["hashq.t.b0003"]
    assert queue["arguments"]["x-queue-type"] == "classic"
    assert queue["arguments"]["x-single-active-consumer"] is True


async def test_init_is_idempotent(settings: Settings, management: Management) -> None:
    first = await ensure_topology(settings)
    second = await ensure_topology(settings)
    assert first == second
    assert len(_bindings(management, first)) == 8
    assert len([name for name in _queues(management) if name.startswith("hashq.t.b")]) == 8


async def test_concurrent_inits_agree(settings: Settings, management: Management) -> None:
    results = await asyncio.gather(*(ensure_topology(settings) for _ in range(3)))
    assert len(set(results)) == 1
    assert len(_bindings(management, results[0])) == 8


@pytest.mark.parametrize("change", [{"queue_type": "classic"}, {"delivery_limit": 3}])
async def test_other_settings_are_refused_and_nothing_changes(
    settings: Settings, management: Management, change: dict[str, object]
) -> None:
    original = await ensure_topology(settings)
    with pytest.raises(TopologyMismatch, match="already exists with another topology"):
        await ensure_topology(settings.model_copy(update=change))
    assert _record(settings) == original
    assert len(_bindings(management, original)) == 8
    assert len([name for name in _queues(management) if name.startswith("hashq.t.b")]) == 8


@pytest.mark.parametrize("buckets", [16, 4])
async def test_another_bucket_count_is_refused_by_init_and_taken_from_the_record_by_the_rest(
    settings: Settings, management: Management, buckets: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A count other than the app's: ``hashq init`` refuses it and says how to grow the app;
    a worker, coordinator or command whose settings are older than a resize uses the app's
    count, and says so once."""
    original = await ensure_topology(settings)
    other = settings.model_copy(update={"buckets": buckets})
    with pytest.raises(TopologyMismatch, match=f"hashq resize --buckets {buckets}"):
        await ensure_topology(other, exact_count=True)
    assert await ensure_topology(other, check_bindings=False) == original
    assert f"app 't' has 8 buckets, HASHQ_BUCKETS says {buckets}" in caplog.text
    assert _record(settings) == original
    assert len(_bindings(management, original)) == 8


async def test_broker_topology_without_record_is_not_extended(
    settings: Settings, management: Management
) -> None:
    """ZooKeeper lost its record (wiped, or another ensemble): init must not re-bind over a broker
    topology of another size, which would remap keys."""
    original = await ensure_topology(settings.model_copy(update={"buckets": 16}))
    client = open_zk(settings.zk_hosts)
    client.delete("/hashq/t/topology")
    client.stop()
    client.close()
    with pytest.raises(TopologyMismatch, match="16 bindings, expected 8"):
        await ensure_topology(settings)
    assert len(_bindings(management, original)) == 16


async def test_queue_bound_to_the_entry_exchange_is_reported(settings: Settings) -> None:
    await ensure_topology(settings)
    connection = await connect_amqp(settings, "test-bind")
    async with connection:
        channel = await connection.channel()
        stray = await channel.declare_queue("stray", durable=True)
        await stray.bind("hashq.t")
    with pytest.raises(TopologyMismatch, match=r"expected only hashq\.t\.ring"):
        await ensure_topology(settings)


async def test_missing_queue_is_reported(settings: Settings) -> None:
    await ensure_topology(settings)
    connection = await connect_amqp(settings, "test-delete")
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete("hashq.t.b0005")
    with pytest.raises(TopologyMismatch, match=r"hashq\.t\.b0005"):
        await ensure_topology(settings)


async def test_binding_added_by_hand_is_reported(settings: Settings) -> None:
    await ensure_topology(settings)
    connection = await connect_amqp(settings, "test-bind")
    async with connection:
        channel = await connection.channel()
        stray = await channel.declare_queue("stray", durable=True)
        await stray.bind("hashq.t.ring", routing_key="1")
    with pytest.raises(TopologyMismatch, match="changed by hand"):
        await ensure_topology(settings)
