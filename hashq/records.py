"""The ZooKeeper protocol between workers and the coordinator, as plain data: paths, records and
their JSON encoding. ``docs/protocol.md`` describes it in prose; this module is its one
implementation, shared by both sides.

Under ``/hashq/<app>``:

- ``workers/<worker_id>`` (ephemeral; the worker writes): a ``Registration``;
- ``assignments/<worker_id>`` (persistent; the coordinator writes): an ``Assignment``, the
  buckets that worker may consume and the epoch of each grant;
- ``buckets/<NNNN>`` (persistent; the coordinator writes): a ``BucketRecord``;
- ``releases/<NNNN>-<epoch>`` (persistent; the worker that held the bucket creates it, the
  coordinator deletes it once acted upon): a ``Release``;
- ``leader`` (persistent; the leading coordinator writes): a ``Leadership``. Every write of the
  leader checks this node's version, so a deposed leader's writes fail.
"""

from __future__ import annotations

import enum
import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from typing import Any

# 2: a worker names each AMQP connection of an incarnation with a number and announces it in its
# registration before consuming on it (a version-1 coordinator would not find such a connection
# to fence, so it must grant such a worker nothing).
PROTOCOL_VERSION = 2
# How long a bucket queue may take, after a connection died, to take back what that
# connection's channels held: a quorum queue whose leader was on a failed node does so only
# once it has a leader again (tests/e2e/test_cluster.py; the simulation's RETURN_LAG_SECONDS,
# 4.9 s, stays just below it). Neither a worker's release after a lost connection nor a grant after
# a fence lets the next owner consume sooner (docs/protocol.md, "Returns take time").
RETURN_GRACE_SECONDS = 5.0
# How long after the broker last answered it a worker may start a message delivered on that
# connection (``hashq.worker.machine.contact``): so a connection the broker closed starts nothing
# in its worker this long after the close, whatever that worker knows (docs/protocol.md,
# "Granting before the return grace: the old owner's bound"). Half a second: a crash's failover
# waits out this bound (or the crash grace, if longer) after the broker's word of the close.
BROKER_CONTACT_SECONDS = 0.5
# How often a worker asks a bucket queue again while it waits for the queue's word before
# consuming it again after a lost connection (``hashq.worker.machine.proof``).
QUEUE_ASK_SECONDS = 0.25
QUEUE_ANSWER_WITHIN = 2.0  # a question not answered by then counts as no answer


def queue_holds_nothing(ready: int, consumers: int) -> bool:
    """Whether a quorum queue's answer to a passive declare (its ready messages, its
    consumers) proves that no consumer holds any of its messages, so that a new consumer gets
    the oldest first. A quorum queue counts a consumer until what it was delivered is settled
    or returned: a cancelled one that still holds messages is counted (``rabbit_fifo``
    keeps it, status ``cancelled``), and a dead channel's consumer is removed in the same step
    that returns what it held (``down``). But a queue that cannot answer (no leader, a
    timeout) says 0 ready and 0 consumers (``rabbit_quorum_queue:stat/2``), so only an answer
    with ready messages proves anything: an empty queue's answer cannot be told from none. A
    classic queue does not count a cancelled consumer that still holds messages: it is never
    asked. The coordinator asks before granting a fenced bucket early; a worker, before
    consuming again a bucket whose connection died under it."""
    return consumers == 0 and ready > 0


class BucketState(enum.Enum):
    """Where a bucket is in its life, as the coordinator records it."""

    UNASSIGNED = "unassigned"
    """No owner; nobody may consume it."""
    GRANTED = "granted"
    """``owner`` may consume it at ``epoch``; no one else may."""
    REVOKING = "revoking"
    """Taken from ``owner``'s assignment; ``owner`` drains and writes a release at ``epoch``.
    Nobody else may consume it yet."""
    FENCING = "fencing"
    """``owner`` is gone or did not release in time; the coordinator cuts its connection off.
    Nobody else may consume it yet."""


