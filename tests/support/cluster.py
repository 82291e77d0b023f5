"""A three-node RabbitMQ cluster and a three-node ZooKeeper ensemble on loopback (failover tests).

Each member is one ``tools/services.sh`` invocation with its own ``HASHQ_SERVICES_DIR`` under
``base_dir`` and its own ports; the RabbitMQ members share one Erlang cookie and one epmd port.
Members are numbered from 0: member ``i`` is ``rabbit{i+1}@localhost`` on AMQP port ``5681+i``,
management port ``15681+i`` and ZooKeeper client port ``2191+i``. Needs the local services
(no Docker): the Debian packages rabbitmq-server and zookeeper, which the script installs as root.
The servers outlive a test process that dies (services.sh detaches them); ``up`` first stops what
a previous run left under the same ``base_dir``, so a fixed directory is safer than ``tmp_path``.

    cluster = LocalCluster(tmp_path)
    cluster.up()
    try:
        cluster.kill_rabbit(0)
        ...
        cluster.start_rabbit(0)
    finally:
        cluster.down()
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from tools import SERVICES_SCRIPT
from tools.polling import wait_until

SCRIPT = SERVICES_SCRIPT

AMQP_PORT = 5681
MANAGEMENT_PORT = 15681
ZK_CLIENT_PORT = 2191
ZK_PEER_PORT = 2891
ZK_ELECTION_PORT = 3891
EPMD_PORT = 4381
COOKIE = "HASHQLOCALCLUSTERCOOKIE"
SCRIPT_TIMEOUT = 300.0
_AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()
_INSTALLED = (Path("/usr/lib/rabbitmq/bin/rabbitmq-server"), Path("/usr/share/java/zookeeper.jar"))
_TOOLS = ("bash", "java", "epmd", "ss", "curl")


def cluster_possible() -> bool:
    """Whether this machine can run the cluster: the Debian packages are installed."""
    return all(path.exists() for path in _INSTALLED) and all(map(shutil.which, _TOOLS))


class ClusterError(RuntimeError):
    """A member did not start, stop or answer as expected."""


@dataclass(frozen=True)
class _Call:
    member: int
    command: str  # up, down or kill
    service: str  # rabbitmq or zookeeper


class LocalCluster:
    """Runs ``size`` RabbitMQ members and ``size`` ZooKeeper members through services.sh."""

    def __init__(self, base_dir: Path | str, size: int = 3) -> None:
        self.base_dir = Path(base_dir)
        self.size = size
        self.amqp_urls = [f"amqp://guest:guest@127.0.0.1:{AMQP_PORT + i}/" for i in range(size)]
        self.management_urls = [f"http://127.0.0.1:{MANAGEMENT_PORT + i}" for i in range(size)]
        self.zk_hosts = ",".join(f"127.0.0.1:{ZK_CLIENT_PORT + i}" for i in range(size))
        self.rabbit_nodes = [f"rabbit{i + 1}@localhost" for i in range(size)]
        self._rabbit_killed: set[int] = set()

    # ------------------------------------------------------------ whole cluster
    def up(self, timeout: float = 180.0) -> None:
        """Start every member from empty state and wait until the cluster and ensemble form.

        Whatever a previous run left under ``base_dir`` is stopped and removed first.
        """
        self.down()
        for member in range(self.size):
            shutil.rmtree(self._member_dir(member), ignore_errors=True)
        try:
            # ZooKeeper members must start together (a lone member cannot form a quorum);
            # RabbitMQ members join one at a time, each once the cluster it joins has fully
            # booted: a node joining while the seed still enables feature flags fails its
            # boot with schema_integrity_check_failed (seen about once in six starts).
            ensemble = [_Call(i, "up", "zookeeper") for i in range(self.size)]
            self._run([*ensemble, _Call(0, "up", "rabbitmq")])
            for member in range(1, self.size):
                self._run([_Call(member, "up", "rabbitmq")])
            self.wait_rabbit_running(self.size, timeout=timeout)
            # Members that just joined may not have enabled quorum queues yet: declaring one
            # there fails with "the corresponding feature flag is disabled".
            _wait(self._quorum_queues_enabled, timeout, "the quorum_queue feature flag")
            self.wait_zk_leader(timeout=timeout)
        except BaseException:
            self.down()
            raise

    def down(self) -> None:
        """Stop every member; afterwards no process or listener of the cluster is left."""
        services = ("rabbitmq", "zookeeper")
        self._run([_Call(i, "down", s) for s in services for i in range(self.size)])
        self._rabbit_killed.clear()
        _stop_idle_epmd()
        busy = [port for port in self.ports() if _listening(port)]
        if busy:
            raise ClusterError(f"ports still listening after down: {busy}")

    def ports(self) -> list[int]:
        """Every port the cluster listens on, for leak checks."""
        per_member = (AMQP_PORT, AMQP_PORT + 20000, MANAGEMENT_PORT, ZK_CLIENT_PORT)
        ports = [base + i for base in per_member for i in range(self.size)]
        return [*ports, *self._zk_quorum_ports(), EPMD_PORT]

    def __enter__(self) -> LocalCluster:
        self.up()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.down()

    # ------------------------------------------------------------ RabbitMQ
    def kill_rabbit(self, i: int) -> None:
        """SIGKILL member ``i``'s broker; its state stays on disk for ``start_rabbit``."""
        self._run([_Call(i, "kill", "rabbitmq")])
        self._rabbit_killed.add(i)

    def stop_rabbit(self, i: int) -> None:
        """Shut member ``i``'s broker down cleanly (``rabbitmqctl shutdown``): it closes its
        client connections first, and says so on its event exchange."""
        self._run([_Call(i, "down", "rabbitmq")])
        self._rabbit_killed.add(i)

    def start_rabbit(self, i: int, timeout: float = 120.0) -> None:
        """Restart member ``i``'s broker and wait until every live member reports it running."""
        self._run([_Call(i, "up", "rabbitmq")])
        self._rabbit_killed.discard(i)
        self.wait_rabbit_running(self.size - len(self._rabbit_killed), timeout=timeout)

    def rabbit_index(self, node: str) -> int:
        """The member index of a node name such as ``rabbit2@localhost`` (ValueError if none)."""
        return self.rabbit_nodes.index(node)

    def rabbit_running(self, via: int) -> list[str]:
        """Names of the nodes that member ``via``'s management API reports running."""
        nodes: list[dict[str, Any]] = self.management_get(via, "/api/nodes")
        return sorted(node["name"] for node in nodes if node.get("running"))

    def wait_rabbit_running(self, count: int, timeout: float = 120.0) -> None:
        """Wait until every live member sees ``count`` running nodes."""
        live = [i for i in range(self.size) if i not in self._rabbit_killed]
        _wait(lambda: all(len(self._try_running(i)) == count for i in live), timeout, "rabbit")

    def management_get(self, i: int, path: str) -> Any:
        """GET ``path`` (e.g. ``/api/queues``) from member ``i``'s management API, as JSON."""
        request = urllib.request.Request(self.management_urls[i] + path)
        request.add_header("Authorization", _AUTH)
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.load(response)

    def _quorum_queues_enabled(self) -> bool:
        try:
            flags = [self.management_get(i, "/api/feature-flags") for i in range(self.size)]
        except OSError:
            return False
        return all(
            any(f["name"] == "quorum_queue" and f["state"] == "enabled" for f in listed)
            for listed in flags
        )

    def _try_running(self, i: int) -> list[str]:
        try:
            return self.rabbit_running(i)
        except OSError:
            return []

    # ------------------------------------------------------------ ZooKeeper
    def keep_logs(self, folder: Path) -> None:
        """Copy every member's server logs into ``folder``: the next ``up`` wipes them."""
        for i in range(self.size):
            for service, logs in (("rabbitmq", "log"), ("zookeeper", "zookeeper.log")):
                source = self._member_dir(i) / service / logs
                target = folder / f"member{i + 1}-{service}"
                if source.is_dir():
                    shutil.copytree(source, target, dirs_exist_ok=True)
                elif source.is_file():
                    folder.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(source, target)

    def kill_zk(self, i: int) -> None:
        """SIGKILL member ``i``'s ZooKeeper; its data stays on disk for ``start_zk``."""
        self._run([_Call(i, "kill", "zookeeper")])

    def start_zk(self, i: int) -> None:
        """Restart member ``i``'s ZooKeeper and wait until it serves as leader or follower."""
        self._run([_Call(i, "up", "zookeeper")])

    def zk_mode(self, i: int) -> str | None:
        """``leader``, ``follower``, or None when member ``i`` does not serve."""
        reply = _four_letter_word(ZK_CLIENT_PORT + i, b"srvr")
        for line in reply.splitlines():
            if line.startswith("Mode: "):
                return line.removeprefix("Mode: ").strip()
        return None

    def zk_leader_index(self) -> int | None:
        """Which member says ``Mode: leader``, if any."""
        return next((i for i in range(self.size) if self.zk_mode(i) == "leader"), None)

    def wait_zk_leader(self, timeout: float = 60.0) -> int:
        """Wait until some member leads; return its index."""
        leader: list[int] = []

        def found() -> bool:
            index = self.zk_leader_index()
            leader[:] = [] if index is None else [index]
            return bool(leader)

        _wait(found, timeout, "zookeeper leader")
        return leader[0]

    # ------------------------------------------------------------ services.sh
    def _member_dir(self, i: int) -> Path:
        return self.base_dir / f"member{i + 1}"

    def _zk_quorum_ports(self) -> list[int]:
        return [base + i for base in (ZK_PEER_PORT, ZK_ELECTION_PORT) for i in range(self.size)]

    def _env(self, i: int) -> dict[str, str]:
        ensemble = ",".join(
            f"{m + 1}=127.0.0.1:{ZK_PEER_PORT + m}:{ZK_ELECTION_PORT + m}" for m in range(self.size)
        )
        member = {
            "HASHQ_SERVICES_MODE": "local",
            "HASHQ_SERVICES_DIR": str(self._member_dir(i)),
            "HASHQ_SERVICES_AMQP_PORT": str(AMQP_PORT + i),
            "HASHQ_SERVICES_MANAGEMENT_PORT": str(MANAGEMENT_PORT + i),
            "HASHQ_SERVICES_ZK_PORT": str(ZK_CLIENT_PORT + i),
            "HASHQ_SERVICES_EPMD_PORT": str(EPMD_PORT),
            "HASHQ_SERVICES_ERLANG_COOKIE": COOKIE,
            "HASHQ_SERVICES_RABBIT_NODE": self.rabbit_nodes[i],
            "HASHQ_SERVICES_ZK_ENSEMBLE": ensemble,
            "HASHQ_SERVICES_ZK_MYID": str(i + 1),
            "HASHQ_SERVICES_TLS": "0",  # the TLS tests use the single node
        }
        if i > 0:
            member["HASHQ_SERVICES_RABBIT_JOIN"] = self.rabbit_nodes[0]
        return {**os.environ, **member}

    def _run(self, calls: Sequence[_Call]) -> None:
        """Run the calls concurrently (ensemble members cannot start alone); raise if any fails."""
        running = [
            (
                call,
                subprocess.Popen(
                    ["bash", str(SCRIPT), call.command, call.service],
                    env=self._env(call.member),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                ),
            )
            for call in calls
        ]
        failures = [_finish(call, process) for call, process in running]
        problems = [problem for problem in failures if problem]
        if problems:
            raise ClusterError("; ".join(problems))


