"""The control plane at scale, simulated: ``python -m tools.sim.scale``.

Runs the real coordinator and worker machines over the simulated servers with ``--workers``
workers and ``--buckets`` buckets, two coordinators, no faults and no messages, and reports,
in virtual seconds, the time to the last grant of:
- a cold start (every process started at once);
- ``--joining`` workers joining at once;
- a rolling restart of every worker, one at a time (each stopped cleanly, started again, and
  the next stopped once it has registered), as a deployment does it;
with the grants each made, and the real CPU the coordinators' machines spent deciding.

Virtual time counts the protocol's round trips and waits. ZooKeeper answers each request after
one modelled latency whatever its size, so the time the leader's reads take at this scale
(``tools.bench.zk_reads``) is not in it; ``tools.bench.control`` measures the same steps
against the real ZooKeeper.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from hashq_coordinator.machine.core import CoordinatorMachine
from hashq_coordinator.machine.events import Action, Event
from tools.sim.cluster import Cluster, Scenario
from tools.sim.coordinator import CoordinatorConfig
from tools.sim.worker import WorkerConfig

SETTLE_WITHIN = 120.0  # virtual seconds a step may take before the run gives up on it
CHECK_EVERY = 1.0  # virtual seconds between looks at whether the shares are balanced


@dataclass
class Decisions:
    """The coordinators' machines' CPU, over every event they handled."""

    seconds: dict[str, list[float]] = field(default_factory=dict)

    def timed(
        self, handle: Callable[[CoordinatorMachine, Event, float], list[Action]]
    ) -> Callable[[CoordinatorMachine, Event, float], list[Action]]:
        def timed_handle(machine: CoordinatorMachine, event: Event, now: float) -> list[Action]:
            began = time.process_time()
            try:
                return handle(machine, event, now)
            finally:
                spent = time.process_time() - began
                self.seconds.setdefault(type(event).__name__, []).append(spent)

        return timed_handle


class Scaled:
    """One cluster at scale, and when its leaders last granted a bucket."""

    def __init__(self, workers: int, buckets: int) -> None:
        quiet = replace(
            Scenario.draw(1, parking=False, resize=False),
            workers=workers,
            buckets=buckets,
            coordinators=2,
            keys=1,
            consumer_timeout=0.0,
            worker_configs=tuple(WorkerConfig() for _ in range(workers)),
            coordinator_config=CoordinatorConfig(),
            faults=(),
            slow_share=0.0,
            thread_share=0.0,
            stranded="",
            return_lag=0.0,
        )
        self.cluster = Cluster(quiet, [])
        self.world = self.cluster.world
        self.grants = 0
        self.last_grant = 0.0

    def _count_grants(self) -> None:
        made = sum(c.machine.grants_made for c in self.cluster.coordinators)
        if made != self.grants:
            self.grants, self.last_grant = made, self.world.now

    def run_for(self, seconds: float) -> None:
        self.world.run_until(self.world.now + seconds, self._count_grants)

    def settle(self, what: str) -> None:
        """Run until every bucket is granted to a live worker with even shares."""
        deadline = self.world.now + SETTLE_WITHIN
        while why := self.cluster.unbalanced():
            if self.world.now >= deadline:
                raise SystemExit(f"{what}: not settled after {SETTLE_WITHIN:g} s: {why}")
            self.run_for(CHECK_EVERY)

    def step(self, what: str, change: Callable[[], None]) -> None:
        began, grants = self.world.now, self.grants
        change()
        self.settle(what)
        print(
            f"{what}: last grant {self.last_grant - began:.2f} s after it began, "
            f"{self.grants - grants:,} grants"
        )

    def start(self) -> None:
        self.cluster.start()

    def join(self, count: int) -> None:
        first = len(self.cluster.workers)
        for index in range(first, first + count):
            self.cluster.worker_configs.append(WorkerConfig())
            self.cluster.start_worker(index)
        joiners = self.cluster.workers[first:]
        self._run_while(lambda: not all(w.machine.incarnation for w in joiners))

    def rolling_restart(self) -> None:
        """Each worker in turn stopped cleanly, started again once it has ended, and the next
        stopped once this one has registered; prints the spread of the steps' durations."""
        durations = []
        for index in range(len(self.cluster.workers)):
            began = self.world.now
            worker = self.cluster.workers[index]
            worker.stop()
            self._run_while(lambda w=worker: w.alive and not w.stopped)  # type: ignore[misc]
            self.cluster.restart_worker(index)
            self._run_while(lambda i=index: not self.cluster.workers[i].machine.incarnation)  # type: ignore[misc]
            durations.append(self.world.now - began)
        quantiles = statistics.quantiles(durations, n=100)
        print(
            f"  each worker's step (stop, end, start, register): median "
            f"{statistics.median(durations):.3f} s, p99 {quantiles[98]:.3f} s, "
            f"max {max(durations):.3f} s"
        )

    def _run_while(self, condition: Callable[[], bool]) -> None:
        deadline = self.world.now + SETTLE_WITHIN
        while condition():
            if self.world.now >= deadline:
                raise SystemExit("a worker did not end or register in time")
            self.run_for(0.01)


def measure(workers: int, buckets: int, joining: int) -> None:
    logging.disable(logging.CRITICAL)  # the machines' lines, thousands a second
    decisions = Decisions()
    original = CoordinatorMachine.handle
    CoordinatorMachine.handle = decisions.timed(original)  # type: ignore[method-assign,assignment]
    began = time.process_time()
    try:
        scaled = Scaled(workers, buckets)
        print(f"{workers:,} workers, {buckets:,} buckets, 2 coordinators (virtual seconds)")
        scaled.step("cold start", scaled.start)
        scaled.step(f"{joining} joining at once", lambda: scaled.join(joining))
        scaled.step(f"rolling restart of all {workers + joining:,}", scaled.rolling_restart)
    finally:
        CoordinatorMachine.handle = original  # type: ignore[method-assign]
        logging.disable(logging.NOTSET)
    print(
        f"the whole run: {time.process_time() - began:.0f} s CPU, {scaled.world.now:.0f} virtual s"
    )
    print("the coordinators' machines' CPU, by event (ms):")
    for name, spent in sorted(decisions.seconds.items(), key=lambda item: -sum(item[1])):
        print(f"  {name}: {len(spent):,} events, {1000 * sum(spent):,.0f} in all, {_spread(spent)}")


def _spread(seconds: list[float]) -> str:
    ms = sorted(1000 * s for s in seconds)
    return f"median {ms[len(ms) // 2]:.2f}, p99 {ms[len(ms) * 99 // 100]:.2f}, max {ms[-1]:.2f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.sim.scale", description=__doc__)
    parser.add_argument("--workers", type=int, default=1_000)
    parser.add_argument("--buckets", type=int, default=4_096)
    parser.add_argument("--joining", type=int, default=100)
    args = parser.parse_args(argv)
    measure(args.workers, args.buckets, args.joining)
    return 0


if __name__ == "__main__":
    sys.exit(main())
