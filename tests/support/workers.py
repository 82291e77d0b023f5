"""Worker and coordinator processes for the tests (``tools.launcher.Child``: real processes, so
that kill -9, SIGSTOP and SIGTERM are real), and waiting for what they executed. The handlers in
``tests/support/handlers.py`` append one JSON line per execution, which ``tools.checker`` judges.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path

from hashq.settings import Settings
from tests.support.grants import Grants
from tests.support.workload import publish, workload
from tools.checker import Verdict, check
from tools.executions import read_appended
from tools.launcher import Child, child_environment
from tools.polling import eventually, wait_until

__all__ = [
    "SESSION",
    "StartWorker",
    "Verdict",
    "WorkerProcess",
    "check",
    "kill_and_time_failover",
    "read_appended",
    "start_coordinator",
    "stop_cleanly",
    "two_busy_workers",
    "wait_for_executions",
]


SESSION = "2"  # seconds: short ZooKeeper sessions make failover quick to test


class WorkerProcess(Child):
    """A ``hashq-worker`` running ``handler`` (or, with ``module``, another hashq command)."""

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
        argv = ["-m", module, *([handler] if handler else [])]
        super().__init__(worker_id, argv, env, logs / f"{worker_id}.log")
        self.worker_id = worker_id

    def stop_process(self, within: float = 5) -> float:
        """SIGSTOP, and the time by which the kernel reported the process stopped."""
        if not self.freeze(within):
            raise AssertionError(f"{self.name} did not stop within {within:g}s")
        return time.time()


StartWorker = Callable[..., WorkerProcess]  # the ``start_worker`` fixture: id, handler, env


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


def wait_for_executions(path: Path, expected: dict[str, int], within: float) -> Verdict:
    """Wait until every expected message has a successful execution, or time runs out: the
    verdict on the records then."""
    return wait_until(
        lambda: check(path, expected), within, every=0.25, until=lambda v: not v.lost, or_last=True
    )


async def two_busy_workers(
    settings: Settings,
    cluster: Callable[..., WorkerProcess],
    record: Path,
    zk_view: Grants,
    keys: int,
    executed: int,
    **env: str,
) -> tuple[WorkerProcess, dict[str, int]]:
    """A coordinator, w1 and w2 sharing the buckets, ``keys`` keys of 30 messages published, and
    more than ``executed`` of them done; w1, still busy (20 ms handlers, 8 at once), and what
    was published. ``env`` goes to both workers."""
    cluster("c1")
    slow = {"HASHQ_TEST_DELAY_MS": "20", "HASHQ_CONCURRENCY": "8", **env}
    first = cluster("w1", **slow)
    cluster("w2", **slow)
    await eventually(lambda: zk_view.all_granted(settings.buckets, {"w1", "w2"}))
    messages, expected = workload(keys=keys, per_key=30)
    await publish(settings, messages)
    await eventually(lambda: len(read_appended(record)) > executed)
    return first, expected


async def kill_and_time_failover(
    settings: Settings,
    doomed: WorkerProcess,
    record: Path,
    expected: dict[str, int],
    zk_view: Grants,
) -> float:
    """Kill ``doomed`` (w1) with -9 while w2 works beside it: every message done, in order,
    never two at once, only w2 repeating what w1 had held; the seconds until the last of w1's
    buckets started a message on w2."""
    lost = {b for b, r in zk_view.records(settings.buckets).items() if r.owner == "w1"}
    doomed.kill()
    killed_at = time.time()
    report = await asyncio.to_thread(wait_for_executions, record, expected, 120)
    assert (report.lost, report.reordered, report.overlaps) == ([], [], [])
    for repeat in report.repeats:
        assert repeat["worker"] == "w2" and repeat["redelivered"]
    resumed = {
        int(r["bucket"]): float(r["start"]) - killed_at
        for r in sorted(read_appended(record), key=lambda r: -float(r["start"]))
        if r["bucket"] in lost and r["worker"] == "w2"
    }
    assert set(resumed) == lost
    return max(resumed.values())
