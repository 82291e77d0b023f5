"""Parked keys of one bucket lease, without I/O: which keys of the bucket are parked, what
becomes of each of their messages (run, move to the key's parking queue, wait), and the steps
that park a key, take it over at a new epoch, release or drop it, and let it flow again.

``LeaseCore`` asks it about every message that becomes its key's active one; the edges
(``hashq.worker.bucket_lease``, the simulator's ``tools.sim.parking``) carry out its actions
and report back. docs/protocol.md, "Parked keys", says why each rule is needed:

- a key's messages move only once its record exists (created or claimed at this epoch), so the
  next owner, which reads the records before it starts anything, knows the key is parked;
- one message of a key moves at a time, published with a confirm before it is acknowledged,
  so the parking queue holds the key's messages in their order (perhaps twice: at least once);
- a released key flows again only once no message of it moves any more and its parking queue,
  asked on the channel that acknowledged what it delivered, holds nothing;
- every write of a record but the first carries the version read, and an owner claims the
  record at its epoch before it acts on it, so a former owner's late write fails.
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from hashq.parked import ParkedRecord
from hashq.worker.machine.lanes import InOrder

log = logging.getLogger(__name__)

ASK_AGAIN_SECONDS = 0.25  # an answer that proved nothing: ask the parking queue again after


class Parkable(Protocol):
    @property
    def key(self) -> str: ...

    @property
    def from_parking(self) -> bool:
        """Delivered from its key's parking queue, not from the bucket queue."""
        ...


J = TypeVar("J", bound=Parkable)


class Fate(enum.Enum):
    """What becomes of a message that is its key's active one."""

    RUN = "run"
    MOVE = "move"
    """Published to its key's parking queue with a confirm, then acknowledged."""
    DEAD_LETTER = "dead-letter"
    """A parked message of a dropped key: dead-lettered with a confirm, then acknowledged."""
    WAIT = "wait"
    """Not yet: it stays its key's active message until the key's phase allows it to go on."""
    GONE = "gone"
    """A parked message whose parking channel was closed: it went back to the parking queue."""


class ParkPhase(enum.Enum):
    """Where a parked key is in this lease, each phase documented by what it allows."""

    CLAIMING = "claiming"
    """Its record is being created (a message of it just failed for good) or claimed at this
    epoch (found at the lease's start). Nothing of the key runs or moves: its active message
    waits."""
    PARKED = "parked"
    """Each message of the key moves to its parking queue, one at a time, in lane order."""
    RELEASING = "releasing"
    """Its messages still move; its parking queue is consumed, and what it holds runs in order
    (or is dead-lettered, if the key is dropped)."""
    EMPTYING = "emptying"
    """Nothing of the key moves any more (its active message waits); what is left in the
    parking queue runs (or is dead-lettered) until the queue proves it holds nothing."""
    UNPARKING = "unparking"
    """Its parking queue proved empty: the consumer stops, and the record is deleted; the key's
    active message still waits. (The empty queue stays, for the key's next park: a quorum queue
    declared again while its deletion is under way made RabbitMQ 3.10 close the connection.)"""
    LOST = "lost"
    """Its record was claimed at a higher epoch: this lease is stale. Nothing of the key runs,
    moves or is written here any more."""


# ------------------------------------------------------------ actions
class RecordOp(enum.Enum):
    CREATE = "create"
    SET = "set"
    DELETE = "delete"
    READ = "read"


class Outcome(enum.Enum):
    DONE = "done"
    """Created, set, deleted, or read (with its version)."""
    EXISTS = "exists"
    GONE = "gone"
    CHANGED = "changed"
    """The version did not match: written by someone since it was read."""
    FAILED = "failed"
    """No answer (a connection lost): perhaps applied, perhaps not."""


@dataclass(frozen=True)
class WriteRecord:
    key: str
    op: RecordOp
    record: ParkedRecord | None = None
    version: int = -1
    after: float = 0.0  # seconds to wait first (a write that got no answer is read again)
    why: str = ""  # a create: "failed" (a message failed for good) or "hot" (a hot key)


@dataclass(frozen=True)
class WatchRecord:
    """Tell ``seen`` of every change of the key's record (the operator's) while the lease
    lives: asked once, as the key becomes one of the lease's."""

    key: str


@dataclass(frozen=True)
class ConsumeParked:
    """Consume the key's parking queue on a channel of its own (of the lease's connection);
    report ``consuming`` once the broker confirmed the consumer."""

    key: str


@dataclass(frozen=True)
class StopParked:
    """Close the key's parking channel: what it holds goes back to the parking queue, in order."""

    key: str


@dataclass(frozen=True)
class AskParked:
    """A passive declare of the key's parking queue on its parking channel (after the
    acknowledgements sent on it), ``after`` seconds from now; report ``answered``."""

    key: str
    after: float = 0.0


@dataclass(frozen=True)
class CutOff(Generic[J]):
    """Stop ``job``'s handler: its parking channel closed under it, so its message went back
    to the parking queue (which is consumed again only once the handler stopped, so that its
    redelivery never runs beside it); report ``dropped`` once it stopped."""

    job: J


@dataclass(frozen=True)
class Dispatch(Generic[J]):
    """Hand ``job`` to the runners: it became its key's active message, or may go on now."""

    job: J


Queue = ConsumeParked | StopParked | AskParked  # a parking queue's I/O
Action = WriteRecord | WatchRecord | Queue | CutOff[Any] | Dispatch[Any]


@dataclass(eq=False)
class ParkedKey(Generic[J]):
    """One parked key of the lease."""

    record: ParkedRecord
    phase: ParkPhase = ParkPhase.CLAIMING
    version: int = -1  # the record's version as last written or read here
    creating: bool = False  # CLAIMING by creating the record (else by claiming one found)
    waiting: J | None = None  # its active bucket message, waiting for the phase to allow it
    moving: J | None = None  # its bucket message being moved
    consuming: bool = False  # a parking consumer was asked for
    confirmed: bool = False  # ... and the broker confirmed it
    order: InOrder[J] = field(default_factory=InOrder)
    queue: deque[J] = field(default_factory=deque)  # parked messages delivered, not yet active
    active: J | None = None  # the parked message running (or being dead-lettered)
    running: J | None = None  # ... once a runner started it
    cut: J | None = None  # a parked message still running whose channel went (``CutOff``)
    held: int = 0  # parked messages delivered, not yet acknowledged
    asking: bool = False

    @property
    def key(self) -> str:
        return self.record.key

    @property
    def moves(self) -> bool:
        return self.phase in (ParkPhase.PARKED, ParkPhase.RELEASING)
