"""What the worker's machine does to a lease once it exists: the events about it, revoking it,
cutting it off, and ending it once closed (released, or dropped).

``WorkerMachine`` (``hashq.worker.machine.core``, whose docstring follows a lease from grant to
release) inherits these steps; they read and change its fields, declared here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from hashq.records import RETURN_GRACE_SECONDS
from hashq.worker.machine.events import (
    Action,
    ChannelLost,
    Closed,
    CutOff,
    Drain,
    Event,
    QueueAnswered,
    ReleaseWritten,
    Session,
    Settled,
    Subscribe,
    Subscribed,
    WriteRelease,
)
from hashq.worker.machine.proof import WorkerProof
from hashq.worker.machine.states import (
    RELEASE_RETRY_SECONDS,
    RETRY_SECONDS,
    Lease,
    Phase,
    WorkerCounts,
)

# The machine's logger: these are its messages (the JSON log format names the logger).
log = logging.getLogger("hashq.worker.machine.core")


class WorkerLeases(WorkerProof):
    """The lease steps of ``WorkerMachine``, which sets these fields in its ``__init__``."""

    drain_timeout: float
    session: Session
    incarnation: str
    link_up: bool
    link_up_since: float  # when the current connection came up
    connection_number: int
    leases: dict[int, Lease]
    counts: WorkerCounts
    _retry_at: float
    _stop_by: float | None
    buckets: int  # the app's bucket count: a grant of a bucket beyond it is ignored
    _numbers: Iterator[int]

    def lease_of(self, bucket: int) -> Lease | None:
        for lease in self.leases.values():
            if lease.bucket == bucket:
                return lease
        return None

    def _subscribe(self, bucket: int, epoch: int, actions: list[Action]) -> None:
        if self.lease_of(bucket) is not None:
            return  # consumed, or an earlier lease of it has not ended yet
        if not 0 <= bucket < self.buckets:
            log.error("granted bucket %d, which does not exist; ignored", bucket)
            return
        lease = self._new_lease(next(self._numbers), bucket, epoch, self.connection_number)
        self.leases[lease.number] = lease
        if lease.phase is Phase.SUBSCRIBING:
            actions.append(Subscribe(lease.number, bucket, epoch))

    # ------------------------------------------------------------ events
    def _take_lease_event(self, event: Event, now: float, actions: list[Action]) -> None:
        lease = self.leases.get(getattr(event, "lease", -1))
        if lease is None:
            return  # of a lease already gone
        if isinstance(event, Subscribed):
            if event.ok:
                lease.phase = Phase.CONSUMING
                log.info(
                    "bucket %d epoch %d: consuming", lease.bucket, lease.epoch, extra=lease.fields
                )
            else:
                log.warning("bucket %d: subscribing failed: %s", lease.bucket, event.error)
                lease.phase, lease.void = Phase.CLOSING, True
                actions.append(CutOff(lease.number))
                self._retry_at = now + RETRY_SECONDS
        elif isinstance(event, ChannelLost):
            self._channel_lost(lease, event, actions)
        elif isinstance(event, Closed):
            lease.phase = Phase.CLOSED if lease.phase is not Phase.RELEASING else lease.phase
            lease.running = event.running
            lease.unconfirmed = not event.confirmed
        elif isinstance(event, Settled):
            lease.running = 0
        elif isinstance(event, ReleaseWritten):
            self._release_written(lease, event, now)
        elif isinstance(event, QueueAnswered):
            actions.extend(self._take_answer(lease, event, now))

    def _channel_lost(self, lease: Lease, event: ChannelLost, actions: list[Action]) -> None:
        if event.consumer_timeout and lease.phase in (Phase.CONSUMING, Phase.DRAINING):
            self.counts.consumer_timeouts += 1
            log.error(
                "bucket %d: RabbitMQ closed its channel because a message stayed unacknowledged "
                "past the broker's consumer_timeout (%s); every message held went back and "
                "counts as a delivery. Set consumer_timeout above the longest handler, and off "
                "with HASHQ_ON_FAILURE=block (docs/operations.md)",
                lease.bucket,
                event.reason,
            )
        if lease.phase is Phase.CONSUMING:
            log.warning("bucket %d: %s; subscribing again", lease.bucket, event.reason)
            lease.phase = Phase.CLOSING
            actions.append(CutOff(lease.number))

    def _release_written(self, lease: Lease, event: ReleaseWritten, now: float) -> None:
        if event.ok:
            self.counts.handovers += 1
            self.counts.drain_seconds.append(max(0.0, now - lease.since))
            del self.leases[lease.number]
            return
        if self.session is Session.LOST or self._past_stop(now):
            log.warning(
                "bucket %d epoch %d: release not written (%s)",
                lease.bucket,
                lease.epoch,
                event.error,
            )
            del self.leases[lease.number]
            return
        log.warning(
            "bucket %d: writing the release failed (%s); retrying", lease.bucket, event.error
        )
        lease.phase, lease.retry_at = Phase.CLOSED, now + RELEASE_RETRY_SECONDS

    # ------------------------------------------------------------ deciding
    def _revoke(self, lease: Lease, now: float, actions: list[Action]) -> None:
        """Drain, close, then release: nothing of the bucket is acknowledged after the release."""
        lease.revoked, lease.since = True, now
        if lease.phase is Phase.PROVING:
            lease.phase = Phase.CLOSED  # nothing consumed; released as the lost lease would be
        elif lease.phase in (Phase.SUBSCRIBING, Phase.CONSUMING):
            log.info(
                "bucket %d epoch %d: revoked; draining",
                lease.bucket,
                lease.epoch,
                extra=lease.fields,
            )
            lease.phase = Phase.DRAINING
            actions.append(Drain(lease.number, self.drain_timeout))

    def _cut_off_all(self, actions: list[Action], void: bool) -> None:
        """Close every lease now: what they held goes back to the queues. A lease cut off by a
        lost connection is released (if revoked) or subscribed again (if still granted) once
        settled; one of a lost session is ``void``."""
        for lease in self.leases.values():
            lease.void = lease.void or void
            self._close(lease, actions)

    def _close(self, lease: Lease, actions: list[Action]) -> None:
        """Cut ``lease`` off now (a proving lease has no channel: it is closed at once)."""
        if lease.phase is Phase.PROVING:
            lease.phase = Phase.CLOSED
        elif lease.phase in (Phase.SUBSCRIBING, Phase.CONSUMING, Phase.DRAINING):
            lease.phase = Phase.CLOSING
            actions.append(CutOff(lease.number))

    def _settle_closed(self, now: float, actions: list[Action]) -> None:
        """A closed lease that no handler holds any more ends: released if revoked (and of
        this life), else dropped, so that a bucket still granted is subscribed again."""
        for lease in list(self.leases.values()):
            if lease.phase is not Phase.CLOSED or lease.running:
                continue
            if not lease.revoked or lease.void:
                del self.leases[lease.number]
                if not lease.revoked:
                    self._note_unproven(lease)
            elif lease.incarnation != self.incarnation or self.session is Session.LOST:
                del self.leases[lease.number]  # that life's grants are void: it is fenced
            elif self._may_release(lease, now):
                lease.phase = Phase.RELEASING
                actions.append(
                    WriteRelease(lease.number, lease.bucket, lease.epoch, lease.incarnation)
                )

    def _may_release(self, lease: Lease, now: float) -> bool:
        """A release lets the next owner consume. If the lease's channel closed because its
        connection died, the broker may not know yet: it still holds the channel, whose
        consumer the drain cancelled, so the next owner would be the active consumer at once
        and get later messages of a key whose earlier ones are still checked out here. A newer
        connection of this incarnation proves the old one gone from its node (it holds the
        liveness queue, which the old one held until the broker dropped it); until then the
        release waits, and the coordinator fences if it must. Even then a bucket queue led
        from another node may take back what the old channel held only later, once it has a
        leader again, so the release also waits ``RETURN_GRACE_SECONDS`` after the newer
        connection came up (the cluster test found the reordering this prevents)."""
        if self.session is not Session.CONNECTED or now < lease.retry_at:
            return False
        if not lease.unconfirmed:
            return True
        if not (self.link_up and self.connection_number > lease.connection):
            return False
        lease.retry_at = self.link_up_since + RETURN_GRACE_SECONDS  # also the machine's timer
        return now >= lease.retry_at

    # ------------------------------------------------------------ helpers
    def _past_stop(self, now: float) -> bool:
        return self._stop_by is not None and now >= self._stop_by
