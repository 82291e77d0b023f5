"""The control plane at scale on the real servers: ``python -m tools.bench.control``.

A real coordinator (``hashq-coordinator``, a process of its own) leads ``--workers`` stand-in
workers over ``--buckets`` buckets (classic queues) on the configured ZooKeeper and RabbitMQ.
The stand-ins (``StandIns``, all in this process, on one ZooKeeper session) follow the worker's
side of the ZooKeeper protocol (docs/protocol.md) and nothing more: each registers an
incarnation, watches its assignment, releases at once every bucket taken from it (a drain of
nothing), and on a clean stop releases what it holds, then deregisters. They hold no AMQP
connection, so the broker tells the leader at once that a stopped one has none left.

Reported for a cold start (every stand-in registering at once), ``--joining`` more joining at
once, and a rolling restart of all of them (each stopped, registered again as a new
incarnation, then the next): the time from the change to the last grant a stand-in saw, how
long each bucket that moved went without an owner (from its release to its next grant), and
the coordinator's CPU. The simulated twin is ``tools.sim.scale``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.recipe.watchers import DataWatch

from hashq.admin.apps import remove_app
from hashq.provision import ensure_topology
from hashq.records import (
    BROKER_CONTACT_SECONDS,
    Assignment,
    Paths,
    Registration,
    Release,
    worker_connection_name,
)
from hashq.settings import Settings, load_settings
from tools.bench.rig import cpu_seconds
from tools.launcher import Fleet
from tools.polling import wait_until

SETTLE_WITHIN = 300.0
IDLE_SECONDS = 10.0


class StandIns:
    """Stand-in workers on one ZooKeeper session; each bucket's releases and grants, timed."""

    def __init__(self, zk: KazooClient, paths: Paths, session_timeout: float) -> None:
        self._zk, self._paths, self._session = zk, paths, session_timeout
        self._lock = threading.Lock()  # the watches' thread and the caller's
        self.incarnations: dict[str, str] = {}  # worker id -> its incarnation ("": stopped)
        self.held: dict[str, dict[int, int]] = {}  # worker id -> bucket -> epoch
        self.released_at: dict[int, float] = {}  # bucket -> when it was last released
        self.gaps: list[float] = []  # seconds from a bucket's release to its next grant
        self.last_grant = 0.0
        self.failed_releases = 0
        self._watching: set[str] = set()

    def register(self, worker: str) -> None:
        incarnation = uuid.uuid4().hex[:8]
        registration = Registration(
            worker,
            incarnation,
            1,
            connection=worker_connection_name(worker, incarnation),
            drain_timeout=5.0,
            session_timeout=self._session,
            contact_seconds=BROKER_CONTACT_SECONDS,
        )
        with self._lock:
            self.incarnations[worker], self.held[worker] = incarnation, {}
        if worker not in self._watching:  # one watch per worker id, for all its lives
            self._watching.add(worker)
            DataWatch(self._zk, self._paths.assignment(worker), self._reader(worker))
        self._zk.create(self._paths.worker(worker), registration.encode(), ephemeral=True)

    def register_all(self, workers: list[str]) -> None:
        for worker in workers:
            self.register(worker)

    def stop(self, worker: str) -> None:
        """Release every bucket held, then deregister (a worker's clean stop)."""
        with self._lock:
            ended = self.held.pop(worker, {})
            incarnation, self.incarnations[worker] = self.incarnations[worker], ""
        self._release(worker, incarnation, ended)
        self._zk.delete(self._paths.worker(worker))

    def _reader(self, worker: str) -> Callable[[bytes | None, Any], None]:
        def read(data: bytes | None, _: Any) -> None:
            if data:
                self._assigned(worker, Assignment.decode(data))

        return read

    def _assigned(self, worker: str, assignment: Assignment) -> None:
        with self._lock:
            now = time.monotonic()
            incarnation = self.incarnations.get(worker, "")
            if not incarnation or assignment.incarnation != incarnation:
                return
            held = self.held.setdefault(worker, {})
            grants = assignment.grants
            ended = {b: e for b, e in held.items() if grants.get(b) != e}
            for bucket, epoch in grants.items():
                if held.get(bucket) != epoch:
                    self.last_grant = now
                    if bucket in self.released_at:
                        self.gaps.append(now - self.released_at.pop(bucket))
            self.held[worker] = dict(grants)
        self._release(worker, incarnation, ended)

    def _release(self, worker: str, incarnation: str, ended: dict[int, int]) -> None:
        if not ended:
            return
        transaction = self._zk.transaction()
        for bucket, epoch in ended.items():
            release = Release(worker, incarnation, bucket, epoch)
            transaction.create(self._paths.release(bucket, epoch), release.encode())
        with self._lock:
            self.released_at.update(dict.fromkeys(ended, time.monotonic()))
        # Not waited for: every stand-in's watch runs on kazoo's one callback thread.
        transaction.commit_async().rawlink(self._committed)

    def _committed(self, result: Any) -> None:
        try:
            failed = any(isinstance(answer, Exception) for answer in result.get())
        except Exception:
            failed = True
        if failed:
            with self._lock:
                self.failed_releases += 1

    def balanced(self, buckets: int) -> bool:
        """Every bucket held by a live stand-in, shares within one of each other."""
        with self._lock:
            counts = [len(self.held.get(w, {})) for w, i in self.incarnations.items() if i]
        return sum(counts) == buckets and max(counts) - min(counts) <= 1


