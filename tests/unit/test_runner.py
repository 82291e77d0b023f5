"""The runners, without a broker: a plain-function handler runs in a thread that cannot be
stopped, and its job must count as running until the thread returns; and a job waiting for a
thread has not started, so nothing starts it after its lease closed or while runners pause."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest
from aiormq.abc import DeliveredMessage
from pamqp import commands as spec
from pamqp.header import ContentHeader

from hashq.message import Message
from hashq.routing import Route
from hashq.settings import Settings
from hashq.topology import Topology
from hashq.tracing import Tracing
from hashq.worker.dead_letter import DeadLetters
from hashq.worker.jobs import Job
from hashq.worker.machine.parking import Fate
from hashq.worker.metrics import WorkerMetrics
from hashq.worker.retry import RetryPolicy
from hashq.worker.runners import Heard, Runners


async def test_a_thread_handler_cut_off_twice_is_waited_for_until_it_returns() -> None:
    """A lease closed twice (a drain timing out, then the connection dropping) cancels the
    runner twice. The second cancellation used to end the wait for the thread, so the job
    counted as finished, and its bucket could be subscribed again, while the thread still ran
    its message."""
    release = threading.Event()

    def handler(message: Message) -> None:
        release.wait(10)

    runners = _runners(handler, concurrency=1, threads=1)
    message = Message("k", b"", {}, "m", bucket=0, epoch=1, redelivered=False, attempt=1)
    route = Route.of(handler)
    call = asyncio.ensure_future(runners._call(_job(_Lease(), 1), message, route, None))
    await asyncio.sleep(0.1)
    for _ in range(2):  # cut off, and cut off again
        call.cancel()
        await asyncio.sleep(0.1)
    assert not call.done(), "the job stopped counting as running while its thread ran"
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await call
    await runners.close()


async def test_a_job_waiting_for_its_retry_does_not_keep_its_closed_lease_waiting() -> None:
    """A handler failed and its retry waits: the job must not count as running, or a lease
    closed meanwhile (its channel closed by the broker's consumer_timeout, in the chaos run with
    poison keys) waits for it for ever, and its bucket is neither consumed again nor released."""
    attempts: list[int] = []

    async def handler(message: Message) -> None:
        attempts.append(message.attempt)
        raise RuntimeError("broken")

    runners = _runners(handler, concurrency=1, threads=1)
    runners.start()
    lease = _Lease()
    runners.dispatch(_job(lease, 1))
    await asyncio.sleep(0.05)  # it failed; its retry waits (RetryPolicy's base delay)
    assert attempts == [1]
    assert lease.running == [], "a job waiting for its retry counted as running"
    lease.close()
    await runners.close()


class _Lease:
    """As much of a bucket lease as the runners use: it may start jobs until it closes."""

    bucket, epoch, log_fields = 0, 1, {"bucket": 0}

    def __init__(self) -> None:
        self.open = True
        self.running: list[Job] = []

    def may_start(self, job: Job) -> bool:
        return self.open

    def fate(self, job: Job) -> Fate:
        return Fate.RUN

    def started(self, job: Job, fate: Fate = Fate.RUN) -> None:
        self.running.append(job)

    def park(self, job: Job, reason: str, since: float) -> None:
        self.running.remove(job)

    async def move(self, job: Job) -> None:
        raise AssertionError("no key is parked here")

    def finished(self, job: Job) -> None:
        self.running.remove(job)

    dropped = finished

    def ack(self, job: Job) -> bool:
        return True

    def close(self) -> None:
        """``BucketLease.close``: start nothing more, cut off every job it started."""
        self.open = False
        for job in list(self.running):
            job.cut_off()


def _runners(
    handler: object,
    *,
    concurrency: int,
    threads: int,
    awake: Callable[[], bool] = lambda: True,
    contact: Heard | None = None,
    tracing: Tracing | None = None,
) -> Runners:
    return Runners(
        handler,  # type: ignore[arg-type]
        concurrency=concurrency,
        threads=threads,
        policy=RetryPolicy(),
        dead_letters=DeadLetters(Topology.from_settings(Settings()), "w1"),  # never used here
        codec="raw",
        metrics=WorkerMetrics(["running"]),
        awake=awake,
        contact=contact,
        tracing=tracing,
    )


def _job(lease: _Lease, tag: int) -> Job:
    frame = spec.Basic.Deliver(delivery_tag=tag)
    header = ContentHeader(properties=spec.Basic.Properties(message_id=f"m{tag}"))
    delivery = DeliveredMessage(frame, header, b"", None)  # type: ignore[arg-type]
    return Job(lease, delivery, f"k{tag}")


class _Blocking:
    """A plain handler whose first call blocks until ``release``; it notes every message."""

    def __init__(self) -> None:
        self.began: list[str | None] = []
        self.release = threading.Event()

    def __call__(self, message: Message) -> None:
        self.began.append(message.message_id)
        if len(self.began) == 1:
            self.release.wait(10)


async def test_a_job_waiting_for_a_thread_never_starts_after_its_lease_closed() -> None:
    """More runners than threads: jobs handed to a busy pool waited in its queue, counted as
    started; cut off, their runners waited for them, and the pool ran them once a thread freed,
    after the fence (the stale starts of the 30-minute chaos run, seed 23)."""
    handler, lease = _Blocking(), _Lease()
    runners = _runners(handler, concurrency=4, threads=1)
    runners.start()
    for tag in (1, 2, 3):
        runners.dispatch(_job(lease, tag))
    await asyncio.sleep(0.2)
    assert handler.began == ["m1"]
    lease.close()  # fenced while the first handler runs on in its thread
    handler.release.set()
    await asyncio.sleep(0.3)
    assert handler.began == ["m1"], "a job of a closed lease started once a thread freed"
    await runners.close()


async def test_paused_runners_start_no_job_that_waited_for_a_thread() -> None:
    """A pause seen (the process was stopped, its session may be gone): nothing starts until
    ZooKeeper confirms the session; a job queued in the thread pool began regardless."""
    handler, lease = _Blocking(), _Lease()
    runners = _runners(handler, concurrency=4, threads=1)
    runners.start()
    for tag in (1, 2):
        runners.dispatch(_job(lease, tag))
    await asyncio.sleep(0.2)
    runners.pause()
    handler.release.set()
    await asyncio.sleep(0.3)
    assert handler.began == ["m1"], "a job started while the runners were paused"
    runners.resume()
    await asyncio.sleep(0.3)
    assert handler.began == ["m1", "m2"]
    await runners.close()


class _PausedAfterTheRunnerLooked:
    """The watchdog's answer when a SIGSTOP falls between a runner's check and its thread's:
    awake for the runner's first look, paused from then on until ``resumed``."""

    def __init__(self) -> None:
        self.looks = 0
        self.resumed = False

    def __call__(self) -> bool:
        self.looks += 1
        return self.looks == 1 or self.resumed