def _finish(call: _Call, process: subprocess.Popen[str]) -> str | None:
    try:
        _, stderr = process.communicate(timeout=SCRIPT_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate()
    if process.returncode == 0:
        return None
    return f"services.sh {call.command} {call.service} (member {call.member}): {stderr.strip()}"


def _wait(probe: Callable[[], bool], timeout: float, what: str) -> None:
    try:
        wait_until(probe, timeout, every=0.25, what=f"{what} ready")
    except TimeoutError as exc:
        raise ClusterError(str(exc)) from None


def _four_letter_word(port: int, word: bytes) -> str:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as connection:
            connection.sendall(word)
            chunks = []
            while chunk := connection.recv(4096):
                chunks.append(chunk)
    except OSError:
        return ""
    return b"".join(chunks).decode(errors="replace")


def _listening(port: int) -> bool:
    done = subprocess.run(
        ["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=False
    )
    return bool(done.stdout.strip())


def _stop_idle_epmd() -> None:
    """A member killed and never restarted skips its epmd cleanup in down; do it here."""
    if not shutil.which("epmd"):
        return
    names = subprocess.run(
        ["epmd", "-port", str(EPMD_PORT), "-names"], capture_output=True, text=True, check=False
    )
    if names.returncode == 0 and "\nname " not in names.stdout:
        subprocess.run(["epmd", "-port", str(EPMD_PORT), "-kill"], capture_output=True, check=False)
