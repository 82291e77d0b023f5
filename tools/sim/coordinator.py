"""A simulated coordinator: the production ``CoordinatorMachine`` on virtual time, with edges
that do what ``hashq_coordinator.runtime``, ``hashq_coordinator.store`` and
``hashq_coordinator.fencing.fencer`` do against the server models: the lock recipe, the claim, the
checked commit, and fences through the liveness queue and the management API."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hashq.records import (
    Assignment,
    BucketRecord,
    BucketState,
    Leadership,
    Registration,
    incarnation_connections,
    parse_release_name,
    parse_worker_connection_name,
    queue_holds_nothing,
)
from hashq.topology import Topology
from hashq_coordinator.machine import events as cm
from hashq_coordinator.machine.core import CoordinatorMachine
from hashq_coordinator.machine.fencebook import Incarnation
from hashq_coordinator.registrations import Member, Registrations, listed_in_order
from tools.sim.invariants import Invariants
from tools.sim.process import Process
from tools.sim.rabbit import Broker
from tools.sim.worker import PATHS
from tools.sim.world import World
from tools.sim.zoo import (
    BadVersion,
    ConnectionLoss,
    NodeExists,
    NoNode,
    SessionExpired,
    ZkClient,
    ZkError,
    ZooKeeper,
)

TICK_SECONDS = 0.5
RETRY_SECONDS = 1.0


@dataclass(frozen=True)
class CoordinatorConfig:
    drain_timeout: float = 5.0
    fence_grace: float = 1.0
    settle: float = 1.0
    management_lag: float = 2.0
    session_timeout: float = 4.0
    crash_grace: float = 0.5
    crash_events: bool = True  # the broker's event exchange is enabled
    ask_returns: bool = True  # quorum bucket queues: asked whether they took back what was held


class SimCoordinator(Process):
    def __init__(
        self,
        world: World,
        name: str,
        broker: Broker,
        zk: ZooKeeper,
        invariants: Invariants,
        config: CoordinatorConfig,
    ) -> None:
        super().__init__(world, name)
        self.broker, self.zk, self.invariants, self.config = broker, zk, invariants, config
        self.machine = CoordinatorMachine(
            name,
            broker.initial_buckets,  # then the topology record's (a resize)
            settle=config.settle,
            drain_timeout=config.drain_timeout,
            fence_grace=config.fence_grace,
            crash_grace=config.crash_grace,
            ask_returns=config.ask_returns,
        )
        self.client = ZkClient(zk, self.zk_link, config.session_timeout, self.bound(self._zk_state))
        self._lock_node = ""
        self._registrations = Registrations()  # ``Store``'s
        self._watched: set[str] = set()  # registrations watched (the model's watches last)
        self._buckets = 0  # the topology record's count, as last read
        self._campaigning = False
        self._generation = itertools.count(1)
        self._fences: dict[Incarnation, int] = {}  # the generation each fence runs under
        self.on_claim: Callable[[], None] | None = None  # a fault armed for the next claim
        self.on_commit: Callable[[cm.Commit], None] | None = None  # ... for the next commit

    def start(self) -> None:
        for path in (PATHS.workers, PATHS.releases):
            self.client.watch(path, self.bound(lambda: self.post(cm.Tick())))
        if self.config.crash_events:
            self.broker.on_closed.append(self._broker_event)
        self.client.start()
        self._ticking()

    def _broker_event(self, name: str) -> None:
        """``CrashFeed``: a ``connection.closed`` event of a worker's connection reaches this
        process over its own AMQP link, if that link is up when it is sent and when it arrives
        (a node shutting down still sends the events of the connections it closes)."""
        incarnation = parse_worker_connection_name(name)
        if incarnation is None or not self.alive or not self.amqp_link.up:
            return

        def arrived() -> None:
            if self.amqp_link.up:
                self.post(cm.ConnectionClosed(incarnation, name))

        self.later(self.world.latency(), arrived)

    def kill(self) -> None:
        super().kill()
        self.client.crash()

    def _ticking(self) -> None:
        self.post(cm.Tick())
        self.later(TICK_SECONDS, self._ticking)

    def _zk_state(self, state: str) -> None:
        self._registrations.forget()  # ``Store``'s listener: a notification may be lost
        if state == "lost":
            self.post(cm.SessionLost())
        elif state == "connected":
            self._retry_campaign()

    # ------------------------------------------------------------ the machine
    def post(self, event: cm.Event) -> None:
        if not self.alive:
            return
        role = self.machine.role
        for action in self.machine.handle(event, self.world.now):
            self._do(action)
        if self.machine.role is not role:
            self.world.note(f"{self.name}: {role.value} -> {self.machine.role.value} ({event})")

    def _do(self, action: cm.Action) -> None:
        if isinstance(action, cm.Observe):
            self._observe(action.ask_gone, action.ask_held)
        elif isinstance(action, cm.Commit):
            self._commit(action)
        elif isinstance(action, cm.Fence):
            generation = self._fences[action.incarnation] = next(self._generation)
            self._fence(action.incarnation, generation)
        elif isinstance(action, cm.Wake):
            self.later(action.after, lambda: self.post(cm.Tick()))
        elif isinstance(action, cm.Resign):
            self._fences.clear()
        elif isinstance(action, cm.Claim):
            self._claim()
        elif isinstance(action, cm.GiveBack):
            self._give_back()

    def _call(self, request: Callable[[ZooKeeper, int], Any], then: Callable[[Any], None]) -> None:
        self.client.call(request, self.bound(then))

    # ------------------------------------------------------------ election
    def _campaign(self) -> None:
        """kazoo's lock recipe: an ephemeral sequential node named with a prefix of this
        attempt's own (each campaign makes a new ``Lock``), found again if the answer to its
        creation was lost; the lowest sequence number holds the lock."""
        self._campaigning = True
        prefix = f"{self.name}-{next(self._generation)}__lock__"

        def created(answer: Any) -> None:
            if isinstance(answer, ConnectionLoss):
                self.later(RETRY_SECONDS, lambda: self._call(create, created))  # kazoo retries
                return
            if isinstance(answer, ZkError):
                self._campaigning = False
                self.later(RETRY_SECONDS, self._retry_campaign)
                return
            self._lock_node = answer
            self.world.note(f"{self.name}: lock node {answer}")
            self._wait_for_lock()

        def create(zk: ZooKeeper, session: int) -> str:
            for child in _children(zk, PATHS.election):
                if child.startswith(prefix):
                    return f"{PATHS.election}/{child}"
            return zk.create(f"{PATHS.election}/{prefix}", b"", session, sequential=True)

        self._call(create, created)

    def _retry_campaign(self) -> None:
        if (
            not self._campaigning
            and not self._lock_node
            and self.machine.role is cm.Role.CANDIDATE
            and self.client.connected
        ):
            self._campaign()

    def _wait_for_lock(self) -> None:
        def look(answer: Any) -> None:
            if not self._campaigning:
                return  # given back meanwhile
            if isinstance(answer, ZkError):
                self.later(RETRY_SECONDS, self._wait_for_lock)  # kazoo retries
                return
            mine = self._lock_node.rsplit("/", 1)[-1]
            if mine not in answer:
                self._campaigning, self._lock_node = False, ""  # gone with our session
                self.later(RETRY_SECONDS, self._retry_campaign)
            elif min(answer, key=lambda child: child[-10:]) == mine:
                self._campaigning = False
                self.post(cm.LockAcquired())
            else:
                self.later(0.2, self._wait_for_lock)

        self._call(lambda zk, _: zk.children(PATHS.election), look)

    def _claim(self) -> None:
        """``Store.claim``, then the records, then the assignments: three requests, as in
        production, any of which may fail with the lock held."""
        me = self.name
        self._registrations.forget()  # as ``Store.claim``: a new lead reads everything

        def claim(zk: ZooKeeper, session: int) -> tuple[int, int]:
            try:
                data, stat = zk.get(PATHS.leader)
                epoch = Leadership.decode(data).epoch + 1
                version = zk.set(PATHS.leader, Leadership(me, epoch).encode(), stat.version).version
            except NoNode:
                zk.create(PATHS.leader, Leadership(me, 1).encode())
                epoch, version = 1, 0
            zk.create(_alive(epoch), me.encode(), session)
            return epoch, version

        def claimed(answer: Any) -> None:
            if isinstance(answer, ZkError):
                self.post(cm.ClaimFailed(type(answer).__name__))
                return
            epoch, version = answer
            self._alive_node = _alive(epoch)
            self._call(lambda zk, _: _records(zk), lambda records: read(epoch, version, records))

        def read(epoch: int, version: int, records: Any) -> None:
            if isinstance(records, ZkError):
                self.post(cm.ClaimFailed(type(records).__name__))
                return
            self._call(
                lambda zk, _: _assignments(zk),
                lambda written: elected(epoch, version, records, written),
            )

        def elected(epoch: int, version: int, records: Any, written: Any) -> None:
            if isinstance(written, ZkError):
                self.post(cm.ClaimFailed(type(written).__name__))
            else:
                self.post(cm.Elected(epoch, version, records, written))

        self._call(claim, claimed)
        if self.on_claim is not None:
            armed, self.on_claim = self.on_claim, None
            armed()

    def _give_back(self) -> None:
        """Delete our lock node, retrying until ZooKeeper takes it, then campaign again."""
        node = self._lock_node

        def deleted(answer: Any) -> None:
            gone = isinstance(answer, NoNode | SessionExpired)  # with the node, or the session
            self.world.note(f"{self.name}: giving back {node}: {answer!r}")
            if isinstance(answer, ZkError) and not gone:
                self.later(RETRY_SECONDS, self._give_back)
                return
            self._lock_node = ""
            self._campaigning = False
            self.later(RETRY_SECONDS, self._retry_campaign)

        if not node:
            self._campaigning = False
            self.later(RETRY_SECONDS, self._retry_campaign)
            return
        self.world.note(f"{self.name}: giving back {node}")
        self._call(lambda zk, _: zk.delete(node), deleted)

    # ------------------------------------------------------------ leading
    def _observe(self, ask_gone: tuple[Incarnation, ...], ask_held: tuple[int, ...]) -> None:
        """``Store.workers`` then ``Store.releases``: two requests, as in production, so a
        release may appear between them; then the liveness of each suspect and the state of
        each bucket queue asked about."""

        def list_workers(zk: ZooKeeper, _: int) -> tuple[int, list[str]]:
            buckets = Topology.from_record(zk.get(PATHS.topology)[0]).buckets
            return buckets, zk.children(PATHS.workers)

        def read_releases(zk: ZooKeeper, _: int) -> dict[tuple[int, int], str]:
            found = {}
            for name in zk.children(PATHS.releases):
                parsed = parse_release_name(name)
                if parsed is not None:
                    found[parsed] = name
            return found

        def got_workers(answer: Any) -> None:
            if isinstance(answer, ZkError):
                self.post(cm.ObserveFailed(type(answer).__name__))
                return
            self._buckets, names = answer
            self._read_registrations(names, got_members)

        def got_members(workers: Any) -> None:
            if isinstance(workers, ZkError):
                self.post(cm.ObserveFailed(type(workers).__name__))
                return
            self._call(read_releases, lambda releases: got_releases(workers, releases))

        def got_releases(workers: dict[str, Member], answer: Any) -> None:
            if isinstance(answer, ZkError):
                self.post(cm.ObserveFailed(type(answer).__name__))
                return
            registrations = {name: member.registration for name, member in workers.items()}
            versions = {name: member.version for name, member in workers.items()}
            if not ask_gone and not ask_held:
                self.post(cm.Observed(registrations, answer, versions, buckets=self._buckets))
                return

            def asked() -> None:  # ``leader._asked``: a passive declare each, a round trip
                gone = frozenset(i for i in ask_gone if self._gone(i))
                emptied = frozenset(b for b in ask_held if self._holds_nothing(b))
                observed = cm.Observed(
                    registrations, answer, versions, gone, emptied, self._buckets
                )
                self.post(observed)

            self.later(self.world.latency(), asked)

        self._call(list_workers, got_workers)

    def _read_registrations(self, names: list[str], then: Callable[[Any], None]) -> None:
        """``Store.workers`` after its listing: every notification sent before the listing's
        answer has run (the down pipe is FIFO), so read only the new and the changed, each
        watched from its read on; ``then`` gets every member, in the listing's order."""
        for name in names:
            self._watch_registration(name)  # (the model's watch tells at once: ``unread`` reads)
        kept, unread, generation = self._registrations.unread(names)

        def read(zk: ZooKeeper, _: int) -> dict[str, Member]:
            found = {}
            for name in unread:
                with contextlib.suppress(NoNode):
                    data, stat = zk.get(PATHS.worker(name))
                    found[name] = Member(Registration.decode(data), stat.version)
            return found

        def got(answer: Any) -> None:
            if not isinstance(answer, ZkError):
                self._registrations.remember(generation, answer)
                answer = listed_in_order(names, kept, answer)
            then(answer)

        self._call(read, got)

    def _watch_registration(self, name: str) -> None:
        """``Store._read_all``'s watch: kazoo's is set by each read, the model's once, for good
        (it is called again at every reconnection, where ``forget`` covers it)."""
        if name not in self._watched:
            self._watched.add(name)
            path = PATHS.worker(name)
            self.client.watch(path, self.bound(lambda: self._registrations.changed(name)))

    def _commit(self, commit: cm.Commit) -> None:
        if self.on_commit is not None:
            armed, self.on_commit = self.on_commit, None
            armed(commit)
        alive = getattr(self, "_alive_node", "")
        invariants = self.invariants

        def write(zk: ZooKeeper, _: int) -> None:
            ops: list[Callable[[ZooKeeper], object]] = [
                lambda z: z.check(PATHS.leader, commit.version),
                lambda z: z.check(alive, 0),
            ]
            for worker, version in commit.expelled.items():
                ops.append(lambda z, w=worker, v=version: _expel(z, w, v))  # type: ignore[misc]
            for bucket, record in commit.records.items():
                ops.append(
                    _put(PATHS.bucket(bucket), record.encode(), bucket in commit.known_records)
                )
            for worker, assignment in commit.assignments.items():
                known = worker in commit.known_assignments
                ops.append(_put(PATHS.assignment(worker), assignment.encode(), known))
            for worker in commit.removed:
                ops.append(lambda z, w=worker: z.delete(PATHS.assignment(w)))  # type: ignore[misc]
            for name in commit.consumed:
                ops.append(lambda z, n=name: z.delete(f"{PATHS.releases}/{n}"))  # type: ignore[misc]
            zk.multi(ops)
            for bucket, record in sorted(commit.records.items()):  # applied: check the epochs
                if record.state is BucketState.GRANTED and record.owner:
                    invariants.granted(bucket, record.epoch)

        def written(answer: Any) -> None:
            if isinstance(answer, _Returned):
                self.post(cm.ExpelRefused(str(answer)))
            elif isinstance(answer, ZkError):
                self.post(
                    cm.Deposed(f"ZooKeeper refused the leader's write: {type(answer).__name__}")
                )
            else:
                self.post(cm.Committed())

        self._call(write, written)

    # ------------------------------------------------------------ fencing
    def _fence(self, incarnation: Incarnation, generation: int) -> None:
        """``Fencer._cut_off``: done at once if the broker says no connection of the
        incarnation is left; else, once the newest announced connection is listable, close
        every listed connection of it (retrying whatever fails)."""
        if self._fences.get(incarnation) != generation:
            return  # abandoned: the lead was lost
        now = self.world.now
        covered = self.machine.book.sighting(incarnation, now)
        if self._gone(incarnation):
            self._fenced(incarnation, generation, covered)
            return
        wait = self.machine.book.listable_in(incarnation, now, self.config.management_lag)
        if wait > 0:
            self.later(wait, lambda: self._fence(incarnation, generation))
            return
        listed = self.broker.listed_connections() if self.amqp_link.up else None
        pattern = incarnation_connections(*incarnation)
        names = [n for n in listed or [] if pattern.fullmatch(n)]
        if listed is None or not all(self.broker.force_close(n) for n in names):
            self.later(RETRY_SECONDS, lambda: self._fence(incarnation, generation))
            return
        self.later(self.world.latency(), lambda: self._fenced(incarnation, generation, covered))

    def _gone(self, incarnation: Incarnation) -> bool:
        """``Fencer._gone``: a passive declare of the incarnation's liveness queue, asked only
        if its registration said it holds one."""
        worker, life = incarnation
        return (
            self.machine.book.sighting(incarnation, self.world.now).liveness
            and self.amqp_link.up
            and self.broker.up
            and not self.broker.exists(f"alive.{worker}.{life}")
        )

    def _holds_nothing(self, bucket: int) -> bool:
        """``Liveness.holds_nothing``: a passive declare of the bucket queue."""
        if not self.amqp_link.up:
            return False
        answer = self.broker.stat(self.broker.bucket_queue(bucket))
        return answer is not None and queue_holds_nothing(*answer)

    def _fenced(self, incarnation: Incarnation, generation: int, covered: Any) -> None:
        if self._fences.get(incarnation) == generation:
            del self._fences[incarnation]
            self.world.note(f"{self.name}: fenced {incarnation[0]} {incarnation[1]}")
            self.post(cm.FenceDone(incarnation, covered))


