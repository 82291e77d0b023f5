"""One bucket lease's deliveries, without I/O: their queue order, their key lanes, which jobs
run, and what is still held unacknowledged.

``BucketLease`` (``hashq.worker.bucket_lease``) feeds it what its channel delivers and carries
out what it says; the simulator feeds it the deliveries of its broker model. A job is anything
with a ``key`` that says whether it came from its key's parking queue. What becomes of a job
that is its key's active one, parked keys included, is ``ParkedKeys``'s to say
(``hashq.worker.machine.parked_keys``): ``fate`` as a runner takes it.

A resize's marker (``hashq.resizing``: a job whose ``marker`` is the bucket count the app grows
to) runs no handler and has no lane. It passes (``passable``) once every job delivered before it
is finished, and no key parked here is one the resize moves away (its parked messages would run
after the key's new bucket started); the edge then says so in ZooKeeper and acknowledges it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from hashq.placement import bucket_of
from hashq.worker.machine.lanes import InOrder, Lanes
from hashq.worker.machine.parked_keys import ParkedKeys
from hashq.worker.machine.parking import Action, Fate


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

    @property
    def from_parking(self) -> bool: ...

    @property
    def marker(self) -> int:
        """0, or for a resize's marker the bucket count the resize grows the app to."""
        ...


J = TypeVar("J", bound=Keyed)


@dataclass
class _Marker(Generic[J]):
    job: J
    ahead: dict[str, int]  # key -> its jobs delivered before the marker and not yet finished
    passing: bool = False  # handed to the edge by ``passable``


class LeaseCore(Generic[J]):
    """What one lease holds: deliveries in tag order, one active job per key."""

    def __init__(
        self,
        bucket: int = 0,
        epoch: int = 0,
        worker: str = "",
        parks: bool = False,
        hot_after: int = 0,
        window: int = 0,
    ) -> None:
        """``parks``: the worker parks keys, so the lease reads its bucket's parked keys before
        anything of it goes on (``ParkedKeys.load``). ``hot_after``: a key holding that many
        messages of a full ``window`` (the prefetch) steps aside (``ParkedKeys.step_aside``);
        0: never. Only a full window: a key ahead of the others in a window with room for
        them holds nobody up, and moving it would cost more than running it."""
        self.hot_after, self.window = (hot_after, window) if parks else (0, 0)
        self.state = LeaseState.CONSUMING
        self._order: InOrder[J] = InOrder()
        self._lanes: Lanes[J] = Lanes()
        self.parked: ParkedKeys[J] = ParkedKeys(bucket, epoch, worker)
        self.parked.loaded = not parks
        self.held = 0  # delivered, not yet acknowledged or dead-lettered
        # Insertion-ordered (not a set of objects hashed by address): the simulator replays a
        # seed exactly only if every iteration order is the same in every process.
        self._running: dict[J, None] = {}
        self._markers: list[_Marker[J]] = []  # in queue order

    def deliver(self, tag: int, job: J) -> list[J]:
        """A delivery (tags are 1, 2, 3, ... per channel, perhaps out of order): the jobs now
        ready to run, in queue order."""
        ready = []
        for arrived in self._order.push(tag, job):
            if self.state is LeaseState.CLOSED:
                continue
            self.held += 1
            if arrived.marker:
                self._markers.append(_Marker(arrived, self._lanes.in_hand_by_key()))
            elif self._lanes.add(arrived.key, arrived) and self.parked.admit(arrived):
                ready.append(arrived)
        return ready

    def take(self) -> list[Action]:
        """What the parked keys ask for (parked messages to dispatch among them)."""
        return self.parked.take() if self.state is not LeaseState.CLOSED else []

    @property
    def asks(self) -> bool:
        """Whether ``take`` has anything (cheap: asked after every change)."""
        return self.parked.asks and self.state is not LeaseState.CLOSED

    def may_start(self) -> bool:
        return self.state is not LeaseState.CLOSED

    def fate(self, job: J) -> Fate:
        """What to do with ``job`` as a runner takes it. WAIT: it was handed to the parked keys
        (``take`` dispatches it again when it may go on); GONE: its channel went."""
        fate = self.parked.fate(job)
        if fate is Fate.WAIT:
            self.parked.wait(job)
        return fate

    def started(self, job: J, fate: Fate = Fate.RUN) -> None:
        self._running[job] = None
        self.parked.started(job, fate)

    def finished(self, job: J) -> list[J]:
        """``job`` was acknowledged or dead-lettered: its key's next job, if ready now."""
        self._running.pop(job, None)
        if self.state is LeaseState.CLOSED:
            return []  # the channel handed everything back: nothing is held any more
        self.parked.finished(job)
        if job.from_parking:
            return []
        self.held -= 1
        if job.marker:
            self._markers = [m for m in self._markers if m.job is not job]
            return []
        if self._markers:
            self._count_down(job.key)
        in_hand = self._lanes.in_hand(job.key) - 1  # ``job`` is done
        following = self._lanes.done(job.key)
        if following is None:
            return []
        full = self.held + 1 >= self.window  # the broker sends the next one in ``job``'s place
        if 0 < self.hot_after <= in_hand and full and self.parked.phase(job.key) is None:
            # Between two of its messages, so that none of it runs as it steps aside.
            self.parked.step_aside(following, in_hand)
            return []
        return [following] if self.parked.admit(following) else []

    def _count_down(self, key: str) -> None:
        for marker in self._markers:
            left = marker.ahead.get(key, 0) - 1
            if left > 0:
                marker.ahead[key] = left
            else:
                marker.ahead.pop(key, None)

    def passable(self) -> list[J]:
        """Markers that may pass now, each handed out once: everything delivered before them
        is finished, and no key parked here moves to another bucket under their count."""
        if not self._markers or self.state is LeaseState.CLOSED or not self.parked.loaded:
            return []
        ready = []
        for marker in self._markers:
            if not (marker.passing or marker.ahead or self._parked_moving(marker.job.marker)):
                marker.passing = True
                ready.append(marker.job)
        return ready

    def _parked_moving(self, buckets: int) -> list[str]:
        """Keys parked here that a ring of ``buckets`` routes to another bucket."""
        return [key for key in self.parked.keys if bucket_of(key, buckets) != self.parked.bucket]

    def dropped(self, job: J) -> None:
        """``job`` will not finish here (its handler was cut off); it goes back to the queue."""
        self._running.pop(job, None)
        self.parked.dropped(job)

    def park(self, job: J, reason: str, now: float) -> None:
        """``job``'s handler failed for good: its key is parked (``ParkedKeys.park``)."""
        self._running.pop(job, None)
        if self.state is not LeaseState.CLOSED:
            self.parked.park(job, reason, now)

    def drain(self) -> None:
        if self.state is LeaseState.CONSUMING:
            self.state = LeaseState.DRAINING
            self.parked.drain()

    def close(self) -> list[J]:
        """The channel closes: nothing is held any more. Returns the jobs still running, which
        must be told to stop (a thread may not listen: see ``settled``)."""
        self.state = LeaseState.CLOSED
        self._lanes.clear()
        self._markers.clear()
        self.held = 0
        self.parked.close()
        return list(self._running)

    @property
    def idle(self) -> bool:
        """Nothing delivered is left unfinished (parked messages included)."""
        return self.held == 0 and self.parked.held == 0

    @property
    def settled(self) -> bool:
        """No handler of this lease runs any more."""
        return not self._running

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def markers_held(self) -> int:
        return len(self._markers)

    @property
    def waiting(self) -> int:
        return self._lanes.waiting
