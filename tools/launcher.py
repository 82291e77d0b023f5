"""The one process launcher of the tests and the tools: ``python -m <module> ...`` as a real
process (so that kill -9, SIGSTOP and SIGTERM are real), with the settings' environment (and
nothing else of the caller's ``HASHQ_*`` variables) and a log file of its own; a ``Fleet`` of
them by name. (What such a run created is removed by ``hashq.admin.apps``.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from hashq.settings import Settings
from tools import ROOT
from tools.polling import wait_until


def child_environment(settings: Settings, **extra: str) -> dict[str, str]:
    """This process's environment without its own ``HASHQ_`` variables, plus ``settings``'."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("HASHQ_")}
    return {**env, **settings.environment(), **extra}


def process_state(pid: int) -> str:
    """The process state letter from /proc (R, S, T, Z, ...); "" once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return ""
    return stat.rsplit(")", 1)[1].split()[0]


class Child:
    """One ``python <argv>`` process, run from the repository's root (where ``-m`` finds the
    tools and the tests), writing stdout and stderr to ``log``."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        self._log_file = log.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, *argv],
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, number: int) -> bool:
        """Send ``number``; False if the process had already exited."""
        if not self.alive:
            return False
        self.process.send_signal(number)
        return True

    def freeze(self, within: float = 5.0) -> bool:
        """SIGSTOP, then wait until the kernel reports the process stopped (the signal is
        delivered asynchronously: until then it may still start work). False if it exited or
        did not stop within ``within`` seconds."""
        if not self.signal(signal.SIGSTOP):
            return False
        stopped = wait_until(
            lambda: process_state(self.pid) in ("T", "t") or not self.alive,
            within,
            every=0.001,
            or_last=True,
        )
        return bool(stopped) and self.alive

    def wait(self, within: float) -> int | None:
        """Wait up to ``within`` seconds for the process to exit: its exit status, or None."""
        try:
            return self.process.wait(max(0.0, within))
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL (a frozen process too), and wait until it is gone."""
        self.signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        """Kill it if it still runs, and close its log."""
        self.kill()
        self._log_file.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


class Fleet:
    """Named children, each logging to ``<logs>/<name>.log``, each with ``HASHQ_WORKER_ID``
    set to its name."""

    def __init__(self, settings: Settings, logs: Path, extra: dict[str, str]) -> None:
        self._env = child_environment(settings, **extra)
        self._logs = logs
        self.processes: dict[str, Child] = {}

    def start(self, name: str, *argv: str, env: dict[str, str] | None = None) -> str:
        """Start ``python <argv>`` as ``name``, with ``env`` over the fleet's environment."""
        chosen = {**self._env, "HASHQ_WORKER_ID": name, **(env or {})}
        self.processes[name] = Child(name, list(argv), chosen, self._logs / f"{name}.log")
        return name

    def alive(self, prefix: str) -> list[str]:
        return [n for n, child in self.processes.items() if n.startswith(prefix) and child.alive]

    def signal(self, name: str, number: int) -> bool:
        return self.processes[name].signal(number)

    def stop_all(self, within: float = 45) -> None:
        """SIGCONT and SIGTERM to all, then SIGKILL to whatever is left after ``within``."""
        for child in self.processes.values():
            child.signal(signal.SIGCONT)
            child.signal(signal.SIGTERM)
        wait_until(lambda: not any(c.alive for c in self.processes.values()), within, or_last=True)
        for child in self.processes.values():
            child.stop()