class _Returned(BadVersion):
    """``hashq.errors.WorkerReturned``: an expelled worker's registration changed."""


def _expel(zk: ZooKeeper, worker: str, version: int) -> None:
    try:
        zk.delete(PATHS.worker(worker), version)
    except (NoNode, BadVersion):
        raise _Returned(f"the registration of {worker} changed since it was read") from None


def _alive(epoch: int) -> str:
    return f"{PATHS.root}/leader-session-{epoch:010d}"


def _put(path: str, data: bytes, known: bool) -> Callable[[ZooKeeper], object]:
    if known:
        return lambda z: z.set(path, data)
    return lambda z: z.create(path, data)


def _records(zk: ZooKeeper) -> dict[int, BucketRecord]:
    records = {}
    for name in _children(zk, PATHS.buckets):
        records[int(name)] = BucketRecord.decode(zk.get(f"{PATHS.buckets}/{name}")[0])
    return records


def _assignments(zk: ZooKeeper) -> dict[str, Assignment]:
    return {
        name: Assignment.decode(zk.get(PATHS.assignment(name))[0])
        for name in _children(zk, PATHS.assignments)
    }


def _children(zk: ZooKeeper, path: str) -> list[str]:
    try:
        return zk.children(path)
    except NoNode:
        return []


__all__ = ["CoordinatorConfig", "NodeExists", "SimCoordinator"]
