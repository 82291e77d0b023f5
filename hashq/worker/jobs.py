"""One delivery's life inside a worker, in one place: a ``Job`` is delivered on a bucket lease,
started by a runner, and ends in one of three ways, each decided here (``Outcomes``):

- its handler returned: it is acknowledged, and its key's next delivery goes on (``settle``);
- its handler raised: it runs again after a backoff, its key waiting meanwhile, or, with its
  attempts spent, it is dead-lettered, confirmed, and then acknowledged, or its key is parked
  (``failed``; ``hashq.worker.machine.parked_keys``);
- its key is parked: it is moved to the key's parking queue, confirmed, then acknowledged
  (``move``);
- its lease closed under it (fenced, or the drain timed out): its handler is cut off and it
  goes back to the queue, unacknowledged (``Job.cut_off``, ``Lease.dropped``).

``Lease`` is all a job and the runners need of the bucket lease that delivered it
(``hashq.worker.bucket_lease.BucketLease``): whether it may start, and what to tell it as the
job moves on. Only the job's own methods change its fields.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from aiormq.abc import DeliveredMessage
from pamqp import commands as spec

from hashq._io.logs import key_for_log
from hashq.errors import Park, Reject, Retry
from hashq.message import Message
from hashq.worker.machine.parking import Fate
from hashq.worker.metrics import WorkerMetrics
from hashq.worker.retry import OnFailure, RetryPolicy

if TYPE_CHECKING:
    from hashq.worker.dead_letter import DeadLetters

log = logging.getLogger(__name__)

# Calls the function after a delay in seconds: the event loop's call_later, unless a test
# harness (hashq.testing) runs retries at once.
Later = Callable[[float, Callable[[], None]], object]


class Lease(Protocol):
    """The bucket lease a job was delivered on."""

    @property
    def bucket(self) -> int: ...

    @property
    def epoch(self) -> int: ...

    @property
    def log_fields(self) -> dict[str, int]: ...

    def may_start(self, job: Job) -> bool:
        """Whether ``job`` may start now: its lease still consumes, its key's turn has come."""
        ...

    def fate(self, job: Job) -> Fate:
        """What to do with ``job`` as a runner takes it (``LeaseCore.fate``): run it, move it
        to its parked key's queue, dead-letter it (a dropped key's), or nothing (WAIT: it
        waits with its parked key; GONE: its parking channel closed)."""
        ...

    def started(self, job: Job, fate: Fate = Fate.RUN) -> None:
        """``job``'s handler begins (or its move, or its dead-lettering)."""
        ...

    def park(self, job: Job, reason: str, since: float) -> None:
        """``job`` failed for good: its key is parked, ``job`` first (``since``: the wall
        clock, for people: ``hashq parked list``)."""
        ...

    async def move(self, job: Job) -> None:
        """Publish ``job``'s message to its key's parking queue; raises unless confirmed."""
        ...

    def finished(self, job: Job) -> None:
        """``job`` was acknowledged or dead-lettered: its key's next delivery may start."""
        ...

    def dropped(self, job: Job) -> None:
        """``job`` will not finish here; its message goes back to the queue."""
        ...

    def ack(self, job: Job) -> bool:
        """Count ``job`` as done; False if its channel is gone (its message went back)."""
        ...


def deliver_frame(delivery: DeliveredMessage) -> spec.Basic.Deliver:
    frame = delivery.delivery
    assert isinstance(frame, spec.Basic.Deliver), frame
    return frame


@dataclass(eq=False)
class Job:
    """One delivery of a bucket on its way through the worker."""

    lease: Lease
    delivery: DeliveredMessage
    key: str
    attempt: int = 1
    first_failure: float | None = None
    from_parking: bool = False  # delivered from its key's parking queue (``hashq.parked``)
    marker: int = 0  # a resize's marker: the bucket count it grows to (``hashq.resizing``)
    # While its handler runs: the runner task and the message, so that a closing lease can
    # cut the handler off.
    _handler_task: asyncio.Task[None] | None = field(default=None, repr=False)
    _message: Message | None = field(default=None, repr=False)
    _cut_off: bool = False

    @property
    def tag(self) -> int:
        return deliver_frame(self.delivery).delivery_tag or 0

    @property
    def redelivered(self) -> bool:
        return bool(deliver_frame(self.delivery).redelivered)

    @property
    def message_id(self) -> str | None:
        return self.delivery.header.properties.message_id

    @property
    def was_cut_off(self) -> bool:
        return self._cut_off

    def running(self, task: asyncio.Task[None], message: Message) -> None:
        """Its handler runs in ``task`` on ``message``: from now on a closing lease cuts it off."""
        self._handler_task, self._message = task, message

    def returned(self) -> None:
        """Its handler returned or raised: past cutting off (settling)."""
        self._handler_task = None

    def note_failure(self) -> None:
        """Its handler raised: the first failure's time goes into a dead letter's headers."""
        self.first_failure = self.first_failure or time.time()

    def next_attempt(self) -> None:
        self.attempt += 1

    def cut_off(self) -> None:
        """Stop the running handler: its lease closed (fenced, or the drain timed out)."""
        if self._handler_task is None:
            return  # not running, or past its handler (settling)
        self._cut_off = True
        if self._message is not None:
            self._message.cancel_event.set()
        self._handler_task.cancel()


