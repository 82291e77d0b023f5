"""Fixtures: real RabbitMQ and ZooKeeper for every integration test, each test in its own
RabbitMQ vhost and its own ZooKeeper root, so tests cannot see each other."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from hashq._io.management import Management
from hashq.pytest_plugin import Servers, isolated_vhost, isolated_zk_root
from hashq.settings import Settings
from tests.support.grants import Grants
from tests.support.services import Endpoints, find_endpoints
from tests.support.workers import SESSION, StartWorker, WorkerProcess, start_coordinator


@pytest.fixture(scope="session")
def endpoints() -> Iterator[Endpoints]:
    found = find_endpoints()
    if found is None:
        message = (
            "no RabbitMQ and ZooKeeper: set HASHQ_TEST_AMQP_URL and HASHQ_TEST_ZK_HOSTS, "
            "start a Docker engine, or let tools/services.sh install them (as root)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    yield found
    if found.cleanup is not None:
        found.cleanup()


@pytest.fixture
def vhost(endpoints: Endpoints) -> Iterator[str]:
    """A fresh vhost that the test's user may use, deleted afterwards (the fixtures hashq ships
    for its users' tests do the same: ``hashq.pytest_plugin``)."""
    servers = Servers(endpoints.amqp_url, endpoints.management_url, endpoints.zk_hosts)
    with isolated_vhost(servers) as name:
        yield name


@pytest.fixture
def zk_root(endpoints: Endpoints) -> Iterator[str]:
    """A fresh ZooKeeper path used as chroot, deleted afterwards."""
    with isolated_zk_root(endpoints.zk_hosts) as root:
        yield root


@pytest.fixture
def settings(endpoints: Endpoints, vhost: str, zk_root: str) -> Settings:
    return Settings(
        amqp_url=endpoints.amqp_url + quote(vhost, safe=""),
        zk_hosts=endpoints.zk_hosts + zk_root,
        management_url=endpoints.management_url,
        app="t",
        buckets=8,
        queue_type="quorum",
        connect_timeout=10,
    )


@pytest.fixture
def management(settings: Settings) -> Management:
    return Management(settings)


@pytest.fixture
async def initialized(settings: Settings) -> AsyncIterator[Settings]:
    """``settings`` whose topology has been created."""
    from hashq.provision import ensure_topology

    await ensure_topology(settings)
    yield settings


@pytest.fixture
def record(tmp_path: Path) -> Path:
    """Where the test handlers append one JSON line per execution."""
    return tmp_path / "executions.jsonl"


@pytest.fixture
def grants(initialized: Settings) -> Iterator[Grants]:
    writer = Grants(initialized.zk_hosts, initialized.app)
    yield writer
    writer.close()


@pytest.fixture
def start_worker(initialized: Settings, record: Path, tmp_path: Path) -> Iterator[StartWorker]:
    started: list[WorkerProcess] = []

    def start(
        worker_id: str, handler: str = "tests.support.handlers:record", **extra: str
    ) -> WorkerProcess:
        worker = WorkerProcess(initialized, worker_id, handler, record, tmp_path, extra)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under CI a skipped test is a failure: a test that cannot run there proves nothing, and a
    silent skip once hid every restart, TLS and cluster test."""
    if os.environ.get("CI") != "true":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped:
        names = ", ".join(report.nodeid for report in skipped[:10])
        print(f"\nCI: {len(skipped)} test(s) skipped, which CI counts as failed: {names}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def cluster(initialized: Settings, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start coordinators and workers; everything is killed at the end."""
    started: list[WorkerProcess] = []
    record = tmp_path / "executions.jsonl"

    def start(name: str, **extra: str) -> WorkerProcess:
        env = {"HASHQ_ZK_SESSION_TIMEOUT": SESSION, **extra}
        if name.startswith("c"):
            process = start_coordinator(initialized, name, tmp_path, env)
        else:
            process = WorkerProcess(
                initialized, name, "tests.support.handlers:record", record, tmp_path, env
            )
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


@pytest.fixture
def zk_view(initialized: Settings) -> Iterator[Grants]:
    reader = Grants(initialized.zk_hosts, initialized.app)
    yield reader
    reader.close()