class Paths:
    """ZooKeeper paths of one app."""

    def __init__(self, app: str) -> None:
        self.root = f"/hashq/{app}"
        self.workers = f"{self.root}/workers"
        self.assignments = f"{self.root}/assignments"
        self.buckets = f"{self.root}/buckets"
        self.releases = f"{self.root}/releases"
        self.parked = f"{self.root}/parked"  # ``hashq.parked``
        self.resize = f"{self.root}/resize"  # ``hashq.resizing``
        self.topology = f"{self.root}/topology"  # ``hashq.topology``

    def worker(self, worker_id: str) -> str:
        return f"{self.workers}/{worker_id}"

    def assignment(self, worker_id: str) -> str:
        return f"{self.assignments}/{worker_id}"

    def bucket(self, index: int) -> str:
        return f"{self.buckets}/{index:04d}"

    def release(self, index: int, epoch: int) -> str:
        return f"{self.releases}/{release_name(index, epoch)}"

    @property
    def leader(self) -> str:
        return f"{self.root}/leader"

    @property
    def election(self) -> str:
        return f"{self.root}/election"


def worker_connection_name(worker_id: str, incarnation: str, number: int = 1) -> str:
    """The name of an incarnation's ``number``-th AMQP connection attempt: each reconnect makes
    a new connection, announced in the registration before anything is consumed on it."""
    return f"hashq-worker-{worker_id}-{incarnation}-{number}"


def worker_connection_names(worker_id: str, incarnation: str) -> Iterator[str]:
    """One name per connection attempt of an incarnation, never one twice: the broker reports
    the close of a failed attempt too, and the leader takes a report about a name as about the
    connection announced under it (``FenceBook.heard_closed``)."""
    return (worker_connection_name(worker_id, incarnation, n) for n in itertools.count(1))


def incarnation_connections(worker_id: str, incarnation: str) -> re.Pattern[str]:
    """Matches the name of every connection of one incarnation (and the unnumbered name of a
    protocol-1 worker): what a fence of that incarnation closes."""
    return re.compile(re.escape(f"hashq-worker-{worker_id}-{incarnation}") + r"(-\d+)?")


_WORKER_CONNECTION = re.compile(r"hashq-worker-(?P<worker>.+)-(?P<incarnation>[^-]+)-\d+")


def parse_worker_connection_name(name: str) -> tuple[str, str] | None:
    """The (worker id, incarnation) a connection named by ``worker_connection_name`` belongs
    to; None for any other name (a coordinator's, a publisher's, a protocol-1 worker's)."""
    match = _WORKER_CONNECTION.fullmatch(name)
    return (match["worker"], match["incarnation"]) if match else None


def release_name(index: int, epoch: int) -> str:
    return f"{index:04d}-{epoch:010d}"


def parse_release_name(name: str) -> tuple[int, int] | None:
    bucket, _, epoch = name.partition("-")
    if not (bucket.isdigit() and epoch.isdigit()):
        return None
    return int(bucket), int(epoch)


def _encode(record: Any) -> bytes:
    return json.dumps(asdict(record), sort_keys=True).encode()


def record_fields(data: bytes, what: str, record: type[Any] | None = None) -> dict[str, Any]:
    """The record's fields; with ``record``, only those it knows, so that a field added by a
    newer version is passed over (a rolling upgrade) rather than making the record unreadable."""
    try:
        found = json.loads(data)
    except ValueError:
        raise ValueError(f"unreadable {what} record") from None
    if not isinstance(found, dict):
        raise ValueError(f"unreadable {what} record")
    if record is None:
        return found
    known = {f.name for f in fields(record)}
    return {name: value for name, value in found.items() if name in known}


@dataclass(frozen=True)
class Registration:
    """A live worker. ``incarnation`` changes each time the worker registers (a new ZooKeeper
    session), so grants made to an earlier life of the same worker id are never honoured."""

    worker_id: str
    incarnation: str
    capacity: int
    version: int = PROTOCOL_VERSION
    host: str = ""
    pid: int = 0
    connection: str = ""  # its current AMQP connection's name (see ``worker_connection_name``)
    drain_timeout: float = 0.0  # how long it drains a revoked bucket; 0: unknown (protocol 1)
    session_timeout: float = 0.0  # its ZooKeeper session timeout; 0: unknown (older workers)
    # How long after the broker last answered it it still starts what it was delivered (its
    # version's ``BROKER_CONTACT_SECONDS``); 0: unknown (older workers), so a bucket fenced off
    # it is granted only ``RETURN_GRACE_SECONDS`` after the fence, whatever its queue says.
    contact_seconds: float = 0.0

    def encode(self) -> bytes:
        return _encode(self)

    @classmethod
    def decode(cls, data: bytes) -> Registration:
        return cls(**record_fields(data, "registration", cls))


