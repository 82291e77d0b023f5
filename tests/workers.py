"""Worker processes for the tests, and the checker of what they recorded.

Workers run as real processes (``python -m hashq.worker_cli``), so that kill -9, SIGSTOP and
SIGTERM are real. The handlers in ``tests/handlers.py`` append one JSON line per execution.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hashq.settings import Settings


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
        module: str = "hashq.worker_cli",
    ) -> None:
        env = {key: value for key, value in os.environ.items() if not key.startswith("HASHQ_")}
        env.update(
            HASHQ_AMQP_URL=settings.amqp_url,
            HASHQ_ZK_HOSTS=settings.zk_hosts,
            HASHQ_MANAGEMENT_URL=settings.management_url,
            HASHQ_APP=settings.app,
            HASHQ_BUCKETS=str(settings.buckets),
            HASHQ_QUEUE_TYPE=settings.queue_type,
            HASHQ_DELIVERY_LIMIT=str(settings.delivery_limit),
            HASHQ_ZK_SESSION_TIMEOUT=str(settings.zk_session_timeout),
            HASHQ_WORKER_ID=worker_id,
            HASHQ_TEST_RECORD=str(record),
        )
        env.update(extra or {})
        self.worker_id = worker_id
        self.log = logs / f"{worker_id}.log"
        self._log_file = self.log.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, *([handler] if handler else [])],
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).resolve().parent.parent,
        )

    def signal(self, number: int) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, number)

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


@dataclass
class Report:
    """What the records say about order, overlap and loss."""

    executions: int = 0
    missing: list[tuple[str, int]] = field(default_factory=list)
    skipped_ahead: list[str] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    repeats: list[dict[str, Any]] = field(default_factory=list)


def start_coordinator(
    settings: Settings, name: str, logs: Path, extra: dict[str, str] | None = None
) -> WorkerProcess:
    """A ``hashq-coordinator`` process with a short settle window."""
    env = {"HASHQ_COORDINATOR_ID": name, "HASHQ_SETTLE": "0.5", **(extra or {})}
    return WorkerProcess(settings, name, "", logs / "unused", logs, env, "coordinator.cli")


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check(path: Path, expected: dict[str, int]) -> Report:
    """``expected``: key -> number of messages, numbered 0..n-1 in publish order.

    - missing: a message with no successful execution;
    - skipped_ahead: an execution of seq n before any execution of n-1 (reordering);
    - overlaps: two executions of one key overlapping in time;
    - repeats: executions of a seq already executed (at-least-once redeliveries).
    """
    report = Report()
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in read_records(path):
        if record["outcome"] == "ok":
            by_key[record["key"]].append(record)
            report.executions += 1
    for key, count in expected.items():
        runs = sorted(by_key.get(key, []), key=lambda r: r["start"])
        done: set[int] = set()
        latest: dict[str, Any] | None = None  # the run that ends last so far
        for run in runs:
            if latest is not None and run["start"] < latest["end"]:
                report.overlaps.append(f"{key}: {latest['seq']} and {run['seq']}")
            if latest is None or run["end"] > latest["end"]:
                latest = run
        for run in runs:
            seq = run["seq"]
            if seq in done:
                report.repeats.append(run)
            elif seq > 0 and seq - 1 not in done:
                report.skipped_ahead.append(f"{key}: {seq} before {seq - 1}")
            done.add(seq)
        report.missing.extend((key, seq) for seq in range(count) if seq not in done)
    return report


def wait_for_executions(path: Path, expected: dict[str, int], within: float) -> Report:
    """Wait until every expected message has a successful execution (or time runs out)."""
    deadline = time.monotonic() + within
    while True:
        report = check(path, expected)
        if not report.missing or time.monotonic() > deadline:
            return report
        time.sleep(0.25)
