"""Faults timed by the protocol itself: armed when drawn, they strike at the moment a decision
is taken (a drain begins, a lock is taken, a commit or a revoke is written, a session check is
answered, a new connection is announced). A process already armed for that moment is not armed
again: the fault then counts as not carried out. Healing disarms them all."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hashq.records import BucketRecord, BucketState
from hashq_coordinator.machine.events import Commit
from tools.sim.faults import Fault
from tools.sim.links import (
    cut_zk,
    cut_zk_for,
    freeze,
    heal_amqp,
    heal_both,
    partition_for,
    thaw,
)

if TYPE_CHECKING:
    from tools.sim.cluster import Cluster
    from tools.sim.coordinator import SimCoordinator
    from tools.sim.worker import SimWorker

ARMED = (
    "drain-partition",
    "confirm-freeze",
    "announce-cut",
    "claim-partition",
    "commit-partition",
    "revoke-cut",
)
WORKER_HOOKS = ("on_drain", "on_confirm", "on_reconnect")
COORDINATOR_HOOKS = ("on_claim", "on_commit")
MOVED_WITHIN = 60.0  # the longest a confirm-freeze waits for a bucket to move


def arm(cluster: Cluster, fault: Fault) -> bool:
    worker = cluster.workers[fault.target % len(cluster.workers)]
    coordinator = cluster.coordinators[fault.target % len(cluster.coordinators)]
    session = cluster.scenario.coordinator_config.session_timeout
    kind = fault.kind
    if kind == "drain-partition":
        # Soon after the drain began: its basic.cancel has reached the broker.
        return _arm(worker, "on_drain", lambda: _partition_soon(cluster, worker, fault.duration))
    if kind == "confirm-freeze":
        return _pause_then_freeze_at_confirm(cluster, worker)
    if kind == "announce-cut":
        return _arm(worker, "on_reconnect", lambda: _cut_new_connection(cluster, worker))
    if kind == "claim-partition":
        return _arm(coordinator, "on_claim", lambda: cut_zk_for(cluster, coordinator, session))
    if kind == "commit-partition":
        return _arm(coordinator, "on_commit", lambda _: cut_zk_for(cluster, coordinator, session))
    return _cut_owner_at_revoke(cluster, (cluster.leaders() or [coordinator])[0])


def disarm(cluster: Cluster) -> None:
    for worker in cluster.workers:
        for hook in WORKER_HOOKS:
            setattr(worker, hook, None)
    for coordinator in cluster.coordinators:
        for hook in COORDINATOR_HOOKS:
            setattr(coordinator, hook, None)


def _arm(process: SimWorker | SimCoordinator, hook: str, strike: Callable[..., None]) -> bool:
    if not process.alive or getattr(process, "stopped", False) or getattr(process, hook):
        return False
    setattr(process, hook, strike)
    return True


def _partition_soon(cluster: Cluster, worker: SimWorker, seconds: float) -> None:
    delay = cluster.world.rng.uniform(0.02, 1.0)
    cluster.world.after(delay, lambda: partition_for(cluster, worker, seconds, "as it drains"))


def _cut_new_connection(cluster: Cluster, worker: SimWorker) -> None:
    def cut() -> None:
        if worker.connection is not None and worker.alive:
            cluster.world.note(f"{worker.name}: its new connection closed as it is announced")
            cluster.broker.close_connection(worker.connection, "CONNECTION_FORCED")

    cluster.world.after(cluster.world.rng.uniform(0.001, 0.03), cut)


def _pause_then_freeze_at_confirm(cluster: Cluster, worker: SimWorker) -> bool:
    """A pause the worker notices, so it checks its session; as ZooKeeper's answer arrives
    (queued for the loop), it is frozen again, until what it holds has moved on: the answer is
    stale by then, and only the check asked after the second pause may be believed."""
    world = cluster.world
    if worker.frozen_since is not None or worker.stranded:
        return False
    if not _arm(worker, "on_confirm", lambda: _freeze_until_moved(cluster, worker)):
        return False
    session = worker.config.session_timeout
    world.note(f"{worker.name} paused, to check its session")
    freeze(cluster, worker)
    world.after(max(0.6, session * world.rng.uniform(0.3, 0.8)), lambda: thaw(worker))
    return True


def _freeze_until_moved(cluster: Cluster, worker: SimWorker) -> None:
    """Frozen until a bucket it holds has started elsewhere at a newer epoch (its session
    expired and the coordinator fenced it meanwhile), at most ``MOVED_WITHIN``; for 1.5 to 3
    of its sessions if it holds nothing."""
    world = cluster.world
    if not worker.alive or worker.frozen_since is not None or worker.stranded:
        return
    held = [(lease.bucket, lease.epoch) for lease in worker.machine.leases.values()]
    session = worker.config.session_timeout
    deadline = world.now + (MOVED_WITHIN if held else session * world.rng.uniform(1.5, 3.0))

    def moved() -> bool:
        return any(cluster.invariants.newest_start(bucket) > epoch for bucket, epoch in held)

    world.note(f"{worker.name} frozen again as it checks its session, holding {held}")
    freeze(cluster, worker)
    world.when(lambda: moved() or world.now >= deadline, lambda: thaw(worker))


def _cut_owner_at_revoke(cluster: Cluster, coordinator: SimCoordinator) -> bool:
    """At the next revoke ``coordinator`` commits, the bucket's owner is cut off both servers
    (its host partitioned) within its session: it never hears of the revoke nor of a fence
    closing its connection, so it goes on starting what it holds until its ZooKeeper client
    notices the cut."""

    def armed(commit: Commit) -> None:
        owner = _revoked_owner(cluster, commit)
        if owner is None:
            coordinator.on_commit = armed  # no revoke of a reachable owner: wait for the next
            return
        seconds = owner.config.session_timeout * cluster.world.rng.uniform(0.2, 0.8)
        cluster.world.note(f"{owner.name} cut off both servers for {seconds:.2f}s at a revoke")
        cluster.broker.partition(owner.amqp_link)
        cut_zk(owner)
        cluster.world.after(seconds, lambda: heal_both(owner))

    return _arm(coordinator, "on_commit", armed)


def cut_off_unheard(cluster: Cluster, worker: SimWorker, seconds: float) -> None:
    """The worker's link to RabbitMQ dies, seen by the broker first (it closes the connection,
    which the worker does not hear of); as a leader commits the worker's expulsion, the worker
    is cut off ZooKeeper too, within its session, so it hears neither of the expulsion nor of
    the close and goes on starting what it holds until its ZooKeeper client notices. Healed
    after ``seconds`` (and the ZooKeeper cut after its own time)."""
    world = cluster.world
    world.note(f"{worker.name} cut off RabbitMQ unheard as its connection is closed")
    cluster.broker.partition(worker.amqp_link)
    world.after(seconds, lambda: heal_amqp(worker))
    until = world.now + seconds

    def armed(coordinator: SimCoordinator, commit: Commit) -> None:
        if world.now > until:
            return
        if worker.name not in commit.expelled:
            coordinator.on_commit = lambda c: armed(coordinator, c)
            return
        if worker.alive and worker.zk_link.up:
            cut_zk_for(cluster, worker, worker.config.session_timeout)

    for coordinator in cluster.leaders():
        if coordinator.on_commit is None:
            coordinator.on_commit = lambda c, coordinator=coordinator: armed(coordinator, c)


def _revoked_owner(cluster: Cluster, commit: Commit) -> SimWorker | None:
    """The owner of the first bucket this commit revokes, if it runs the incarnation the
    record names and nothing else has cut it off."""
    for _, record in sorted(commit.records.items()):
        worker = _running(cluster, record)
        if record.state is BucketState.REVOKING and worker is not None:
            return worker
    return None


def _running(cluster: Cluster, record: BucketRecord) -> SimWorker | None:
    for worker in cluster.workers:
        if worker.name == record.owner and worker.machine.incarnation == record.incarnation:
            cut_off = worker.frozen_since is not None or worker.stranded or not worker.zk_link.up
            return None if cut_off or not worker.alive else worker
    return None
