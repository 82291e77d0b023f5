"""Parked keys in the simulation: the edges a worker's leases use for them (what
``hashq.worker.bucket_lease`` does for ``ParkedKeys``'s actions, against the server models), and
the operator: poison keys drawn from the seed, fixed, then released or dropped, and at the end
every parked key released.

A poisoned key's handler fails (the execution ends, not completed) until the key is fixed;
after ``MAX_ATTEMPTS`` the lease parks the key. The operator writes the record as
``hashq parked release`` / ``drop`` does: a state change with the version it read.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hashq.parked import (
    ParkedRecord,
    ParkedState,
    bucket_of_parked_name,
    key_digest,
    parked_name,
)
from hashq.worker.machine import parking as pk
from tools.sim.links import cut_zk, heal_zk
from tools.sim.process import Process
from tools.sim.rabbit import Connection
from tools.sim.world import World
from tools.sim.zoo import BadVersion, NodeExists, NoNode, ZkClient, ZkError, ZooKeeper

if TYPE_CHECKING:
    from tools.sim.leases import Job, LeaseRunner, SimLease

MAX_ATTEMPTS = 2
RETRY_DELAY = 0.05
RETRY_IO = 0.25  # a parking queue's channel that could not be opened, a failed delete


def parking_queue(key: str) -> str:
    return f"parked.{key}"


class SimParking:
    """One worker's edges for its leases' parked keys."""

    def __init__(
        self, process: Process, client: ZkClient, paths: Any, poisoning: Poisoning
    ) -> None:
        self._process = process
        self._client = client
        self._paths = paths
        self._poisoning = poisoning
        self.fails = poisoning.fails
        self.runner: LeaseRunner | None = None
        self._channels: dict[tuple[Connection, int], tuple[SimLease, str]] = {}
        self._watched: set[tuple[int, str]] = set()

    def _path(self, lease: SimLease, key: str) -> str:
        return f"{self._paths.parked}/{parked_name(lease.bucket, key)}"

    def _live(self, lease: SimLease) -> bool:
        runner = self.runner
        return runner is not None and runner.leases.get(lease.number) is lease and not lease.closed

    def _after(self, lease: SimLease, then: Callable[[], None], delay: float = 0.0) -> None:
        """Run ``then`` in the worker, if the lease still lives, then carry out what it asked."""

        def step() -> None:
            if self._live(lease):
                then()
                assert self.runner is not None
                self.runner.pump()

        self._process.later(delay, step) if delay else step()

    # ------------------------------------------------------------ the lease's start
    def load(self, lease: SimLease) -> None:
        prefix = f"{lease.bucket:04d}-"
        folder = self._paths.parked

        def read(zk: ZooKeeper, _: int) -> list[tuple[ParkedRecord, int]]:
            names = [n for n in zk.children(folder) if n.startswith(prefix)]
            found = []
            for name in names:
                if bucket_of_parked_name(name) == lease.bucket:
                    data, stat = zk.get(f"{folder}/{name}")
                    found.append((ParkedRecord.decode(data), stat.version))
            return found

        def take(answer: Any) -> None:
            if isinstance(answer, ZkError):
                self._after(lease, lambda: self.load(lease), RETRY_IO)
                return
            self._after(lease, lambda: lease.core.parked.load(answer))

        self._client.call(read, self._process.bound(take))

    # ------------------------------------------------------------ actions
    def act(self, lease: SimLease, actions: list[pk.Action]) -> list[Job]:
        """Carry out ``actions``; the jobs to dispatch are returned."""
        dispatch = []
        for action in actions:
            if isinstance(action, pk.Dispatch):
                dispatch.append(action.job)
            elif isinstance(action, pk.WatchRecord):
                self._watch(lease, action.key)
            elif isinstance(action, pk.WriteRecord):
                if action.op is pk.RecordOp.CREATE:
                    self._poisoning.parking(self._process, action.key)
                self._write(lease, action)
            elif isinstance(action, pk.ConsumeParked):
                self._consume(lease, action.key)
            elif isinstance(action, pk.StopParked):
                self._stop(lease, action.key)
            elif isinstance(action, pk.AskParked):
                self._ask(lease, action)
            elif isinstance(action, pk.CutOff):
                assert self.runner is not None
                self.runner.cut(action.job)
        return dispatch

    def _write(self, lease: SimLease, action: pk.WriteRecord) -> None:
        path = self._path(lease, action.key)
        op, record, version = action.op, action.record, action.version

        def write(zk: ZooKeeper, _: int) -> Any:
            if op is pk.RecordOp.READ:
                data, stat = zk.get(path)
                return ParkedRecord.decode(data), stat.version
            if op is pk.RecordOp.DELETE:
                zk.delete(path, version)
                return None, -1
            assert record is not None
            if op is pk.RecordOp.CREATE:
                zk.create(path, record.encode())
                return None, 0
            return None, zk.set(path, record.encode(), version).version

        def answered(answer: Any) -> None:
            outcome = _outcome(answer)
            found, made = answer if outcome is pk.Outcome.DONE else (None, -1)
            parked = lease.core.parked
            self._after(lease, lambda: parked.record_result(action.key, op, outcome, found, made))

        def send() -> None:
            self._client.call(write, self._process.bound(answered))

        self._process.later(action.after, send) if action.after else send()

    def _watch(self, lease: SimLease, key: str) -> None:
        """The record's changes (the operator's) reach the lease, as a kazoo DataWatch's."""
        if (lease.number, key) in self._watched:
            return
        self._watched.add((lease.number, key))
        path = self._path(lease, key)

        def changed() -> None:
            if not self._live(lease):
                return

            def read(zk: ZooKeeper, _: int) -> tuple[ParkedRecord, int]:
                data, stat = zk.get(path)
                return ParkedRecord.decode(data), stat.version

            def take(answer: Any) -> None:
                if isinstance(answer, tuple):
                    self._after(lease, lambda: lease.core.parked.seen(key, *answer))

            self._client.call(read, self._process.bound(take))

        self._client.watch(path, self._process.bound(changed))

    def _consume(self, lease: SimLease, key: str) -> None:
        assert self.runner is not None
        channel = self.runner.new_channel()
        connection = lease.connection
        self._channels[connection, channel] = (lease, key)
        queue = parking_queue(key)

        def consumed(error: str) -> None:
            if not error:
                self._after(lease, lambda: lease.core.parked.consuming(key))
            else:
                self._channels.pop((connection, channel), None)
                self._after(lease, lambda: lease.core.parked.parking_lost(key), RETRY_IO)

        def declared(error: str) -> None:
            if (connection, channel) not in self._channels:
                return  # closed meanwhile (its lease, or the key's stream): consume nothing
            if error:
                consumed(error)
            else:
                connection.consume(channel, queue, 4, self._process.bound(consumed), lease.epoch)

        connection.declare(queue, self._process.bound(declared))

    def channel_of(self, lease: SimLease, key: str) -> int | None:
        for (connection, channel), (owner, parked) in self._channels.items():
            if owner is lease and parked == key and connection is lease.connection:
                return channel
        return None

    def _stop(self, lease: SimLease, key: str) -> None:
        channel = self.channel_of(lease, key)
        if channel is not None:
            del self._channels[lease.connection, channel]
            lease.connection.close_channel(channel, lambda _: None)

    def _ask(self, lease: SimLease, action: pk.AskParked) -> None:
        def ask() -> None:
            def answered(answer: tuple[int, int] | None) -> None:
                ready, consumers = answer or (0, 0)
                self._after(lease, lambda: lease.core.parked.answered(action.key, ready, consumers))

            lease.connection.stat(parking_queue(action.key), self._process.bound(answered))

        self._process.later(action.after, ask) if action.after else ask()

    def close_lease(self, lease: SimLease) -> None:
        """The lease closes: its parking channels close with it (what they hold goes back)."""
        for (connection, channel), (owner, _) in list(self._channels.items()):
            if owner is lease:
                del self._channels[connection, channel]
                if connection.client_open:
                    connection.close_channel(channel, lambda _: None)

    # ------------------------------------------------------------ messages
    def lease_of(self, connection: Connection, channel: int) -> tuple[SimLease, str] | None:
        return self._channels.get((connection, channel))

    def lost(self, connection: Connection, channel: int) -> None:
        found = self._channels.pop((connection, channel), None)
        if found is not None:
            lease, key = found
            self._after(lease, lambda: lease.core.parked.parking_lost(key))

    def move(self, job: Job, done: Callable[[bool], None]) -> None:
        """Publish ``job``'s message to its key's parking queue, confirmed."""
        connection = job.lease.connection
        queue = parking_queue(job.key)
        connection.publish_parked(queue, job.msg, self._process.bound(lambda e: done(not e)))

    def dead_letter(self, job: Job, done: Callable[[bool], None]) -> None:
        connection = job.lease.connection
        connection.dead_letter(job.msg, self._process.bound(lambda e: done(not e)))

    def ack(self, job: Job) -> bool:
        channel = self.channel_of(job.lease, job.key)
        if channel is None or not job.lease.connection.client_open:
            return False
        job.lease.connection.ack(channel, job.tag, False)
        return True


