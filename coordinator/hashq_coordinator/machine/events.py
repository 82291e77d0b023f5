"""What happens to a coordinator (events) and what it asks for (actions): plain data passed
between ``CoordinatorMachine`` and its edges (``hashq_coordinator.runtime``, the simulator)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

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


@dataclass(frozen=True)
class ObserveFailed:
    error: str


@dataclass(frozen=True)
class Committed:
    pass


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
    | Deposed
    | FenceDone
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
    """Read the registrations and the releases (``Observed`` or ``ObserveFailed``)."""


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


@dataclass(frozen=True)
class Fence:
    incarnation: Incarnation


@dataclass(frozen=True)
class Resign:
    """No longer leading: every fence under way is abandoned (``GiveBack`` follows)."""

    why: str


Action = Claim | GiveBack | Observe | Commit | Fence | Resign
