"""Helpers the integration tests share: reading queues back, finding connections."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, TypeVar

from kazoo.client import KazooClient
from prometheus_client.parser import text_string_to_metric_families

from hashq._io.amqp import connect_amqp
from hashq._io.management import Management
from hashq.settings import Settings
from hashq.topology import Topology
from hashq_coordinator.fencing.cutoff import close_connection
from tools.launcher import child_environment
from tools.polling import eventually
from tools.queues import take_all

T = TypeVar("T")


def hashq(
    settings: Settings, *args: str, stdin: str = "", **env: str
) -> subprocess.CompletedProcess[str]:
    """The ``hashq`` command, run as a user runs it, with ``settings`` (and ``env``) as its
    environment."""
    return subprocess.run(
        [sys.executable, "-m", "hashq.admin.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=child_environment(settings, **env),
        timeout=120,
    )


def free_port() -> int:
    """A port nothing listens on now, on 127.0.0.1."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def open_zk(hosts: str) -> KazooClient:
    client = KazooClient(hosts=hosts, timeout=10)
    client.start(timeout=15)
    return client


async def key_buckets(settings: Settings) -> dict[str, int]:
    """Drain every bucket queue; map each routing key found to its bucket index."""
    topology = Topology.from_settings(settings)
    mapping: dict[str, int] = {}
    for index, name in enumerate(topology.bucket_queues()):
        for message in await take_all(settings, name):
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

    async def listed() -> bool:
        found: list[dict[str, Any]] = await asyncio.to_thread(management.connections)
        return any(c.get("client_properties", {}).get("connection_name") == name for c in found)

    await eventually(listed, seconds, every=0.25, what=f"connection {name} listed")


async def close_connection_named(management: Management, name: str) -> None:
    listed: list[dict[str, Any]] = await asyncio.to_thread(management.connections)
    for connection in listed:
        if connection.get("client_properties", {}).get("connection_name") == name:
            await asyncio.to_thread(close_connection, management, connection["name"], "test")
            return
    raise AssertionError(f"connection {name} not found")


def into_a_closed_pipe(command: list[str], **popen: Any) -> tuple[int, str]:
    """Run ``command`` with a standard output that nobody reads (its pipe closed at once, as
    ``| head`` does once it has enough): its exit status and its standard error."""
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        process.stdout.close()
        errors = process.stderr.read()
        return process.wait(timeout=60), errors


def user_module(folder: Path, monkeypatch: Any, name: str, text: str) -> None:
    """A module of a user's, ``name``.py in ``folder``, importable for the rest of the test."""
    (folder / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(folder))


Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def get(port: int, path: str) -> tuple[int, str]:
    """GET ``path`` of a process's metrics and health port: the status (0: not listening yet)
    and the body."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except urllib.error.URLError as exc:  # not listening yet
        return 0, str(exc.reason)


def scrape(port: int) -> Scrape:
    """Every sample a process serves on ``/metrics``, by name and labels ({} if it does not
    answer yet)."""
    status, text = get(port, "/metrics")
    if status != 200:
        return {}
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(samples: Scrape, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples that carry ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= set(ls))
