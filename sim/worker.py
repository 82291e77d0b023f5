"""A simulated worker: the production ``WorkerMachine`` and ``LeaseCore`` on virtual time,
with edges that do what ``hashq.worker`` and ``hashq.bucket`` do against the server models.

Handlers take a duration drawn from the seed; a "thread" handler cannot be stopped (it runs on
after its lease is cut off), an async one stops when told. Acknowledgements go out in batches
through the production ``AckWindow``.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hashq.acks import ACK_DELAY, AckWindow
from hashq.machines import events as ev
from hashq.machines.lease import LeaseCore
from hashq.machines.states import WorkerState
from hashq.machines.worker import WorkerMachine
from hashq.protocol import Assignment, Paths, Registration, Release, worker_connection_name
from sim.invariants import Checker, Execution
from sim.process import Process
from sim.rabbit import Broker, Connection, Msg
from sim.world import Violation, World
from sim.zoo import ConnectionLoss, NodeExists, NoNode, SessionExpired, ZkClient, ZkError, ZooKeeper

PATHS = Paths("sim")
ACK_FLUSH_WITHIN = 1.0


@dataclass(frozen=True)
class WorkerConfig:
    drain_timeout: float = 5.0
    session_timeout: float = 4.0
    prefetch: int = 8
    concurrency: int = 4
    capacity: int = 1
    withdraw_after: float = 0.0  # 0: the session timeout (HASHQ_WITHDRAW_AFTER unset)


@dataclass(eq=False)
class Job:
    lease: SimLease
    tag: int
    msg: Msg
    thread: bool
    duration: float
    execution: Execution | None = None
    cut: bool = False

    @property
    def key(self) -> str:
        return self.msg.key


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


class SimWorker(Process):
    def __init__(
        self,
        world: World,
        worker_id: str,
        broker: Broker,
        zk: ZooKeeper,
        checker: Checker,
        config: WorkerConfig,
        handler_time: Callable[[], tuple[float, bool]],
    ) -> None:
        super().__init__(world, worker_id)
        self.worker_id = worker_id
        self.broker, self.zk, self.checker, self.config = broker, zk, checker, config
        self._handler_time = handler_time
        self.machine = WorkerMachine(
            worker_id,
            broker.buckets,
            config.drain_timeout,
            stop_within=config.session_timeout,
            withdraw_after=config.withdraw_after or config.session_timeout,
        )
        self.client = ZkClient(zk, self.zk_link, config.session_timeout, self.bound(self._zk_state))
        self.connection: Connection | None = None
        self.leases: dict[int, SimLease] = {}  # by machine lease number
        self._channels = itertools.count(1)
        self._connection_numbers = itertools.count(1)
        self._ready: deque[Job] = deque()
        self._running = 0
        self._paused = False
        self._timer_at: float | None = None
        self.stopped = False
        self.told_to_stop = False
        self.on_drain: Callable[[], None] | None = None  # a fault armed for the next drain
        self.on_confirm: Callable[[], None] | None = None  # ... for the next session check
        self.on_reconnect: Callable[[], None] | None = None  # ... for the next reconnection
        self.on_link_up: Callable[[], None] | None = None  # ... for when it has been announced
        self.was_fenced = False  # a connection of it was closed through the management API

    # ------------------------------------------------------------ life
    def start(self) -> None:
        self.client.watch(PATHS.assignment(self.worker_id), self.bound(self._read_assignment))
        self.client.start()
        self.post(ev.Tick())

    def stop(self) -> None:
        self.told_to_stop = True
        self.run(lambda: self.post(ev.Stop()))

    def kill(self) -> None:
        super().kill()
        self.client.crash()
        if self.connection is not None:
            self.broker.close_connection(self.connection, "connection reset")  # the OS closes it
        for lease in self.leases.values():
            for job in list(lease.core.close()):
                self._end(job, completed=False)

    def resumed(self, paused: float) -> None:
        if paused > max(0.5, self.config.session_timeout / 4):
            self._paused = True  # the runners check a fresh tick before starting anything
            self.post(ev.PauseSeen(paused))

    # ------------------------------------------------------------ the machine
    def post(self, event: ev.Event) -> None:
        if not self.alive or self.stopped:
            return
        for action in self.machine.handle(event, self.world.now):
            self._do(action)
        if self.machine.state is WorkerState.STOPPED:
            self._finish()
            return
        wake = self.machine.wake_at
        if wake is not None and (self._timer_at is None or wake < self._timer_at):
            self._timer_at = wake
            self.later(wake - self.world.now, self._tick)

    def _tick(self) -> None:
        self._timer_at = None
        self.post(ev.Tick())

    def _do(self, action: ev.Action) -> None:
        if isinstance(action, ev.BeginIncarnation):
            self._begin()
        elif isinstance(action, ev.Reconnect):
            self._reconnect(action.number)
        elif isinstance(action, ev.DropConnection):
            self._drop_connection()
        elif isinstance(action, ev.PauseRunners):
            self._paused = True
        elif isinstance(action, ev.ResumeRunners):
            self._paused = False
            self._pump()
        elif isinstance(action, ev.ConfirmSession):
            self._confirm(action.asked)
        elif isinstance(action, ev.Subscribe):
            self._subscribe(action)
        elif isinstance(action, ev.Drain):
            self._drain(action.lease, action.within)
            if self.on_drain is not None:
                armed, self.on_drain = self.on_drain, None
                armed()
        elif isinstance(action, ev.CutOff):
            self._close(action.lease)
        elif isinstance(action, ev.WriteRelease):
            self._write_release(action)
        elif isinstance(action, ev.Withdraw):
            self._drop_connection()
            self._deregister()
        elif isinstance(action, ev.Deregister):
            self._deregister()

    # ------------------------------------------------------------ ZooKeeper
    def _zk_state(self, state: str) -> None:
        session = {"connected": ev.Session.CONNECTED, "suspended": ev.Session.SUSPENDED}
        self.post(ev.SessionChanged(session.get(state, ev.Session.LOST)))

    def _read_assignment(self) -> None:
        def take(answer: Any) -> None:
            if isinstance(answer, NoNode):
                self.post(ev.AssignmentRead(-1, None))
            elif not isinstance(answer, ZkError):
                data, stat = answer
                self.post(ev.AssignmentRead(stat.mzxid, Assignment.decode(data)))

        self.client.call(lambda zk, _: zk.get(PATHS.assignment(self.worker_id)), self.bound(take))

    def _registration(self, incarnation: str, connection: str) -> Registration:
        return Registration(
            worker_id=self.worker_id,
            incarnation=incarnation,
            capacity=self.config.capacity,
            connection=connection,
            drain_timeout=self.config.drain_timeout,
        )

    def _begin(self) -> None:
        """Open connection 1 of a new incarnation, hold its liveness queue, then register."""
        self._drop_connection()
        incarnation = f"{self.worker_id}i{self.world.unique()}"
        name = worker_connection_name(self.worker_id, incarnation)

        def registered(answer: Any) -> None:
            if isinstance(answer, ZkError):
                self._drop_connection()
                self.post(ev.RegisterFailed(type(answer).__name__))
            else:
                self._link_up(ev.Registered(incarnation, connection))

        def opened(error: str) -> None:
            if error:
                self._drop_connection()
                self.post(ev.RegisterFailed(error))
                return
            data = self._registration(incarnation, name).encode()
            self.client.call(
                lambda zk, session: _register(zk, session, self.worker_id, data),
                self.bound(registered),
            )

        connection = self._open(name, incarnation, opened)

    def _open(self, name: str, incarnation: str, done: Callable[[str], None]) -> int:
        """Open a connection and take the liveness queue on it; returns its number."""
        client = _Client(self, next(self._connection_numbers))
        connection = self.broker.connect(name, client, self.amqp_link)
        client.connection = connection
        if connection is None:
            self.later(0.01, lambda: done("connection refused"))
            return client.number
        self.connection = connection
        liveness = f"alive.{self.worker_id}.{incarnation}"
        connection.declare_exclusive(liveness, self.bound(done))
        return client.number

    def _reconnect(self, number: int) -> None:
        if self.on_reconnect is not None:
            armed, self.on_reconnect = self.on_reconnect, None
            armed()
        self._drop_connection()
        incarnation = self.machine.incarnation
        name = worker_connection_name(self.worker_id, incarnation, number)

        def announced(answer: Any) -> None:
            if isinstance(answer, ZkError):
                gone = not isinstance(answer, ConnectionLoss)
                self._drop_connection()
                self.post(ev.LinkFailed(type(answer).__name__, registration_gone=gone))
                return
            self._read_assignment_then(lambda: self._link_up(ev.LinkUp(connection)))

        def opened(error: str) -> None:
            if error:
                self._drop_connection()
                self.post(ev.LinkFailed(error))
                return
            data = self._registration(incarnation, name).encode()
            self.client.call(
                lambda zk, session: _announce(zk, session, self.worker_id, incarnation, data),
                self.bound(announced),
            )

        # The runtime's number of the connection (events name it), not ``number`` (its name's).
        connection = self._open(name, incarnation, opened)

    def _link_up(self, announced: ev.Registered | ev.LinkUp) -> None:
        """A new connection is announced (by the first registration of an incarnation, or by
        rewriting it): the machine is told, then a fault armed for this moment strikes."""
        self.post(announced)
        if self.on_link_up is not None:
            armed, self.on_link_up = self.on_link_up, None
            armed()

    def _read_assignment_then(self, then: Callable[[], None]) -> None:
        def take(answer: Any) -> None:
            if isinstance(answer, NoNode):
                self.post(ev.AssignmentRead(-1, None))
            elif isinstance(answer, ZkError):
                self._drop_connection()
                self.post(ev.LinkFailed(type(answer).__name__))
                return
            else:
                data, stat = answer
                self.post(ev.AssignmentRead(stat.mzxid, Assignment.decode(data)))
            then()

        self.client.call(lambda zk, _: zk.get(PATHS.assignment(self.worker_id)), self.bound(take))

    def _confirm(self, asked: int) -> None:
        incarnation = self.machine.incarnation

        def verdict(answer: Any) -> None:
            if isinstance(answer, NoNode | SessionExpired):
                found = ev.Session.LOST
            elif isinstance(answer, ZkError):
                found = ev.Session.SUSPENDED
            else:
                data, stat = answer
                ours = stat.owner == self.client.session
                current = Registration.decode(data).incarnation == incarnation
                found = ev.Session.CONNECTED if ours and current else ev.Session.LOST
            self.post(ev.SessionConfirmed(asked, found))

        def arrived(answer: Any) -> None:
            # The answer is queued for the loop; a process stopped right then takes it only
            # after it resumes (an armed fault does exactly that).
            if self.on_confirm is not None:
                armed, self.on_confirm = self.on_confirm, None
                armed()
            self.run(lambda: verdict(answer))

        self.client.call(lambda zk, _: zk.get(PATHS.worker(self.worker_id)), arrived)

    def _write_release(self, action: ev.WriteRelease) -> None:
        release = Release(self.worker_id, action.incarnation, action.bucket, action.epoch).encode()
        path = PATHS.release(action.bucket, action.epoch)

        def written(answer: Any) -> None:
            ok = not isinstance(answer, ZkError) or isinstance(answer, NodeExists)
            self.post(ev.ReleaseWritten(action.lease, ok, "" if ok else type(answer).__name__))

        self.client.call(lambda zk, _: zk.create(path, release), self.bound(written))

    def _deregister(self) -> None:
        self.client.call(lambda zk, _: zk.delete(PATHS.worker(self.worker_id)), lambda _: None)

    def _finish(self) -> None:
        if not self.told_to_stop:
            raise Violation(f"worker {self.name} ended without being told to stop")
        self.stopped = True
        self.client.close()
        self._drop_connection()
        self.kill()

    # ------------------------------------------------------------ AMQP
    def _drop_connection(self) -> None:
        if self.connection is not None:
            connection, self.connection = self.connection, None
            connection.close()
            self._connection_gone(connection)

    def connection_closed(self, connection: Connection, number: int) -> None:
        if connection is self.connection:
            self.connection = None
            self._connection_gone(connection)
        self.post(ev.LinkLost(number))

    def _connection_gone(self, connection: Connection) -> None:
        for lease in list(self.leases.values()):
            if lease.connection is connection:
                self._fire(lease)
                waiting, lease.awaiting_close = lease.awaiting_close, []
                for closed in waiting:
                    closed()

    def _subscribe(self, action: ev.Subscribe) -> None:
        connection = self.connection
        if connection is None:
            self.later(0, lambda: self.post(ev.Subscribed(action.lease, False, "no connection")))
            return
        lease = SimLease(
            action.lease,
            action.bucket,
            action.epoch,
            next(self._channels),
            connection,
            AckWindow(max(1, self.config.prefetch // 2)),
        )
        self.leases[action.lease] = lease

        def done(error: str) -> None:
            self.post(ev.Subscribed(action.lease, not error, error))

        queue = self.broker.bucket_queue(action.bucket)
        connection.consume(
            lease.channel, queue, self.config.prefetch, self.bound(done), action.epoch
        )

    def delivered(self, connection: Connection, channel: int, tag: int, msg: Msg) -> None:
        lease = self._lease_on(connection, channel)
        if lease is None:
            return
        duration, thread = self._handler_time()
        for job in lease.core.deliver(tag, Job(lease, tag, msg, thread, duration)):
            self._ready.append(job)
        self._pump()

    def channel_lost(
        self, connection: Connection, channel: int, reason: str, timeout: bool
    ) -> None:
        lease = self._lease_on(connection, channel)
        if lease is not None:
            lease.closed = True
            self.post(ev.ChannelLost(lease.number, reason, timeout))

    def _lease_on(self, connection: Connection, channel: int) -> SimLease | None:
        for lease in self.leases.values():
            if lease.connection is connection and lease.channel == channel:
                return lease
        return None

    # ------------------------------------------------------------ running jobs
    def _pump(self) -> None:
        while self._ready and not self._paused and self._running < self.config.concurrency:
            job = self._ready.popleft()
            if job.lease.core.may_start() and self.leases.get(job.lease.number) is job.lease:
                self._execute(job)

    def _execute(self, job: Job) -> None:
        lease = job.lease
        lease.core.started(job)
        self._running += 1
        job.execution = self.checker.start(
            self.worker_id, job.msg.key, job.msg.seq, lease.bucket, lease.epoch, self.world.now
        )
        self.later(job.duration, lambda: self._returned(job))

    def _returned(self, job: Job) -> None:
        """The handler returned (a thread told to stop returns only now)."""
        if job.cut and not job.thread:
            return  # stopped when it was cut off
        self._running -= 1
        lease = job.lease
        usable = lease.core.may_start() and not lease.closed and lease.connection.client_open
        if job.cut or not usable:
            lease.core.dropped(job)
            self._end(job, completed=True)  # its work was done, but it goes back to the queue
        else:
            self._end(job, completed=True)
            if lease.window.complete(job.tag):
                self._send_acks(lease)
            elif not lease.ack_timer:
                lease.ack_timer = True
                self.later(ACK_DELAY, lambda: self._send_acks(lease))
            following = lease.core.finished(job)
            if following is not None:
                self._ready.append(following)
        self._after_job(lease)
        self._pump()

    def _end(self, job: Job, completed: bool) -> None:
        if job.execution is not None and job.execution.running:
            self.checker.end(job.execution, completed)

    def _after_job(self, lease: SimLease) -> None:
        if lease.core.idle and lease.on_idle:
            self._fire(lease)
        if lease.core.settled and lease.settle_watched:
            lease.settle_watched = False
            self.leases.pop(lease.number, None)
            self.post(ev.Settled(lease.number))

    def _send_acks(self, lease: SimLease) -> None:
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
            self.later(ACK_DELAY, lambda: self._send_acks(lease))

    # ------------------------------------------------------------ ending leases
    def _drain(self, number: int, within: float) -> None:
        lease = self.leases.get(number)
        if lease is None:
            self.later(0, lambda: self.post(ev.Closed(number)))
            return
        lease.core.drain()
        lease.connection.cancel(lease.channel, lambda _: None)
        finished = [False]

        def close() -> None:
            if not finished[0]:
                finished[0] = True
                self._close(number)

        if lease.core.idle:
            close()
            return
        lease.on_idle.append(close)
        self.later(within, close)

    def _fire(self, lease: SimLease) -> None:
        callbacks, lease.on_idle = lease.on_idle, []
        for callback in callbacks:
            callback()

    def _close(self, number: int) -> None:
        """``BucketLease.close``: stop running handlers, flush acknowledgements, close the
        channel; then ``Closed`` (when the broker answered, or the connection is gone)."""
        lease = self.leases.get(number)
        if lease is None:
            self.later(0, lambda: self.post(ev.Closed(number)))
            return
        for job in lease.core.close():
            job.cut = True
            if not job.thread:
                self._running -= 1
                lease.core.dropped(job)
                self._end(job, completed=False)
        self._pump()
        self._send_acks(lease)
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
            self.post(ev.Closed(number, running, confirmed))

        if lease.connection.client_open:
            lease.awaiting_close.append(closed)
            lease.connection.close_channel(
                lease.channel, self.bound(lambda error: closed(confirmed=not error))
            )
        else:
            self.later(0, closed)


class _Client:
    """The broker's calls into the worker, each run inside its process."""

    def __init__(self, worker: SimWorker, number: int) -> None:
        self._worker = worker
        self.number = number
        self.connection: Connection | None = None

    def delivered(self, channel: int, tag: int, msg: Msg, redelivered: bool) -> None:
        self._worker.run(lambda: self._worker.delivered(self._conn(), channel, tag, msg))

    def channel_closed(self, channel: int, reason: str) -> None:
        timeout = "timed out" in reason
        self._worker.run(lambda: self._worker.channel_lost(self._conn(), channel, reason, timeout))

    def consumer_cancelled(self, channel: int) -> None:
        self._worker.run(
            lambda: self._worker.channel_lost(self._conn(), channel, "consumer cancelled", False)
        )

    def connection_closed(self, reason: str) -> None:
        if "fenced" in reason:
            self._worker.was_fenced = True
        self._worker.run(lambda: self._worker.connection_closed(self._conn(), self.number))

    def _conn(self) -> Connection:
        assert self.connection is not None
        return self.connection


def _register(zk: ZooKeeper, session: int, worker_id: str, data: bytes) -> None:
    """``Membership._create_registration``: create the ephemeral registration, or take over
    one of this session."""
    path = PATHS.worker(worker_id)
    try:
        zk.create(path, data, session)
    except NodeExists:
        _, stat = zk.get(path)
        if stat.owner != session:
            raise
        zk.set(path, data)


def _announce(zk: ZooKeeper, session: int, worker_id: str, incarnation: str, data: bytes) -> None:
    """``Membership._replace_registration``: a checked set of our own registration."""
    path = PATHS.worker(worker_id)
    current, stat = zk.get(path)
    if stat.owner != session or Registration.decode(current).incarnation != incarnation:
        raise NoNode(path)
    zk.set(path, data, stat.version)
