"""The coordinator's decisions, without I/O: whether it leads, what it last committed, and from
each observation of ZooKeeper the next commit and the fences to carry out.

``CoordinatorMachine.handle(event, now)`` returns actions; ``hashq_coordinator.runtime``
carries them out with kazoo and the management API, the simulator (``tools/sim/``) with its
models. ``now`` is the caller's monotonic clock: records' ``since`` is kept on it while leading.

While leading, one observation at a time: ``Observe`` -> ``Observed`` -> ``Commit`` ->
``Committed`` (or ``Deposed``, or ``ExpelRefused``). Fences start only once the records that
need them are committed, and each incarnation has at most one fence under way.

Crashes: when the broker says a connection of a live incarnation closed (``ConnectionClosed``),
the incarnation is a suspect. Once ``crash_grace`` has passed (a live worker reconnects within
it), the next observation asks the broker whether the incarnation still holds a connection; if
not, it is expelled: its registration is deleted in the commit, checked against the version
read before the question, and its buckets are fenced as those of a vanished worker.

When a fenced bucket may be granted again (its queue took back what the owner held): see
``handover.View.returned``. The bucket count is the topology record's, read at each observation.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from hashq.records import PROTOCOL_VERSION, Assignment, BucketRecord, BucketState, Registration
from hashq_coordinator.machine.events import (
    Action,
    Claim,
    ClaimFailed,
    Commit,
    Committed,
    ConnectionClosed,
    Deposed,
    Elected,
    Event,
    ExpelRefused,
    Fence,
    FenceDone,
    GiveBack,
    LockAcquired,
    Observe,
    Observed,
    ObserveFailed,
    Resign,
    Role,
    SessionLost,
    StepDown,
    Wake,
)
from hashq_coordinator.machine.fencebook import FenceBook, Incarnation
from hashq_coordinator.machine.handover import View, assignments, committed_owners, step
from hashq_coordinator.machine.planner import plan

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    records: dict[int, BucketRecord]
    written: dict[str, Assignment]
    fences: set[Incarnation]
    changed: dict[int, BucketRecord] = field(default_factory=dict)
    expelled: tuple[Incarnation, ...] = ()


class CoordinatorMachine:
    def __init__(
        self,
        me: str,
        buckets: int,
        *,
        settle: float,
        drain_timeout: float,
        fence_grace: float,
        crash_grace: float = 0.5,
        ask_returns: bool = False,
        book: FenceBook | None = None,
    ) -> None:
        self.me = me
        self.buckets = buckets
        self.settle = settle
        self.revoke_timeout = drain_timeout + fence_grace
        self.fence_grace = fence_grace
        self.crash_grace = crash_grace
        self.ask_returns = ask_returns
        self.role = Role.CANDIDATE
        self.book = book or FenceBook()
        self.records: dict[int, BucketRecord] = {}
        self.written: dict[str, Assignment] = {}
        self.members: set[Incarnation] = set()
        self.fencing: set[Incarnation] = set()
        self.grants_made = 0
        self.fences_done = 0
        self.expelled = 0  # crashed incarnations expelled (committed)
        self.suspects: dict[Incarnation, float] = {}  # connection closed at (this clock)
        self._asking: tuple[Incarnation, ...] = ()  # suspects the observation under way asks
        self._held_asked: dict[int, BucketRecord] = {}  # buckets it asks about, as when asked
        self._leader_epoch = 0
        self._version = 0
        self._changed_at = 0.0
        self._busy = False  # an observation or a commit is under way
        self._missed = False  # an observation was asked for while busy
        self._asked_at = 0.0  # when the observation under way was asked
        self._pending: _Pending | None = None
        self._refused: set[Incarnation] = set()

    def in_transit(self) -> int:
        return sum(1 for record in self.records.values() if record.moving)

    # ------------------------------------------------------------ events
    def handle(self, event: Event, now: float) -> list[Action]:
        if isinstance(event, LockAcquired):
            self.role = Role.CLAIMING
            return [Claim()]
        if isinstance(event, ClaimFailed):
            log.warning(
                "coordinator %s: taking the lead failed (%s); retrying", self.me, event.error
            )
            self.role = Role.CANDIDATE
            return [GiveBack()]
        if isinstance(event, Elected):
            return self._elected(event, now)
        if isinstance(event, SessionLost):
            if self.role is not Role.CANDIDATE:
                log.warning("coordinator %s: ZooKeeper session lost; not leading", self.me)
                return self._resign("session lost")
            return []
        if isinstance(event, StepDown):
            return self._resign(event.why)
        if self.role is not Role.LEADER:
            return []
        if isinstance(event, Observed):
            return self._observed(event, now)
        if isinstance(event, ObserveFailed):
            log.warning("coordinator %s: reading state failed: %s", self.me, event.error)
            self._busy = False
            return []
        if isinstance(event, Committed):
            return self._committed() + self._observe_missed(now)
        if isinstance(event, ConnectionClosed):
            return self._connection_closed(event, now)
        if isinstance(event, ExpelRefused):
            return self._expel_refused(event, now)
        if isinstance(event, Deposed):
            log.warning("coordinator %s: %s; standing down", self.me, event.error)
            return self._resign("deposed")
        if isinstance(event, FenceDone):
            self.fencing.discard(event.incarnation)
            self.book.done(event.incarnation, event.covered, now)
            self.fences_done += 1
        return self._observe(now)

    def _observe(self, now: float) -> list[Action]:
        if self._busy:
            self._missed = True  # observed again as soon as this one is committed
            return []
        self._busy, self._missed, self._asked_at = True, False, now
        self._asking = self._due(now)
        self._held_asked = self._awaiting_return(now) if self.ask_returns else {}
        return [Observe(self._asking, tuple(self._held_asked))]

    def _awaiting_return(self, now: float) -> dict[int, BucketRecord]:
        """Fencing buckets whose owner's fence has finished (before this question is asked)
        and that still wait for their queue to take back what the owner held."""
        view = self._view(now, {}, frozenset())
        return {bucket: self.records[bucket] for bucket in view.awaiting_return()}

    def _view(
        self,
        now: float,
        live: Mapping[str, Registration],
        releases: frozenset[tuple[int, int]],
        emptied: frozenset[int] = frozenset(),
    ) -> View:
        return View(
            buckets=self.buckets,
            records=self.records,
            workers=live,
            releases=releases,
            fenced=self.book.covered(),
            fences_done=self.book.fences_done(),
            closed_at=self.book.closed_at(),
            contact_bounds=self.book.contact_bounds(),
            now=now,
            revoke_timeout=self.revoke_timeout,
            fence_grace=self.fence_grace,
            emptied=emptied,
        )

    def _due(self, now: float) -> tuple[Incarnation, ...]:
        return tuple(
            sorted(i for i, since in self.suspects.items() if now - since >= self.crash_grace)
        )

    def _observe_missed(self, now: float) -> list[Action]:
        """Observe again at once if a watch or a suspect's grace came while busy (not a tick on)."""
        return self._observe(now) if self._missed or self._due(now) else []

    def _connection_closed(self, event: ConnectionClosed, now: float) -> list[Action]:
        """A connection of a live member closed (others are of no concern): a suspect, asked
        about once the grace has passed since its newest close (whether any connection of it
        is left). When it closed bounds the owner's contact (``View.returned``)."""
        if event.incarnation not in self.members:
            return []
        self.suspects[event.incarnation] = now
        self.book.heard_closed(event.incarnation, event.connection, now)
        return [Wake(self.crash_grace)]

    def _expel_refused(self, refused: ExpelRefused, now: float) -> list[Action]:
        """Nothing of the commit was written: whoever it would have expelled is asked about
        again at once (the one whose registration changed will be found alive)."""
        log.info("coordinator %s: not expelled, it came back: %s", self.me, refused.error)
        pending, self._busy, self._pending = self._pending, False, None
        for incarnation in pending.expelled if pending else ():
            self.suspects.setdefault(incarnation, now - self.crash_grace)
        return self._observe(now)

    def _elected(self, event: Elected, now: float) -> list[Action]:
        if self.role is not Role.CLAIMING:
            return []  # the claim outlived its session: the lock went with it (``Resign``)
        self._leader_epoch, self._version = event.epoch, event.version
        # Moving buckets' ``since`` restarts on this process's clock: the previous leader's
        # means nothing here, so each pending revoke gets its full time again.
        self.records = {
            b: replace(r, since=now) if r.moving else r for b, r in event.records.items()
        }
        self.written = dict(event.assignments)
        self.book.new_term()
        self._changed_at, self._busy, self._pending, self._asked_at = now, True, None, now
        self.role = Role.LEADER
        log.info(
            "coordinator %s: leader at leader epoch %d (%d buckets in transit)",
            self.me,
            event.epoch,
            self.in_transit(),
        )
        return [Observe()]

    def _resign(self, why: str) -> list[Action]:
        if self.role is Role.LEADER:
            log.info("coordinator %s: gives up the lead (%s)", self.me, why)
        self.role = Role.CANDIDATE
        self.records, self.written, self.fencing = {}, {}, set()
        self._busy, self._pending, self._missed = False, None, False
        self.suspects, self._asking, self._held_asked = {}, (), {}
        # The lock goes back however long ZooKeeper takes: dropped after one failed try while
        # the session lives on, its node would sit ahead of every later one of this session.
        return [Resign(why), GiveBack()]

    # ------------------------------------------------------------ one observation
    def _observed(self, event: Observed, now: float) -> list[Action]:
        if event.buckets and event.buckets != self.buckets:  # the record's, not the settings'
            log.info("coordinator %s: the app has %d buckets", self.me, event.buckets)
            self.buckets = event.buckets
        crashed = self._crashed(event)
        live = {w: r for w, r in self._understood(event.workers).items() if w not in crashed}
        self._note_membership(live, now)
        settled = now - self._changed_at >= self.settle
        asked, self._held_asked = self._held_asked, {}
        # A bucket counts as emptied only if it is still as it was when its queue was asked.
        emptied = frozenset(
            b for b in event.emptied if b in asked and asked[b] == self.records.get(b)
        )
        view = self._view(now, live, frozenset(event.releases), emptied)
        capacities = {worker: registration.capacity for worker, registration in live.items()}
        decision = step(view, plan(view.buckets, capacities, committed_owners(view)), settled)
        for bucket, (owner, waited) in decision.stuck.items():
            log.warning(
                "bucket %d: worker %s did not release within %.0fs; fencing it",
                bucket,
                owner,
                waited,
            )
        commit = self._commit_of(decision.records, live, event.releases, crashed)
        records = {**self.records, **decision.records}
        written = {**self.written, **commit.assignments}
        written = {w: a for w, a in written.items() if w not in commit.removed}
        expelled = tuple((w, event.workers[w].incarnation) for w in sorted(crashed))
        self._pending = _Pending(records, written, decision.fences, decision.records, expelled)
        due = view.proof_due()
        wake: list[Action] = [Wake(max(0.0, due - now))] if due is not None else []
        if commit.empty:
            return self._committed() + self._observe_missed(now) + wake
        return [commit, *wake]

    def _crashed(self, event: Observed) -> dict[str, int]:
        """The asked suspects the broker said have no connection left, still registered as the
        incarnation suspected: worker -> the version of its registration read (before the
        question), which the commit's delete checks. Every asked suspect is settled."""
        asked, self._asking = self._asking, ()
        crashed = {}
        for worker, incarnation in asked:
            since = self.suspects.get((worker, incarnation))
            if since is not None and since + self.crash_grace <= self._asked_at:
                del self.suspects[(worker, incarnation)]  # else it closed again since: ask again
            registration = event.workers.get(worker)
            if (
                (worker, incarnation) in event.gone
                and registration is not None
                and registration.incarnation == incarnation
                and worker in event.versions
            ):
                crashed[worker] = event.versions[worker]
        return crashed

    def _commit_of(
        self,
        changed: dict[int, BucketRecord],
        live: Mapping[str, Registration],
        releases: Mapping[tuple[int, int], str],
        crashed: Mapping[str, int],
    ) -> Commit:
        records = {**self.records, **changed}
        wanted = assignments(records, live, self._leader_epoch, self.buckets)
        return Commit(
            version=self._version,
            records=changed,
            known_records=tuple(self.records),
            assignments={w: a for w, a in wanted.items() if self.written.get(w) != a},
            known_assignments=tuple(self.written),
            removed=tuple(w for w in self.written if w not in live),
            consumed=tuple(
                name
                for (bucket, epoch), name in releases.items()
                if bucket not in records
                or epoch < records[bucket].epoch
                or records[bucket].state is BucketState.UNASSIGNED
            ),
            expelled=dict(crashed),
        )

    def _committed(self) -> list[Action]:
        pending, self._pending, self._busy = self._pending, None, False
        if pending is None:
            return []
        for bucket, record in sorted(pending.changed.items()):
            before = self.records.get(bucket, BucketRecord())
            _log_transition(bucket, before, record)
            if record.epoch > before.epoch:
                self.grants_made += 1
        self.records, self.written = pending.records, pending.written
        for worker, incarnation in pending.expelled:
            self.expelled += 1
            log.warning(
                "worker %s incarnation %s: its AMQP connection closed and none came back within "
                "%gs; expelled as crashed, its buckets move",
                worker,
                incarnation,
                self.crash_grace,
            )
        fences = sorted(pending.fences - self.fencing)
        self.fencing.update(fences)
        return [Fence(incarnation) for incarnation in fences]

    def _understood(self, workers: Mapping[str, Registration]) -> dict[str, Registration]:
        """The workers whose protocol it speaks (a newer one may read grants otherwise)."""
        known = {}
        for worker, registration in workers.items():
            if registration.version <= PROTOCOL_VERSION:
                known[worker] = registration
            elif (worker, registration.incarnation) not in self._refused:
                self._refused.add((worker, registration.incarnation))
                log.error(
                    "worker %s speaks protocol version %d; this coordinator speaks %d: it gets "
                    "no buckets (upgrade the coordinators first)",
                    worker,
                    registration.version,
                    PROTOCOL_VERSION,
                )
        return known

    def _note_membership(self, live: Mapping[str, Registration], now: float) -> None:
        current = {(w, r.incarnation) for w, r in live.items()}
        # Fence bookkeeping keeps incarnations that are live or still named by a bucket record.
        named = {(str(r.owner), str(r.incarnation)) for r in self.records.values() if r.owner}
        self.book.note(live, current | named, now, self._asked_at)
        if current != self.members:
            joined = sorted(w for w, _ in current - self.members)
            left = sorted(w for w, _ in self.members - current)
            log.info(
                "workers: %d live (joined %s, left %s)", len(current), joined or "-", left or "-"
            )
            self.members = current
            self._changed_at = now


def _log_transition(bucket: int, before: BucketRecord, after: BucketRecord) -> None:
    where = f"{after.owner}" + (f" -> {after.target}" if after.target else "")
    log.info(
        "bucket %d: %s -> %s (%s, epoch %d)",
        bucket,
        before.state.value,
        after.state.value,
        where if after.owner else "no owner",
        after.epoch,
    )