def _outcome(answer: Any) -> pk.Outcome:
    if isinstance(answer, NoNode):
        return pk.Outcome.GONE
    if isinstance(answer, NodeExists):
        return pk.Outcome.EXISTS
    if isinstance(answer, BadVersion):
        return pk.Outcome.CHANGED
    if isinstance(answer, ZkError):
        return pk.Outcome.FAILED
    return pk.Outcome.DONE


# ------------------------------------------------------------ the operator
@dataclass(frozen=True)
class Poison:
    """Key ``key`` fails from ``at`` until ``fixed``; then it is released (or dropped). ``cut``:
    the first worker to park it is cut off ZooKeeper for that long as it writes the record."""

    at: float
    key: str
    fixed: float
    drop: bool
    cut: float = 0.0


class Poisoning:
    """The keys whose handler fails now, and what the schedule does as a worker parks one."""

    def __init__(self, world: World, poisons: tuple[Poison, ...]) -> None:
        self._world = world
        self.failing: set[str] = set()
        self._cuts = {p.key: p.cut for p in poisons if p.cut}

    def fails(self, key: str) -> bool:
        return key in self.failing

    def parking(self, process: Process, key: str) -> None:
        cut = self._cuts.pop(key, 0.0)
        if cut and process.zk_link.up:
            self._world.note(f"fault: {process.name} cut off ZooKeeper as it parks {key}")
            cut_zk(process)
            self._world.after(cut, lambda: heal_zk(process))