class Outcomes:
    """What follows a handler: acknowledge, retry later, or dead-letter."""

    def __init__(
        self,
        policy: RetryPolicy,
        dead_letters: DeadLetters,
        metrics: WorkerMetrics,
        dispatch: Callable[[Job], None],
        keys_in_clear: bool = False,
        later: Later | None = None,
    ) -> None:
        self._policy = policy
        self._later = later
        self._dead_letters = dead_letters
        self._metrics = metrics
        self._dispatch = dispatch  # hands a job back to the runners
        self._keys_in_clear = keys_in_clear
        self._debug = False  # read as the worker starts (``notice_log_level``), not per message
        self.processed = 0

    def notice_log_level(self) -> None:
        """Whether to log each message done: asked once, since the check costs on the hot path."""
        self._debug = log.isEnabledFor(logging.DEBUG)

    def settle(self, job: Job) -> str:
        """Acknowledge ``job`` and let its key go on; if its channel is gone, drop it (its
        message went back to the queue). Returns which: ``done`` or ``dropped``."""
        lease = job.lease
        if not lease.ack(job):
            lease.dropped(job)
            return "dropped"
        self.processed += 1
        self._metrics.processed[lease.bucket] += 1
        if self._debug:
            log.debug(
                "bucket %d epoch %d: message %s of key %s done",
                lease.bucket,
                lease.epoch,
                job.message_id,
                key_for_log(job.key, self._keys_in_clear),
                extra=lease.log_fields,
            )
        lease.finished(job)
        return "done"

    async def failed(self, job: Job, error: Exception, policy: RetryPolicy | None = None) -> str:
        """The handler raised: retry after the policy's delay (``policy``, its handler's own, or
        the worker's; or the one a ``Retry`` asked for), or dead-letter (at once for a
        ``Reject``), or park its key. Returns which (a span's ``hashq.outcome``)."""
        lease = job.lease
        self._metrics.failed[lease.bucket] += 1
        job.note_failure()
        if isinstance(error, Reject):
            return await self.dead_letter(job, "rejected", error)
        if isinstance(error, Park):
            self.park(job, f"parked by the handler: {error}")
            return "parked"
        policy = policy or self._policy
        delay = policy.next_delay(job.attempt)
        asked = isinstance(error, Retry)
        log.log(
            logging.INFO if asked else logging.WARNING,
            "bucket %d epoch %d: handler %s (attempt %d): %s: %s",
            lease.bucket,
            lease.epoch,
            "asked for a retry" if asked else "failed",
            job.attempt,
            type(error).__name__,
            error,
            extra=lease.log_fields,
        )
        if delay is None and policy.on_failure is OnFailure.PARK:
            self.park(job, f"failed {job.attempt} times: {type(error).__name__}: {error}")
            return "parked"
        if delay is None:
            return await self.dead_letter(job, "handler-failed", error)
        if isinstance(error, Retry) and error.after is not None:
            delay = error.after
        job.next_attempt()
        self._metrics.retried[lease.bucket] += 1
        self._retry_later(job, delay)
        return "retry"

    async def dead_letter(self, job: Job, reason: str, error: BaseException | None) -> str:
        """Publish ``job`` to the dead-letter exchange, confirmed, then acknowledge it; if the
        publish fails, try again after the base delay (its key waits). Returns which."""
        lease = job.lease
        try:
            await self._dead_letters.publish(job, reason, error)
        except Exception as exc:
            log.warning("bucket %d: dead-lettering failed (%r); retrying", lease.bucket, exc)
            self._retry_later(job, self._policy.base_delay)
            return "retry"
        self._metrics.dead_lettered[lease.bucket, reason] += 1
        log.error(
            "bucket %d epoch %d: message %s dead-lettered (%s)",
            lease.bucket,
            lease.epoch,
            job.message_id,
            reason,
            extra=lease.log_fields,
        )
        self.settle(job)
        return "dead-lettered"

    def park(self, job: Job, reason: str) -> None:
        job.lease.park(job, reason[:500], time.time())

    async def move(self, job: Job) -> str:
        """Move ``job`` to its parked key's queue, confirmed, then acknowledge it; if the
        publish fails, try again after the base delay (its key waits). Returns which."""
        try:
            await job.lease.move(job)
        except Exception as exc:
            log.warning(
                "bucket %d: moving a parked key's message failed (%r); retrying",
                job.lease.bucket,
                exc,
            )
            self._retry_later(job, self._policy.base_delay)
            return "retry"
        self._metrics.moved[job.lease.bucket] += 1
        self.settle(job)
        return "moved"

    def _retry_later(self, job: Job, delay: float) -> None:
        """``job`` runs again after ``delay`` if its lease still consumes. Meanwhile it does not
        run: counted as running, a lease whose channel closed would wait for it for ever, and
        its bucket would be neither consumed again nor released (the simulator's runners do
        the same, ``tools.sim.leases``)."""
        job.lease.dropped(job)

        def again() -> None:
            if job.lease.may_start(job):
                self._dispatch(job)

        (self._later or asyncio.get_running_loop().call_later)(delay, again)
