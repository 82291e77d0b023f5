"""Carrying faults out on a simulated cluster, and healing them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tools.sim import armed, upgrade
from tools.sim.faults import ADDED_KINDS, Fault
from tools.sim.links import cut_zk, cut_zk_for, freeze, heal_amqp, heal_both, heal_zk, thaw
from tools.sim.process import Process

if TYPE_CHECKING:
    from tools.sim.cluster import Cluster
    from tools.sim.worker import SimWorker


def apply(cluster: Cluster, fault: Fault) -> bool:
    """Carry ``fault`` out; False if it had nothing to act on (its target is down, say)."""
    kind = fault.kind
    to_worker = ("crash", "stop", "amqp-partition", "server-cancel", "connection-reset")
    if kind in to_worker or kind in ADDED_KINDS:
        return _apply_to_worker(cluster, fault)
    if kind in ("freeze", "zk-partition"):
        return _apply_to_any(cluster, fault)
    if kind in armed.ARMED:
        return armed.arm(cluster, fault)
    if kind == "leader-zk-partition":
        return _cut_leader_off_zk(cluster)
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
        world.after(duration, lambda: heal_amqp(worker))
    elif kind == "refused-reconnect":  # then a node that refuses after the handshake began
        if worker.connection is None:
            return False
        worker.refusing = 1 + fault.target % 2
        cluster.broker.close_connection(worker.connection, "CONNECTION_FORCED - reset")
    elif kind == "connection-reset":  # a RabbitMQ node of a cluster going, a reset link
        if worker.connection is None:
            return False
        if fault.target >= 8:  # the worker's link dies, seen by the broker first
            armed.cut_off_unheard(cluster, worker, duration)
        cluster.broker.close_connection(worker.connection, "CONNECTION_FORCED - reset")
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
        freeze(cluster, process)
        world.after(duration, lambda: thaw(process))
    else:
        cut_zk(process)
        world.after(duration, lambda: heal_zk(process))
    return True


def _cut_leader_off_zk(cluster: Cluster) -> bool:
    """The leading coordinator, within its session."""
    leaders = cluster.leaders()
    if leaders:
        cut_zk_for(cluster, leaders[0], cluster.scenario.coordinator_config.session_timeout)
    return bool(leaders)


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
            world.after(duration, lambda: heal_amqp(coordinator))
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
    armed.disarm(cluster)
    for index in range(len(cluster.workers)):
        cluster.restart_worker(index)
    for index in range(len(cluster.coordinators)):
        cluster.restart_coordinator(index)
    for process in [*cluster.workers, *cluster.coordinators]:
        thaw(process)
        heal_both(process)


def _any_process(cluster: Cluster, target: int) -> Process:
    processes: list[Process] = [*cluster.workers, *cluster.coordinators]
    return processes[target % len(processes)]


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
        cut_zk(worker)
    if how in ("amqp-partition", "isolated"):
        cluster.broker.partition(worker.amqp_link)
    if how == "freeze":
        freeze(cluster, worker)


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
        cut_zk(worker)
        world.note(f"{worker.name} cut off ZooKeeper for good after announcing a connection")
        leaders = cluster.leaders()
        for leader in leaders:
            cut_zk_for(cluster, leader, session, longer)
        if not leaders:
            world.note("no leader to cut off ZooKeeper with it")

    def announced() -> None:
        world.after(world.rng.uniform(0.05, 0.5), cut)

    worker.on_link_up = announced
    if worker.connection is not None:
        cluster.broker.close_connection(worker.connection, "CONNECTION_FORCED")
