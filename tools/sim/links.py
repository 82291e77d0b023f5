"""Cutting a simulated process off the servers, freezing it, and healing it: what every fault
does to links. A frozen process stays cut off whatever heals meanwhile; its thaw heals it (a
stopped process sends and answers nothing, whatever the network does)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tools.sim.process import Process

if TYPE_CHECKING:
    from tools.sim.cluster import Cluster


def freeze(cluster: Cluster, process: Process) -> None:
    """To the servers a stopped process is cut off: they give up on it after their timeouts."""
    process.freeze()
    cluster.broker.partition(process.amqp_link)
    cut_zk(process)


def thaw(process: Process) -> None:
    if process.frozen_since is None or process.stranded:
        return
    process.amqp_link.heal()
    _open_zk(process)
    process.resume()


def cut_zk(process: Process) -> None:
    client = getattr(process, "client", None)
    if process.zk_link.up and client is not None:
        process.zk_link.cut()
        client.partitioned()


def cut_zk_for(cluster: Cluster, process: Process, session: float, longer: bool = False) -> None:
    """Off ZooKeeper for less than its session timeout: the session, and its nodes, survive.
    ``longer``: for 1.5 to 3 session timeouts, so that the session expires."""
    world = cluster.world
    seconds = session * (world.rng.uniform(1.5, 3.0) if longer else world.rng.uniform(0.2, 0.8))
    if not process.zk_link.up or not process.alive:
        return
    world.note(f"{process.name} cut off ZooKeeper for {seconds:.2f}s")
    cut_zk(process)
    world.after(seconds, lambda: heal_zk(process))


def partition_for(cluster: Cluster, process: Process, seconds: float, why: str) -> None:
    """Off RabbitMQ for ``seconds``."""
    cluster.world.note(f"{process.name} cut off RabbitMQ {why}, for {seconds:.2f}s")
    cluster.broker.partition(process.amqp_link)
    cluster.world.after(seconds, lambda: heal_amqp(process))


def heal_zk(process: Process) -> None:
    if process.frozen_since is None:
        _open_zk(process)


def heal_amqp(process: Process) -> None:
    if process.frozen_since is None and not process.stranded:
        process.amqp_link.heal()


def heal_both(process: Process) -> None:
    heal_zk(process)
    heal_amqp(process)


def _open_zk(process: Process) -> None:
    if not process.zk_link.up and not process.stranded:
        process.zk_link.heal()
        client = getattr(process, "client", None)
        if client is not None:
            client.healed()
