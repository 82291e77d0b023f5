"""Faults drawn from a seed, as a schedule fixed before the run starts (so that a failing run
can be shrunk by leaving faults out)."""

from __future__ import annotations

import random
from dataclasses import dataclass

FAULT_KINDS = (
    "crash",  # kill -9 a worker; it starts again (same id) after the duration
    "stop",  # stop a worker cleanly; it starts again after the duration
    "freeze",  # SIGSTOP a worker or coordinator for the duration
    "amqp-partition",  # cut a worker off RabbitMQ
    "drain-partition",  # cut a worker off RabbitMQ the next time it starts draining a bucket
    "zk-partition",  # cut a worker or coordinator off ZooKeeper
    "leader-zk-partition",  # cut the leading coordinator off ZooKeeper, within its session
    "claim-partition",  # ... a coordinator off ZooKeeper just after it took the lock
    "commit-partition",  # ... a coordinator off ZooKeeper as it commits (within its session)
    "revoke-cut",  # a bucket's owner cut off both servers as its revoke is committed
    "confirm-freeze",  # a pause, then a freeze as its session check answers, till buckets moved
    "announce-cut",  # the broker closes a worker's new connection while it is announced
    "coordinator-crash",  # kill -9 a coordinator; it starts again after the duration
    "management-partition",  # cut a coordinator off RabbitMQ (API and liveness)
    "management-failing",  # the management API fails every call
    "rabbitmq-restart",
    "zookeeper-restart",
    "server-cancel",  # the broker cancels a worker's consumer (basic.cancel)
    "rolling-upgrade",  # each worker stopped and started again in turn, with new settings
    # The broker closes a worker's AMQP connection; the worker lives on. For targets 8 and up,
    # the worker is cut off both servers for the duration as it happens, so it hears nothing.
    "connection-reset",
)
# Faults a test adds to a drawn schedule (not drawn themselves, so that every seed's schedule
# stays as it was): the broker closes a worker's connection, and its next connect first meets
# one or two nodes that refuse it after the handshake began (each reports that name closed).
ADDED_KINDS = ("refused-reconnect",)


@dataclass(frozen=True)
class Fault:
    at: float
    kind: str
    target: int  # index of the worker or coordinator (taken modulo their number)
    duration: float

    def __str__(self) -> str:
        return f"{self.at:8.3f}s {self.kind} #{self.target} for {self.duration:.2f}s"


def draw_faults(rng: random.Random, horizon: float, mean_gap: float) -> list[Fault]:
    faults = []
    at = rng.uniform(1.0, 2 * mean_gap)
    while at < horizon:
        kind = rng.choice(FAULT_KINDS)
        duration = rng.choice((rng.uniform(0.05, 2.0), rng.uniform(2.0, 12.0)))
        faults.append(Fault(round(at, 3), kind, rng.randrange(16), round(duration, 3)))
        at += rng.expovariate(1 / mean_gap)
    return faults