def draw_hot_after(seed: int) -> int:
    """Messages of one key in hand from which it steps aside (0: never), for seeds with
    poisoned keys; from a generator of its own, drawn after them."""
    return random.Random(f"hot-{seed}").choice((0, 2, 4, 8))


def draw_poisons(seed: int, keys: int, horizon: float) -> list[Poison]:
    """From a generator of their own, so that every other draw of the seed stays as it was;
    a third of the seeds have none (nor hot keys: their workers park nothing)."""
    rng = random.Random(f"parking-{seed}")
    if rng.random() < 1 / 3:
        return []
    poisons = []
    for _ in range(rng.randint(1, 4)):
        at = rng.uniform(1.0, horizon * 0.8)
        fixed = at + rng.choice((rng.uniform(0.5, 5.0), rng.uniform(5.0, 60.0)))
        drop = rng.random() < 0.25
        cut = rng.choice((0.0, 0.0, rng.uniform(0.5, 3.0), rng.uniform(3.0, 12.0)))
        poisons.append(Poison(at, f"k{rng.randrange(keys)}", fixed, drop, cut))
    return poisons


def set_state(zk: ZooKeeper, paths: Any, key: str, state: ParkedState) -> bool:
    """What ``hashq parked release`` / ``drop`` writes: the state, with the version read.
    False if the key has no record. Found by the key's digest, whatever its bucket (a resize
    changes the bucket the ring sends the key to, not where its record is)."""
    names = [n for n in zk.children(paths.parked) if n.endswith(f"-{key_digest(key)}")]
    if not names:
        return False
    path = f"{paths.parked}/{names[0]}"
    while True:
        try:
            data, stat = zk.get(path)
            record = ParkedRecord.decode(data)
            if record.state is state:
                return True
            zk.set(path, record.to(state).encode(), stat.version)
            return True
        except NoNode:
            return False
        except BadVersion:
            continue


def parked_records(zk: ZooKeeper, paths: Any) -> list[ParkedRecord]:
    return [
        ParkedRecord.decode(zk.get(f"{paths.parked}/{name}")[0])
        for name in zk.children(paths.parked)
    ]
