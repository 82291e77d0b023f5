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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hashq.pytest_plugin import start_containers
from tools import SERVICES_SCRIPT
from tools.broker_env import rabbit_eval

SCRIPT = SERVICES_SCRIPT


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
    pause: Callable[[str], None] | None = None  # SIGSTOP "rabbitmq": it answers nothing
    resume: Callable[[str], None] | None = None
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
        pause=control("pause"),
        resume=control("resume"),
        tls=TlsEndpoints.from_script_env(env),
        rabbit_eval=rabbit_eval,
    )


def _script(*args: str) -> str:
    done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, check=True)
    return done.stdout


def from_containers() -> Endpoints | None:
    """Containers where a Docker engine answers (``hashq.pytest_plugin``, as users get them)."""
    if os.environ.get("HASHQ_SERVICES_MODE") == "local":
        return None
    started = start_containers()
    if started is None:
        return None
    servers, stop = started
    return Endpoints(
        servers.amqp_url, servers.zk_hosts, servers.management_url, "testcontainers", cleanup=stop
    )


def find_endpoints() -> Endpoints | None:
    for source in (from_environment, from_containers, from_script):
        endpoints = source()
        if endpoints is not None:
            return endpoints
    return None
