"""pytest fixtures for testing an app against real RabbitMQ and ZooKeeper (``pip install hashq``
registers them; no import needed). Each test gets a RabbitMQ vhost and a ZooKeeper root of its
own, deleted afterwards, so tests cannot see each other. hashq's own tests use the same helpers.

- ``hashq_servers`` (session): where the servers are: ``HASHQ_TEST_AMQP_URL`` (without a
  vhost), ``HASHQ_TEST_MANAGEMENT_URL`` and ``HASHQ_TEST_ZK_HOSTS`` if set; else servers on
  localhost's usual ports if they answer; else RabbitMQ and ZooKeeper started in containers for
  the session (``pip install 'hashq[testing]'`` and a Docker engine; stopped at the end). With
  none of these, the tests that use them are skipped, or fail under ``CI=true``.
- ``hashq_settings``: ``WorkerSettings`` for this test's vhost and root (app ``test``, 8 buckets).
- ``hashq_app``: the same, with the app's topology created (``hashq init``).

For a handler alone, with no servers at all, ``hashq.testing.run`` is faster.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pytest

if TYPE_CHECKING:  # imported where used: pytest loads this plugin in every run, tests or not
    from kazoo.client import KazooClient

    from hashq._io.management import Management
    from hashq.settings import WorkerSettings

__all__ = ["Servers", "isolated_vhost", "isolated_zk_root", "settings_for", "start_containers"]

RABBIT_IMAGE = "rabbitmq:4.1-management"
ZK_IMAGE = "zookeeper:3.9"


@dataclass(frozen=True)
class Servers:
    """Where the test servers are: an AMQP URL ending in ``/`` (no vhost), the management API,
    ZooKeeper's hosts (no chroot)."""

    amqp_url: str
    management_url: str
    zk_hosts: str

    @classmethod
    def from_environment(cls) -> Servers:
        return cls(
            os.environ.get("HASHQ_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
            os.environ.get("HASHQ_TEST_MANAGEMENT_URL", "http://127.0.0.1:15672"),
            os.environ.get("HASHQ_TEST_ZK_HOSTS", "127.0.0.1:2181"),
        )

    def admin(self) -> Management:
        from hashq._io.management import Management
        from hashq.settings import Settings

        return Management(Settings(amqp_url=self.amqp_url, management_url=self.management_url))


@contextmanager
def isolated_vhost(servers: Servers) -> Iterator[str]:
    """A fresh vhost that the servers' user may use, deleted afterwards."""
    name = f"hashq-test-{uuid.uuid4().hex[:10]}"
    admin = servers.admin()
    path = f"/api/vhosts/{quote(name, safe='')}"
    admin.request("PUT", path, {})
    from hashq.settings import Settings

    user = Settings(amqp_url=servers.amqp_url).management_credentials[0]
    admin.request(
        "PUT",
        f"/api/permissions/{quote(name, safe='')}/{quote(user, safe='')}",
        {"configure": ".*", "write": ".*", "read": ".*"},
    )
    try:
        yield name
    finally:
        admin.request("DELETE", path, missing_ok=True)


@contextmanager
def isolated_zk_root(zk_hosts: str) -> Iterator[str]:
    """A fresh ZooKeeper path to use as chroot, deleted afterwards (with a new client: the test
    may have restarted ZooKeeper under the first)."""
    root = f"/hashq-tests/{uuid.uuid4().hex[:10]}"
    _on_zk(zk_hosts, lambda client: client.ensure_path(root))
    try:
        yield root
    finally:
        _on_zk(zk_hosts, lambda client: client.delete(root, recursive=True))


def settings_for(servers: Servers, vhost: str, zk_root: str, **overrides: object) -> WorkerSettings:
    """Settings that reach the servers at ``vhost`` and ``zk_root`` (app ``test``, 8 buckets)."""
    from hashq.settings import WorkerSettings

    given: dict[str, object] = {"app": "test", "buckets": 8, **overrides}
    return WorkerSettings(
        amqp_url=servers.amqp_url + quote(vhost, safe=""),
        management_url=servers.management_url,
        zk_hosts=servers.zk_hosts + zk_root,
        **given,  # type: ignore[arg-type]
    )


def _on_zk(hosts: str, action: Callable[[KazooClient], object]) -> None:
    from kazoo.client import KazooClient

    client = KazooClient(hosts=hosts, timeout=10)
    client.start(timeout=10)
    try:
        action(client)
    finally:
        client.stop()
        client.close()


def answers(servers: Servers) -> str | None:
    """None if both servers answer, else why not."""
    try:
        servers.admin().request("GET", "/api/overview")
        _on_zk(servers.zk_hosts, lambda client: client.get_children("/"))
    except Exception as exc:  # whatever a server that is not there raises
        return str(exc)
    return None


def start_containers() -> tuple[Servers, Callable[[], None]] | None:
    """RabbitMQ (with the plugins hashq needs) and ZooKeeper in containers, and how to stop
    them; None without testcontainers or a Docker engine."""
    if not _docker_answers():
        return None
    try:
        from testcontainers.core.container import DockerContainer
    except ImportError:
        return None
    plugins = Path(tempfile.mkdtemp()) / "enabled_plugins"
    plugins.write_text("[rabbitmq_management,rabbitmq_consistent_hash_exchange].\n")
    rabbit: Any = (
        DockerContainer(RABBIT_IMAGE)
        .with_exposed_ports(5672, 15672)
        .with_volume_mapping(str(plugins), "/etc/rabbitmq/enabled_plugins")
    )
    zookeeper: Any = DockerContainer(ZK_IMAGE).with_exposed_ports(2181)
    rabbit.start()
    zookeeper.start()
    host = rabbit.get_container_host_ip()
    servers = Servers(
        f"amqp://guest:guest@{host}:{rabbit.get_exposed_port(5672)}/",
        f"http://{host}:{rabbit.get_exposed_port(15672)}",
        f"{zookeeper.get_container_host_ip()}:{zookeeper.get_exposed_port(2181)}",
    )
    deadline = time.monotonic() + 120
    while answers(servers) and time.monotonic() < deadline:  # RabbitMQ takes a while to boot
        time.sleep(1)

    def stop() -> None:
        for container in (rabbit, zookeeper):
            container.stop()

    return servers, stop


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        done = subprocess.run(["docker", "info"], capture_output=True, timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


@pytest.fixture(scope="session")
def hashq_servers() -> Iterator[Servers]:
    servers = Servers.from_environment()
    why = answers(servers)
    started = None
    if why and "HASHQ_TEST_AMQP_URL" not in os.environ:
        try:
            started = start_containers()
        except Exception as exc:  # an image that cannot be pulled, say
            why = f"{why}; containers did not start: {exc}"
    try:
        if started is not None:
            servers = started[0]
            why = answers(servers)
        if why:
            message = f"hashq_servers: RabbitMQ or ZooKeeper does not answer ({why})"
            if os.environ.get("CI") == "true":
                pytest.fail(message)
            pytest.skip(message)
        yield servers
    finally:
        if started is not None:
            started[1]()


@pytest.fixture
def hashq_settings(hashq_servers: Servers) -> Iterator[WorkerSettings]:
    with isolated_vhost(hashq_servers) as vhost, isolated_zk_root(hashq_servers.zk_hosts) as root:
        yield settings_for(hashq_servers, vhost, root)


@pytest.fixture
def hashq_app(hashq_settings: WorkerSettings) -> WorkerSettings:
    """A plain fixture (``asyncio.run``), so that it serves sync tests and async ones in any
    pytest-asyncio mode."""
    from hashq.provision import ensure_topology

    asyncio.run(ensure_topology(hashq_settings))
    return hashq_settings
