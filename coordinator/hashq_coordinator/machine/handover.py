"""One step of the coordinator: from what ZooKeeper holds now and the plan, the next record of
every bucket, the assignments that follow from them, and the fences to carry out. Pure: no I/O.

Per bucket (states in ``hashq.records.BucketState``):

    unassigned --target live--------------------------------> granted(target, epoch + 1)
    granted --owner gone after releasing this epoch---------> granted(target, epoch + 1)
    granted --owner gone------------------------------------> fencing
    granted --plan moves it---------------------------------> revoking(target)
    revoking --release at epoch seen------------------------> granted(target, epoch + 1)
    revoking --owner gone, or no release in drain timeout---> fencing
    fencing --owner's connection cut off (or released)-----> granted(target, epoch + 1)

A fenced bucket is granted once the queue has taken back what the cut-off owner held and the
owner can start nothing more: ``RETURN_GRACE_SECONDS`` after the fence, or
``BROKER_CONTACT_SECONDS`` after it (or after the broker's word that the connection it covered
closed, if sooner) when the queue itself says so (``queue_holds_nothing``).

A bucket is in an owner's assignment only while ``granted`` to it: leaving the assignment is
what tells the owner to drain. A grant never happens before the previous owner released or was
cut off, and always at a higher epoch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from hashq.records import (
    RETURN_GRACE_SECONDS,
    Assignment,
    BucketRecord,
    BucketState,
    Registration,
)

Incarnation = tuple[str, str]  # (worker id, incarnation)
MOVING = (BucketState.REVOKING, BucketState.FENCING)


@dataclass(frozen=True)
class View:
    """What the leader knows at one moment."""

    buckets: int
    records: Mapping[int, BucketRecord]
    workers: Mapping[str, Registration]  # live registrations
    releases: frozenset[tuple[int, int]]  # (bucket, epoch) released
    fenced: frozenset[Incarnation]  # incarnations whose every connection is cut off
    now: float  # the leader's monotonic clock; ``BucketRecord.since`` is on the same clock
    revoke_timeout: float  # how long a revoked owner may take to release before it is fenced
    fence_grace: float = 0.0  # beyond an owner's own drain timeout, when it says it
    # When each incarnation's fences finished (``FenceBook.fences_done``); None: take a fence
    # as done with its returns (the pure tests of the other rules). No default: a caller that
    # forgot it would grant before the queues took back what a fenced owner held.
    fences_done: Mapping[Incarnation, tuple[float, ...]] | None = field(kw_only=True)
    # Fencing buckets whose queue said, when asked after their owner's fence had finished,
    # that no consumer holds any of its messages (``queue_holds_nothing``).
    emptied: frozenset[int] = frozenset()
    # When the connection each incarnation's newest fence covered was heard closed
    # (``FenceBook.closed_at``): its owner's contact bound runs from then, not from the fence.
    closed_at: Mapping[Incarnation, float] = field(default_factory=dict)
    # The contact bound each incarnation declared (``FenceBook.contact_bounds``); an owner
    # missing here gets no early grant, only ``RETURN_GRACE_SECONDS``.
    contact_bounds: Mapping[Incarnation, float] = field(default_factory=dict)

    def returned(self, bucket: int, record: BucketRecord) -> bool:
        """Whether what ``record``'s owner held has been taken back by the queue: it is
        fenced, and a fence that finished after the bucket began to move (so it closed every
        connection that could hold the bucket) did so ``RETURN_GRACE_SECONDS`` ago; or
        ``BROKER_CONTACT_SECONDS`` ago, if the queue, asked after that fence, said no consumer
        holds anything (``emptied``): by then the owner, whatever it knows, starts nothing more
        it was delivered on a closed connection (``hashq.worker.machine.contact``); that bound
        runs from when the broker said the fenced connection closed, if it said so sooner
        (a crash: the grace before the expulsion covers it). A queue
        led from a failed node takes back a dead connection's messages only once it has a
        leader again (tests/e2e/test_cluster.py); a later fence of a newer connection, which
        could not consume the bucket, does not restart the wait."""
        if self.needs_fence(record):
            return False
        if bucket in self.emptied and self._contact_lapses(record) <= self.now:
            return True
        return any(done <= self.now - RETURN_GRACE_SECONDS for done in self._fenced_since(record))

    def _contact_lapses(self, record: BucketRecord) -> float:
        """When the fenced owner of ``record`` starts nothing more delivered on a connection
        that could hold it: its declared contact bound (``BROKER_CONTACT_SECONDS`` of its
        version) after the first fence that finished since the bucket began to move, or after
        the broker's word that the connection that fence covered closed, whichever came first
        (infinity without such a fence, or for an owner that declared no bound)."""
        fenced = self._fenced_since(record)
        if not fenced:
            return math.inf
        owner = (str(record.owner), str(record.incarnation))
        contact = self.contact_bounds.get(owner, math.inf)
        return min(*fenced, self.closed_at.get(owner, math.inf)) + contact

    def proof_due(self) -> float | None:
        """When the first bucket its queue proved (``emptied``), still waiting out its owner's
        contact bound, may be granted: the leader asks again then, not at its next tick."""
        due = [
            self._contact_lapses(record)
            for bucket, record in self.records.items()
            if bucket in self.emptied and not self.returned(bucket, record)
        ]
        return min((at for at in due if at < math.inf), default=None)

    def awaiting_return(self) -> tuple[int, ...]:
        """Fencing buckets whose owner is cut off but whose queue may still be taking back
        what it held: the ones worth asking the queue about."""
        return tuple(
            bucket
            for bucket, record in sorted(self.records.items())
            if record.state is BucketState.FENCING
            and not self.returned(bucket, record)
            and not self.needs_fence(record)
        )

    def needs_fence(self, record: BucketRecord) -> bool:
        """No fence covers the owner's newest connection, or none finished since the bucket
        began to move (one that finished before covers connections, not this bucket's wait)."""
        owner = (str(record.owner), str(record.incarnation))
        return owner not in self.fenced or (
            self.fences_done is not None and not self._fenced_since(record)
        )

    def _fenced_since(self, record: BucketRecord) -> list[float]:
        if self.fences_done is None:
            return [-math.inf]
        owner = (str(record.owner), str(record.incarnation))
        return [done for done in self.fences_done.get(owner, ()) if done >= record.since]

    def revoke_timeout_of(self, record: BucketRecord) -> float:
        """How long ``record``'s owner may take to release: its own drain timeout (from its
        registration) plus the grace, so that a worker that drains longer than the coordinator
        expects is not fenced mid-drain; ``revoke_timeout`` for a worker that does not say.
        Never less than the owner's session timeout: an owner cut off ZooKeeper never hears of
        the revoke and goes on starting what it holds until its client notices (within two
        thirds of its session); fenced sooner, it could start a message after the next owner
        did (the simulation found it: tests/unit/test_sim.py)."""
        registration = self.workers.get(str(record.owner))
        if registration is None or registration.incarnation != record.incarnation:
            return self.revoke_timeout
        if registration.drain_timeout <= 0:
            return self.revoke_timeout
        return max(registration.drain_timeout + self.fence_grace, registration.session_timeout)


@dataclass
class Decision:
    records: dict[int, BucketRecord] = field(default_factory=dict)  # the changed ones
    fences: set[Incarnation] = field(default_factory=set)  # to cut off
    # bucket -> (owner that did not release, seconds it was given)
    stuck: dict[int, tuple[str, float]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.records)


def committed_owners(view: View) -> dict[int, str | None]:
    """Who each bucket belongs to for planning: its target while it moves, else its owner."""
    owners: dict[int, str | None] = {}
    for bucket in range(view.buckets):
        record = view.records.get(bucket, BucketRecord())
        owners[bucket] = record.target if record.moving else record.owner
    return owners


def step(view: View, plan: Mapping[int, str | None], settled: bool = True) -> Decision:
    """The next records. Until membership has ``settled``, no owned bucket starts to move (so a
    rolling restart causes no storm), but buckets without an owner are granted, handovers
    under way go on, and buckets of vanished owners are fenced (granted, if they released
    them first)."""
    decision = Decision()
    # A bucket never granted (a resize's new one) is first granted above every bucket's epoch:
    # the keys that move to it keep a rising epoch, so ``msg.epoch`` stays a fencing token per
    # key (a moved key's zombie in its old bucket carries a lower one).
    unseen = BucketRecord(epoch=max((r.epoch for r in view.records.values()), default=0))
    for bucket in range(view.buckets):
        record = view.records.get(bucket, unseen)
        target = _target(record, plan.get(bucket), settled, view)
        following = _next(bucket, record, target, view, decision)
        if following != record:
            decision.records[bucket] = following
        if following.state is BucketState.FENCING and view.needs_fence(following):
            decision.fences.add((str(following.owner), str(following.incarnation)))
    return decision


def _target(record: BucketRecord, planned: str | None, settled: bool, view: View) -> str | None:
    if settled or record.state is BucketState.UNASSIGNED or record.state is BucketState.FENCING:
        return planned
    if record.state is BucketState.REVOKING:
        return record.target
    return record.owner if _live(record, view) else planned


def _next(
    bucket: int, record: BucketRecord, target: str | None, view: View, decision: Decision
) -> BucketRecord:
    if record.state is BucketState.UNASSIGNED:
        return _grant(record, target, view)
    live = _live(record, view)
    released = (bucket, record.epoch) in view.releases
    if record.state is BucketState.GRANTED:
        if not live:
            # An owner that released before it went (a clean stop) holds nothing to cut off:
            # granted at once, where a fence would cost the next owner another round.
            if released:
                return _grant(record, target, view)
            return _moving(record, BucketState.FENCING, target, view.now)
        if target is not None and target != record.owner:
            return _moving(record, BucketState.REVOKING, target, view.now)
        return record
    if record.state is BucketState.REVOKING:
        if released:
            return _grant(record, target, view)
        allowed = view.revoke_timeout_of(record)
        if not live or view.now - record.since > allowed:
            if live:
                decision.stuck[bucket] = (str(record.owner), allowed)
            return _moving(record, BucketState.FENCING, target, view.now)
        return replace(record, target=target)
    # BucketState.FENCING
    if released or view.returned(bucket, record):
        return _grant(record, target, view)
    return replace(record, target=target)


def _live(record: BucketRecord, view: View) -> bool:
    registration = view.workers.get(str(record.owner))
    return registration is not None and registration.incarnation == record.incarnation


def _moving(
    record: BucketRecord, state: BucketState, target: str | None, now: float
) -> BucketRecord:
    """Into (or on in) a moving state; ``since`` is when the bucket entered that state."""
    since = record.since if state is record.state else now
    return replace(record, state=state, target=target, since=since)


def _grant(record: BucketRecord, target: str | None, view: View) -> BucketRecord:
    """Grant to ``target`` at the next epoch if it is live, else leave the bucket unassigned."""
    registration = view.workers.get(str(target)) if target is not None else None
    if registration is None:
        if record.state is BucketState.UNASSIGNED:
            return record
        return BucketRecord(BucketState.UNASSIGNED, None, None, record.epoch)
    return BucketRecord(
        BucketState.GRANTED, registration.worker_id, registration.incarnation, record.epoch + 1
    )


def assignments(
    records: Mapping[int, BucketRecord],
    workers: Mapping[str, Registration],
    leader_epoch: int,
    buckets: int = 0,
) -> dict[str, Assignment]:
    """Each live worker's assignment: the buckets granted to its current incarnation, and
    those moving to it (``incoming``, written with the revoke, so that it gets their channels
    ready while the old owner drains)."""
    result = {
        worker_id: Assignment(registration.incarnation, {}, leader_epoch, buckets=buckets)
        for worker_id, registration in workers.items()
    }
    incoming: dict[str, list[int]] = {}
    for bucket, record in records.items():
        assignment = result.get(str(record.owner))
        if (
            record.state is BucketState.GRANTED
            and assignment
            and assignment.incarnation == record.incarnation
        ):
            assignment.grants[bucket] = record.epoch
        elif record.state in MOVING and str(record.target) in result:
            incoming.setdefault(str(record.target), []).append(bucket)
    for worker_id, moving in incoming.items():
        result[worker_id] = replace(result[worker_id], incoming=tuple(sorted(moving)))
    return result
