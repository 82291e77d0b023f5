"""What happens to a coordinator (events) and what it asks for (actions): plain data passed
between ``CoordinatorMachine`` and its edges (``hashq_coordinator.runtime``, the simulator)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from hashq.records import Assignment, BucketRecord, Registration
from hashq_coordinator.machine.fencebook import Incarnation, Sighting


class Role(enum.Enum):
    CANDIDATE = "candidate"
    """Waiting for the lock: writes nothing."""
    CLAIMING = "claiming"
    """Holds the lock; raising the leader epoch and reading the state: writes nothing else
    yet. If that fails the lock must be given back: a lock node left behind would sit ahead of
    every later one of this session, and nobody could lead."""
    LEADER = "leader"
    """Holds the lock and the current leader epoch: the only one that writes decisions."""
    STOPPED = "stopped"


# ------------------------------------------------------------ events
@dataclass(frozen=True)
class LockAcquired:
    pass


@dataclass(frozen=True)
class ClaimFailed:
    error: str


@dataclass(frozen=True)
class Elected:
    """The lock is held and the leader epoch raised; what ZooKeeper held then."""

    epoch: int
    version: int  # of the leader node: every commit checks it
    records: Mapping[int, BucketRecord]
    assignments: Mapping[str, Assignment]


@dataclass(frozen=True)
class SessionLost:
    pass


@dataclass(frozen=True)
class Observed:
    workers: Mapping[str, Registration]
    releases: Mapping[tuple[int, int], str]  # (bucket, epoch) -> node name
    versions: Mapping[str, int] = field(default_factory=dict)  # of each registration node read
    # Of the incarnations ``Observe.ask_gone`` named, those the broker said have no connection
    # left, asked after the registrations were read.
    gone: frozenset[Incarnation] = frozenset()
    # Of the buckets ``Observe.ask_held`` named, those whose queue answered that no consumer
    # holds any of its messages (``hashq.records.queue_holds_nothing``).
    emptied: frozenset[int] = frozenset()
    # The topology record's bucket count, read first (0: not read): it grows when a resize
    # commits (``hashq.resizing``), and the plan takes the new buckets in.
    buckets: int = 0


@dataclass(frozen=True)
class ObserveFailed:
    error: str


@dataclass(frozen=True)
class Committed:
    pass


@dataclass(frozen=True)
class ExpelRefused:
    """A commit that expelled crashed workers was refused, nothing of it written: one of
    their registrations changed after it was read (the worker announced a new connection, so it
    lives), or is gone already. Not a loss of the lead."""

    error: str


@dataclass(frozen=True)
class ConnectionClosed:
    """The broker said (its event exchange) that a connection of this worker incarnation
    closed. Whether the worker crashed is asked once the crash grace has passed."""

    incarnation: Incarnation
    connection: str  # its name (``hashq.records.worker_connection_name``)


@dataclass(frozen=True)
class Deposed:
    error: str


@dataclass(frozen=True)
class FenceDone:
    incarnation: Incarnation
    covered: Sighting


@dataclass(frozen=True)
class StepDown:
    """Stop leading (the process stops)."""

    why: str


@dataclass(frozen=True)
class Tick:
    pass


Event = (
    LockAcquired
    | ClaimFailed
    | Elected
    | SessionLost
    | StepDown
    | Observed
    | ObserveFailed
    | Committed
    | ExpelRefused
    | Deposed
    | FenceDone
    | ConnectionClosed
    | Tick
)


# ------------------------------------------------------------ actions
@dataclass(frozen=True)
class Claim:
    """Raise the leader epoch (a checked set), tie the lead to this session, and read every
    bucket record and assignment (``Elected`` or ``ClaimFailed``)."""


@dataclass(frozen=True)
class GiveBack:
    """Release the lock, retrying until ZooKeeper takes it; then campaign again."""


@dataclass(frozen=True)
class Observe:
    """Read the topology record's bucket count, the registrations (with their node versions)
    and the releases, then ask the
    broker whether each incarnation in ``ask_gone`` still holds a connection (its liveness
    queue), and each bucket queue in ``ask_held`` how many messages it has ready and how many
    consumers (a passive declare): ``Observed`` or ``ObserveFailed``. A question the broker
    cannot answer counts as 'not gone' and 'still held'."""

    ask_gone: tuple[Incarnation, ...] = ()
    ask_held: tuple[int, ...] = ()


@dataclass(frozen=True)
class Commit:
    """One transaction, checked against the leader node's ``version``."""

    version: int
    records: Mapping[int, BucketRecord]  # changed
    known_records: tuple[int, ...]  # buckets whose node exists
    assignments: Mapping[str, Assignment]  # changed
    known_assignments: tuple[str, ...]
    removed: tuple[str, ...]  # assignments of workers gone
    consumed: tuple[str, ...]  # release nodes acted upon
    # Registrations of crashed workers to delete, each checked against the version read
    # before the broker said the incarnation has no connection (``ExpelRefused`` if changed).
    expelled: Mapping[str, int] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """Nothing to write: the machine takes it as committed without asking ZooKeeper."""
        return not (
            self.records or self.assignments or self.removed or self.consumed or self.expelled
        )


@dataclass(frozen=True)
class Fence:
    incarnation: Incarnation


@dataclass(frozen=True)
class Wake:
    """Post a ``Tick`` after ``after`` seconds (a crash grace ends then)."""

    after: float


@dataclass(frozen=True)
class Resign:
    """No longer leading: every fence under way is abandoned (``GiveBack`` follows)."""

    why: str


Action = Claim | GiveBack | Observe | Commit | Fence | Wake | Resign