@dataclass(frozen=True)
class Assignment:
    """The buckets one worker incarnation may consume: bucket index -> grant epoch. And
    ``incoming``: buckets moving to it (revoking or fencing with it as target), which it may
    not consume yet; only a hint, so that it opens their channels while the old owner drains.
    ``buckets``: the app's bucket count the leader plans over (0: a leader from before resizes),
    so that a worker started before a resize (``hashq.resizing``) takes grants of new buckets."""

    incarnation: str
    grants: dict[int, int] = field(default_factory=dict)
    leader_epoch: int = 0
    incoming: tuple[int, ...] = ()
    buckets: int = 0

    def encode(self) -> bytes:
        fields = asdict(self)
        fields["grants"] = {str(bucket): epoch for bucket, epoch in self.grants.items()}
        if self.incoming:
            fields["incoming"] = sorted(self.incoming)
        else:  # as before the field: older readers see the same record
            del fields["incoming"]
        if not self.buckets:
            del fields["buckets"]
        return json.dumps(fields, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> Assignment:
        fields = record_fields(data, "assignment")
        grants = {int(bucket): int(epoch) for bucket, epoch in fields.get("grants", {}).items()}
        incoming = tuple(int(bucket) for bucket in fields.get("incoming", ()))
        epoch, buckets = int(fields.get("leader_epoch", 0)), int(fields.get("buckets", 0))
        return cls(fields["incarnation"], grants, epoch, incoming, buckets)

    def grants_for(self, incarnation: str) -> dict[int, int]:
        """The grants, if addressed to ``incarnation``; none otherwise."""
        return dict(self.grants) if incarnation == self.incarnation else {}

    def incoming_for(self, incarnation: str) -> tuple[int, ...]:
        """The incoming buckets, if addressed to ``incarnation``; none otherwise."""
        return self.incoming if incarnation == self.incarnation else ()


@dataclass(frozen=True)
class BucketRecord:
    """The coordinator's record of one bucket. ``epoch`` only ever grows. While a bucket moves
    (``revoking``, ``fencing``), ``target`` names the worker it goes to and ``since`` when the
    move began, on the writing leader's monotonic clock (a new leader restarts it on its own, as
    no clock of another machine means anything here), so that a new leader continues a
    half-done handover."""

    state: BucketState = BucketState.UNASSIGNED
    owner: str | None = None
    incarnation: str | None = None
    epoch: int = 0
    target: str | None = None
    since: float = 0.0

    def encode(self) -> bytes:
        fields = asdict(self)
        fields["state"] = self.state.value
        return json.dumps(fields, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> BucketRecord:
        fields = record_fields(data, "bucket", cls)
        try:
            state = BucketState(fields.pop("state", BucketState.UNASSIGNED.value))
        except ValueError:
            raise ValueError("unreadable bucket record: unknown state") from None
        return cls(state, **fields)

    @property
    def moving(self) -> bool:
        """Revoking or fencing: taken from ``owner``, not yet granted to ``target``."""
        return self.state in (BucketState.REVOKING, BucketState.FENCING)


@dataclass(frozen=True)
class Leadership:
    """Who leads, and the leader epoch: it grows with every new leader."""

    leader: str
    epoch: int

    def encode(self) -> bytes:
        return _encode(self)

    @classmethod
    def decode(cls, data: bytes) -> Leadership:
        return cls(**record_fields(data, "leader", cls))


@dataclass(frozen=True)
class Release:
    """Written by a worker once it has stopped consuming a bucket: nothing of ``bucket`` will be
    started or acknowledged by ``worker_id``/``incarnation`` at ``epoch`` any more."""

    worker_id: str
    incarnation: str
    bucket: int
    epoch: int

    def encode(self) -> bytes:
        return _encode(self)

    @classmethod
    def decode(cls, data: bytes) -> Release:
        return cls(**record_fields(data, "release", cls))
