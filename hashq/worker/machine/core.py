"""The worker's decisions, without I/O: its ZooKeeper session as it bears on what it may do, its
AMQP connection, and each bucket lease from grant to release.

``WorkerMachine.handle(event, now)`` takes what happened and returns what to do. It is
level-triggered: every event updates what the machine knows, then one pass (``_decide``)
compares that with what is granted and asks for whatever is missing, once. The edges carry the
actions out and report back with events; ``now`` is their clock (monotonic, or the
simulator's virtual time), used only for the machine's own timers (``wake_at``).

A lease goes (PROVING ->) SUBSCRIBING -> CONSUMING, and ends DRAINING (revoked) or CLOSING (cut
off) -> CLOSED -> (RELEASING, if revoked) -> gone. PROVING: after a lost connection, in
``hashq.worker.machine.proof``. A bucket is never subscribed again, at its epoch or
another, while an earlier lease of it is not gone: a handler that cannot be stopped keeps its
lease CLOSED, so no message of the bucket runs beside its own redelivery.

The states, each lease's phase and record are in ``hashq.worker.machine.states``; what the machine
does to a lease once it exists, in ``hashq.worker.machine.leases`` (``WorkerLeases``, which it
inherits).
"""

from __future__ import annotations

import itertools
import logging

from hashq.records import Assignment
from hashq.worker.machine.events import (
    Action,
    AssignmentRead,
    BeginIncarnation,
    ConfirmSession,
    Deregister,
    DropConnection,
    Event,
    LinkFailed,
    LinkLost,
    LinkUp,
    PauseRunners,
    PauseSeen,
    Reconnect,
    Registered,
    RegisterFailed,
    RegistrationDeleted,
    ResumeRunners,
    Session,
    SessionChanged,
    SessionConfirmed,
    Stop,
    Withdraw,
)
from hashq.worker.machine.leases import WorkerLeases
from hashq.worker.machine.states import (
    CONFIRM_SECONDS,
    OPEN_PHASES,
    RETRY_SECONDS,
    Lease,
    Phase,
    WorkerCounts,
    WorkerState,
    reconnect_delay,
)

log = logging.getLogger(__name__)

# The state in which the worker has deleted its registration itself while it still names its
# incarnation (a withdrawal clears the incarnation first): a deletion seen then is its own.
_DELETES_ITS_OWN = frozenset({WorkerState.STOPPED})


