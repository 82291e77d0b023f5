"""What a worker and a coordinator count, as Prometheus metrics (prometheus-client).

Each process keeps its own registry, so two workers in one test process never mix their
counts. Per-bucket series are labelled ``bucket``; a worker's series carry no worker label,
since Prometheus adds the scrape target's own labels. The hot path pays a dictionary lookup
and an increment per message: children are looked up once per bucket, not per message.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

HANDLER_SECONDS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class WorkerMetrics:
    """The worker's counters; the runners and the bucket leases report into it."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._processed = Counter(
            "hashq_messages_processed", "Messages handled and acknowledged", ["bucket"], registry=r
        )
        self._failed = Counter(
            "hashq_messages_failed", "Handler attempts that raised", ["bucket"], registry=r
        )
        self._retried = Counter(
            "hashq_messages_retried", "Failed messages scheduled again", ["bucket"], registry=r
        )
        self._dead_lettered = Counter(
            "hashq_messages_dead_lettered",
            "Messages moved to the dead-letter queue",
            ["bucket", "reason"],
            registry=r,
        )
        self.handler_seconds = Histogram(
            "hashq_handler_seconds", "Handler run time", buckets=HANDLER_SECONDS, registry=r
        )
        self.in_flight = Gauge("hashq_messages_in_flight", "Handlers running now", registry=r)
        self.waiting = Gauge(
            "hashq_messages_waiting_for_key",
            "Messages held back until the message before them of the same key finished",
            registry=r,
        )
        self.grants = Gauge("hashq_grants_held", "Buckets this worker consumes", registry=r)
        self.handovers = Counter(
            "hashq_handovers", "Buckets this worker drained and released", registry=r
        )
        self.drain_seconds = Histogram(
            "hashq_drain_seconds", "From revocation to release of a bucket", registry=r
        )
        self.zk_connected = Gauge(
            "hashq_zookeeper_connected", "1 while the ZooKeeper session is connected", registry=r
        )
        self.state = Gauge(
            "hashq_worker_state", "1 for the state the worker is in", ["state"], registry=r
        )
        self._per_bucket: dict[int, tuple[Counter, Counter, Counter]] = {}

    def _children(self, bucket: int) -> tuple[Counter, Counter, Counter]:
        children = self._per_bucket.get(bucket)
        if children is None:
            label = str(bucket)
            children = (
                self._processed.labels(label),
                self._failed.labels(label),
                self._retried.labels(label),
            )
            self._per_bucket[bucket] = children
        return children

    def processed(self, bucket: int) -> None:
        self._children(bucket)[0].inc()

    def failed(self, bucket: int) -> None:
        self._children(bucket)[1].inc()

    def retried(self, bucket: int) -> None:
        self._children(bucket)[2].inc()

    def dead_lettered(self, bucket: int, reason: str) -> None:
        self._dead_lettered.labels(str(bucket), reason).inc()

    def set_state(self, state: str, every: list[str]) -> None:
        for name in every:
            self.state.labels(name).set(1 if name == state else 0)


class CoordinatorMetrics:
    """The coordinator's view: leadership, handovers and fences, and the queues' depth."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.leader = Gauge(
            "hashq_coordinator_leader", "1 while this coordinator leads", registry=r
        )
        self.zk_connected = Gauge(
            "hashq_zookeeper_connected", "1 while the ZooKeeper session is connected", registry=r
        )
        self.workers = Gauge("hashq_workers", "Registered workers", registry=r)
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
