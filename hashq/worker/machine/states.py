"""What the worker's machine (``hashq.worker.machine.core``) keeps: its state, each lease's phase
and record, and its counts; and the timings of its retries.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

RETRY_SECONDS = 1.0  # between attempts to register, reconnect or subscribe
RELEASE_RETRY_SECONDS = 0.5
CONFIRM_SECONDS = 0.3  # between questions to ZooKeeper while suspended
FIRST_RECONNECT_SECONDS = 0.05


def reconnect_delay(failed: int) -> float:
    """Before the next attempt to reconnect after ``failed`` attempts failed: from 0.05 s,
    doubling up to ``RETRY_SECONDS``. A live worker whose connection the broker closed must take
    its liveness queue again within the coordinator's crash grace (0.5 s), and its first try
    fails while the broker has not yet ended the old connection's exclusive queue."""
    return min(RETRY_SECONDS, FIRST_RECONNECT_SECONDS * 2.0 ** max(0, failed - 1))


class WorkerState(enum.Enum):
    STARTING = "starting"
    """Connecting and registering; holds nothing."""
    WAITING = "waiting"
    """Registered, granted nothing: consumes nothing, waits for the coordinator."""
    RUNNING = "running"
    """Registered: consumes exactly its granted buckets."""
    SUSPENDED = "suspended"
    """ZooKeeper unreachable, session perhaps alive: starts nothing new."""
    FENCED = "fenced"
    """Session lost: every bucket was cut off; registering afresh."""
    WITHDRAWN = "withdrawn"
    """Cut off from RabbitMQ for longer than ``withdraw_after``: deregistered, so that the
    coordinator moves its buckets; holds nothing; registers afresh once RabbitMQ answers."""
    STOPPING = "stopping"
    """Draining every bucket, then releasing and deregistering."""
    STOPPED = "stopped"


class Phase(enum.Enum):
    """Where one lease is, as the worker's loop sees it."""

    PROVING = "proving"
    """Granted, but its last lease's connection died under it: nothing is consumed until the
    bucket queue says it took back what that connection held (``AskQueue``), or, quiet, until
    ``RETURN_GRACE_SECONDS`` after the current connection came up. No channel is open."""
    SUBSCRIBING = "subscribing"
    """Asked for; nothing consumed yet."""
    CONSUMING = "consuming"
    """Granted at its epoch: deliveries run."""
    DRAINING = "draining"
    """Revoked: the consumer is cancelled, what was delivered finishes, then the channel closes."""
    CLOSING = "closing"
    """Being cut off: its channel closes now, what it held goes back to the queue."""
    CLOSED = "closed"
    """Its channel is closed; it waits until no handler of it runs (``running``), then is
    released (if revoked), dropped (if void), or dropped and subscribed again (if still
    granted)."""
    RELEASING = "releasing"
    """Closed, settled and revoked: the release is being written."""


# The phases a cut-off still has to close (``WorkerLeases._close``).
OPEN_PHASES = frozenset({Phase.PROVING, Phase.SUBSCRIBING, Phase.CONSUMING, Phase.DRAINING})


@dataclass
class Lease:
    number: int  # unique within the machine: events name leases by it
    bucket: int
    epoch: int
    incarnation: str
    phase: Phase = Phase.SUBSCRIBING
    revoked: bool = False  # to be released once closed and settled
    void: bool = False  # granted to a lost session, or abandoned: nothing to release
    running: int = 0  # handlers still running after the close
    connection: int = 0  # the number of the connection it was consumed on
    unconfirmed: bool = False  # closed while its connection died: see ``_may_release``
    retry_at: float = 0.0  # when a failed release is written again, or a queue asked again
    asking: bool = False  # PROVING: a question to its queue is under way
    told: bool = False  # PROVING: the wait was logged (once per lease)
    since: float = 0.0  # when it was revoked (for the drain-time metric)

    @property
    def fields(self) -> dict[str, int]:
        """For ``extra=``: the JSON log format shows them as fields."""
        return {"bucket": self.bucket, "epoch": self.epoch}


@dataclass
class WorkerCounts:
    handovers: int = 0
    consumer_timeouts: int = 0
    drain_seconds: list[float] = field(default_factory=list)  # taken by the edge
