"""What happens to a worker (events) and what it asks for (actions): plain data passed between
``WorkerMachine`` and its edges. Leases are named by the number the machine gave them."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from hashq.records import Assignment


class Session(enum.Enum):
    """The worker's ZooKeeper session, as it bears on what the worker may do."""

    CONNECTED = "connected"
    """Registered and watching: may start and acknowledge messages of its grants."""
    SUSPENDED = "suspended"
    """Connection lost, session perhaps alive: start nothing new; in-flight ones may finish."""
    LOST = "lost"
    """Session expired: its grants are void. Cut off every bucket, then register afresh."""


# ------------------------------------------------------------ events
@dataclass(frozen=True)
class SessionChanged:
    """The ZooKeeper client's state: CONNECTED (some session; not necessarily ours any more),
    SUSPENDED or LOST."""

    session: Session


@dataclass(frozen=True)
class PauseSeen:
    """The process's clock jumped: it was stopped or starved for ``seconds``."""

    seconds: float


@dataclass(frozen=True)
class SessionConfirmed:
    """ZooKeeper's answer to ``ConfirmSession(asked)``."""

    asked: int
    verdict: Session


@dataclass(frozen=True)
class AssignmentRead:
    """The worker's assignment as read (by the watch, or after an announcement); ``zxid`` is
    the node's modification zxid, -1 if the node does not exist."""

    zxid: int
    assignment: Assignment | None


@dataclass(frozen=True)
class Registered:
    """A new incarnation opened its first connection (``connection``: the runtime's number for
    it, rising over the process's life) and registered."""

    incarnation: str
    connection: int


@dataclass(frozen=True)
class RegisterFailed:
    error: str


@dataclass(frozen=True)
class LinkLost:
    """AMQP connection ``connection`` closed. It may be reported before the ``LinkUp`` or
    ``Registered`` that opened it (the connection died while it was being announced)."""

    connection: int


@dataclass(frozen=True)
class LinkUp:
    """Connection ``connection`` is open, holds the liveness queue, and was announced."""

    connection: int


@dataclass(frozen=True)
class RegistrationDeleted:
    """The registration node of ``incarnation`` was deleted while the session lives: the
    coordinator expelled it (its AMQP connection closed and none came back within the crash
    grace), or the worker deleted it itself."""

    incarnation: str


@dataclass(frozen=True)
class LinkFailed:
    error: str
    registration_gone: bool = False  # the announcement found the registration not ours


@dataclass(frozen=True)
class Subscribed:
    lease: int
    ok: bool = True
    error: str = ""


@dataclass(frozen=True)
class ChannelLost:
    """The broker closed a lease's channel or cancelled its consumer."""

    lease: int
    reason: str
    consumer_timeout: bool = False


@dataclass(frozen=True)
class Closed:
    """A lease's channel is closed (after ``Drain`` or ``CutOff``); ``running`` handlers of it
    have not returned yet (``Settled`` follows when they have). ``confirmed``: the broker
    closed the channel, or answered its close, on a connection still alive; else (the
    connection died) the broker may still hold the channel, its consumer cancelled and its
    unacknowledged messages checked out, until it notices."""

    lease: int
    running: int = 0
    confirmed: bool = True


@dataclass(frozen=True)
class Settled:
    lease: int


@dataclass(frozen=True)
class QueueAnswered:
    """A bucket queue's answer to ``AskQueue``: its ready messages and its consumers, or None
    if it could not be asked (no connection, the declare failed)."""

    lease: int
    answer: tuple[int, int] | None


@dataclass(frozen=True)
class ReleaseWritten:
    lease: int
    ok: bool = True
    error: str = ""


@dataclass(frozen=True)
class Tick:
    """Time passed (the machine's ``wake_at``)."""


@dataclass(frozen=True)
class Stop:
    """Stop: drain and release what is held, within the machine's ``stop_within``."""


Event = (
    SessionChanged
    | PauseSeen
    | SessionConfirmed
    | AssignmentRead
    | Registered
    | RegisterFailed
    | LinkLost
    | LinkUp
    | LinkFailed
    | RegistrationDeleted
    | Subscribed
    | ChannelLost
    | Closed
    | Settled
    | QueueAnswered
    | ReleaseWritten
    | Tick
    | Stop
)


# ------------------------------------------------------------ actions
@dataclass(frozen=True)
class BeginIncarnation:
    """Drop any connection; open the first connection of a new incarnation, then register it
    (``Registered`` or ``RegisterFailed``)."""


@dataclass(frozen=True)
class Reconnect:
    """Drop the connection; open a new connection of this incarnation (under a name it never
    used), hold its liveness queue, announce it and read the assignment (``LinkUp`` or
    ``LinkFailed``)."""


@dataclass(frozen=True)
class DropConnection:
    pass


@dataclass(frozen=True)
class PauseRunners:
    """Start no handler (running ones go on)."""


@dataclass(frozen=True)
class ResumeRunners:
    pass


@dataclass(frozen=True)
class ConfirmSession:
    """Ask ZooKeeper whether the registration is still this session's and incarnation's."""

    asked: int


@dataclass(frozen=True)
class Subscribe:
    lease: int
    bucket: int
    epoch: int


@dataclass(frozen=True)
class AskQueue:
    """Ask the bucket queue of a lease, on the current connection, for its ready messages
    and consumers (a passive declare; ``QueueAnswered``)."""

    lease: int
    bucket: int


@dataclass(frozen=True)
class Drain:
    """Cancel the consumer, finish what was delivered within ``within`` seconds, then close
    (``Closed``)."""

    lease: int
    within: float


@dataclass(frozen=True)
class CutOff:
    """Close the lease's channel now, telling running handlers to stop (``Closed``)."""

    lease: int


@dataclass(frozen=True)
class WriteRelease:
    lease: int
    bucket: int
    epoch: int
    incarnation: str


@dataclass(frozen=True)
class Withdraw:
    """Delete the registration (keeping the ZooKeeper session) and drop the connection: this
    incarnation ends."""


@dataclass(frozen=True)
class Deregister:
    """Stopping is over: delete the registration, close everything."""


Action = (
    BeginIncarnation
    | Reconnect
    | DropConnection
    | PauseRunners
    | ResumeRunners
    | ConfirmSession
    | Subscribe
    | AskQueue
    | Drain
    | CutOff
    | WriteRelease
    | Withdraw
    | Deregister
)
