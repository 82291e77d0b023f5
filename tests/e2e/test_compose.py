"""docker-compose.yml's demo, without a Docker engine: each service of the "demo" profile run
here as a process, in the order its ``depends_on`` gives, with its command and environment as
the file writes them and its secrets as files in ``HASHQ_SECRETS_DIR``. Only what a container
would change is changed: the servers' addresses (this test's RabbitMQ vhost and ZooKeeper root),
one metrics port per process instead of the image's 9471 in each container, and the publisher
stops after a count. The health checks run as written (with that port), and the workers must
stop within the file's ``stop_grace_period`` on SIGTERM."""

from __future__ import annotations

import functools
import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import yaml

from hashq.settings import Settings
from tests.support.helpers import free_port, scrape, total
from tools import ROOT
from tools.launcher import Child, child_environment
from tools.polling import wait_until

PUBLISHED = 600
SECRETS = ("HASHQ_AMQP_URL", "HASHQ_MANAGEMENT_URL")
SERVERS = {"rabbitmq", "zookeeper"}  # started by the test's own services, not as processes


def demo_services() -> dict[str, dict[str, Any]]:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return {
        name: service
        for name, service in compose["services"].items()
        if "demo" in service.get("profiles", [])
    }


def image_metrics_port() -> int:
    match = re.search(r"HASHQ_METRICS_PORT=(\d+)", (ROOT / "Dockerfile").read_text())
    assert match, "the Dockerfile sets no HASHQ_METRICS_PORT"
    return int(match.group(1))


def in_order(services: dict[str, dict[str, Any]]) -> list[str]:
    """Each service after those it depends on."""
    done: list[str] = []
    while len(done) < len(services):
        ready = [
            name
            for name, service in services.items()
            if name not in done and set(service.get("depends_on", {})) <= {*done, *SERVERS}
        ]
        assert ready, f"depends_on has a cycle or names no service: {set(services) - set(done)}"
        done.extend(sorted(ready))
    return done


def argv_of(command: list[str]) -> list[str]:
    """A container's command as ``python`` arguments: an entry point becomes ``-m`` its
    module (pyproject.toml's [project.scripts])."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    program, *rest = command
    if program == "python":
        return rest
    return ["-m", scripts[program].split(":")[0], *rest]


def environment(
    settings: Settings, service: dict[str, Any], secrets: Path, port: int
) -> dict[str, str]:
    """The service's environment, with this test's servers: its secrets from files, as in
    the container (a variable would win over a file, so the settings' own are left out)."""
    env = child_environment(settings)
    for name in SECRETS:
        (secrets / name).write_text(env.pop(name))
    env.update({name: str(value) for name, value in service["environment"].items()})
    env.update(
        HASHQ_ZK_HOSTS=settings.zk_hosts,
        HASHQ_SECRETS_DIR=str(secrets),
        HASHQ_METRICS_PORT=str(port),
    )
    assert set(service["secrets"]) == set(SECRETS)
    return env


def healthy(service: dict[str, Any], port: int, image_port: int) -> bool:
    """The service's health check, as written, asking this process's port."""
    kind, *command = service["healthcheck"]["test"]
    assert kind == "CMD" and command[0] == "python"
    command = [part.replace(f":{image_port}/", f":{port}/") for part in command]
    done = subprocess.run([sys.executable, *command[1:]], capture_output=True, timeout=10)
    return done.returncode == 0


def test_the_compose_demo_runs_as_its_file_says(settings: Settings, tmp_path: Path) -> None:
    services = demo_services()
    image_port = image_metrics_port()
    ports = {name: free_port() for name in services}
    started: dict[str, Child] = {}
    try:
        for name in in_order(services):
            service = services[name]
            secrets = tmp_path / f"{name}-secrets"
            secrets.mkdir()
            argv = argv_of(service["command"])
            if name == "publisher":
                argv += ["--count", str(PUBLISHED), "--rate", "300"]
            env = environment(settings, service, secrets, ports[name])
            child = Child(name, argv, env, tmp_path / f"{name}.log")
            started[name] = child
            if service.get("restart") == "no":  # init: it must finish before the others
                assert child.wait(120) == 0, child.output()[-3000:]
        checked = [name for name in services if "healthcheck" in services[name]]
        for name in checked:
            check = functools.partial(healthy, services[name], ports[name], image_port)
            wait_until(check, 60, what=f"{name}'s health check")
        assert started["publisher"].wait(120) == 0, started["publisher"].output()[-3000:]
        workers = [name for name in services if name.startswith("worker")]
        wait_until(
            lambda: (
                sum(
                    total(scrape(ports[name]), "hashq_messages_processed_total") for name in workers
                )
                >= PUBLISHED
            ),
            120,
            what="every upload processed",
        )
        for name in workers:
            assert " ERROR " not in started[name].output(), started[name].output()[-3000:]
            grace = float(services[name]["stop_grace_period"].removesuffix("s"))
            started[name].signal(signal.SIGTERM)
            assert started[name].wait(grace) == 0, started[name].output()[-3000:]
    finally:
        for child in started.values():
            child.stop()
