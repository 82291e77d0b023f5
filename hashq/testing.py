"""Run a handler in-process, with no servers, the way a worker runs it: for a user's tests.

::

    result = await hashq.testing.run(handle, [("user-1", b"a"), ("user-2", b"b")])
    assert result.done("user-1") == [b"a"]

What runs the messages is the worker's own code: its runners (``HASHQ_CONCURRENCY`` handlers at
once, plain functions in ``HASHQ_THREADS`` threads), each bucket's delivery order and per-key
lanes (``hashq.worker.machine.lease.LeaseCore``), and what follows a handler
(``hashq.worker.jobs.Outcomes``: acknowledge, retry by the policy or a ``Retry``'s delay,
dead-letter with the same headers). So one key's messages run one at a time in publish order
while other keys run concurrently, and a handler that breaks an expectation of order (one that
returns before its work is done, say) shows it here as it would in production.

Only the servers are replaced. Each bucket is a queue in memory that, like RabbitMQ, hands out
at most ``HASHQ_PREFETCH`` messages not yet acknowledged; keys are spread over
``HASHQ_BUCKETS`` buckets by CRC-32, not by the broker's ring (which bucket a key lands in
changes nothing but which keys share a prefetch window). There is no ZooKeeper, so no bucket
moves, no drain and no fence: that is the protocol's part, tested with real servers. Retries run
at once unless ``wait_for_retries`` is set; the delay each one would have waited is kept. A key
parked (``HASHQ_ON_FAILURE=park``, or ``raise hashq.Park``) is parked by the worker's own
``ParkedKeys``, its records kept in memory: its messages, the failed one first, end in
``Result.parked`` in their order, and the run ends with them there (no operator releases them).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiormq.abc import DeliveredMessage
from pamqp import commands as spec
from pamqp.header import ContentHeader

from hashq.errors import HashqError
from hashq.message import Handler, Message, is_async
from hashq.publisher import Outgoing, prepare
from hashq.routing import App, check_handler
from hashq.settings import WorkerSettings
from hashq.topology import Topology
from hashq.worker.dead_letter import DeadLetters, failure_headers
from hashq.worker.jobs import Job
from hashq.worker.machine import parking as pk
from hashq.worker.machine.lease import LeaseCore
from hashq.worker.machine.parking import Fate
from hashq.worker.metrics import WorkerMetrics
from hashq.worker.retry import RetryPolicy
from hashq.worker.runners import Runners

__all__ = ["DeadLetter", "Execution", "Result", "Unfinished", "run", "run_sync"]

WORKER_ID = "hashq.testing"


class Unfinished(HashqError):
    """Raised when the messages were not all acknowledged or dead-lettered in time
    (a handler that never returns, say, or a retry that never ends under ``block``)."""


@dataclass(frozen=True)
class Execution:
    """One call of the handler: its message, when it ran (``time.monotonic()``), and what it
    raised (None: it returned, and the message was acknowledged)."""

    message: Message
    started: float
    ended: float
    error: BaseException | None

    @property
    def key(self) -> str:
        return self.message.key

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class DeadLetter:
    """A message dead-lettered, with the ``x-hashq-*`` headers a worker gives it."""

    key: str
    body: bytes
    headers: dict[str, Any]

    @property
    def reason(self) -> str:
        return str(self.headers["x-hashq-reason"])


@dataclass
class Result:
    """What a run did, in the order it happened."""

    executions: list[Execution] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    retry_delays: list[float] = field(default_factory=list)  # what each retry would wait
    parked_bodies: dict[str, list[bytes]] = field(default_factory=dict)  # by key, in order
    most_at_once: int = 0  # the most handlers that ran at the same time

    def of(self, key: str) -> list[Execution]:
        """Every call of the handler for ``key``, in the order they began."""
        return [execution for execution in self.executions if execution.key == key]

    def parked(self, key: str) -> list[bytes]:
        """The bodies of ``key`` moved to its parking queue, in their order."""
        return self.parked_bodies.get(key, [])

    def done(self, key: str) -> list[bytes]:
        """The bodies of ``key`` whose handler returned, in the order it returned."""
        return [execution.message.body for execution in self.of(key) if execution.ok]


async def run(
    handler: Handler | App,
    messages: Iterable[Outgoing | tuple[str, bytes | str]],
    settings: WorkerSettings | None = None,
    *,
    wait_for_retries: bool = False,
    within: float = 10.0,
) -> Result:
    """Run ``messages`` (published in this order) through ``handler`` as a worker with
    ``settings`` (default: the defaults) owning every bucket would; return once each one was
    acknowledged or dead-lettered, or raise ``Unfinished`` after ``within`` seconds."""
    settings = settings or WorkerSettings()
    if isinstance(handler, App):
        handler.check_runs_as(handler.name)  # not its name (nothing is shared here): its handlers
    else:
        check_handler("the handler", handler)  # as the worker command does, before any message
    result = Result()
    broker = _Broker(settings, result, wait_for_retries)

    def recording(one: Handler) -> Handler:
        return _recording(one, result)

    recorded = handler.mapped(recording) if isinstance(handler, App) else recording(handler)
    runners = Runners(
        recorded,
        concurrency=settings.concurrency,
        threads=settings.threads,
        policy=RetryPolicy.from_settings(settings),
        dead_letters=broker.dead_letters,
        codec=settings.codec,
        metrics=WorkerMetrics(["testing"]),
        later=broker.later,
    )
    broker.dispatch = runners.dispatch
    runners.start()
    try:
        for message in messages:
            broker.publish(_outgoing(message))
        await broker.all_done(within)
    finally:
        await runners.close()
    return result


def run_sync(
    handler: Handler | App,
    messages: Iterable[Outgoing | tuple[str, bytes | str]],
    settings: WorkerSettings | None = None,
    **options: Any,
) -> Result:
    """``run`` for a test without an event loop of its own."""
    return asyncio.run(run(handler, messages, settings, **options))


def _outgoing(message: Outgoing | tuple[str, bytes | str]) -> Outgoing:
    if isinstance(message, Outgoing):
        return message
    key, body = message
    return Outgoing(key, body.encode() if isinstance(body, str) else body)


def _recording(handler: Handler, result: Result) -> Handler:
    """``handler``, noting each call in ``result``; async if it is, so that the runners run it
    where they would run ``handler`` (a plain function in a thread)."""
    lock = threading.Lock()
    running = 0

    def begin() -> float:
        nonlocal running
        with lock:
            running += 1
            result.most_at_once = max(result.most_at_once, running)
        return time.monotonic()

    def end(message: Message, started: float, error: BaseException | None) -> None:
        nonlocal running
        with lock:
            running -= 1
            result.executions.append(Execution(message, started, time.monotonic(), error))

    if is_async(handler):

        @functools.wraps(handler)  # its signature, so that a body type it declares is seen
        async def recorded(message: Message, *payload: Any) -> None:
            started, error = begin(), None
            try:
                await handler(message, *payload)  # type: ignore[misc]
            except BaseException as exc:
                error = exc
                raise
            finally:
                end(message, started, error)

        return recorded

    @functools.wraps(handler)
    def recorded_in_thread(message: Message, *payload: Any) -> None:
        started, error = begin(), None
        try:
            handler(message, *payload)
        except BaseException as exc:
            error = exc
            raise
        finally:
            end(message, started, error)

    return recorded_in_thread


class _Broker:
    """The buckets in memory, the dead letters, and the retries under way."""

    def __init__(self, settings: WorkerSettings, result: Result, wait: bool) -> None:
        self._result = result
        self._wait = wait
        self.dispatch: Callable[[Job], None] = lambda job: None
        self.dead_letters = _DeadLetters(Topology.from_settings(settings), result)
        self._buckets = [_Bucket(n, settings.prefetch, self) for n in range(settings.buckets)]
        self._retrying = 0
        self._changed = asyncio.Event()

    def publish(self, message: Outgoing) -> None:
        key, body, properties = prepare(message)
        bucket = zlib.crc32(key.encode()) % len(self._buckets)
        self._buckets[bucket].publish(key, body, properties)

    def parked(self, key: str, body: bytes) -> None:
        self._result.parked_bodies.setdefault(key, []).append(body)

    def later(self, delay: float, again: Callable[[], None]) -> object:
        """Outcomes' clock: a retry waits ``delay`` only if asked to."""
        self._result.retry_delays.append(delay)
        self._retrying += 1

        def retry() -> None:
            self._retrying -= 1
            again()
            self.changed()

        loop = asyncio.get_running_loop()
        return loop.call_later(delay, retry) if self._wait else loop.call_soon(retry)

    def changed(self) -> None:
        self._changed.set()

    async def all_done(self, within: float) -> None:
        deadline = time.monotonic() + within
        while self._retrying or not all(bucket.empty for bucket in self._buckets):
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), deadline - time.monotonic())
            except TimeoutError:
                left = sum(bucket.left for bucket in self._buckets)
                raise Unfinished(f"{left} messages not done within {within:g} s") from None


