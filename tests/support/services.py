"""Finding real RabbitMQ and ZooKeeper servers for the tests.

In order: the addresses in ``HASHQ_TEST_AMQP_URL`` / ``HASHQ_TEST_ZK_HOSTS`` (and
``HASHQ_TEST_MANAGEMENT_URL``); containers through testcontainers where a Docker engine
answers; the project's ``tools/services.sh``. Only the last can restart a server, so tests
that restart one skip elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools import SERVICES_SCRIPT
from tools.broker_env import rabbit_eval
from tools.polling import wait_until

SCRIPT = SERVICES_SCRIPT
RABBIT_IMAGE = "rabbitmq:4.1-management"
ZK_IMAGE = "zookeeper:3.9"


@dataclass(frozen=True)
class TlsEndpoints:
    """The broker's TLS listeners, and the files of the CA and the client certificate that
    ``tools/services.sh`` made for them."""

    amqps_port: int
    management_port: int
    ca_file: Path
    client_cert_file: Path
    client_key_file: Path

    @classmethod
    def from_script_env(cls, env: dict[str, str]) -> TlsEndpoints | None:
        folder = env.get("HASHQ_SERVICES_TLS_DIR")
        if folder is None or not (Path(folder) / "client.pem").is_file():
            return None
        return cls(
            int(env["HASHQ_SERVICES_AMQPS_PORT"]),
            int(env["HASHQ_SERVICES_MANAGEMENT_TLS_PORT"]),
            Path(folder) / "ca.pem",
            Path(folder) / "client.pem",
            Path(folder) / "client.key",
        )


@dataclass
class Endpoints:
    """Where the servers are, and (for local ones) how to restart them."""

    amqp_url: str  # with the default vhost; tests add their own
    zk_hosts: str
    management_url: str
    source: str
    restart: Callable[[str], None] | None = None  # "rabbitmq" or "zookeeper"
    stop: Callable[[str], None] | None = None
    start: Callable[[str], None] | None = None
    cleanup: Callable[[], None] | None = None
    tls: TlsEndpoints | None = None
    rabbit_eval: Callable[[str], str] | None = None  # an Erlang expression in the broker


def from_environment() -> Endpoints | None:
    amqp, zk = os.environ.get("HASHQ_TEST_AMQP_URL"), os.environ.get("HASHQ_TEST_ZK_HOSTS")
    if not (amqp and zk):
        return None
    management = os.environ.get("HASHQ_TEST_MANAGEMENT_URL", "http://127.0.0.1:15672")
    return Endpoints(amqp.rstrip("/") + "/", zk, management, "environment")


def from_script() -> Endpoints | None:
    if shutil.which("bash") is None:
        return None
    done = subprocess.run(["bash", str(SCRIPT), "up"], capture_output=True, text=True)
    if done.returncode != 0:
        return None
    env = dict(line.removeprefix("export ").split("=", 1) for line in _script("env").splitlines())

    def control(action: str) -> Callable[[str], None]:
        def run(service: str) -> None:
            _script(action, service)

        return run

    return Endpoints(
        env["HASHQ_AMQP_URL"],
        env["HASHQ_ZK_HOSTS"],
        env["HASHQ_MANAGEMENT_URL"],
        "tools/services.sh",
        restart=control("restart"),
        stop=control("down"),
        start=control("up"),
        tls=TlsEndpoints.from_script_env(env),
        rabbit_eval=rabbit_eval,
    )


def _script(*args: str) -> str:
    done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, check=True)
    return done.stdout


def from_containers() -> Endpoints | None:
    if os.environ.get("HASHQ_SERVICES_MODE") == "local" or not _docker_answers():
        return None
    from testcontainers.core.container import DockerContainer

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
    endpoints = Endpoints(
        f"amqp://guest:guest@{host}:{rabbit.get_exposed_port(5672)}/",
        f"{zookeeper.get_container_host_ip()}:{zookeeper.get_exposed_port(2181)}",
        f"http://{host}:{rabbit.get_exposed_port(15672)}",
        "testcontainers",
        cleanup=lambda: _stop_all(rabbit, zookeeper),
    )
    _wait_for_management(endpoints.management_url, seconds=120)
    return endpoints


def _stop_all(*containers: Any) -> None:
    for container in containers:
        container.stop()


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        done = subprocess.run(["docker", "info"], capture_output=True, timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def _wait_for_management(url: str, seconds: float) -> None:
    request = urllib.request.Request(f"{url}/api/overview")
    request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")  # guest:guest

    def answers() -> bool:
        try:
            with urllib.request.urlopen(request, timeout=3):
                return True
        except OSError:
            return False

    wait_until(answers, seconds, every=1, what=f"the management API at {url}")


def find_endpoints() -> Endpoints | None:
    for source in (from_environment, from_containers, from_script):
        endpoints = source()
        if endpoints is not None:
            return endpoints
    return None
