"""TLS to RabbitMQ, against a broker whose amqps:// and https:// listeners require a client
certificate signed by the test CA (``tools/services.sh`` makes the CA and the listeners)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from hashq._io.amqp import connect_amqp
from hashq._io.management import Management
from hashq.errors import ServiceUnavailable
from hashq.provision import ensure_topology
from hashq.publisher import Outgoing, Publisher
from hashq.settings import Settings
from tests.support.services import Endpoints, TlsEndpoints
from tests.support.workers import WorkerProcess, start_coordinator, wait_for_executions
from tools.launcher import child_environment
from tools.polling import eventually


@pytest.fixture
def tls(endpoints: Endpoints) -> TlsEndpoints:
    if endpoints.tls is None:
        pytest.skip(f"the servers from {endpoints.source} have no TLS listeners")
    return endpoints.tls


@pytest.fixture
def tls_settings(settings: Settings, tls: TlsEndpoints) -> Settings:
    return settings.model_copy(
        update={
            "amqp_url": f"amqps://guest:guest@localhost:{tls.amqps_port}/"
            + quote(settings.vhost, safe=""),
            "management_url": f"https://localhost:{tls.management_port}",
            "tls_ca_file": tls.ca_file,
            "tls_cert_file": tls.client_cert_file,
            "tls_key_file": tls.client_key_file,
        }
    )


async def test_a_worker_over_tls_processes_in_order(
    tls_settings: Settings, settings: Settings, tmp_path: Path
) -> None:
    await ensure_topology(tls_settings)
    record = tmp_path / "executions.jsonl"
    processes = [
        start_coordinator(tls_settings, "c1", tmp_path),
        WorkerProcess(tls_settings, "w1", "tests.support.handlers:record", record, tmp_path),
    ]
    try:
        messages = [
            Outgoing(f"k{key}", json.dumps({"seq": seq}).encode())
            for seq in range(20)
            for key in range(20)
        ]
        async with Publisher(tls_settings) as publisher:
            await publisher.publish_many(messages)
        expected = {f"k{key}": 20 for key in range(20)}
        report = await asyncio.to_thread(wait_for_executions, record, expected, 60)
        assert (report.lost, report.reordered, report.overlaps) == ([], [], [])
        # Every hashq connection in the test's vhost came in over TLS, and the management API
        # answered over https with the client certificate.
        connections = await _listed_connections(settings)
        assert connections and all(c["ssl"] for c in connections), connections
        depths = await asyncio.to_thread(Management(tls_settings).queue_depths)
        assert len(depths) >= tls_settings.buckets
    finally:
        for process in processes:
            process.stop()


async def _listed_connections(settings: Settings, within: float = 20) -> list[dict[str, Any]]:
    """The vhost's connections, once the management API lists any (it lags by seconds)."""

    async def ours() -> list[dict[str, Any]]:
        listed = await asyncio.to_thread(Management(settings).connections)
        return [c for c in listed if c.get("vhost") == settings.vhost]

    return await eventually(ours, within, every=0.5, or_last=True)


async def test_a_broker_the_ca_does_not_vouch_for_is_refused_in_one_line(
    tls_settings: Settings, tmp_path: Path, tls: TlsEndpoints
) -> None:
    stranger = tmp_path / "stranger.pem"
    stranger.write_text(tls.client_cert_file.read_text())  # a certificate, but not the CA
    untrusting = tls_settings.model_copy(update={"tls_ca_file": stranger})
    with pytest.raises(ServiceUnavailable) as caught:
        await connect_amqp(untrusting, "test-untrusted")
    assert "certificate verify failed" in str(caught.value)
    assert "\n" not in str(caught.value)
    with pytest.raises(ServiceUnavailable, match="certificate verify failed"):
        Management(untrusting).connections()


async def test_without_a_client_certificate_the_broker_refuses(tls_settings: Settings) -> None:
    anonymous = tls_settings.model_copy(update={"tls_cert_file": None, "tls_key_file": None})
    with pytest.raises(ServiceUnavailable) as caught:
        await connect_amqp(anonymous, "test-anonymous")
    assert str(caught.value).startswith("RabbitMQ at amqps://guest:***@localhost:")
    assert "\n" not in str(caught.value)


def test_unusable_tls_files_stop_a_worker_at_once_in_one_line(
    tls_settings: Settings, tmp_path: Path
) -> None:
    not_a_certificate = tmp_path / "ca.pem"
    not_a_certificate.write_text("not a certificate\n")
    env = child_environment(tls_settings, HASHQ_TLS_CA_FILE=str(not_a_certificate))
    done = subprocess.run(
        [sys.executable, "-m", "hashq.worker.cli", "tests.support.handlers:record"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "TLS files cannot be used" in lines[0], done.stderr
