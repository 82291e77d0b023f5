"""Resizes in the simulation: what ``hashq resize`` does (``hashq.admin.resize``), on virtual
time against the server models, driven by the production ``hashq.resizing.next_step``; and the
resizes a seed draws (when, to how many buckets, whether the resizer dies half way and when it
is run again, and what befalls an old bucket's owner at the barrier).

The switch is modelled as the real one is carried out: the new queues declared, a settle, the
entry exchange unbound (publishes are returned), one round trip per binding added, the entry
exchange bound again over the new count. Each step is a callback of its own, so a resizer
killed between two leaves the broker as a dead ``hashq resize`` would.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hashq.records import BucketRecord, Paths
from hashq.resizing import (
    SWITCH_SETTLE_SECONDS,
    Decision,
    ResizePhase,
    ResizeRecord,
    Step,
    next_step,
    passed_buckets,
)
from hashq.topology import Topology
from tools.sim.faults import Fault
from tools.sim.process import Process
from tools.sim.rabbit import Broker
from tools.sim.worker import PATHS
from tools.sim.world import World
from tools.sim.zoo import NoNode, ZkClient, ZkError, ZooKeeper

if TYPE_CHECKING:
    from tools.sim.cluster import Cluster

POLL_SECONDS = 0.5  # how often the resizer reads the passed nodes while it waits
REMARK_SECONDS = 30.0  # markers published again into the old buckets not passed by then
BARRIER_FAULTS = ("", "crash", "freeze", "amqp-partition", "coordinator-crash")


@dataclass(frozen=True)
class ResizePlan:
    """One ``hashq resize --buckets to`` a seed draws, started at ``at``; with ``dies_after``,
    the command is killed that long after it started and run again ``rerun_after`` later."""

    at: float
    to: int
    dies_after: float | None = None
    rerun_after: float = 0.0
    barrier_fault: str = ""  # what befalls an old bucket's owner once markers are out
    fault_for: float = 0.0


def draw_resizes(seed: int, buckets: int, horizon: float) -> tuple[ResizePlan, ...]:
    """None for a third of the seeds; else one or two resizes, each growing the count."""
    rng = random.Random(f"resize-{seed}")
    if rng.random() < 1 / 3:
        return ()
    plans, count = [], buckets
    at = rng.uniform(5.0, horizon * 0.5)
    for _ in range(rng.choice((1, 1, 2))):
        count += rng.choice((1, max(1, count // 2), count, 3 * count))
        dies = rng.choice((None, None, rng.uniform(0.0, 8.0)))
        plans.append(
            ResizePlan(
                at=round(at, 3),
                to=count,
                dies_after=None if dies is None else round(dies, 3),
                rerun_after=round(rng.uniform(1.0, 30.0), 3),
                barrier_fault=rng.choice(BARRIER_FAULTS),
                fault_for=round(rng.uniform(0.5, 12.0), 3),
            )
        )
        at += rng.uniform(20.0, 120.0)
    return tuple(plans)


def start_resize(cluster: Cluster, plan: ResizePlan, again: bool = False) -> None:
    """Run ``hashq resize``; if the plan says so, kill it and run it again later."""
    armed = None if again or not plan.barrier_fault else lambda: _at_barrier(cluster, plan)
    world, name = cluster.world, f"r{len(cluster.resizers)}"
    resizer = SimResizer(world, name, cluster.broker, cluster.zk, PATHS, plan.to, armed)
    cluster.resizers.append(resizer)
    world.note(f"{name}: hashq resize --buckets {plan.to}")
    resizer.start()
    if plan.dies_after is None or again:
        return

    def die() -> None:
        if not resizer.finished:
            world.note(f"{name}: killed")
            resizer.kill()
            world.after(plan.rerun_after, lambda: start_resize(cluster, plan, again=True))

    world.after(plan.dies_after, die)


def _at_barrier(cluster: Cluster, plan: ResizePlan) -> None:
    """The markers are out: an old bucket's owner (or the leader) meets a fault."""
    kind, rng = plan.barrier_fault, cluster.world.rng
    if kind == "coordinator-crash":
        target = rng.randrange(len(cluster.coordinators))
    else:
        path = PATHS.bucket(rng.randrange(cluster.broker.initial_buckets))
        try:
            owner = BucketRecord.decode(cluster.zk.get(path)[0]).owner
        except NoNode:
            return
        owners = [worker.name for worker in cluster.workers]
        if owner not in owners:
            return
        target = owners.index(str(owner))
    cluster.apply_fault(Fault(cluster.world.now, kind, target, plan.fault_for))


