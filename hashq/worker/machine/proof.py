"""Consuming a bucket again after its connection died under it, only once its queue says that
what the dead connection held is back (the PROVING phase of a lease).

Why: a bucket still granted whose connection died is consumed again on the next connection.
If the broker had cancelled the old consumer (``basic.cancel``) while the notice could not
reach the worker, the old channel still holds its unacknowledged deliveries until the broker
ends it, and single-active-consumer makes the new consumer active at once: it would get later
messages of a key before the earlier ones came back (docs/protocol.md, "Consumed again after a
lost connection"). So the new lease first asks its quorum queue (a passive declare) every
``QUEUE_ASK_SECONDS``: it consumes once the queue has no consumer and some ready messages
(``queue_holds_nothing``: a cancelled consumer that holds messages is counted, and a dead
channel's consumer leaves in the step that returns what it held). An empty queue's answer,
(0, 0), cannot be told from no answer, so a quiet queue is consumed ``RETURN_GRACE_SECONDS``
after the new connection came up, as a release after a lost connection waits. While any
consumer is counted, the lease waits: an old consumer not cancelled would keep the new one
waiting anyway, and a cancelled one still holds messages.

Classic queues do not count a cancelled consumer that holds messages; a worker of classic bucket
queues consumes again at once (``prove_returns`` is off), as before.

``WorkerMachine`` inherits these steps; the fields are set in its ``__init__``.
"""

from __future__ import annotations

import logging

from hashq.records import QUEUE_ASK_SECONDS, RETURN_GRACE_SECONDS, queue_holds_nothing
from hashq.worker.machine.events import Action, AskQueue, QueueAnswered, Session, Subscribe
from hashq.worker.machine.states import Lease, Phase

log = logging.getLogger("hashq.worker.machine.core")


class WorkerProof:
    """The proving steps of ``WorkerMachine``."""

    prove_returns: bool
    incarnation: str
    session: Session
    link_up: bool
    link_up_since: float
    connection_number: int
    leases: dict[int, Lease]
    # bucket -> (epoch, connection) of a still-granted lease that a dying connection closed
    unproven: dict[int, tuple[int, int]]

    def _note_unproven(self, lease: Lease) -> None:
        """``lease``, not revoked, ends: if its connection died under it (its subscribing
        failed included: the consumer may have reached the broker), the next lease of its
        bucket at its epoch must hear from the queue first. An earlier life's marks nothing."""
        ours = lease.incarnation == self.incarnation
        if self.prove_returns and lease.unconfirmed and ours:
            self.unproven[lease.bucket] = (lease.epoch, lease.connection)

    def _new_lease(self, number: int, bucket: int, epoch: int, connection: int) -> Lease:
        """A lease to subscribe now, or to prove first if its bucket's last lease at this epoch
        died with its connection (it keeps that connection's number: a release waits as the
        old lease's would, ``_may_release``)."""
        marked = self.unproven.pop(bucket, None)
        if marked is None or marked[0] != epoch:
            return Lease(number, bucket, epoch, self.incarnation, connection=connection)
        return Lease(
            number,
            bucket,
            epoch,
            self.incarnation,
            phase=Phase.PROVING,
            connection=marked[1],
            unconfirmed=True,
        )

    def _ask_due(self, now: float, actions: list[Action]) -> None:
        for lease in self.leases.values():
            if lease.phase is Phase.PROVING and not lease.asking and now >= lease.retry_at:
                lease.asking = True
                actions.append(AskQueue(lease.number, lease.bucket))

    def _take_answer(self, lease: Lease, event: QueueAnswered, now: float) -> list[Action]:
        if lease.phase is not Phase.PROVING:
            return []
        lease.asking = False
        answer = event.answer
        if not (self.session is Session.CONNECTED and self.link_up):
            self._wait(lease, answer, now)  # asked again once ``_reconcile`` runs
            return []
        quiet = answer is None or answer[1] == 0  # no consumer counted, or no word at all
        if answer is not None and queue_holds_nothing(*answer):
            why = "its queue took back what the lost connection held"
        elif quiet and now >= self.link_up_since + RETURN_GRACE_SECONDS:
            why = f"its queue said nothing for {RETURN_GRACE_SECONDS:g}s since the connection"
        else:
            self._wait(lease, answer, now)
            return []
        log.info(
            "bucket %d epoch %d: %s; consuming again",
            lease.bucket,
            lease.epoch,
            why,
            extra=lease.fields,
        )
        lease.phase, lease.unconfirmed = Phase.SUBSCRIBING, False
        lease.connection = self.connection_number  # consumed on this one from now on
        return [Subscribe(lease.number, lease.bucket, lease.epoch)]

    def _wait(self, lease: Lease, answer: tuple[int, int] | None, now: float) -> None:
        lease.retry_at = now + QUEUE_ASK_SECONDS
        if not lease.told:
            lease.told = True
            log.info(
                "bucket %d epoch %d: its connection died under it; consuming again once its "
                "queue has taken back what that connection held (asked: %s)",
                lease.bucket,
                lease.epoch,
                "no answer" if answer is None else f"{answer[0]} ready, {answer[1]} consumers",
                extra=lease.fields,
            )
