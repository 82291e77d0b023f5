"""Processes started for a demo, a chaos run or a benchmark: each one gets the settings'
environment (and nothing else of the caller's ``HASHQ_*`` variables), its own log file and a
name by which it can be signalled later. And the removal of what such a run created."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hashq._io.amqp import connect_amqp, connection_name
from hashq._io.zk import close_zk, connect_zk
from hashq.settings import Settings
from hashq.topology import Topology


def process_state(pid: int) -> str:
    """The process state letter from /proc (R, S, T, Z, ...); "" once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return ""
    return stat.rsplit(")", 1)[1].split()[0]


class Fleet:
    """Named child processes; ``python -m <module> ...`` each, logging to ``<logs>/<name>.log``."""

    def __init__(
        self, settings: Settings, logs: Path, extra: dict[str, str], cwd: Path | None = None
    ) -> None:
        self._env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("HASHQ_")},
            **settings.environment(),
            **extra,
        }
        self._logs = logs
        self._cwd = cwd  # where ``-m`` finds modules outside the installed package
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *argv: str) -> str:
        log = (self._logs / f"{name}.log").open("ab")
        self.processes[name] = subprocess.Popen(
            [sys.executable, *argv],
            env={**self._env, "HASHQ_WORKER_ID": name},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self._cwd,
        )
        return name

    def alive(self, prefix: str) -> list[str]:
        return [
            name
            for name, process in self.processes.items()
            if name.startswith(prefix) and process.poll() is None
        ]

    def signal(self, name: str, number: int) -> bool:
        """Send ``number`` to ``name``; False if it had already exited."""
        if self.processes[name].poll() is not None:
            return False
        self.processes[name].send_signal(number)
        return True

    def frozen(self, name: str, within: float = 5.0) -> bool:
        """Whether ``name`` is stopped (SIGSTOP) within ``within`` seconds: the signal is
        delivered asynchronously, so a process may still run a little after it was sent."""
        deadline = time.monotonic() + within
        while process_state(self.processes[name].pid) not in ("T", "t"):
            if time.monotonic() > deadline or self.processes[name].poll() is not None:
                return False
            time.sleep(0.001)
        return True

    def wait(self, name: str, within: float) -> bool:
        """Wait up to ``within`` seconds for ``name`` to exit; True if it did."""
        try:
            self.processes[name].wait(max(0.0, within))
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop_all(self, within: float = 45) -> None:
        """SIGCONT and SIGTERM to all, then SIGKILL to whatever is left after ``within``."""
        for name in self.processes:
            self.signal(name, signal.SIGCONT)
            self.signal(name, signal.SIGTERM)
        deadline = time.monotonic() + within
        for process in self.processes.values():
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


async def remove(settings: Settings, queues: list[str], exchanges: list[str], zk_path: str) -> None:
    """Delete a run's queues, exchanges and ZooKeeper subtree, so that runs do not pile up."""
    connection = await connect_amqp(settings, connection_name("cleanup"))
    async with connection:
        channel = await connection.channel()
        for queue in queues:
            await channel.queue_delete(queue)
        for exchange in exchanges:
            await channel.exchange_delete(exchange)
    zk = await asyncio.to_thread(connect_zk, settings)
    try:
        await asyncio.to_thread(zk.delete, zk_path, recursive=True)
    finally:
        await asyncio.to_thread(close_zk, zk)


async def remove_app(settings: Settings) -> None:
    """Delete a hashq app: its queues, exchanges and ZooKeeper state."""
    topology = Topology.from_settings(settings)
    await remove(
        settings,
        [*topology.bucket_queues(), topology.dead_letter_queue],
        [topology.exchange, topology.ring_exchange, topology.dead_letter_exchange],
        topology.zk_root,
    )