class SimResizer(Process):
    def __init__(
        self,
        world: World,
        name: str,
        broker: Broker,
        zk: ZooKeeper,
        paths: Paths,
        wanted: int,
        on_barrier: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(world, name)
        self.broker, self.paths, self.wanted = broker, paths, wanted
        self.client = ZkClient(zk, self.zk_link, 6.0, lambda _: None)
        self.finished = False
        self._marked_at: float | None = None
        self._on_barrier = on_barrier

    def start(self) -> None:
        self.client.start()
        self.later(self.world.latency(), self._read)

    def kill(self) -> None:
        super().kill()
        self.client.crash()

    def _read(self) -> None:
        paths = self.paths

        def read(zk: ZooKeeper, _: int) -> tuple[int, ResizeRecord | None, int, list[str]]:
            buckets = Topology.from_record(zk.get(paths.topology)[0]).buckets
            try:
                data, stat = zk.get(paths.resize)
            except NoNode:
                return buckets, None, -1, []
            return buckets, ResizeRecord.decode(data), stat.version, zk.children(paths.resize)

        self.client.call(read, self.bound(self._decide))

    def _decide(self, answer: Any) -> None:
        if isinstance(answer, ZkError):
            self.later(POLL_SECONDS, self._read)
            return
        buckets, record, version, children = answer
        passed = passed_buckets(children, self.wanted)
        decision = next_step(self.wanted, buckets, record, passed)
        self.world.note(f"{self.name}: {decision.step.value} {decision.why}")
        self._carry_out(decision, buckets, version)

    def _carry_out(self, decision: Decision, buckets: int, version: int) -> None:
        step = decision.step
        if step is Step.BEGIN:
            self._write(ResizeRecord(buckets, self.wanted), version)
        elif step is Step.SWITCH:
            self._switch(buckets, version)
        elif step is Step.MARK:
            self._mark(decision.buckets)
        elif step is Step.COMMIT:
            self._commit(version)
        elif step is Step.REFUSE and "under way" in decision.why:
            self.later(5.0, self._read)  # the operator tries again once the other one is done
        else:
            self.finished = True
            self.client.close()

    # ------------------------------------------------------------ the steps
    def _write(self, record: ResizeRecord, version: int) -> None:
        path = self.paths.resize

        def write(zk: ZooKeeper, _: int) -> None:
            if version < 0:
                zk.create(path, record.encode(), makepath=False)
            else:
                zk.set(path, record.encode(), version)

        self.client.call(write, self.bound(lambda _: self._read()))

    def _switch(self, old: int, version: int) -> None:
        """The new queues, a settle, then the routing from ``old`` to the new count with the
        entry exchange unbound meanwhile; then the record says BARRIER."""
        broker, hop = self.broker, self.world.latency

        def declared() -> None:
            broker.declare_buckets(self.wanted)
            self.later(SWITCH_SETTLE_SECONDS, unbound)

        def unbound() -> None:
            broker.unroute()
            self.later(hop() * (self.wanted - old + 1), bound)

        def bound() -> None:
            broker.route(self.wanted)
            self._write(ResizeRecord(old, self.wanted, ResizePhase.BARRIER), version)

        if not broker.up:
            self.later(POLL_SECONDS, self._read)
            return
        self.later(hop(), declared)

    def _mark(self, waiting: tuple[int, ...]) -> None:
        now = self.world.now
        due = self._marked_at is None or now - self._marked_at >= REMARK_SECONDS
        if due and all(self.broker.publish_marker(bucket, self.wanted) for bucket in waiting):
            self._marked_at = now
            if self._on_barrier is not None:
                armed, self._on_barrier = self._on_barrier, None
                armed()
        self.later(POLL_SECONDS, self._read)

    def _commit(self, version: int) -> None:
        paths, wanted = self.paths, self.wanted

        def commit(zk: ZooKeeper, _: int) -> None:
            data, stat = zk.get(paths.topology)
            grown = Topology.from_record(data)
            done = ResizeRecord(grown.buckets, wanted, ResizePhase.DONE)
            passed = [f"{paths.resize}/{name}" for name in zk.children(paths.resize)]
            topology = Topology(grown.app, wanted, grown.queue_type, grown.delivery_limit)
            zk.multi(
                [
                    lambda z: z.set(paths.resize, done.encode(), version),
                    lambda z: z.set(paths.topology, topology.to_record(), stat.version),
                    *[lambda z, p=p: z.delete(p) for p in passed],
                ]
            )

        self.client.call(commit, self.bound(lambda _: self._read()))
