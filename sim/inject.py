"""Carrying faults out on a simulated cluster, and healing them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from coordinator.machine import Commit
from hashq.protocol import BucketState
from sim import upgrade
from sim.faults import Fault
from sim.process import Process

if TYPE_CHECKING:
    from sim.cluster import Cluster
    from sim.coordinator import SimCoordinator
    from sim.worker import SimWorker


def apply(cluster: Cluster, fault: Fault) -> bool:
    """Carry ``fault`` out; False if it had nothing to act on (its target is down, say)."""
    kind = fault.kind
    if kind in ("crash", "stop", "amqp-partition", "drain-partition", "server-cancel"):
        return _apply_to_worker(cluster, fault)
    if kind in ("freeze", "zk-partition"):
        return _apply_to_any(cluster, fault)
    if kind in ARMED:
        return _apply_armed(cluster, fault)
    if kind == "rolling-upgrade":
        return upgrade.start(cluster)
    return _apply_to_servers(cluster, fault)


def _apply_to_worker(cluster: Cluster, fault: Fault) -> bool:
    world, kind, duration = cluster.world, fault.kind, fault.duration
    index = fault.target % len(cluster.workers)
    worker = cluster.workers[index]
    if not worker.alive or worker.stopped:
        return False
    if kind == "crash":
        worker.kill()
        world.after(duration, lambda: cluster.restart_worker(index))
    elif kind == "stop":
        worker.stop()
        world.after(duration, lambda: cluster.restart_worker(index))
    elif kind == "amqp-partition":
        cluster.broker.partition(worker.amqp_link)
        world.after(duration, lambda: _heal_amqp(worker))
    elif kind == "drain-partition":
        # Soon after the drain began: its basic.cancel has reached the broker.
        delay = world.rng.uniform(0.02, 1.0)

        def armed() -> None:
            world.after(delay, lambda: _partition_for(cluster, worker, duration))

        worker.on_drain = armed
    else:
        return _cancel_a_consumer(cluster, worker.name)
    return True


def _apply_to_any(cluster: Cluster, fault: Fault) -> bool:
    """Freeze, or cut off ZooKeeper, a worker or a coordinator."""
    world, duration = cluster.world, fault.duration
    process = _any_process(cluster, fault.target)
    if not process.alive or process.frozen_since is not None:
        return False
    if fault.kind == "freeze":
        _freeze(cluster, process)
        world.after(duration, lambda: _thaw(cluster, process))
    else:
        _cut_zk(process)
        world.after(duration, lambda: _heal_zk(process))
    return True


MOVED_WITHIN = 60.0  # the longest a confirm-freeze waits for a bucket to move

ARMED = (
    "confirm-freeze",
    "announce-cut",
    "claim-partition",
    "commit-partition",
    "revoke-cut",
    "leader-zk-partition",
)


def _apply_armed(cluster: Cluster, fault: Fault) -> bool:
    """Faults timed by the protocol itself: they strike at the moment a decision is taken."""
    world = cluster.world
    session = cluster.scenario.coordinator_config.session_timeout
    if fault.kind == "confirm-freeze":
        return _pause_then_freeze_at_confirm(
            cluster, cluster.workers[fault.target % len(cluster.workers)]
        )
    if fault.kind == "announce-cut":
        worker = cluster.workers[fault.target % len(cluster.workers)]

        def cut_new_connection() -> None:
            def cut() -> None:
                if worker.connection is not None and worker.alive:
                    world.note(f"{worker.name}: its new connection closed as it is announced")
                    cluster.broker.close_connection(worker.connection, "CONNECTION_FORCED")

            world.after(world.rng.uniform(0.001, 0.03), cut)

        worker.on_reconnect = cut_new_connection
        return worker.alive
    coordinators = cluster.coordinators
    if fault.kind == "claim-partition":
        coordinator = coordinators[fault.target % len(coordinators)]
        coordinator.on_claim = lambda: _cut_zk_for(cluster, coordinator, session)
        return coordinator.alive
    if fault.kind == "commit-partition":
        coordinator = coordinators[fault.target % len(coordinators)]
        coordinator.on_commit = lambda _: _cut_zk_for(cluster, coordinator, session)
        return coordinator.alive
    if fault.kind == "revoke-cut":
        leaders = _leaders(cluster) or [coordinators[fault.target % len(coordinators)]]
        return _cut_owner_at_revoke(cluster, leaders[0])
    leaders = _leaders(cluster)
    if not leaders:
        return False
    _cut_zk_for(cluster, leaders[0], session)
    return True


def _pause_then_freeze_at_confirm(cluster: Cluster, worker: SimWorker) -> bool:
    """A pause the worker notices, so it checks its session; as ZooKeeper's answer arrives
    (queued for the loop), it is frozen again, until what it holds has moved on: the answer is
    stale by then, and only the check asked after the second pause may be believed."""
    world = cluster.world
    if not worker.alive or worker.stopped or worker.frozen_since is not None or worker.stranded:
        return False
    session = worker.config.session_timeout
    worker.on_confirm = lambda: _freeze_until_moved(cluster, worker)
    world.note(f"{worker.name} paused, to check its session")
    _freeze(cluster, worker)
    world.after(max(0.6, session * world.rng.uniform(0.3, 0.8)), lambda: _thaw(cluster, worker))
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
        return any(cluster.checker.newest_start(bucket) > epoch for bucket, epoch in held)

    world.note(f"{worker.name} frozen again as it checks its session, holding {held}")
    _freeze(cluster, worker)
    world.when(lambda: moved() or world.now >= deadline, lambda: _thaw(cluster, worker))


def _cut_owner_at_revoke(cluster: Cluster, coordinator: SimCoordinator) -> bool:
    """At the next revoke ``coordinator`` commits, the bucket's owner is cut off both servers
    (its host partitioned) within its session: it never hears of the revoke nor of a fence
    closing its connection, so it goes on starting what it holds until its ZooKeeper client
    notices the cut."""

    def armed(commit: Commit) -> None:
        owners = sorted(
            str(record.owner)
            for record in commit.records.values()
            if record.state == BucketState.REVOKING.value and record.owner
        )
        worker = next((w for w in cluster.workers if owners and w.name == owners[0]), None)
        if worker is None:
            coordinator.on_commit = armed  # no revoke in this commit: wait for the next
            return
        seconds = worker.config.session_timeout * cluster.world.rng.uniform(0.2, 0.8)
        cluster.world.note(f"{worker.name} cut off both servers for {seconds:.2f}s at a revoke")
        cluster.broker.partition(worker.amqp_link)
        _cut_zk(worker)
        cluster.world.after(seconds, lambda: _heal_both(worker))

    coordinator.on_commit = armed
    return coordinator.alive


def _leaders(cluster: Cluster) -> list[SimCoordinator]:
    return [c for c in cluster.coordinators if c.alive and c.machine.role.value == "leader"]


def _cut_zk_for(cluster: Cluster, process: Process, session: float, longer: bool = False) -> None:
    """Off ZooKeeper for less than its session timeout: the session, and its nodes, survive.
    ``longer``: for 1.5 to 3 session timeouts, so that the session expires."""
    world = cluster.world
    seconds = session * (world.rng.uniform(1.5, 3.0) if longer else world.rng.uniform(0.2, 0.8))
    if not process.zk_link.up or not process.alive:
        return
    world.note(f"{process.name} cut off ZooKeeper for {seconds:.2f}s")
    _cut_zk(process)
    world.after(seconds, lambda: _heal_zk(process))


def _apply_to_servers(cluster: Cluster, fault: Fault) -> bool:
    world, broker, duration = cluster.world, cluster.broker, fault.duration
    if fault.kind in ("coordinator-crash", "management-partition"):
        index = fault.target % len(cluster.coordinators)
        coordinator = cluster.coordinators[index]
        if not coordinator.alive:
            return False
        if fault.kind == "coordinator-crash":
            coordinator.kill()
            world.after(duration, lambda: cluster.restart_coordinator(index))
        else:
            coordinator.amqp_link.cut()
            world.after(duration, coordinator.amqp_link.heal)
        return True
    if fault.kind == "management-failing":
        broker.api_failing = True
        world.after(duration, lambda: setattr(broker, "api_failing", False))
        return True
    if fault.kind == "rabbitmq-restart":
        if not broker.up:
            return False
        broker.restart(min(duration, 8.0))
        return True
    if fault.kind == "zookeeper-restart":
        if not cluster.zk.up:
            return False
        cluster.zk.restart(min(duration, 8.0))
        return True
    raise ValueError(f"unknown fault kind {fault.kind!r}")


def heal_all(cluster: Cluster) -> None:
    """Every fault ends now: links heal, frozen processes resume, dead ones start again, the
    management API answers. (Server restarts end on their own, within seconds.)"""
    cluster.broker.api_failing = False
    upgrade.end(cluster)
    for index in range(len(cluster.workers)):
        cluster.restart_worker(index)
    for index in range(len(cluster.coordinators)):
        cluster.restart_coordinator(index)
    for process in [*cluster.workers, *cluster.coordinators]:
        _thaw(cluster, process)
        _heal_both(process)


def _partition_for(cluster: Cluster, process: Process, duration: float) -> None:
    cluster.world.note(f"{process.name} cut off RabbitMQ as it drains, for {duration:.2f}s")
    cluster.broker.partition(process.amqp_link)
    cluster.world.after(duration, lambda: _heal_amqp(process))


def _any_process(cluster: Cluster, target: int) -> Process:
    processes: list[Process] = [*cluster.workers, *cluster.coordinators]
    return processes[target % len(processes)]


def _freeze(cluster: Cluster, process: Process) -> None:
    """A stopped process answers nothing: to the servers it is cut off, and they give up on it
    after their timeouts."""
    process.freeze()
    cluster.broker.partition(process.amqp_link)
    _cut_zk(process)


def _heal_amqp(process: Process) -> None:
    if not process.stranded:
        process.amqp_link.heal()


def _heal_both(process: Process) -> None:
    _heal_zk(process)
    _heal_amqp(process)


def _thaw(cluster: Cluster, process: Process) -> None:
    if process.frozen_since is None or process.stranded:
        return
    process.amqp_link.heal()
    _heal_zk(process)
    process.resume()


def _cut_zk(process: Process) -> None:
    client = getattr(process, "client", None)
    if process.zk_link.up and client is not None:
        process.zk_link.cut()
        client.partitioned()


def _heal_zk(process: Process) -> None:
    if not process.zk_link.up and not process.stranded:
        process.zk_link.heal()
        client = getattr(process, "client", None)
        if client is not None:
            client.healed()


def _cancel_a_consumer(cluster: Cluster, worker: str) -> bool:
    broker = cluster.broker
    for connection in broker.connections:
        if connection.name.startswith(f"hashq-worker-{worker}") and connection.channels:
            channel = min(connection.channels.values(), key=lambda c: c.number)
            broker.cancel_from_server(channel)
            return True
    return False


def strand(cluster: Cluster, worker: SimWorker, how: str) -> None:
    """Cut ``worker`` off for good: from ZooKeeper, from RabbitMQ, from both, or frozen."""
    if how == "zk-after-reconnect":
        _strand_after_reconnect(cluster, worker)
        return
    worker.stranded = True
    if how in ("zk-partition", "isolated"):
        _cut_zk(worker)
    if how in ("amqp-partition", "isolated"):
        cluster.broker.partition(worker.amqp_link)
    if how == "freeze":
        _freeze(cluster, worker)


def _strand_after_reconnect(cluster: Cluster, worker: SimWorker) -> None:
    """The broker closes the worker's connection; soon after it has announced its new one and
    subscribed on it, it is cut off ZooKeeper for good, and so is the leader for a while:
    longer than its session (the next leader never saw the announcement), or within it (the
    same leader looks again after the worker's own, shorter, session may have expired). Either
    way the new connection may still be missing from the management API's list when the
    worker is fenced: the fence must wait the full lag."""
    world = cluster.world
    session = cluster.scenario.coordinator_config.session_timeout
    longer = world.rng.random() < 0.5

    def cut() -> None:
        if not worker.alive or cluster.stranded_worker != worker.name:
            return
        worker.stranded = True
        _cut_zk(worker)
        world.note(f"{worker.name} cut off ZooKeeper for good after announcing a connection")
        leaders = _leaders(cluster)
        for leader in leaders:
            _cut_zk_for(cluster, leader, session, longer)
        if not leaders:
            world.note("no leader to cut off ZooKeeper with it")

    def announced() -> None:
        world.after(world.rng.uniform(0.05, 0.5), cut)

    worker.on_link_up = announced
    if worker.connection is not None:
        cluster.broker.close_connection(worker.connection, "CONNECTION_FORCED")
