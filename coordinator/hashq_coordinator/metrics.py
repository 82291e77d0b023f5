"""The coordinator's metrics (Prometheus): leadership, handovers and fences, and the queues'
depth. Served by ``hashq._io.health`` beside the readiness probe."""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CollectorRegistry, Counter, Gauge

from hashq._io.health import describe_process
from hashq._io.management import Management
from hashq.topology import Topology

log = logging.getLogger(__name__)


class CoordinatorMetrics:
    """The coordinator's view: leadership, handovers and fences, and the queues' depth."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        describe_process(r, "coordinator")
        self.leader = Gauge(
            "hashq_coordinator_leader", "1 while this coordinator leads", registry=r
        )
        self.zk_connected = Gauge(
            "hashq_zookeeper_connected", "1 while the ZooKeeper session is connected", registry=r
        )
        self.workers = Gauge("hashq_workers", "Registered workers", registry=r)
        self.can_fence = Gauge(
            "hashq_coordinator_can_fence",
            "1 while the management API lets this coordinator list and close connections",
            registry=r,
        )
        self.crash_detection = Gauge(
            "hashq_coordinator_crash_detection",
            "1 while this coordinator hears RabbitMQ's connection.closed events (a crashed "
            "worker's buckets move within the crash grace); 0: only at session expiry",
            registry=r,
        )
        self.expelled = Counter(
            "hashq_crashes_expelled",
            "Workers this coordinator expelled as crashed since it started (their AMQP "
            "connection closed and none came back within the crash grace)",
            registry=r,
        )
        self.grants = Counter(
            "hashq_bucket_grants",
            "Buckets granted at a new epoch: first grants and moves",
            registry=r,
        )
        self.fences = Counter(
            "hashq_fences", "Workers cut off through the management API", registry=r
        )
        self.in_transit = Gauge(
            "hashq_buckets_in_transit", "Buckets revoked and not yet granted again", registry=r
        )
        self.queue_depth = Gauge(
            "hashq_bucket_queue_messages",
            "Messages in a bucket's queue (ready and unacknowledged): the lag",
            ["bucket"],
            registry=r,
        )
        self.dead_letters = Gauge(
            "hashq_dead_letter_messages", "Messages in the dead-letter queue", registry=r
        )


async def read_depths(
    metrics: CoordinatorMetrics, management: Management, topology: Topology
) -> None:
    """Each bucket queue's depth (the lag) and the dead-letter queue's, from the management API;
    left as they were when it does not answer."""
    try:
        depths = await asyncio.to_thread(management.queue_depths)
    except Exception as exc:
        log.debug("reading queue depths: %r", exc)
        return
    for bucket, name in enumerate(topology.bucket_queues()):
        metrics.queue_depth.labels(str(bucket)).set(depths.get(name, 0))
    metrics.dead_letters.set(depths.get(topology.dead_letter_queue, 0))