async def test_a_thread_that_runs_only_after_a_pause_does_not_begin_its_job() -> None:
    """A free thread runs its job once the loop lets go of the interpreter; a SIGSTOP in between
    began the job as the process resumed, after its session had expired and the bucket had
    gone on at the next epoch (the stale start of the 30-minute chaos run, seed 23, at 10633ed;
    the simulator's seed 343). The thread looks again, and the job waits for the runners to
    resume."""
    handler, lease, awake = _Blocking(), _Lease(), _PausedAfterTheRunnerLooked()
    handler.release.set()
    runners = _runners(handler, concurrency=1, threads=1, awake=awake)
    runners.start()
    runners.dispatch(_job(lease, 1))
    await asyncio.sleep(0.3)
    assert handler.began == [], "a job began in a thread that ran after a pause"
    assert lease.running == [], "a job its thread refused still counts as running"
    awake.resumed = True
    runners.resume()  # the session was confirmed
    await asyncio.sleep(0.3)
    assert handler.began == ["m1"]
    await runners.close()


async def test_a_thread_sees_runners_paused_by_a_watchdog_that_ticked_again() -> None:
    """The watchdog pauses the runners, then ticks: a thread that looks after the tick finds the
    process awake, so it must look at the runners' pause after the tick, not before."""
    handler, lease = _Blocking(), _Lease()
    handler.release.set()
    looks: list[bool] = []

    def awake() -> bool:  # the runner's look, then the thread's: by then the watchdog has
        looks.append(True)  # seen the pause, paused the runners and ticked again
        if len(looks) == 2:
            runners.pause()
        return True

    runners = _runners(handler, concurrency=1, threads=1, awake=awake)
    runners.start()
    runners.dispatch(_job(lease, 1))
    await asyncio.sleep(0.3)
    assert handler.began == [], "a thread began a job while the runners were paused"
    runners.resume()
    await asyncio.sleep(0.3)
    assert handler.began == ["m1"]
    await runners.close()


@pytest.mark.parametrize("kind", ["thread", "async"])
async def test_a_handler_sees_when_the_worker_let_it_begin(kind: str) -> None:
    """``Message.started_at`` is taken after the last check, before the handler's first line:
    the chaos run judges starts by it, so a stop between the two counts as a fenced zombie
    (the third 30-minute run's one stale start) and a start decided late still shows."""
    seen: list[tuple[float, float]] = []

    def plain(message: Message) -> None:
        seen.append((message.started_at, time.monotonic()))

    async def coroutine(message: Message) -> None:
        plain(message)

    lease = _Lease()
    runners = _runners(plain if kind == "thread" else coroutine, concurrency=1, threads=1)
    runners.start()
    before = time.monotonic()
    runners.dispatch(_job(lease, 1))
    await asyncio.sleep(0.2)
    [(started_at, first_line)] = seen
    assert before <= started_at <= first_line
    await runners.close()


class _SlowLease(_Lease):
    """A lease whose check is where a process stop lands: it takes 0.3 s, then says yes."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[float] = []

    def may_start(self, job: Job) -> bool:
        self.asked.append(time.monotonic())
        time.sleep(0.3)
        return self.open


@pytest.mark.parametrize("kind", ["thread", "async"])
async def test_a_start_is_dated_before_the_checks_that_let_it_begin(kind: str) -> None:
    """A stop during or after the checks must not date the start after the stop: a job
    decided before it is a fenced zombie, not a stale start (a short chaos run in CI saw one
    when the clock was read after the checks). Every start is dated before the last check."""
    seen: list[float] = []

    def plain(message: Message) -> None:
        seen.append(message.started_at)

    async def coroutine(message: Message) -> None:
        plain(message)

    looks: list[float] = []

    def awake() -> bool:  # the pause check, where a stop may land too
        looks.append(time.monotonic())
        time.sleep(0.3)
        return True

    lease = _SlowLease()
    handler = plain if kind == "thread" else coroutine
    runners = _runners(handler, concurrency=1, threads=1, awake=awake)
    runners.start()
    runners.dispatch(_job(lease, 1))
    await asyncio.sleep(2.0)
    [started_at] = seen
    assert started_at < looks[-1] < lease.asked[-1]  # before the last look's first check
    await runners.close()
