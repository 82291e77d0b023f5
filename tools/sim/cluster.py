"""One simulated run: the servers, workers, coordinators and a publisher on one virtual
clock, a fault schedule applied to them, and the invariants checked after every step; then,
with every fault healed, the end checks (nothing lost, every queue drained, every live worker
holding its share)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field, replace

from hashq.parked import ParkedState
from hashq.records import (
    RETURN_GRACE_SECONDS,
    Assignment,
    BucketRecord,
    BucketState,
    Registration,
)
from hashq.resizing import ResizeRecord
from hashq.topology import Topology
from tools.sim.coordinator import CoordinatorConfig, SimCoordinator
from tools.sim.faults import Fault, draw_faults
from tools.sim.inject import apply, heal_all, strand
from tools.sim.invariants import Invariants
from tools.sim.parking import (
    Poison,
    Poisoning,
    draw_hot_after,
    draw_poisons,
    parked_records,
    set_state,
)
from tools.sim.rabbit import Broker
from tools.sim.resizer import ResizePlan, SimResizer, draw_resizes, start_resize
from tools.sim.worker import DRAIN_TIMEOUTS, PATHS, WITHDRAW_DELAYS, SimWorker, WorkerConfig
from tools.sim.world import Violation, World
from tools.sim.zoo import NoNode, ZooKeeper

PUBLISH_GAP = 0.01  # virtual seconds between publishes
# Virtual seconds the healed cluster has to finish everything. 300 s until seed 197 drew a
# backlog of 8,219 messages left to one worker of concurrency 1 whose slow handlers (2 to 14 s)
# run one at a time: it needed 331 s, with no bucket stalled. A stalled bucket never finishes.
SETTLE_LIMIT = 450.0
# How one worker may stay cut off for good while the rest heals: its keys must go on elsewhere.
# A quorum queue whose leader was on a failed node returns a dead consumer's messages once it
# has a leader again: within seconds (tests/e2e/test_cluster.py). The model's bound is just
# below the grace the protocol waits for it, so that a wait that starts too early shows.
RETURN_LAG_SECONDS = 0.98 * RETURN_GRACE_SECONDS
STRANDED = ("zk-partition", "amqp-partition", "freeze", "isolated", "zk-after-reconnect")


@dataclass(frozen=True)
class Scenario:
    """Everything a seed decides before the run."""

    seed: int
    workers: int
    coordinators: int
    buckets: int
    keys: int
    consumer_timeout: float
    worker_configs: tuple[WorkerConfig, ...]
    coordinator_config: CoordinatorConfig
    faults: tuple[Fault, ...]
    slow_share: float  # handlers past the drain timeout
    thread_share: float  # handlers that cannot be stopped
    stranded: str  # how worker 0 stays cut off after the other faults heal ("": it does not)
    return_lag: float = 0.0  # how late a queue may return a dead connection's messages
    poisons: tuple[Poison, ...] = ()  # keys whose handler fails for a while (parked keys)
    resizes: tuple[ResizePlan, ...] = ()  # ``hashq resize`` runs (and their faults)

    @classmethod
    def draw(
        cls, seed: int, horizon: float = 400.0, parking: bool = True, resize: bool = True
    ) -> Scenario:
        rng = random.Random(f"scenario-{seed}")
        workers = rng.randint(2, 5)
        session = rng.choice((2.0, 4.0, 6.0))
        configs = [
            WorkerConfig(
                drain_timeout=rng.choice(DRAIN_TIMEOUTS),
                session_timeout=session,
                prefetch=rng.choice((1, 4, 16)),
                concurrency=rng.choice((1, 4)),
            )
            for _ in range(workers)
        ]
        coordinator = CoordinatorConfig(
            drain_timeout=rng.choice(DRAIN_TIMEOUTS),
            fence_grace=rng.choice((0.0, 1.0)),
            session_timeout=session,
        )
        scenario = cls(
            seed=seed,
            workers=workers,
            coordinators=rng.randint(2, 3),
            buckets=rng.choice((3, 8, 16)),
            keys=rng.choice((5, 40, 400)),
            consumer_timeout=rng.choice((0.0, 0.0, 9.0)),
            worker_configs=tuple(configs),
            coordinator_config=coordinator,
            faults=tuple(draw_faults(rng, horizon, mean_gap=rng.choice((1.0, 3.0, 8.0)))),
            slow_share=rng.choice((0.0, 0.0005, 0.002)),
            thread_share=rng.choice((0.0, 0.5, 1.0)),
            stranded=rng.choice(("", "", *STRANDED)),
        )
        scenario = scenario.with_timeouts(rng)
        if resize:
            scenario = replace(scenario, resizes=draw_resizes(seed, scenario.buckets, horizon))
        poisons = tuple(draw_poisons(seed, scenario.keys, horizon)) if parking else ()
        if not poisons:
            return scenario
        hot = draw_hot_after(seed)
        hot_configs = tuple(replace(c, hot_after=hot) for c in scenario.worker_configs)
        return replace(scenario, poisons=poisons, worker_configs=hot_configs)

    def with_timeouts(self, rng: random.Random) -> Scenario:
        """Timeouts that need not match the session's: a listing lag longer than the session
        (a new connection may outlive its worker's registration unlisted), a withdrawal delay
        longer than a RabbitMQ restart, workers' sessions unlike the coordinators'. Drawn
        last, so the draws before stay as they were."""
        lag = rng.choice((2.0, 6.0, 12.0))
        withdraw = rng.choice(WITHDRAW_DELAYS)
        sessions = rng.choice(((), (2.0, 4.0, 6.0)))  # (): every worker has the coordinators'
        configs = tuple(
            replace(
                c,
                withdraw_after=withdraw,
                session_timeout=rng.choice(sessions) if sessions else c.session_timeout,
            )
            for c in self.worker_configs
        )
        coordinator = replace(self.coordinator_config, management_lag=lag)
        return_lag = rng.choice((0.0, 0.0, 1.0, RETURN_LAG_SECONDS))
        # Fewer threads than runners for plain handlers; drawn last of all.
        configs = tuple(replace(c, threads=rng.choice((0, 0, 1, 2))) for c in configs)
        # How late a free thread runs its job (the interpreter's switch interval is 5 ms);
        # drawn after everything else.
        handoff = rng.choice((0.0, 0.0, 0.001, 0.005, 0.01))
        configs = tuple(replace(c, thread_handoff=handoff) for c in configs)
        # Crash detection from the broker's events: a grace down to none (so that the question
        # races a reconnecting worker's announcement), or no event exchange at all.
        coordinator = replace(
            coordinator,
            crash_grace=rng.choice((2.0, 0.5, 0.05, 0.0)),
            crash_events=rng.choice((True, True, True, False)),
        )
        # The bucket queues asked whether they took back what a fenced owner held (quorum
        # queues), or the return grace waited out every time (classic queues); drawn last.
        coordinator = replace(coordinator, ask_returns=rng.choice((True, True, True, False)))
        return replace(
            self, worker_configs=configs, coordinator_config=coordinator, return_lag=return_lag
        )


@dataclass
class Outcome:
    seed: int
    steps: int = 0
    virtual_seconds: float = 0.0
    violation: str = ""
    applied: list[Fault] = field(default_factory=list)
    confirmed: int = 0
    executions: int = 0
    expelled: int = 0  # crashed incarnations the leaders expelled (their connection closed)
    fault_counts: Counter[str] = field(default_factory=Counter)
    trace: list[str] = field(default_factory=list)


class Cluster:
    def __init__(self, scenario: Scenario, faults: list[Fault] | None = None) -> None:
        self.scenario = scenario
        self.faults = list(scenario.faults if faults is None else faults)
        self.world = World(scenario.seed)
        self.invariants = Invariants()
        self.zk = ZooKeeper(self.world)
        self.broker = Broker(
            self.world,
            scenario.buckets,
            consumer_timeout=scenario.consumer_timeout,
            heartbeat=3.0,
            listing_lag=scenario.coordinator_config.management_lag,
            return_lag=scenario.return_lag,
            jump=bool(scenario.resizes),
        )
        self.broker.on_consumers = self.invariants.consumer_added
        self.broker.on_connect = self.invariants.connection_opened
        self.worker_configs = list(scenario.worker_configs)  # a rolling upgrade changes them
        self.upgrades = 0  # rolling upgrades begun
        self.upgrading = 0  # the one under way (0: none)
        self.workers: list[SimWorker] = []
        self.coordinators: list[SimCoordinator] = []
        self.confirmed: set[tuple[str, int]] = set()
        self._next_seq: dict[str, int] = {}
        self._publishing = True
        self.stranded_worker = ""  # the worker left cut off at the end, if any
        self.poisoning = Poisoning(self.world, scenario.poisons)
        self.resizers: list[SimResizer] = []
        self.outcome = Outcome(scenario.seed)

    # ------------------------------------------------------------ processes
    def start_worker(self, index: int) -> None:
        config = self.worker_configs[index]
        worker = SimWorker(
            self.world,
            f"w{index}",
            self.broker,
            self.zk,
            self.invariants,
            config,
            self._handler_time,
            self.poisoning if self.scenario.poisons else None,
        )
        if index < len(self.workers):
            self.workers[index] = worker
        else:
            self.workers.append(worker)
        worker.start()

    def start_coordinator(self, index: int) -> None:
        coordinator = SimCoordinator(
            self.world,
            f"c{index}",
            self.broker,
            self.zk,
            self.invariants,
            self.scenario.coordinator_config,
        )
        if index < len(self.coordinators):
            self.outcome.expelled += self.coordinators[index].machine.expelled
            self.coordinators[index] = coordinator
        else:
            self.coordinators.append(coordinator)
        coordinator.start()

    def restart_worker(self, index: int) -> None:
        """Start worker ``index`` again once it has ended (a clean stop may take a while)."""
        worker = self.workers[index]
        if worker.stranded:
            return
        if not worker.alive or worker.stopped:
            self.start_worker(index)
        elif worker.told_to_stop:
            self.world.when(
                lambda: not worker.alive or worker.stopped, lambda: self.restart_worker(index)
            )

    def leaders(self) -> list[SimCoordinator]:
        return [c for c in self.coordinators if c.alive and c.machine.role.value == "leader"]

    def restart_coordinator(self, index: int) -> None:
        if not self.coordinators[index].alive:
            self.start_coordinator(index)

    def _handler_time(self) -> tuple[float, bool]:
        rng = self.world.rng
        thread = rng.random() < self.scenario.thread_share
        if rng.random() < self.scenario.slow_share:
            return rng.uniform(2.0, 14.0), thread
        return rng.expovariate(1 / 0.003), thread

    # ------------------------------------------------------------ publishing
    def _publish(self) -> None:
        if not self._publishing:
            return
        key = f"k{self.world.rng.randrange(self.scenario.keys)}"
        seq = self._next_seq.get(key, 1)
        if self.broker.publish(key, seq):
            self.confirmed.add((key, seq))
            self._next_seq[key] = seq + 1
        self.world.after(PUBLISH_GAP, self._publish)

    # ------------------------------------------------------------ running
    def start(self) -> None:
        """The nodes ``hashq init`` creates, then every coordinator and worker started."""
        for path in (PATHS.workers, PATHS.assignments, PATHS.buckets, PATHS.releases, PATHS.parked):
            self.zk.create(path, b"")
        topology = Topology("sim", self.scenario.buckets, "quorum", self.broker.delivery_limit)
        self.zk.create(PATHS.topology, topology.to_record())
        for index in range(self.scenario.coordinators):
            self.start_coordinator(index)
        for index in range(self.scenario.workers):
            self.start_worker(index)

    def run(self, steps: int) -> Outcome:
        self.start()
        self._publish()
        for poison in self.scenario.poisons:
            self.world.after(poison.at, lambda p=poison: self._poison(p))  # type: ignore[misc]
        for plan in self.scenario.resizes:
            self.world.after(plan.at, lambda p=plan: start_resize(self, p))  # type: ignore[misc]
        pending = sorted(self.faults, key=lambda f: f.at)
        try:
            while self.world.steps < steps and pending:
                fault = pending.pop(0)
                self.world.run_until(fault.at, self._check)
                if self.world.steps >= steps:
                    break
                self.apply_fault(fault)
            self._heal()
            self._publishing = False
            self._finish()
        except Violation as exc:
            self.outcome.violation = str(exc)
        self.outcome.steps = self.world.steps
        self.outcome.virtual_seconds = self.world.now
        self.outcome.confirmed = len(self.confirmed)
        self.outcome.executions = self.invariants.checker.verdict.executions
        self.outcome.expelled += sum(c.machine.expelled for c in self.coordinators)
        self.outcome.trace = self.world.trace
        return self.outcome

    def _poison(self, poison: Poison) -> None:
        self.poisoning.failing.add(poison.key)
        self.world.note(f"poisoned {poison.key} until {poison.fixed:.3f}s")
        self.world.after(poison.fixed - poison.at, lambda: self._fix(poison))

    def _fix(self, poison: Poison) -> None:
        """The handler is fixed; the operator releases the key (or drops what it parked)."""
        self.poisoning.failing.discard(poison.key)
        state = ParkedState.DROPPING if poison.drop else ParkedState.RELEASING
        if set_state(self.zk, PATHS, poison.key, state):
            self.world.note(f"operator: {poison.key} {state.value}")

    def _release_all(self) -> None:
        """The end: every key still parked is released (no handler fails any more)."""
        self.poisoning.failing.clear()
        for record in parked_records(self.zk, PATHS):
            if record.state is ParkedState.PARKED:
                set_state(self.zk, PATHS, record.key, ParkedState.RELEASING)

    def _check(self) -> None:
        """The invariants checked on every step beyond those seen as executions start and end."""

    def apply_fault(self, fault: Fault) -> None:
        if apply(self, fault):
            self.outcome.applied.append(fault)
            self.outcome.fault_counts[fault.kind] += 1
            self.world.note(f"fault: {fault}")

    def _heal(self) -> None:
        heal_all(self)
        self.world.note("every fault healed")
        if self.scenario.stranded and len(self.workers) > 1:
            self.world.run_until(self.world.now + 5.0, self._check)  # the healed take buckets
            self._strand_one()
        self.world.run_until(self.world.now + 5.0, self._check)  # its buckets get messages
        stranded = [w for w in self.workers if w.name == self.stranded_worker]
        if stranded and not stranded[0].stranded:  # an armed stranding that never struck
            self.world.note(f"worker {self.stranded_worker} was not stranded after all")
            stranded[0].on_link_up, self.stranded_worker = None, ""

    def _strand_one(self) -> None:
        """Cut one running worker off for good: one that was fenced once and lived on (its
        next fence must close its newer connection), else one that reconnected; among those,
        the one holding most."""
        running = [w for w in self.workers if w.alive and not w.told_to_stop and not w.stopped]
        if not running:
            return
        worker = max(
            running,
            key=lambda w: (
                w.was_fenced and bool(w.machine.consuming()),
                w.machine.connection_number > 1 and bool(w.machine.consuming()),
                len(w.machine.consuming()),
            ),
        )
        self.stranded_worker = worker.name
        strand(self, worker, self.scenario.stranded)
        self.world.note(f"worker {worker.name} stranded for good: {self.scenario.stranded}")

    # ------------------------------------------------------------ the end
    def _finish(self) -> None:
        """Within ``SETTLE_LIMIT`` virtual seconds of healing: every confirmed message done,
        every queue empty, every bucket granted to a live worker, shares balanced."""
        deadline = self.world.now + SETTLE_LIMIT
        while self.world.now < deadline:
            self._release_all()
            self.world.run_until(self.world.now + 1.0, self._check)
            if not self._unfinished():
                return
        raise Violation(f"not done {SETTLE_LIMIT:g}s after healing: {self._unfinished()}")

    def _unfinished(self) -> str:
        dead = {(m.key, m.seq) for m in self.broker.dead}
        lost = self.confirmed - self.invariants.completed - dead
        if lost:
            return f"{len(lost)} confirmed messages never completed (e.g. {sorted(lost)[:3]})"
        backlog = self.broker.backlog()
        if backlog:
            return f"{backlog} messages still in queues"
        parked = parked_records(self.zk, PATHS)
        if parked:
            return f"{len(parked)} keys still parked: {[r.key for r in parked][:3]}"
        resize = _read_resize(self.zk)
        if resize is not None and resize.under_way:
            return f"the resize to {resize.new} buckets is still {resize.phase.value}"
        return self.unbalanced()

    def unbalanced(self) -> str:
        """Why the buckets are not yet each granted to a live worker with even shares ("": they
        are)."""
        live = _read_registrations(self.zk)
        held: Counter[str] = Counter()
        count = Topology.from_record(self.zk.get(PATHS.topology)[0]).buckets
        for bucket in range(count):
            record = _read_record(self.zk, bucket)
            granted = record is not None and record.state is BucketState.GRANTED
            owner = live.get(str(record.owner)) if record is not None else None
            if record is None or not granted or owner is None:
                return f"bucket {bucket} not granted to a live worker: {record}"
            if owner.incarnation != record.incarnation:
                return f"bucket {bucket} granted to an earlier life of {owner.worker_id}"
            assignment = _read_assignment(self.zk, owner.worker_id)
            if (
                assignment is None
                or assignment.grants_for(owner.incarnation).get(bucket) != record.epoch
            ):
                return f"bucket {bucket}: assignment of {owner.worker_id} does not say so"
            if owner.worker_id == self.stranded_worker:
                return f"bucket {bucket} granted to the stranded {owner.worker_id}"
            held[owner.worker_id] += 1
        counts = [held.get(worker, 0) for worker in live if worker != self.stranded_worker]
        if counts and max(counts) - min(counts) > 1:
            return f"shares unbalanced: {dict(held)}"
        return ""


def _read_registrations(zk: ZooKeeper) -> dict[str, Registration]:
    try:
        names = zk.children(PATHS.workers)
    except NoNode:
        return {}
    return {name: Registration.decode(zk.get(PATHS.worker(name))[0]) for name in names}


def _read_record(zk: ZooKeeper, bucket: int) -> BucketRecord | None:
    try:
        return BucketRecord.decode(zk.get(PATHS.bucket(bucket))[0])
    except NoNode:
        return None


def _read_assignment(zk: ZooKeeper, worker: str) -> Assignment | None:
    try:
        return Assignment.decode(zk.get(PATHS.assignment(worker))[0])
    except NoNode:
        return None


def _read_resize(zk: ZooKeeper) -> ResizeRecord | None:
    try:
        return ResizeRecord.decode(zk.get(PATHS.resize)[0])
    except NoNode:
        return None
