"""A rolling upgrade as the simulation draws it: each worker in turn is stopped cleanly and,
once it has ended, started again with the new release's settings (another drain timeout and
withdrawal delay); the next goes once this one has registered again. Then each coordinator in
turn is killed and started again: killed rather than stopped, the harder case, since its lock
node lasts until its session expires. Healing ends an upgrade under way."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from tools.sim.worker import DRAIN_TIMEOUTS, WITHDRAW_DELAYS
from tools.sim.world import POLL_SECONDS

if TYPE_CHECKING:
    from tools.sim.cluster import Cluster

REGISTER_WITHIN = 30.0  # a fault may keep a restarted worker from registering for a while


def start(cluster: Cluster) -> bool:
    """Begin an upgrade; False if one is under way."""
    if cluster.upgrading:
        return False
    cluster.upgrades += 1
    cluster.upgrading = cluster.upgrades
    _worker(cluster, cluster.upgrades, 0)
    return True


def end(cluster: Cluster) -> None:
    """No further process is stopped; one stopped already starts again as healing starts it."""
    cluster.upgrading = 0


def _worker(cluster: Cluster, round_: int, index: int) -> None:
    world = cluster.world
    if cluster.upgrading != round_:
        return
    if index >= len(cluster.workers):
        _coordinator(cluster, round_, 0)
        return
    worker = cluster.workers[index]
    if not worker.alive or worker.stopped or worker.told_to_stop or worker.stranded:
        world.after(POLL_SECONDS, lambda: _worker(cluster, round_, index + 1))
        return
    world.note(f"rolling upgrade: {worker.name}")
    worker.stop()
    new = replace(
        cluster.worker_configs[index],
        drain_timeout=world.rng.choice(DRAIN_TIMEOUTS),
        withdraw_after=world.rng.choice(WITHDRAW_DELAYS),
    )

    def ended() -> None:
        cluster.worker_configs[index] = new
        cluster.restart_worker(index)
        deadline = world.now + REGISTER_WITHIN
        world.when(
            lambda: bool(cluster.workers[index].machine.incarnation) or world.now >= deadline,
            lambda: _worker(cluster, round_, index + 1),
        )

    world.when(lambda: not worker.alive or worker.stopped, ended)


def _coordinator(cluster: Cluster, round_: int, index: int) -> None:
    if cluster.upgrading != round_:
        return
    if index >= len(cluster.coordinators):
        end(cluster)
        return
    coordinator = cluster.coordinators[index]
    if coordinator.alive:
        cluster.world.note(f"rolling upgrade: {coordinator.name}")
        coordinator.kill()
        cluster.world.after(0.5, lambda: cluster.restart_coordinator(index))
    cluster.world.after(3.0, lambda: _coordinator(cluster, round_, index + 1))
