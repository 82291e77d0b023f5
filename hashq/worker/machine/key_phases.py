"""The state of a lease's parked keys and the steps between their phases, without I/O: the
records (claimed, adopted, written), the parking queue's consumer, and the one transition
function. ``ParkedKeys`` (``hashq.worker.machine.parked_keys``) builds its events on it."""

from __future__ import annotations

import logging
from typing import Generic

from hashq.parked import ParkedRecord, ParkedState
from hashq.worker.machine.parking import (
    ASK_AGAIN_SECONDS,
    Action,
    AskParked,
    ConsumeParked,
    CutOff,
    Dispatch,
    J,
    Outcome,
    ParkedKey,
    ParkPhase,
    RecordOp,
    StopParked,
    WriteRecord,
)

log = logging.getLogger(__name__)


class KeyPhases(Generic[J]):
    """The parked keys of one lease (``bucket`` at ``epoch``, held by ``worker``), and what
    they asked for (``_out``)."""

    def __init__(self, bucket: int, epoch: int, worker: str = "") -> None:
        self.bucket, self.epoch, self.worker = bucket, epoch, worker
        self.loaded = False  # the records were read: until then nothing of the bucket goes on
        self.draining = False
        self._keys: dict[str, ParkedKey[J]] = {}
        self._out: list[Action] = []

    def _claim(self, parked: ParkedKey[J]) -> None:
        self._to(parked, ParkPhase.CLAIMING)
        record = parked.record.claimed(self.epoch)
        self._write(parked, RecordOp.SET, record)

    def _next_parked(self, parked: ParkedKey[J]) -> None:
        if parked.queue:
            parked.active = parked.queue.popleft()
            self._out.append(Dispatch(parked.active))

    def _progress(self, parked: ParkedKey[J]) -> None:
        """Ask the parking queue whether it holds anything, when that can prove it empty: the
        consumer confirmed, nothing of it held, and (emptying) nothing of the key moving."""
        if parked.phase not in (ParkPhase.RELEASING, ParkPhase.EMPTYING):
            return
        if parked.phase is ParkPhase.EMPTYING and parked.moving is not None:
            return
        if parked.confirmed and parked.held == 0 and not parked.asking and not self.draining:
            self._ask(parked, 0.0)

    def _ask(self, parked: ParkedKey[J], after: float) -> None:
        parked.asking = True
        self._out.append(AskParked(parked.key, after))

    # ------------------------------------------------------------ the record
    def record_result(
        self,
        key: str,
        op: RecordOp,
        outcome: Outcome,
        record: ParkedRecord | None = None,
        version: int = -1,
    ) -> None:
        """The answer to a ``WriteRecord`` (``record`` and ``version``: what a read found,
        or the version a write made)."""
        parked = self._keys.get(key)
        if parked is None or parked.phase is ParkPhase.LOST:
            return
        if outcome in (Outcome.CHANGED, Outcome.FAILED, Outcome.EXISTS):
            after = ASK_AGAIN_SECONDS if outcome is Outcome.FAILED else 0.0
            self._out.append(WriteRecord(key, RecordOp.READ, after=after))
        elif op is RecordOp.READ:
            self._adopt(parked, record if outcome is Outcome.DONE else None, version)
        elif op is RecordOp.DELETE or outcome is Outcome.GONE:
            self._gone(parked, deleted=op is RecordOp.DELETE)
        else:
            parked.version = version
            if parked.phase is ParkPhase.CLAIMING:
                parked.creating = False
                self._apply_state(parked)

    def seen(self, key: str, record: ParkedRecord | None, version: int) -> None:
        """The record as a watch read it: the operator may have changed its state."""
        parked = self._keys.get(key)
        if parked is None or parked.phase in (ParkPhase.CLAIMING, ParkPhase.LOST):
            return
        if record is not None and version > parked.version:
            self._adopt(parked, record, version)

    def _adopt(self, parked: ParkedKey[J], record: ParkedRecord | None, version: int) -> None:
        """What a read found: nothing, a record claimed at a higher epoch (the key is lost to a
        newer owner), at a lower one (claim it), or at this one (its state applies)."""
        if record is None:
            self._gone(parked, deleted=False)
        elif record.epoch > self.epoch:
            self._lose(parked)
        elif record.epoch < self.epoch:
            parked.record, parked.version = record, version
            self._claim(parked)
        else:
            parked.record, parked.version, parked.creating = record, version, False
            if parked.phase is ParkPhase.UNPARKING:
                self._write(parked, RecordOp.DELETE)
            else:
                self._apply_state(parked)

    def _gone(self, parked: ParkedKey[J], deleted: bool) -> None:
        """No record. Unparking, or claiming one a former owner deleted once it proved its
        queue empty: the key flows. Else it was deleted under a parked key: written again."""
        if parked.phase is ParkPhase.UNPARKING or (
            parked.phase is ParkPhase.CLAIMING and not parked.creating
        ):
            del self._keys[parked.key]
            self._to_flowing(parked, deleted)
            return
        parked.creating = True
        parked.phase = ParkPhase.CLAIMING
        self._out.append(
            WriteRecord(parked.key, RecordOp.CREATE, parked.record.claimed(self.epoch))
        )

    def _lose(self, parked: ParkedKey[J]) -> None:
        self._stop_consuming(parked)
        self._to(parked, ParkPhase.LOST)
        parked.waiting = None

    def _apply_state(self, parked: ParkedKey[J]) -> None:
        """The record's state, at this epoch: the phase it asks for."""
        state = parked.record.state
        if parked.phase in (ParkPhase.UNPARKING, ParkPhase.LOST):
            return
        if state is ParkedState.PARKED:
            self._stop_consuming(parked)
            self._to(parked, ParkPhase.PARKED)
        elif state is ParkedState.RELEASING and parked.phase is not ParkPhase.EMPTYING:
            self._to(parked, ParkPhase.RELEASING)
        elif state is ParkedState.DROPPING:
            self._to(parked, ParkPhase.RELEASING if self.draining else ParkPhase.EMPTYING)
        wanted = parked.phase in (ParkPhase.RELEASING, ParkPhase.EMPTYING)
        if wanted and not parked.consuming and parked.cut is None:
            self._consume(parked)
        self._let_go(parked)
        self._progress(parked)

    def _write(
        self, parked: ParkedKey[J], op: RecordOp, record: ParkedRecord | None = None
    ) -> None:
        if record is not None:
            parked.record = record
        self._out.append(WriteRecord(parked.key, op, record, parked.version))

    # ------------------------------------------------------------ helpers
    def _consume(self, parked: ParkedKey[J]) -> None:
        parked.consuming, parked.confirmed = True, False
        self._out.append(ConsumeParked(parked.key))

    def _stop_consuming(self, parked: ParkedKey[J]) -> None:
        if parked.consuming:
            self._out.append(StopParked(parked.key))
        self._forget_stream(parked)

    def _forget_stream(self, parked: ParkedKey[J]) -> None:
        """The parking channel is gone: what it held went back to the parking queue, and the
        parked message still running is cut off."""
        if parked.running is not None:
            parked.cut, parked.running = parked.running, None
            self._out.append(CutOff(parked.cut))
        parked.consuming = parked.confirmed = parked.asking = False
        parked.order = type(parked.order)()
        parked.queue.clear()
        parked.active, parked.held = None, 0

    def _let_go(self, parked: ParkedKey[J]) -> None:
        """The phase lets the key's waiting bucket message go on (moving)."""
        if parked.moves and parked.waiting is not None:
            job, parked.waiting = parked.waiting, None
            self._out.append(Dispatch(job))

    def _to_flowing(self, parked: ParkedKey[J], deleted: bool) -> None:
        log.info(
            "bucket %d epoch %d: a parked key flows again (%s)",
            self.bucket,
            self.epoch,
            "released" if deleted else "its record is gone",
            extra={"bucket": self.bucket, "epoch": self.epoch},
        )
        if parked.waiting is not None:
            self._out.append(Dispatch(parked.waiting))

    def _to(self, parked: ParkedKey[J], phase: ParkPhase) -> None:
        """The one transition of a parked key's phase: logged with the lease's epoch."""
        if parked.phase is not phase:
            log.debug(
                "bucket %d epoch %d: parked key %s -> %s",
                self.bucket,
                self.epoch,
                parked.phase.value,
                phase.value,
                extra={"bucket": self.bucket, "epoch": self.epoch},
            )
        parked.phase = phase