class _Bucket:
    """One bucket queue and the worker's lease on it (``hashq.worker.jobs.Lease``), as the
    broker and ``BucketLease`` would be, without a channel: at most ``prefetch`` delivered and
    not acknowledged."""

    epoch = 1

    def __init__(self, bucket: int, prefetch: int, broker: _Broker) -> None:
        self.bucket = bucket
        self.log_fields = {"bucket": bucket, "epoch": self.epoch}
        self._prefetch = prefetch
        self._broker = broker
        self._queue: deque[tuple[str, bytes, spec.Basic.Properties]] = deque()
        self._core: LeaseCore[Job] = LeaseCore(bucket, self.epoch, WORKER_ID, parks=True)
        self._core.parked.load([])  # no key of it is parked yet
        self._tags = 0

    @property
    def empty(self) -> bool:
        return not self._queue and self._core.idle

    @property
    def left(self) -> int:
        return len(self._queue) + self._core.held

    def publish(self, key: str, body: bytes, properties: spec.Basic.Properties) -> None:
        self._queue.append((key, body, properties))
        self._deliver()

    def _deliver(self) -> None:
        while self._queue and self._core.held < self._prefetch:
            key, body, properties = self._queue.popleft()
            self._tags += 1
            frame = spec.Basic.Deliver(delivery_tag=self._tags, routing_key=key)
            header = ContentHeader(properties=properties)
            job = Job(self, DeliveredMessage(frame, header, body, None), key)  # type: ignore[arg-type]
            for ready in self._core.deliver(self._tags, job):
                self._broker.dispatch(ready)

    def may_start(self, job: Job) -> bool:
        return self._core.may_start()

    def fate(self, job: Job) -> Fate:
        fate = self._core.fate(job)
        self._act()
        return fate

    def started(self, job: Job, fate: Fate = Fate.RUN) -> None:
        self._core.started(job, fate)

    def park(self, job: Job, reason: str, since: float) -> None:
        self._core.park(job, reason, since)
        self._act()

    async def move(self, job: Job) -> None:
        self._broker.parked(job.key, job.delivery.body)

    def _act(self) -> None:
        """What its parked keys ask for: records are written at once, in memory."""
        for action in self._core.take():
            if isinstance(action, pk.Dispatch):
                self._broker.dispatch(action.job)
            elif isinstance(action, pk.WriteRecord) and action.op is pk.RecordOp.CREATE:
                self._core.parked.record_result(action.key, action.op, pk.Outcome.DONE, None, 0)
                self._act()

    def finished(self, job: Job) -> None:
        for following in self._core.finished(job):
            self._broker.dispatch(following)
        self._act()
        self._deliver()
        self._broker.changed()

    def dropped(self, job: Job) -> None:
        self._core.dropped(job)
        self._act()

    def ack(self, job: Job) -> bool:
        return True


class _DeadLetters(DeadLetters):
    """The dead-letter queue: what a worker would publish there, kept in ``result``."""

    def __init__(self, topology: Topology, result: Result) -> None:
        super().__init__(topology, WORKER_ID)
        self._result = result

    async def publish(self, job: Job, reason: str, error: BaseException | None) -> None:
        headers = failure_headers(job, reason, error, WORKER_ID)
        self._result.dead_letters.append(DeadLetter(job.key, job.delivery.body, headers))
