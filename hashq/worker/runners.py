"""Running handlers: a fixed pool of runner tasks takes ready jobs and, for each, calls the
handler; what follows (acknowledge, retry, dead-letter) is ``hashq.worker.jobs.Outcomes``.

No task per message: ``concurrency`` runners pull from one queue of ready jobs, which wakes as
few of them as keep the jobs moving (``hashq.worker.ready``). A retry does not hold a runner
while it waits; the job comes back to the queue when its delay is over, and its key's lane stays
blocked meanwhile, so only that key waits.

A plain (non-async) handler runs in a pool of ``threads`` threads, and then there are never more
runners than threads: a ``ThreadPoolExecutor`` queues what it is given while its threads are busy
and runs it when one frees, whatever became of its bucket meanwhile, so a job queued there would
start after its lease was cut off or after a pause that outlived the session (a stale start). A
runner decides to start a job only when its thread is free. Even a free thread runs its job only
once the loop lets go of the interpreter, and a pause (SIGSTOP) may fall in between; so the
thread checks again before it calls the handler (``_in_thread``), and a job it refuses goes back.
An async handler is looked at again too, once its body is decoded (a validation of the user's
type may take long), just before it is called (``_call``): the same look (``_may_begin``). No
check closes the last microseconds before a handler's first line: a pause there is what the
epoch, the fencing token, is for. ``Message.started_at`` is the clock read just before that last
look, so a record can tell such a late first line from a late start: a pause after that read
either shows in the checks (they refuse) or falls in that window.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from hashq.errors import Undecodable
from hashq.message import Handler, Message, MessageHandler
from hashq.routing import App, Route, Router
from hashq.settings import WorkerSettings
from hashq.topology import Topology
from hashq.tracing import Execution, Span, Tracing, current, tracing_for
from hashq.worker.dead_letter import DeadLetters
from hashq.worker.jobs import Job, Later, Outcomes
from hashq.worker.machine.parking import Fate
from hashq.worker.metrics import WorkerMetrics
from hashq.worker.ready import ReadyJobs
from hashq.worker.retry import RetryPolicy


class Heard(Protocol):
    """Whether the broker answered the worker lately (``hashq.worker.contact.ContactKeeper``):
    runners start a delivered message only then."""

    def heard(self) -> bool: ...
    async def heard_again(self) -> None: ...


class _AlwaysHeard:
    def heard(self) -> bool:
        return True

    async def heard_again(self) -> None:
        return None


class Runners:
    """``concurrency`` tasks running jobs from one ready queue."""

    def __init__(
        self,
        handler: Handler | App,
        *,
        concurrency: int,
        threads: int,
        policy: RetryPolicy,
        dead_letters: DeadLetters,
        codec: str,
        metrics: WorkerMetrics,
        awake: Callable[[], bool] = lambda: True,
        contact: Heard | None = None,
        keys_in_clear: bool = False,
        later: Later | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._router = Router.of(handler, policy)  # which handler a job takes (hashq.App)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="hashq-handler")
        self._codec = codec
        self._awake = awake
        self._contact = contact or _AlwaysHeard()
        self._metrics = metrics
        self._tracing = tracing
        self._outcomes = Outcomes(
            policy, dead_letters, metrics, self.dispatch, keys_in_clear, later
        )
        self._ready: ReadyJobs[Job] = ReadyJobs()
        self._may_start = asyncio.Event()
        self._may_start.set()
        self._closing = False
        all_async = self._router.all_async
        self._concurrency = concurrency if all_async else min(concurrency, threads)
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    def for_worker(
        cls,
        settings: WorkerSettings,
        handler: Handler | App,
        dead_letters: DeadLetters,
        metrics: WorkerMetrics,
        awake: Callable[[], bool],
        contact: Heard,
    ) -> Runners:
        """A worker's runners, as its settings say."""
        clear = settings.log_keys == "clear"  # in its DEBUG lines and its spans alike
        exchange = Topology.from_settings(settings).exchange
        return cls(
            handler,
            concurrency=settings.concurrency,
            threads=settings.threads,
            policy=RetryPolicy.from_settings(settings),
            dead_letters=dead_letters,
            codec=settings.codec,
            metrics=metrics,
            awake=awake,
            contact=contact,
            keys_in_clear=clear,
            tracing=tracing_for(settings.tracing, exchange, keys_in_clear=clear),
        )

    def start(self) -> None:
        """Start the runner tasks (on the running loop)."""
        self._outcomes.notice_log_level()
        self._tasks = [asyncio.ensure_future(self._run()) for _ in range(self._concurrency)]

    @property
    def processed(self) -> int:
        """Messages acknowledged after their handler returned or they were dead-lettered."""
        return self._outcomes.processed

    def dispatch(self, job: Job) -> None:
        self._ready.put(job)

    def pause(self) -> None:
        """Start nothing new (ZooKeeper suspended); running handlers go on."""
        self._may_start.clear()

    def resume(self) -> None:
        self._may_start.set()

    async def close(self) -> None:
        self._closing = True
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            _, stuck = await asyncio.wait(self._tasks, timeout=1.0)
            for task in stuck:  # a runner waiting for a handler thread that does not return
                task.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------ one job
    async def _run(self) -> None:
        me = asyncio.current_task()
        assert me is not None
        while True:
            job = self._ready.take()
            if job is None:
                await self._ready.wait()
                continue
            if not self._awake():
                self.pause()  # the process was paused: the worker confirms its session first
            if not self._may_start.is_set():
                self._ready.put_back(job)  # paused: leave it for later
                await self._may_start.wait()
                continue
            if not self._contact.heard():
                self._ready.put_back(job)  # the broker has not answered lately: wait for it
                await self._contact.heard_again()
                continue
            await self._execute(job, me)

    async def _execute(self, job: Job, me: asyncio.Task[None]) -> None:
        lease = job.lease
        if not lease.may_start(job):
            return  # its bucket was closed: the message went back to the queue
        fate = lease.fate(job)
        if fate in (Fate.MOVE, Fate.DEAD_LETTER):
            with self._traced(job) as execution:
                execution.ended(await self._not_run(job, fate))
            return
        if fate is not Fate.RUN:
            return  # it waits with its key, or went back to its parking queue
        try:
            message, route = self._message(job)
            if route.payload is not None:  # validated in a thread: see ``_message``
                message.data = await asyncio.to_thread(route.payload.decode, job.delivery.body)
        except Undecodable as exc:
            if lease.may_start(job):  # else it went back to the queue while it was decoded
                with self._traced(job) as execution:
                    execution.ended(await self._outcomes.dead_letter(job, exc.reason, exc), exc)
            return
        if route.payload is not None and not lease.may_start(job):
            return  # its bucket was closed while its body was decoded in a thread
        lease.started(job)
        job.running(me, message)  # a closing lease may cut it off now
        if self._tracing is None or not self._tracing.active:
            await self._handle(job, message, route, None)  # untraced: nothing more per message
            return
        with self._tracing.executing(message) as execution:
            execution.ended(*await self._handle(job, message, route, execution.span))

    def _traced(self, job: Job) -> contextlib.AbstractContextManager[Execution]:
        """A span for a job that runs no handler (dead-lettered or moved as it is)."""
        if self._tracing is None or not self._tracing.active:
            return contextlib.nullcontext(Execution(None))
        return self._tracing.executing(_bare_message(job))

    async def _handle(
        self, job: Job, message: Message, route: Route, span: Span | None
    ) -> tuple[str, Exception | None]:
        """Call the handler, then settle, retry or dead-letter: what became of it (a span's
        ``hashq.outcome``, and the handler's exception)."""
        lease = job.lease
        since = time.perf_counter()
        try:
            if span is None:
                began = await self._call(job, message, route, None)
            else:
                with current(span):
                    began = await self._call(job, message, route, span)
        except asyncio.CancelledError:
            if not job.was_cut_off:
                raise
            _uncancel()
            lease.dropped(job)
            return "cut-off", None
        except Exception as exc:
            job.returned()
            self._metrics.handler_seconds.observe(time.perf_counter() - since)
            return await self._outcomes.failed(job, exc, route.policy), exc
        job.returned()
        if not began:
            self._not_begun(job)
            return "not-begun", None
        self._metrics.handler_seconds.observe(time.perf_counter() - since)
        return self._outcomes.settle(job), None

    async def _not_run(self, job: Job, fate: Fate) -> str:
        """A parked key's message: moved to its parking queue, or (its key dropped)
        dead-lettered."""
        job.lease.started(job, fate)
        if fate is Fate.MOVE:
            return await self._outcomes.move(job)
        return await self._outcomes.dead_letter(job, "dropped", None)

    async def _call(self, job: Job, message: Message, route: Route, span: Span | None) -> bool:
        """Call the handler; False if the look just before it begins (``_may_begin``) says no:
        on the loop for an async handler, after its body was decoded (which may take long), and
        in its thread for a plain one (``_in_thread``)."""
        if route.is_async:
            deciding = self._may_begin(job)
            if deciding is None:
                return False
            message.started_at = deciding
            result = route.call(message)
            assert inspect.isawaitable(result)
            await result
            return True
        message.cancel_event  # noqa: B018 - made here, in the loop's thread, before the thread starts
        submitted = self._pool.submit(self._in_thread, job, message, route.call, span)
        thread = asyncio.wrap_future(submitted)
        try:
            began: bool = await asyncio.shield(thread)
        except asyncio.CancelledError:
            if not submitted.cancel():  # it began: wait for it (cancelled: it never will)
                await self._until_done(thread)
            raise
        return began

    def _in_thread(
        self, job: Job, message: Message, handler: MessageHandler, span: Span | None
    ) -> bool:
        """In the handler's thread: call the handler only if ``_may_begin`` says yes there (with
        its span current in this thread)."""
        deciding = self._may_begin(job)
        if deciding is None:
            return False
        message.started_at = deciding
        with current(span):
            handler(message)
        return True

    def _may_begin(self, job: Job) -> float | None:
        """The last look before a handler begins: the clock (its ``Message.started_at``) if the
        process was not paused since the watchdog's last tick, the runners are not paused, the
        broker answered lately (``hashq.worker.contact``) and the lease still consumes; None if
        not. Checked in that order, the reverse of the watchdog's (it pauses, then ticks).

        The clock is read before the checks, not after: a stop between them shows in
        ``_awake``, which reads the clock itself. Read after, a stop in between (a thread that
        passed the checks and waits for the interpreter lock) would date the start after the
        stop, after its bucket had gone on elsewhere: a fenced zombie's start seen as stale."""
        deciding = time.monotonic()
        if (
            self._awake()
            and self._may_start.is_set()
            and self._contact.heard()
            and job.lease.may_start(job)
        ):
            return deciding
        return None

    def _not_begun(self, job: Job) -> None:
        """Its thread refused it: it goes back to the ready queue, where a runner sees the pause
        too (``_run``), unless its lease closed (then its message went back to the queue)."""
        job.lease.dropped(job)
        if job.lease.may_start(job):
            self._ready.put(job)

    async def _until_done(self, thread: asyncio.Future[Any]) -> None:
        """Wait for a handler thread told to stop (through ``message.cancel_event``): a thread
        cannot be stopped, and its job must stay "running" until it returns, however often the
        runner is cancelled meanwhile (a lease closed twice), so that its message never starts
        beside its own redelivery. Only closing the runners (the worker exits) stops the wait."""
        while not thread.done():
            try:
                await asyncio.wait({thread})
            except asyncio.CancelledError:
                if self._closing:
                    raise
                _uncancel()

    def _message(self, job: Job) -> tuple[Message, Route]:
        """The message its handler gets, and the route it takes; ``Undecodable`` (or one of its
        kinds: an unknown job type, a body that is not JSON) if it cannot be handled.

        A body to validate as a declared type (``route.payload``) is left to the caller, which
        decodes it in a thread: a user's validators may take long, and a loop held past the
        pause limit would stop the watchdog's ticks, so that the last look (``_may_begin``)
        refused the job each time it came back, for ever."""
        delivery = job.delivery
        headers = dict(delivery.header.properties.headers or {})
        route = self._router.route(headers)
        message = _bare_message(job, headers)
        if route.payload is None and self._codec == "json":
            try:
                message.data = json.loads(delivery.body)
            except ValueError as exc:
                raise Undecodable(f"body is not JSON: {exc}") from None
        return message, route


def _bare_message(job: Job, headers: dict[str, Any] | None = None) -> Message:
    """``job``'s message as its handler sees it, its body not decoded."""
    delivery = job.delivery
    properties = delivery.header.properties
    return Message(
        key=job.key,
        body=delivery.body,
        headers=dict(properties.headers or {}) if headers is None else headers,
        message_id=properties.message_id,
        bucket=job.lease.bucket,
        epoch=job.lease.epoch,
        redelivered=job.redelivered,
        attempt=job.attempt,
    )


def _uncancel() -> None:
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