class WorkerMachine(WorkerLeases):
    def __init__(
        self,
        worker_id: str,
        buckets: int,
        drain_timeout: float,
        stop_within: float,
        withdraw_after: float,
        prove_returns: bool,
    ) -> None:
        self.worker_id = worker_id
        self.prove_returns = prove_returns  # quorum bucket queues: see ``machine.proof``
        self.unproven: dict[int, tuple[int, int]] = {}
        self.buckets = buckets
        self.drain_timeout = drain_timeout
        self.stop_within = stop_within  # how long stopping may wait for releases
        self.withdraw_after = withdraw_after  # without RabbitMQ for that long: give grants up
        self.state = WorkerState.STARTING
        self.session = Session.CONNECTED
        self.zk_link = True  # whether the ZooKeeper client is connected (any session)
        self.incarnation = ""
        self.assignment: Assignment | None = None
        self._assignment_zxid = -1
        self.link_up = False  # the AMQP connection of this incarnation is usable
        self.link_up_since = 0.0  # when it came up
        self._link_lost_at: float | None = None  # when it stopped being usable
        self._connection = 0  # the runtime's number of the current connection
        self._dead_connection = 0  # the highest such number reported lost
        self.connection_number = 0  # connections this incarnation asked for (a lease keeps its)
        self.reconnect_attempts = 0
        self.leases: dict[int, Lease] = {}  # by number
        self.counts = WorkerCounts()
        self._numbers = itertools.count(1)
        self._doubts = 0  # pauses and disconnects seen: a verdict asked for before one is stale
        self._confirming = False
        self._busy = False  # registering or reconnecting: one at a time
        self._retry_at = 0.0  # no registering, subscribing or confirming before then
        # Reconnects keep their own time: a subscribe's or a confirmation's retry must not hold
        # a live worker's new connection past the coordinator's crash grace.
        self._reconnect_at = 0.0
        self._paused = False
        self._stop_by: float | None = None
        self.wake_at: float | None = None  # the edge sends a Tick then (None: no timer)

    # ------------------------------------------------------------ reading
    def grants(self) -> dict[int, int]:
        """Bucket -> epoch this incarnation may consume now (none unless CONNECTED)."""
        if self.session is not Session.CONNECTED or self.assignment is None:
            return {}
        return self.assignment.grants_for(self.incarnation)

    def consuming(self) -> dict[int, int]:
        return {
            lease.bucket: lease.epoch
            for lease in self.leases.values()
            if lease.phase is Phase.CONSUMING
        }

    # ------------------------------------------------------------ events
    def handle(self, event: Event, now: float) -> list[Action]:
        actions: list[Action] = []
        self._take(event, now, actions)
        if self.state is not WorkerState.STOPPED:
            self._decide(now, actions)
        return actions

    def _take(self, event: Event, now: float, actions: list[Action]) -> None:
        if isinstance(event, SessionChanged):
            self._take_session(event.session, actions)
        elif isinstance(event, PauseSeen):
            log.warning(
                "worker %s was paused for %.1fs; checking its session",
                self.worker_id,
                event.seconds,
            )
            self._suspect(actions)
        elif isinstance(event, SessionConfirmed):
            self._take_verdict(event, now)
        elif isinstance(event, AssignmentRead):
            self._take_assignment(event)
        elif isinstance(event, Registered):
            self._busy, self._link_lost_at = False, None
            self.incarnation, self.session = event.incarnation, Session.CONNECTED
            self.unproven = {}  # the last life's; its grants are void
            self.connection_number, self.reconnect_attempts = 1, 0
            self._link_to(event.connection, now)
        elif isinstance(event, RegisterFailed):
            self._busy, self._retry_at = False, now + RETRY_SECONDS
        elif isinstance(event, LinkLost):
            self._dead_connection = max(self._dead_connection, event.connection)
            if event.connection == self._connection:
                self._link_lost(now)
        elif isinstance(event, LinkUp):
            self._busy = False
            if self._link_to(event.connection, now) and self.reconnect_attempts > 1:
                log.info("AMQP connection back after %d attempts", self.reconnect_attempts)
            self.reconnect_attempts = 0 if self.link_up else self.reconnect_attempts
        elif isinstance(event, LinkFailed):
            self._busy, self._reconnect_at = False, now + reconnect_delay(self.reconnect_attempts)
            if event.registration_gone:
                log.warning("%s; the session is lost", event.error)
                self.session = Session.LOST
        elif isinstance(event, RegistrationDeleted):
            self._registration_deleted(event.incarnation)
        elif isinstance(event, Stop):
            self._stop_by = now + self.stop_within
        else:
            self._take_lease_event(event, now, actions)

    def _registration_deleted(self, incarnation: str) -> None:
        """Expelled by the coordinator (or deleted by this worker as it withdrew or stopped,
        when the incarnation is no longer current or the state says so): the grants are void
        as after a lost session. Cut everything off at once rather than drain, since the
        buckets go on elsewhere."""
        if incarnation != self.incarnation or self.state in _DELETES_ITS_OWN:
            return
        log.warning(
            "worker %s incarnation %s: registration deleted by the coordinator (expelled as "
            "crashed after its AMQP connection closed); the session's grants are void",
            self.worker_id,
            incarnation,
        )
        self.session = Session.LOST

    def _link_to(self, connection: int, now: float) -> bool:
        """Take ``connection`` as the current one; False (and the link down) if it was
        reported lost already."""
        self._connection = connection
        self.link_up = connection > self._dead_connection
        if self.link_up:
            self._link_lost_at = None
            self.link_up_since = now
        else:
            self._link_lost(now)
            self._reconnect_at = now + reconnect_delay(self.reconnect_attempts)
        return self.link_up

    def _link_lost(self, now: float) -> None:
        self.link_up = False
        if self._link_lost_at is None:
            self._link_lost_at = now

    # ------------------------------------------------------------ the session
    def _take_session(self, value: Session, actions: list[Action]) -> None:
        # LOST sticks until the worker has registered again: a later CONNECTED belongs to a new
        # session whose registration does not exist yet. CONNECTED after SUSPENDED is taken
        # only from a confirmation, which checks the registration is still ours.
        self.zk_link = value is Session.CONNECTED
        if value is Session.CONNECTED:
            return
        self._doubts += 1
        if self.session is not Session.LOST:
            self.session = value
        self._pause(actions)

    def _suspect(self, actions: list[Action]) -> None:
        """The process may have been paused: act as SUSPENDED until a confirmation says
        otherwise."""
        self._doubts += 1
        if self.session is Session.CONNECTED:
            self.session = Session.SUSPENDED
        self._pause(actions)

    def _take_verdict(self, event: SessionConfirmed, now: float) -> None:
        """A verdict is dropped if a pause or a disconnect was seen while it was on its way:
        the session may have expired after ZooKeeper answered (the worker then asks again)."""
        self._confirming = False
        if event.asked != self._doubts or self.session is not Session.SUSPENDED:
            return
        if event.verdict is Session.SUSPENDED:
            self._retry_at = now + CONFIRM_SECONDS
            return
        log.info("worker %s: ZooKeeper session %s", self.worker_id, event.verdict.value)
        self.session = event.verdict

    def _take_assignment(self, event: AssignmentRead) -> None:
        """Keep the assignment read, unless a newer one was kept already (the watch and an
        announcement read it on different paths, so they may arrive out of order)."""
        if event.zxid >= 0 and event.zxid < self._assignment_zxid:
            return
        self._assignment_zxid = max(event.zxid, self._assignment_zxid)
        self.assignment = event.assignment
        if event.assignment is not None and event.assignment.buckets > self.buckets:
            log.info("the app has %d buckets now (a resize)", event.assignment.buckets)
            self.buckets = event.assignment.buckets

    def _pause(self, actions: list[Action]) -> None:
        if not self._paused:
            self._paused = True
            actions.append(PauseRunners())

    # ------------------------------------------------------------ deciding
    def _decide(self, now: float, actions: list[Action]) -> None:
        self._settle_closed(now, actions)
        if self._stop_by is not None:
            self._decide_stop(now, actions)
        elif self.session is Session.LOST:
            self._fence_self(now, actions)
        elif self.session is Session.SUSPENDED:
            self._pause(actions)
            self._transition(WorkerState.SUSPENDED)
            if not self._confirming and now >= self._retry_at:
                self._confirming = True
                actions.append(ConfirmSession(self._doubts))
        elif not self.incarnation:
            self._begin(now, actions)
        elif not self.link_up and self._withdrawing(now):
            self._withdraw(now, actions)
        elif not self.link_up:
            self._reconnect(now, actions)
        else:
            self._reconcile(now, actions)
        self._settle_closed(now, actions)  # leases closed before they were revoked just now
        self._set_timer(now)

    def _reconcile(self, now: float, actions: list[Action]) -> None:
        """Consume exactly what is granted: revoke the rest, subscribe what is missing."""
        if self._paused:
            self._paused = False
            actions.append(ResumeRunners())
        grants = self.grants()
        for lease in list(self.leases.values()):
            if lease.void or lease.revoked:
                continue
            if grants.get(lease.bucket) != lease.epoch or lease.incarnation != self.incarnation:
                self._revoke(lease, now, actions)
        if now >= self._retry_at:
            for bucket, epoch in sorted(grants.items()):
                self._subscribe(bucket, epoch, actions)
        self._ask_due(now, actions)
        self._transition(WorkerState.RUNNING if self.consuming() else WorkerState.WAITING)

    # ------------------------------------------------------------ connection and incarnation
    def _begin(self, now: float, actions: list[Action]) -> None:
        if not self._busy and self.zk_link and now >= self._retry_at:
            self._busy = True
            actions.append(BeginIncarnation())

    def _reconnect(self, now: float, actions: list[Action]) -> None:
        """Reopen a lost AMQP connection under a new number. Said once per outage, not at
        every attempt; readiness shows it meanwhile."""
        if self.reconnect_attempts == 0:
            log.warning("AMQP connection lost; cutting off every bucket and reconnecting")
        self._cut_off_all(actions, void=False)
        if self._busy or now < self._reconnect_at:
            return
        self._busy = True
        self.reconnect_attempts += 1
        self.connection_number += 1
        actions.append(Reconnect())

    def _withdrawing(self, now: float) -> bool:
        lost = self._link_lost_at
        return lost is not None and now - lost >= self.withdraw_after and not self._busy

    def _withdraw(self, now: float, actions: list[Action]) -> None:
        """RabbitMQ has been out of reach for ``withdraw_after``: a worker that cannot consume
        must not keep its grants, so it deregisters (the coordinator then moves its buckets,
        fencing whatever connection of it the broker may still hold) and registers afresh, as a
        new incarnation, once RabbitMQ answers again."""
        log.warning(
            "worker %s: no AMQP connection for %gs or more; withdrawing from its grants until "
            "RabbitMQ answers again",
            self.worker_id,
            self.withdraw_after,
        )
        self._transition(WorkerState.WITHDRAWN)
        self._cut_off_all(actions, void=True)
        self.incarnation, self._link_lost_at = "", None
        self._retry_at = now + RETRY_SECONDS  # the timer that begins the next incarnation
        actions.append(Withdraw())

    def _fence_self(self, now: float, actions: list[Action]) -> None:
        """Session lost: the grants are void. Cut everything off, then register afresh."""
        if self.state is not WorkerState.FENCED:
            self._transition(WorkerState.FENCED)
            self._cut_off_all(actions, void=True)
            self.link_up = False
            actions.append(DropConnection())
        self._begin(now, actions)

    def _decide_stop(self, now: float, actions: list[Action]) -> None:
        """Drain and release every bucket while the session is ours (cut them off otherwise),
        then deregister; exiting never waits past ``stop_within``."""
        self._transition(WorkerState.STOPPING)
        usable = self.session is Session.CONNECTED and self.link_up
        for lease in self.leases.values():
            if lease.phase in (Phase.CONSUMING, Phase.PROVING) and usable and not lease.void:
                self._revoke(lease, now, actions)
            elif lease.phase in OPEN_PHASES and not usable:
                lease.void = True
                self._close(lease, actions)
        if not self.leases or self._past_stop(now):
            actions.append(Deregister())
            self._transition(WorkerState.STOPPED)

    # ------------------------------------------------------------ helpers
    def _set_timer(self, now: float) -> None:
        times = [self._retry_at, *(lease.retry_at for lease in self.leases.values())]
        if not self.link_up:
            times.append(self._reconnect_at)
        if self._link_lost_at is not None:
            times.append(self._link_lost_at + self.withdraw_after)
        if self._stop_by is not None:
            times.append(self._stop_by)
        later = [t for t in times if t > now]
        self.wake_at = min(later) if later else None

    def _transition(self, state: WorkerState) -> None:
        if state is self.state:
            return
        log.info(
            "worker %s: %s -> %s (incarnation %s, grants %s)",
            self.worker_id,
            self.state.value,
            state.value,
            self.incarnation or "-",
            self.consuming() or "none",
        )
        self.state = state
