"""The bucket topology of one app, as plain data: names, queue arguments and the record kept in
ZooKeeper. No I/O here; ``hashq.provision`` declares it.

Layout for app ``orders`` with N buckets:

- ``hashq.orders``: the exchange publishers use (durable, fanout), bound to exactly one
  destination, the ring;
- ``hashq.orders.ring``: the ``x-consistent-hash`` exchange, transient and internal, bound to
  the bucket queues in index order with weight ``"1"``;
- bucket queues ``hashq.orders.b0000`` .. ``hashq.orders.b{N-1:04}`` (durable): name order is
  index order;
- dead-letter exchange ``hashq.orders.dlx`` (fanout) and its queue ``hashq.orders.dead``;
- the record ``/hashq/orders/topology`` in ZooKeeper.

Why the ring is transient: the consistent-hash exchange keeps its ring in memory and, after a
broker restart, rebuilds it from the recovered bindings in whatever order recovery produces
(measured on RabbitMQ 3.10: 88% of keys moved to other buckets after one restart). A transient
ring does not survive a restart at all: until a hashq process rebuilds it, in index order, the
entry exchange has no binding and mandatory publishes come back unroutable instead of landing
in the wrong bucket. The ring is always complete before the entry exchange is bound to it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from hashq import placement
from hashq.errors import TopologyMismatch
from hashq.parked import parking_queue
from hashq.settings import Settings

log = logging.getLogger(__name__)

TOPOLOGY_VERSION = 1
BUCKET_WEIGHT = "1"  # the consistent-hash exchange reads a binding's routing key as its weight

QueueType = Literal["quorum", "classic"]


@dataclass(frozen=True)
class Topology:
    """What an app's exchange, queues and ZooKeeper nodes are called and how they are declared."""

    app: str
    buckets: int
    queue_type: QueueType
    delivery_limit: int
    version: int = TOPOLOGY_VERSION

    @classmethod
    def from_settings(cls, settings: Settings) -> Topology:
        return cls(
            app=settings.app,
            buckets=settings.buckets,
            queue_type=settings.queue_type,
            delivery_limit=settings.delivery_limit,
        )

    # ------------------------------------------------------------ names
    @property
    def exchange(self) -> str:
        return f"hashq.{self.app}"

    @property
    def ring_exchange(self) -> str:
        return f"hashq.{self.app}.ring"

    @property
    def dead_letter_exchange(self) -> str:
        return f"hashq.{self.app}.dlx"

    @property
    def dead_letter_queue(self) -> str:
        return f"hashq.{self.app}.dead"

    def bucket_of(self, key: str) -> int:
        """The bucket the ring routes ``key`` to (``hashq.placement``)."""
        return placement.bucket_of(key, self.buckets)

    def bucket_queue(self, index: int) -> str:
        if not 0 <= index < self.buckets:
            raise IndexError(f"bucket {index} out of range 0..{self.buckets - 1}")
        return self.queue_name(index)

    @property
    def queue_beyond(self) -> str:
        """The name the next bucket queue would have: if it exists, the app has more buckets."""
        return self.queue_name(self.buckets)

    def liveness_queue(self, worker_id: str, incarnation: str) -> str:
        """An exclusive queue that each AMQP connection of a worker incarnation declares before
        it is named in ZooKeeper. Exclusive, so at most one connection of the incarnation holds
        it, and the broker deletes it when that connection closes, however it closes: its
        absence tells the coordinator, without the management API and without a listing lag,
        that no connection of the incarnation can consume."""
        return f"hashq.{self.app}.alive.{worker_id}.{incarnation}"

    def queue_name(self, index: int) -> str:
        """Bucket queue ``index``'s name, whether or not this topology has it (a resize's)."""
        return f"hashq.{self.app}.b{index:04d}"

    def bucket_queues(self) -> list[str]:
        return [self.bucket_queue(index) for index in range(self.buckets)]

    def bucket_of_queue(self, name: str) -> int:
        prefix = f"hashq.{self.app}.b"
        if not name.startswith(prefix) or not name[len(prefix) :].isdigit():
            raise ValueError(f"{name!r} is not a bucket queue of app {self.app!r}")
        return int(name[len(prefix) :])

    @property
    def zk_root(self) -> str:
        return f"/hashq/{self.app}"

    @property
    def zk_topology(self) -> str:
        return f"{self.zk_root}/topology"

    # ------------------------------------------------------------ declarations
    def bucket_arguments(self) -> dict[str, Any]:
        """Arguments of every bucket queue. They cannot change after creation."""
        arguments: dict[str, Any] = {
            "x-queue-type": self.queue_type,
            "x-single-active-consumer": True,
            "x-dead-letter-exchange": self.dead_letter_exchange,
        }
        if self.queue_type == "quorum":
            # A message that keeps killing its consumer is dead-lettered instead of looping.
            arguments["x-delivery-limit"] = self.delivery_limit
            # At-least-once dead-lettering needs reject-publish overflow; without it, a
            # dead-lettered message can be lost if the broker fails at that moment.
            arguments["x-dead-letter-strategy"] = "at-least-once"
            arguments["x-overflow"] = "reject-publish"
        return arguments

    def dead_letter_arguments(self) -> dict[str, Any]:
        return {"x-queue-type": self.queue_type}

    def parking_arguments(self) -> dict[str, Any]:
        """A parked key's queue: of the buckets' type, with no delivery limit (a released
        message handed back by a closed channel must not be dead-lettered for it), and a single
        active consumer, as a bucket queue has: a new owner's consumer gets nothing while a
        dead owner's still counts, so what that one held comes back before anything later."""
        return {"x-queue-type": self.queue_type, "x-single-active-consumer": True}

    def parking_queue(self, key: str) -> str:
        return parking_queue(self.app, key)

    # ------------------------------------------------------------ the ZooKeeper record
    def to_record(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_record(cls, data: bytes) -> Topology:
        try:
            fields = json.loads(data)
            return cls(**fields)
        except (ValueError, TypeError) as exc:
            raise TopologyMismatch(f"unreadable topology record in ZooKeeper: {exc}") from None

    def differences(self, other: Topology) -> list[str]:
        """Human-readable ``field: ours vs theirs`` for every field that differs."""
        ours, theirs = asdict(self), asdict(other)
        return [
            f"{name} {ours[name]!r} vs {theirs[name]!r}"
            for name in ours
            if ours[name] != theirs[name]
        ]

    def adopt(self, recorded: Topology) -> Topology:
        """The recorded topology, which these settings must match but for the bucket count: a
        resize (``hashq.resizing``) changes the app's count, not every process's settings. A
        count that differs is said once, as a warning; anything else raises as
        ``require_same`` does."""
        self.require_same(replace(recorded, buckets=self.buckets))
        if recorded.buckets != self.buckets:
            log.warning(
                "app %r has %d buckets, HASHQ_BUCKETS says %d: using %d (the app was resized; "
                "set HASHQ_BUCKETS=%d)",
                self.app,
                recorded.buckets,
                self.buckets,
                recorded.buckets,
                recorded.buckets,
            )
        return recorded

    def require_same(self, recorded: Topology) -> None:
        """Raise ``TopologyMismatch`` unless ``recorded`` (what exists) equals these settings."""
        if recorded.version > TOPOLOGY_VERSION:
            raise TopologyMismatch(
                f"app {self.app!r} has topology version {recorded.version}; this hashq "
                f"understands up to {TOPOLOGY_VERSION}: upgrade hashq"
            )
        diffs = self.differences(recorded)
        if diffs:
            raise TopologyMismatch(
                f"app {self.app!r} already exists with another topology (settings vs existing: "
                f"{'; '.join(diffs)}); it was left untouched: use the existing settings or "
                "another HASHQ_APP"
            )
