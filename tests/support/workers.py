"""Worker processes for the tests, and the checker of what they recorded.

Workers run as real processes (``python -m hashq.worker.cli``), so that kill -9, SIGSTOP and
SIGTERM are real. The handlers in ``tests/support/handlers.py`` append one JSON line per execution.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hashq.settings import Settings
from tests.support.helpers import child_environment
from tools import ROOT
from tools.checker import Report, check, read_records
from tools.launcher import process_state

__all__ = [
    "SESSION",
    "Report",
    "StartWorker",
    "WorkerProcess",
    "check",
    "read_records",
    "start_coordinator",
    "stop_cleanly",
    "wait_for_executions",
]


SESSION = "2"  # seconds: short ZooKeeper sessions make failover quick to test


class WorkerProcess:
    """A ``hashq-worker`` (or, with ``module``, another hashq command) as a real process."""

    def __init__(
        self,
        settings: Settings,
        worker_id: str,
        handler: str,
        record: Path,
        logs: Path,
        extra: dict[str, str] | None = None,
        module: str = "hashq.worker.cli",
    ) -> None:
        env = child_environment(
            settings, HASHQ_WORKER_ID=worker_id, HASHQ_TEST_RECORD=str(record), **(extra or {})
        )
        self.worker_id = worker_id
        self.log = logs / f"{worker_id}.log"
        self._log_file = self.log.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, *([handler] if handler else [])],
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )

    def signal(self, number: int) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, number)

    def stop_process(self, within: float = 5) -> float:
        """SIGSTOP, then wait until the kernel reports the process stopped; returns that time.
        Until then the process may still start work: the signal is delivered asynchronously."""
        self.signal(signal.SIGSTOP)
        deadline = time.monotonic() + within
        while process_state(self.process.pid) not in ("T", "t"):
            assert time.monotonic() < deadline, "the process did not stop"
            time.sleep(0.001)
        return time.time()

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.process.wait(10)

    def wait(self, within: float) -> int:
        return self.process.wait(within)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.signal(signal.SIGKILL)
            self.process.wait(10)
        self._log_file.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def stop_cleanly(worker: WorkerProcess, *others: WorkerProcess) -> None:
    """SIGTERM ``worker``, which must drain and exit 0; then stop it and ``others`` for good."""
    try:
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.output()[-2000:]
    finally:
        for process in (worker, *others):
            process.stop()


def start_coordinator(
    settings: Settings, name: str, logs: Path, extra: dict[str, str] | None = None
) -> WorkerProcess:
    """A ``hashq-coordinator`` process with a short settle window."""
    env = {"HASHQ_COORDINATOR_ID": name, "HASHQ_SETTLE": "0.5", **(extra or {})}
    return WorkerProcess(settings, name, "", logs / "unused", logs, env, "hashq_coordinator.cli")


def wait_for_executions(path: Path, expected: dict[str, int], within: float) -> Report:
    """Wait until every expected message has a successful execution (or time runs out)."""
    deadline = time.monotonic() + within
    while True:
        report = check(path, expected)
        if not report.missing or time.monotonic() > deadline:
            return report
        time.sleep(0.25)


StartWorker = Callable[..., WorkerProcess]  # the ``start_worker`` fixture: id, handler, env