class Bench:
    def __init__(self, settings: Settings, zk: KazooClient, coordinator: int) -> None:
        self.settings, self.coordinator = settings, coordinator
        self.stand_ins = StandIns(zk, Paths(settings.app), settings.zk_session_timeout)

    def step(self, what: str, change: Callable[[], None]) -> None:
        began, cpu = time.monotonic(), cpu_seconds(self.coordinator)
        self.stand_ins.gaps.clear()
        change()
        changed = time.monotonic() - began
        buckets = self.settings.buckets
        wait_until(lambda: self.stand_ins.balanced(buckets), SETTLE_WITHIN, what=what, every=0.1)
        spent = cpu_seconds(self.coordinator) - cpu
        if self.stand_ins.failed_releases:
            raise SystemExit(f"{what}: {self.stand_ins.failed_releases} release writes failed")
        gaps = sorted(self.stand_ins.gaps)
        without = (
            f"; a moved bucket without an owner: median {1000 * statistics.median(gaps):.0f} ms, "
            f"p99 {1000 * gaps[len(gaps) * 99 // 100]:.0f} ms, max {1000 * gaps[-1]:.0f} ms"
            if gaps
            else ""
        )
        print(
            f"{what} (made in {changed:.2f} s): last grant "
            f"{self.stand_ins.last_grant - began:.2f} s after it began, "
            f"the coordinator's CPU {spent:.1f} s{without}",
            flush=True,
        )

    def idle(self, seconds: float) -> None:
        cpu = cpu_seconds(self.coordinator)
        time.sleep(seconds)
        share = (cpu_seconds(self.coordinator) - cpu) / seconds
        print(f"nothing changing for {seconds:g} s: the coordinator's CPU {share:.0%} of a core")

    def rolling_restart(self, workers: list[str]) -> None:
        for worker in workers:
            self.stand_ins.stop(worker)
            self.stand_ins.register(worker)


def measure(settings: Settings, workers: int, joining: int, logs: Path) -> None:
    asyncio.run(ensure_topology(settings))
    fleet = Fleet(settings, logs, {})
    zk = KazooClient(hosts=settings.zk_hosts, timeout=settings.zk_session_timeout)
    zk.start()
    try:
        fleet.start("coordinator-1", "-m", "hashq_coordinator.cli", "--coordinator-id", "c1")
        bench = Bench(settings, zk, fleet.processes["coordinator-1"].pid)
        wait_until(lambda: zk.exists(Paths(settings.app).leader), 60, what="a leader")
        names = [f"standin-{n:05d}" for n in range(workers + joining)]
        print(f"{workers:,} stand-in workers, {settings.buckets:,} buckets, 1 coordinator")
        bench.step("cold start", lambda: bench.stand_ins.register_all(names[:workers]))
        bench.idle(IDLE_SECONDS)
        bench.step(
            f"{joining} joining at once",
            lambda: bench.stand_ins.register_all(names[workers:]),
        )
        bench.step(f"rolling restart of all {len(names):,}", lambda: bench.rolling_restart(names))
    finally:
        fleet.stop_all(30)
        zk.stop()
        asyncio.run(remove_app(settings))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.control", description=__doc__)
    parser.add_argument("--workers", type=int, default=1_000)
    parser.add_argument("--buckets", type=int, default=4_096)
    parser.add_argument("--joining", type=int, default=100)
    parser.add_argument("--logs", type=Path, default=Path("/tmp/hashq-bench-control"))
    args = parser.parse_args(argv)
    args.logs.mkdir(parents=True, exist_ok=True)
    app = f"control-{time.strftime('%H%M%S')}"
    settings = load_settings(app=app, buckets=args.buckets, queue_type="classic")
    measure(settings, args.workers, args.joining, args.logs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
