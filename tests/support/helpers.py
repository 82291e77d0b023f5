"""Helpers the integration tests share: reading queues back, finding connections."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from aio_pika.abc import AbstractIncomingMessage
from kazoo.client import KazooClient

from hashq._io.amqp import connect_amqp
from hashq._io.management import Management
from hashq.settings import Settings
from hashq.topology import Topology

T = TypeVar("T")


def child_environment(settings: Settings, **extra: str) -> dict[str, str]:
    """This process's environment without its own HASHQ_ variables, plus ``settings``'."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("HASHQ_")}
    return {**env, **settings.environment(), **extra}


def open_zk(hosts: str) -> KazooClient:
    client = KazooClient(hosts=hosts, timeout=10)
    client.start(timeout=15)
    return client


async def drain(settings: Settings, queue: str) -> list[AbstractIncomingMessage]:
    """Every message in ``queue``, taken off it (acknowledged), in queue order."""
    taken: list[AbstractIncomingMessage] = []
    connection = await connect_amqp(settings, "test-drain")
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=500)
        declared = await channel.declare_queue(queue, passive=True)
        remaining = declared.declaration_result.message_count or 0
        if remaining == 0:
            return taken
        async with declared.iterator() as messages:
            async for message in messages:
                await message.ack()
                taken.append(message)
                if len(taken) >= remaining:
                    break
    return taken


async def key_buckets(settings: Settings) -> dict[str, int]:
    """Drain every bucket queue; map each routing key found to its bucket index."""
    topology = Topology.from_settings(settings)
    mapping: dict[str, int] = {}
    for index, name in enumerate(topology.bucket_queues()):
        for message in await drain(settings, name):
            assert message.routing_key is not None
            previous = mapping.setdefault(message.routing_key, index)
            assert previous == index, f"key {message.routing_key} found in two buckets"
    return mapping


async def queue_depths(settings: Settings) -> dict[str, int]:
    topology = Topology.from_settings(settings)
    depths = {}
    connection = await connect_amqp(settings, "test-depths")
    async with connection:
        channel = await connection.channel()
        for name in [*topology.bucket_queues(), topology.dead_letter_queue]:
            declared = await channel.declare_queue(name, passive=True)
            depths[name] = declared.declaration_result.message_count or 0
    return depths


async def wait_for_connection(management: Management, name: str, seconds: float = 15) -> None:
    """Wait until the management API lists the connection ``name`` (it lags by seconds)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        listed: list[dict[str, Any]] = await asyncio.to_thread(management.connections)
        if any(c.get("client_properties", {}).get("connection_name") == name for c in listed):
            return
        await asyncio.sleep(0.25)
    raise AssertionError(f"connection {name} not listed within {seconds}s")


async def close_connection_named(management: Management, name: str) -> None:
    listed: list[dict[str, Any]] = await asyncio.to_thread(management.connections)
    for connection in listed:
        if connection.get("client_properties", {}).get("connection_name") == name:
            await asyncio.to_thread(management.close_connection, connection["name"], "test")
            return
    raise AssertionError(f"connection {name} not found")


async def eventually(
    condition: Callable[[], T | None], within: float = 60, every: float = 0.05
) -> T:
    """Poll ``condition`` until it returns something true, and return that; fail the test after
    ``within`` seconds. The one polling helper of the tests."""
    deadline = time.monotonic() + within
    while not (found := condition()):
        assert time.monotonic() < deadline, f"condition not reached within {within:g}s"
        await asyncio.sleep(every)
    return found
