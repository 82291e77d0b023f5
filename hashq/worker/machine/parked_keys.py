"""``ParkedKeys``: the parked keys of one bucket lease, as a state machine without I/O (its
vocabulary, and the rules it keeps, are ``hashq.worker.machine.parking``)."""

from __future__ import annotations

import logging

from hashq.parked import ParkedRecord, ParkedState
from hashq.worker.machine.key_phases import KeyPhases
from hashq.worker.machine.parking import (
    ASK_AGAIN_SECONDS,
    Action,
    Dispatch,
    Fate,
    J,
    ParkedKey,
    ParkPhase,
    RecordOp,
    WatchRecord,
    WriteRecord,
)

log = logging.getLogger(__name__)


class ParkedKeys(KeyPhases[J]):
    """What one lease (``bucket`` at ``epoch``, held by ``worker``) knows of its parked keys.
    Events come in as calls; the actions they cause wait in ``take()``."""

    def __init__(self, bucket: int, epoch: int, worker: str = "") -> None:
        super().__init__(bucket, epoch, worker)
        self._before_load: dict[str, J] = {}  # active messages that came before the records

    def take(self) -> list[Action]:
        out, self._out = self._out, []
        return out

    @property
    def asks(self) -> bool:
        """Whether ``take`` has anything: asked after every change, so it must be cheap."""
        return bool(self._out)

    def phase(self, key: str) -> ParkPhase | None:
        parked = self._keys.get(key)
        return parked.phase if parked is not None else None

    @property
    def held(self) -> int:
        """Parked messages delivered and not yet acknowledged, over every key."""
        return sum(parked.held for parked in self._keys.values())

    @property
    def keys(self) -> list[str]:
        return list(self._keys)

    # ------------------------------------------------------------ the lease's start
    def load(self, found: list[tuple[ParkedRecord, int]]) -> None:
        """The records of the bucket's parked keys, with their versions, read after the grant:
        each is claimed at this epoch (unless it already is: a lease subscribed again); the
        messages that waited for the read go on."""
        self.loaded = True
        for record, version in found:
            parked: ParkedKey[J] = ParkedKey(record, version=version)
            self._keys[record.key] = parked
            self._out.append(WatchRecord(record.key))
            self._adopt(parked, record, version)
        before, self._before_load = self._before_load, {}
        for key, job in before.items():
            self._admit_or_wait(key, job)

    # ------------------------------------------------------------ bucket messages
    def admit(self, job: J) -> bool:
        """``job``, a bucket message, became its key's active one: True if it may be
        dispatched now, else it waits here until its key's phase lets it go on."""
        if not self.loaded:
            self._before_load[job.key] = job
            return False
        parked = self._keys.get(job.key)
        if parked is None or parked.moves:
            return True
        parked.waiting = job
        return False

    def _admit_or_wait(self, key: str, job: J) -> None:
        if self.admit(job):
            self._out.append(Dispatch(job))

    def fate(self, job: J) -> Fate:
        """What to do with ``job`` now that a runner takes it."""
        parked = self._keys.get(job.key)
        if job.from_parking:
            if parked is None or parked.active is not job:
                return Fate.GONE
            dropping = parked.record.state is ParkedState.DROPPING
            return Fate.DEAD_LETTER if dropping else Fate.RUN
        if not self.loaded:
            return Fate.WAIT
        if parked is None:
            return Fate.RUN
        return Fate.MOVE if parked.moves and parked.moving is None else Fate.WAIT

    def wait(self, job: J) -> None:
        """``fate`` said WAIT as a runner took ``job``: it waits here."""
        if not self.loaded:
            self._before_load[job.key] = job
            return
        parked = self._keys.get(job.key)
        if parked is None:
            self._out.append(Dispatch(job))
        else:
            parked.waiting = job

    def started(self, job: J, fate: Fate) -> None:
        parked = self._keys.get(job.key)
        if parked is None:
            return
        if fate is Fate.MOVE:
            parked.moving = job
        elif job.from_parking and parked.active is job:
            parked.running = job

    def finished(self, job: J) -> None:
        """``job`` was acknowledged (run, moved or dead-lettered)."""
        parked = self._keys.get(job.key)
        if parked is None:
            return
        if job.from_parking:
            if parked.cut is job:
                self._stopped(parked)
            if parked.active is not job:
                return  # its channel was closed meanwhile: it was not counted any more
            parked.active = parked.running = None
            parked.held -= 1
            self._next_parked(parked)
        elif parked.moving is job:
            parked.moving = None
        self._progress(parked)

    def dropped(self, job: J) -> None:
        """``job`` will not finish here: its channel closed, or its handler was cut off."""
        parked = self._keys.get(job.key)
        if parked is None:
            return
        if parked.moving is job:
            parked.moving = None
        if parked.running is job:
            parked.running = None  # a runner gave it back: it is dispatched again
        if parked.cut is job:
            self._stopped(parked)

    def _stopped(self, parked: ParkedKey[J]) -> None:
        """The parked message cut off has stopped: its parking queue may be consumed again."""
        parked.cut = None
        if parked.phase in (ParkPhase.RELEASING, ParkPhase.EMPTYING) and not parked.consuming:
            self._consume(parked)

    # ------------------------------------------------------------ parking a key
    def park(self, job: J, reason: str, now: float) -> None:
        """``job``, its key's active message, failed for good: park its key (or park it again,
        if it is a parked message being released)."""
        parked = self._keys.get(job.key)
        if job.from_parking:
            if parked is not None and parked.active is job:
                parked.running = None  # it returned: its failure is what parks the key again
                self._park_again(parked)
            return
        if parked is not None:
            return  # a moved message cannot fail; a late report of a run before the park
        log.warning(
            "bucket %d epoch %d: a key is parked: %s",
            self.bucket,
            self.epoch,
            reason,
            extra={"bucket": self.bucket, "epoch": self.epoch},
        )
        self._park_new(job, ParkedState.PARKED, reason, now, "failed")

    def step_aside(self, job: J, in_hand: int) -> None:
        """A hot key: ``job``, its next message, is one of ``in_hand`` it holds, more than its
        share of the window. The key is parked released at once (``releasing``): its messages
        move to its parking queue as they come and run from there in order, one at a time, so
        the window is the other keys' again; once it caught up (its parking queue proved
        empty) it flows as before."""
        log.info(
            "bucket %d epoch %d: a hot key steps aside (%d messages in hand)",
            self.bucket,
            self.epoch,
            in_hand,
            extra={"bucket": self.bucket, "epoch": self.epoch},
        )
        reason = f"hot key: {in_hand} messages in the bucket's window"
        self._park_new(job, ParkedState.RELEASING, reason, 0.0, "hot")

    def _park_new(self, job: J, state: ParkedState, reason: str, now: float, why: str) -> None:
        """Park ``job``'s key, not parked here yet, ``job`` (its active message) first."""
        record = ParkedRecord(job.key, self.bucket, state, self.epoch, reason, now, self.worker)
        self._keys[job.key] = ParkedKey(record, creating=True, waiting=job)
        self._out.append(WatchRecord(job.key))
        self._to(self._keys[job.key], ParkPhase.CLAIMING)
        self._out.append(WriteRecord(job.key, RecordOp.CREATE, record, why=why))

    def _park_again(self, parked: ParkedKey[J]) -> None:
        """A released message failed for good: the key is parked again, the failed message
        first in its parking queue (its channel is closed, so it goes back there)."""
        self._stop_consuming(parked)
        self._to(parked, ParkPhase.PARKED)
        self._write(parked, RecordOp.SET, parked.record.to(ParkedState.PARKED))
        self._let_go(parked)

    # ------------------------------------------------------------ parked messages
    def consuming(self, key: str) -> None:
        """The broker confirmed the consumer of ``key``'s parking queue."""
        parked = self._keys.get(key)
        if parked is not None and parked.consuming:
            parked.confirmed = True
            self._progress(parked)

    def delivered(self, key: str, tag: int, job: J) -> None:
        """A parked message, delivered on ``key``'s parking channel with ``tag``."""
        parked = self._keys.get(key)
        if parked is None or not parked.consuming:
            return
        for arrived in parked.order.push(tag, job):
            parked.held += 1
            parked.queue.append(arrived)
        if parked.active is None:
            self._next_parked(parked)

    def parking_lost(self, key: str) -> None:
        """``key``'s parking channel closed (by the broker, or with the connection): what it
        held went back to the parking queue. It is consumed again if the phase wants it."""
        parked = self._keys.get(key)
        if parked is None or not parked.consuming:
            return
        self._forget_stream(parked)
        if parked.phase in (ParkPhase.RELEASING, ParkPhase.EMPTYING) and parked.cut is None:
            self._consume(parked)

    def answered(self, key: str, ready: int, consumers: int) -> None:
        """The parking queue's answer to ``AskParked``: its ready messages and consumers. Only
        (0 ready, one consumer: ours, holding nothing) proves it holds nothing: a quorum queue
        without a leader answers (0, 0), and counts a dead channel's consumer until it took
        back what that consumer held (the queue has a single active consumer, so ours gets
        nothing before those come back, in their place)."""
        parked = self._keys.get(key)
        if parked is None or not parked.asking:
            return
        parked.asking = False
        empty = ready == 0 and consumers == 1 and parked.held == 0 and parked.confirmed
        if not empty or self.draining:
            if ready == 0:
                self._ask(parked, ASK_AGAIN_SECONDS)
            return
        if parked.phase is ParkPhase.RELEASING:
            self._to(parked, ParkPhase.EMPTYING)
            self._progress(parked)
        elif parked.phase is ParkPhase.EMPTYING:  # asked only once nothing moves (_progress)
            self._to(parked, ParkPhase.UNPARKING)
            self._stop_consuming(parked)
            self._write(parked, RecordOp.DELETE)

    # ------------------------------------------------------------ the lease's end
    def drain(self) -> None:
        """The lease drains: what it holds must finish, so every parked key moves its messages
        again (an emptying key goes back to releasing) and nothing more is asked."""
        self.draining = True
        for parked in self._keys.values():
            if parked.phase is ParkPhase.EMPTYING:
                self._to(parked, ParkPhase.RELEASING)
                self._let_go(parked)

    def close(self) -> None:
        """The lease's channels close: every parking channel's messages went back."""
        for parked in self._keys.values():
            self._forget_stream(parked)
            parked.waiting = parked.moving = None
        self._out.clear()
