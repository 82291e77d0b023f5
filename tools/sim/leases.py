"""A simulated worker's bucket leases and the jobs delivered on them: what
``hashq.worker.bucket_lease``, ``hashq.worker.jobs`` and ``hashq.worker.runners`` do, on virtual
time, against the broker model.

Handlers take a duration drawn from the seed; a "thread" handler cannot be stopped (it runs on
after its lease is cut off), an async one stops when told. Thread handlers share a pool of
``threads`` threads (0: one per runner) which, like ``ThreadPoolExecutor``, queues what it is
given while every thread is busy and runs it when one frees, whatever became of its lease
meanwhile; so a runner gives the pool a job only when a thread is free (``Runners``: no more
runners than threads for a plain handler). A free thread takes its job ``thread_handoff`` seconds
later (it waits for the loop to let go of the interpreter), so a pause may fall in between; the
thread then begins the handler only if its runners are not paused, its lease still consumes and
the broker answered its connection recently (``Runners._in_thread``, ``BrokerContact``), else the
job goes back. Acknowledgements go out in batches through the
production ``AckWindow``.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from hashq.worker.acks import ACK_DELAY, AckWindow
from hashq.worker.machine import events as ev
from hashq.worker.machine.lease import LeaseCore
from hashq.worker.machine.parking import Fate
from tools.sim.invariants import Execution, Invariants
from tools.sim.markers import SimMarkers
from tools.sim.parking import MAX_ATTEMPTS, RETRY_DELAY, SimParking
from tools.sim.process import Process
from tools.sim.rabbit import Broker, Connection, Msg


@dataclass(eq=False)
class Job:
    lease: SimLease
    tag: int
    msg: Msg
    thread: bool
    duration: float
    execution: Execution | None = None
    cut: bool = False
    from_parking: bool = False
    attempt: int = 1

    @property
    def key(self) -> str:
        return self.msg.key

    @property
    def marker(self) -> int:
        return self.msg.marker


@dataclass(eq=False)
class SimLease:
    number: int
    bucket: int
    epoch: int
    channel: int
    connection: Connection
    window: AckWindow
    core: LeaseCore[Job] = field(default_factory=LeaseCore)
    ack_timer: bool = False
    on_idle: list[Callable[[], None]] = field(default_factory=list)
    awaiting_close: list[Callable[[], None]] = field(default_factory=list)
    closed: bool = False
    settle_watched: bool = False


class LeaseRunner:
    """The leases of one ``SimWorker`` (``process``) and the jobs delivered on them: it runs
    inside that process, and tells the worker's machine what happened through ``post``."""

    def __init__(
        self,
        process: Process,
        post: Callable[[ev.Event], None],
        broker: Broker,
        invariants: Invariants,
        prefetch: int,
        concurrency: int,
        handler_time: Callable[[], tuple[float, bool]],
        threads: int = 0,
        thread_handoff: float = 0.0,
        heard: Callable[[Connection], bool] = lambda _: True,
        parking: SimParking | None = None,
        hot_after: int = 0,
        markers: SimMarkers | None = None,
    ) -> None:
        self._process = process
        self._worker_id, self._world = process.name, process.world  # its name is the worker's id
        self._post = post
        self._broker, self._invariants = broker, invariants
        self._prefetch, self._concurrency = prefetch, concurrency
        self._handler_time = handler_time
        self.leases: dict[int, SimLease] = {}  # by machine lease number
        self._channels = itertools.count(1)
        self._ready: deque[Job] = deque()
        self._running = 0
        self._threads, self._threads_busy = threads, 0
        self._pool_queue: deque[Job] = deque()  # given to a pool whose threads were all busy
        self._handoff = thread_handoff
        self._heard = heard  # the worker's ``BrokerContact`` of a connection is fresh
        self.paused = False  # the runners start nothing (``PauseRunners``, a pause seen)
        self._parking = parking
        self._hot_after = hot_after
        if parking is not None:
            parking.runner = self
        self._markers = markers
        if markers is not None:
            markers.runner = self

    def new_channel(self) -> int:
        return next(self._channels)

    def resume(self) -> None:
        self.paused = False
        self.pump()

    def abandon(self) -> None:
        """The process died: whatever ran in it ends unfinished."""
        for lease in self.leases.values():
            for job in list(lease.core.close()):
                self._end(job, completed=False)

    # ------------------------------------------------------------ AMQP
    def connection_gone(self, connection: Connection) -> None:
        for lease in list(self.leases.values()):
            if lease.connection is connection:
                self._fire(lease)
                waiting, lease.awaiting_close = lease.awaiting_close, []
                for closed in waiting:
                    closed()

    def subscribe(self, action: ev.Subscribe, connection: Connection | None) -> None:
        if connection is None:
            self._process.later(
                0, lambda: self._post(ev.Subscribed(action.lease, False, "no connection"))
            )
            return
        lease = SimLease(
            action.lease,
            action.bucket,
            action.epoch,
            next(self._channels),
            connection,
            AckWindow(max(1, self._prefetch // 2)),
            LeaseCore(
                action.bucket,
                action.epoch,
                self._worker_id,
                self._parking is not None,
                self._hot_after,
                min(self._prefetch, self._broker.prefetch_cap),
            ),
        )
        self.leases[action.lease] = lease
        if self._parking is not None:
            self._parking.load(lease)

        def done(error: str) -> None:
            self._post(ev.Subscribed(action.lease, not error, error))

        queue = self._broker.bucket_queue(action.bucket)
        connection.consume(
            lease.channel, queue, self._prefetch, self._process.bound(done), action.epoch
        )

    def delivered(self, connection: Connection, channel: int, tag: int, msg: Msg) -> None:
        parked = self._parking.lease_of(connection, channel) if self._parking else None
        if parked is not None:
            duration, thread = self._handler_time()
            parked[0].core.parked.delivered(
                msg.key, tag, Job(parked[0], tag, msg, thread, duration, from_parking=True)
            )
            self.pump()
            return
        lease = self._lease_on(connection, channel)
        if lease is None:
            return
        duration, thread = self._handler_time()
        for job in lease.core.deliver(tag, Job(lease, tag, msg, thread, duration)):
            self._ready.append(job)
        self.pump()

    def channel_lost(
        self, connection: Connection, channel: int, reason: str, timeout: bool
    ) -> None:
        if self._parking is not None and self._parking.lease_of(connection, channel):
            self._parking.lost(connection, channel)
            return
        lease = self._lease_on(connection, channel)
        if lease is not None:
            lease.closed = True
            self._post(ev.ChannelLost(lease.number, reason, timeout))

    def _lease_on(self, connection: Connection, channel: int) -> SimLease | None:
        for lease in self.leases.values():
            if lease.connection is connection and lease.channel == channel:
                return lease
        return None

    # ------------------------------------------------------------ running jobs
    def pump(self) -> None:
        """Start what may start now (also called when the broker answered: a contact is fresh
        again)."""
        self._take_actions()
        held: list[Job] = []  # plain handlers waiting for a free thread, not yet started
        while self._ready and not self.paused and self._running < self._concurrency:
            job = self._ready.popleft()
            if (job.thread and not self._thread_free()) or not self._heard(job.lease.connection):
                held.append(job)
            elif job.lease.core.may_start() and self.leases.get(job.lease.number) is job.lease:
                self._execute(job)
        self._ready.extendleft(reversed(held))

    def cut(self, job: Job) -> None:
        """Stop ``job``'s handler (its parking channel went): an async one stops now, a thread
        returns when it returns."""
        job.cut = True
        if not job.thread and job.execution is not None and job.execution.running:
            self._running -= 1
            job.lease.core.dropped(job)
            self._end(job, completed=False)

    def _take_actions(self) -> None:
        """What the leases' parked keys asked for; the resize markers that may pass."""
        for lease in list(self.leases.values()):
            if self._parking is not None:
                self._ready.extend(self._parking.act(lease, lease.core.take()))
            if self._markers is not None:
                self._markers.act(lease)

    def marker_passed(self, job: Job) -> None:
        """Its passed node is written: the marker is acknowledged like any message."""
        lease = job.lease
        if self._ack(job):
            lease.core.finished(job)
        self._after_job(lease)
        self.pump()

    def _thread_free(self) -> bool:
        return self._threads == 0 or self._threads_busy < self._threads

    def _execute(self, job: Job) -> None:
        fate = job.lease.core.fate(job)
        if fate in (Fate.WAIT, Fate.GONE):
            return  # it waits with its parked key, or went back to its parking queue
        job.lease.core.started(job, fate)
        self._running += 1
        if fate in (Fate.MOVE, Fate.DEAD_LETTER):
            self._move(job, fate)
            return
        if not job.thread:
            self._begin(job)
        elif self._thread_free():
            self._take_thread(job)
        else:
            self._pool_queue.append(job)  # a thread takes it when one frees, cut off or not

    def _take_thread(self, job: Job) -> None:
        self._threads_busy += 1
        if self._handoff:
            self._process.later(self._handoff, lambda: self._in_thread(job))
        else:
            self._in_thread(job)

    def _in_thread(self, job: Job) -> None:
        """The thread runs: it begins the handler only if the runners are not paused (a pause
        seen, as ``Runners`` sees one by its watchdog's tick), the lease still consumes and the
        broker answered its connection recently."""
        if self.paused or not job.lease.core.may_start() or not self._heard(job.lease.connection):
            self._not_begun(job)
            return
        self._begin(job)

    def _not_begun(self, job: Job) -> None:
        self._running -= 1
        lease = job.lease
        lease.core.dropped(job)
        if lease.core.may_start():
            self._ready.append(job)  # paused: it begins once the session is confirmed
        self._thread_returned()
        self._after_job(lease)
        self.pump()

    def _move(self, job: Job, fate: Fate) -> None:
        """Move a message to its parking queue, or dead-letter a parked one; then acknowledge."""
        assert self._parking is not None
        lease = job.lease

        def done(ok: bool) -> None:
            self._running -= 1
            if ok and lease.core.may_start() and self._ack(job):
                self._ready.extend(lease.core.finished(job))
            else:
                lease.core.dropped(job)
                if lease.core.may_start():
                    self._process.later(RETRY_DELAY, lambda: self._again(job))
            self._after_job(lease)
            self.pump()

        mover = self._parking.move if fate is Fate.MOVE else self._parking.dead_letter
        mover(job, done)

    def _again(self, job: Job) -> None:
        if job.lease.core.may_start() and self.leases.get(job.lease.number) is job.lease:
            self._ready.append(job)
            self.pump()

    def _ack(self, job: Job) -> bool:
        """Acknowledge ``job``: a parked message singly on its parking channel, a bucket
        message with the bucket channel's next batch. False if its channel is gone."""
        lease = job.lease
        if job.from_parking:
            return self._parking is not None and self._parking.ack(job)
        if lease.closed or not lease.connection.client_open:
            return False
        if lease.window.complete(job.tag):
            self.send_acks(lease)
        elif not lease.ack_timer:
            lease.ack_timer = True
            self._process.later(ACK_DELAY, lambda: self.send_acks(lease))
        return True

    def _failed(self, job: Job) -> None:
        """Its handler raised: again after a delay (its key waits), or, its attempts spent,
        its key is parked."""
        lease = job.lease
        self._end(job, completed=False, failed=True)
        if job.attempt >= MAX_ATTEMPTS:
            lease.core.park(job, "handler failed", self._world.now)
            return
        job.attempt += 1
        lease.core.dropped(job)
        self._process.later(RETRY_DELAY, lambda: self._again(job))

    def _begin(self, job: Job) -> None:
        lease = job.lease
        job.execution = self._invariants.start(
            self._worker_id, job.msg.key, job.msg.seq, lease.bucket, lease.epoch, self._world.now
        )
        self._process.later(job.duration, lambda: self._returned(job))

    def _thread_returned(self) -> None:
        self._threads_busy -= 1
        if self._pool_queue:
            self._take_thread(self._pool_queue.popleft())

    def _returned(self, job: Job) -> None:
        """The handler returned (a thread told to stop returns only now)."""
        if job.cut and not job.thread:
            return  # stopped when it was cut off
        if job.thread:
            self._thread_returned()
        self._running -= 1
        lease = job.lease
        usable = lease.core.may_start() and not lease.closed and lease.connection.client_open
        if job.cut or not usable:
            lease.core.dropped(job)
            self._end(job, completed=True)  # its work was done, but it goes back to the queue
        elif self._parking is not None and self._parking.fails(job.key):
            self._failed(job)
        else:
            self._end(job, completed=True)
            if self._ack(job):
                self._ready.extend(lease.core.finished(job))
            else:
                lease.core.dropped(job)
        self._after_job(lease)
        self.pump()

    def _end(self, job: Job, completed: bool, failed: bool = False) -> None:
        if job.execution is not None and job.execution.running:
            self._invariants.end(job.execution, completed, failed)

    def _after_job(self, lease: SimLease) -> None:
        if lease.core.idle and lease.on_idle:
            self._fire(lease)
        if lease.core.settled and lease.settle_watched:
            lease.settle_watched = False
            self.leases.pop(lease.number, None)
            self._post(ev.Settled(lease.number))

    def send_acks(self, lease: SimLease) -> None:
        lease.ack_timer = False
        if lease.closed or not lease.connection.client_open:
            return
        upto, singles = lease.window.take()
        if upto:
            lease.connection.ack(lease.channel, upto, True)
        for tag in singles:
            lease.connection.ack(lease.channel, tag, False)
        if lease.window.pending and not lease.ack_timer:
            lease.ack_timer = True
            self._process.later(ACK_DELAY, lambda: self.send_acks(lease))

    # ------------------------------------------------------------ ending leases
    def drain(self, number: int, within: float) -> None:
        lease = self.leases.get(number)
        if lease is None:
            self._process.later(0, lambda: self._post(ev.Closed(number)))
            return
        lease.core.drain()
        lease.connection.cancel(lease.channel, lambda _: None)
        finished = [False]

        def close() -> None:
            if not finished[0]:
                finished[0] = True
                self.close(number)

        if lease.core.idle:
            close()
            return
        lease.on_idle.append(close)
        self._process.later(within, close)

    def _fire(self, lease: SimLease) -> None:
        callbacks, lease.on_idle = lease.on_idle, []
        for callback in callbacks:
            callback()

    def close(self, number: int) -> None:
        """``BucketLease.close``: stop running handlers, flush acknowledgements, close the
        channel; then ``Closed`` (when the broker answered, or the connection is gone)."""
        lease = self.leases.get(number)
        if lease is None:
            self._process.later(0, lambda: self._post(ev.Closed(number)))
            return
        if self._parking is not None:
            self._parking.close_lease(lease)
        for job in lease.core.close():
            job.cut = True
            if not job.thread:
                self._running -= 1
                lease.core.dropped(job)
                self._end(job, completed=False)
        self.pump()
        self.send_acks(lease)
        lease.closed = True

        answered = [False]

        def closed(confirmed: bool = False) -> None:
            if answered[0]:
                return
            answered[0] = True
            running = lease.core.running
            if running:
                lease.settle_watched = True
            else:
                self.leases.pop(number, None)
            self._post(ev.Closed(number, running, confirmed))

        if lease.connection.client_open:
            lease.awaiting_close.append(closed)
            lease.connection.close_channel(
                lease.channel, self._process.bound(lambda error: closed(confirmed=not error))
            )
        else:
            self._process.later(0, closed)
