"""One bucket lease's deliveries, without I/O: their queue order, their key lanes, which jobs
run, and what is still held unacknowledged.

``BucketLease`` (``hashq.worker.bucket_lease``) feeds it what its channel delivers and carries
out what it says; the simulator feeds it the deliveries of its broker model. A job is anything
with a ``key``.
"""

from __future__ import annotations

import enum
from typing import Generic, Protocol, TypeVar

from hashq.worker.machine.lanes import InOrder, Lanes


class LeaseState(enum.Enum):
    CONSUMING = "consuming"
    """May start deliveries (unless the worker is paused) and acknowledge them."""
    DRAINING = "draining"
    """No new deliveries arrive (the consumer is cancelled); what was delivered is still
    finished and acknowledged, until the drain timeout."""
    CLOSED = "closed"
    """The channel is closed: everything unacknowledged went back to the queue in order.
    Nothing is started or acknowledged any more; handlers still running were told to stop."""


class Keyed(Protocol):
    @property
    def key(self) -> str: ...


J = TypeVar("J", bound=Keyed)


class LeaseCore(Generic[J]):
    """What one lease holds: deliveries in tag order, one active job per key."""

    def __init__(self) -> None:
        self.state = LeaseState.CONSUMING
        self._order: InOrder[J] = InOrder()
        self._lanes: Lanes[J] = Lanes()
        self.held = 0  # delivered, not yet acknowledged or dead-lettered
        # Insertion-ordered (not a set of objects hashed by address): the simulator replays a
        # seed exactly only if every iteration order is the same in every process.
        self._running: dict[J, None] = {}

    def deliver(self, tag: int, job: J) -> list[J]:
        """A delivery (tags are 1, 2, 3, ... per channel, perhaps out of order): the jobs now
        ready to run, in queue order."""
        ready = []
        for arrived in self._order.push(tag, job):
            if self.state is LeaseState.CLOSED:
                continue
            self.held += 1
            if self._lanes.add(arrived.key, arrived):
                ready.append(arrived)
        return ready

    def may_start(self) -> bool:
        return self.state is not LeaseState.CLOSED

    def started(self, job: J) -> None:
        self._running[job] = None

    def finished(self, job: J) -> J | None:
        """``job`` was acknowledged or dead-lettered: its key's next job, now ready, if any."""
        self._running.pop(job, None)
        if self.state is LeaseState.CLOSED:
            return None  # the channel handed everything back: nothing is held any more
        self.held -= 1
        return self._lanes.done(job.key)

    def dropped(self, job: J) -> None:
        """``job`` will not finish here (its handler was cut off); it goes back to the queue."""
        self._running.pop(job, None)

    def drain(self) -> None:
        if self.state is LeaseState.CONSUMING:
            self.state = LeaseState.DRAINING

    def close(self) -> list[J]:
        """The channel closes: nothing is held any more. Returns the jobs still running, which
        must be told to stop (a thread may not listen: see ``settled``)."""
        self.state = LeaseState.CLOSED
        self._lanes.clear()
        self.held = 0
        return list(self._running)

    @property
    def idle(self) -> bool:
        """Nothing delivered is left unfinished."""
        return self.held == 0

    @property
    def settled(self) -> bool:
        """No handler of this lease runs any more."""
        return not self._running

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return self._lanes.waiting
