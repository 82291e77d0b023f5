"""A simulated worker: the production ``WorkerMachine`` and ``LeaseCore`` on virtual time,
with edges that do what ``hashq.worker.runtime`` and ``hashq.worker.bucket_lease`` do against the
server models.

This module is the process: starting, stopping and dying, the machine's actions, ZooKeeper
(registering, announcing a new connection, session checks, releases) and the AMQP connection.
Its bucket leases and the jobs delivered on them are ``tools.sim.leases``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hashq.records import (
    BROKER_CONTACT_SECONDS,
    QUEUE_ANSWER_WITHIN,
    Assignment,
    Paths,
    Registration,
    Release,
    worker_connection_names,
)
from hashq.worker.machine import events as ev
from hashq.worker.machine.contact import RENEW_SECONDS, BrokerContact
from hashq.worker.machine.core import WorkerMachine
from hashq.worker.machine.states import WorkerState
from tools.sim.invariants import Invariants
from tools.sim.leases import LeaseRunner
from tools.sim.markers import SimMarkers
from tools.sim.parking import Poisoning, SimParking
from tools.sim.process import Process
from tools.sim.rabbit import Broker, Connection, Msg
from tools.sim.world import Violation, World
from tools.sim.zoo import (
    ConnectionLoss,
    NodeExists,
    NoNode,
    SessionExpired,
    ZkClient,
    ZkError,
    ZooKeeper,
)

PATHS = Paths("sim")
ACK_FLUSH_WITHIN = 1.0


DRAIN_TIMEOUTS = (1.0, 3.0, 6.0)  # drawn for workers and coordinators
WITHDRAW_DELAYS = (0.0, 12.0)  # 0: the session timeout


@dataclass(frozen=True)
class WorkerConfig:
    drain_timeout: float = 5.0
    session_timeout: float = 4.0
    prefetch: int = 8
    concurrency: int = 4
    capacity: int = 1
    withdraw_after: float = 0.0  # 0: the worker's session timeout (the first rule)
    threads: int = 0  # the pool of plain handlers' threads (0: one per runner)
    thread_handoff: float = 0.0  # from a runner giving a thread its job to the thread running
    hot_after: int = 0  # messages of one key in hand from which it steps aside (0: never)


class SimWorker(Process):
    def __init__(
        self,
        world: World,
        worker_id: str,
        broker: Broker,
        zk: ZooKeeper,
        invariants: Invariants,
        config: WorkerConfig,
        handler_time: Callable[[], tuple[float, bool]],
        poisoning: Poisoning | None = None,
    ) -> None:
        """``poisoning``: the keys whose handler fails now (None: no key ever does, and the
        worker does not park keys)."""
        super().__init__(world, worker_id)
        self.worker_id = worker_id
        self.broker, self.zk, self.invariants, self.config = broker, zk, invariants, config
        self.machine = WorkerMachine(
            worker_id,
            broker.initial_buckets,  # then the count its assignments name (a resize)
            config.drain_timeout,
            stop_within=config.session_timeout,
            withdraw_after=config.withdraw_after or config.session_timeout,
            prove_returns=True,  # the simulated bucket queues are quorum queues
        )
        self.client = ZkClient(zk, self.zk_link, config.session_timeout, self.bound(self._zk_state))
        parking = SimParking(self, self.client, PATHS, poisoning) if poisoning else None
        self.connection: Connection | None = None
        self.contacts: dict[Connection, BrokerContact] = {}  # of its open connections
        self.runner = LeaseRunner(
            self,
            self.post,
            broker,
            invariants,
            config.prefetch,
            config.concurrency,
            handler_time,
            config.threads,
            config.thread_handoff,
            heard=self._heard,
            parking=parking,
            hot_after=config.hot_after,
            markers=SimMarkers(self, self.client, PATHS.resize),
        )
        self._connection_numbers = itertools.count(1)
        self._names: Iterator[str] = iter(())  # the incarnation's connection names
        self.refusing = 0  # nodes that refuse its next connect after the handshake (a fault)
        self._timer_at: float | None = None
        self.stopped = False
        self.told_to_stop = False
        self.on_drain: Callable[[], None] | None = None  # a fault armed for the next drain
        self.on_confirm: Callable[[], None] | None = None  # ... for the next session check
        self.on_reconnect: Callable[[], None] | None = None  # ... for the next reconnection
        self.on_link_up: Callable[[], None] | None = None  # ... for when it has been announced
        self._seen = ""  # the incarnation its registration node last named
        self.was_fenced = False  # a connection of it was closed through the management API

    # ------------------------------------------------------------ life
    def start(self) -> None:
        self.client.watch(PATHS.assignment(self.worker_id), self.bound(self._read_assignment))
        self.client.watch(PATHS.worker(self.worker_id), self.bound(self._read_registration))
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
        self.runner.abandon()

    def resumed(self, paused: float) -> None:
        if paused > max(0.5, self.config.session_timeout / 4):
            self.runner.paused = True  # the runners check a fresh tick before starting anything
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
            self._reconnect()
        elif isinstance(action, ev.DropConnection):
            self._drop_connection()
        elif isinstance(action, ev.PauseRunners):
            self.runner.paused = True
        elif isinstance(action, ev.ResumeRunners):
            self.runner.resume()
        elif isinstance(action, ev.ConfirmSession):
            self._confirm(action.asked)
        elif isinstance(action, ev.Subscribe):
            self.runner.subscribe(action, self.connection)
        elif isinstance(action, ev.AskQueue):
            self._ask_queue(action)
        elif isinstance(action, ev.Drain):
            self.runner.drain(action.lease, action.within)
            if self.on_drain is not None:
                armed, self.on_drain = self.on_drain, None
                armed()
        elif isinstance(action, ev.CutOff):
            self.runner.close(action.lease)
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

    def _read_registration(self) -> None:
        """``Membership._on_registration``: a deletion of the node after it named an
        incarnation is told to the machine."""

        def take(answer: Any) -> None:
            if isinstance(answer, NoNode) and self._seen:
                deleted, self._seen = self._seen, ""
                self.post(ev.RegistrationDeleted(deleted))
            elif not isinstance(answer, ZkError):
                self._seen = Registration.decode(answer[0]).incarnation

        self.client.call(lambda zk, _: zk.get(PATHS.worker(self.worker_id)), self.bound(take))

    def _registration(self, incarnation: str, connection: str) -> Registration:
        return Registration(
            worker_id=self.worker_id,
            incarnation=incarnation,
            capacity=self.config.capacity,
            connection=connection,
            drain_timeout=self.config.drain_timeout,
            session_timeout=self.config.session_timeout,
            contact_seconds=BROKER_CONTACT_SECONDS,
        )

    def _begin(self) -> None:
        """Open connection 1 of a new incarnation, hold its liveness queue, then register."""
        self._drop_connection()
        incarnation = f"{self.worker_id}i{self.world.unique()}"
        self._names = worker_connection_names(self.worker_id, incarnation)

        def registered(answer: Any) -> None:
            if isinstance(answer, ZkError):
                self._drop_connection()
                self.post(ev.RegisterFailed(type(answer).__name__))
            else:
                self._link_up(ev.Registered(incarnation, connection))

        def register(zk: ZooKeeper, session: int, data: bytes) -> None:
            _register(zk, session, self.worker_id, data)

        connection = self._open_and_write(incarnation, ev.RegisterFailed, register, registered)

    def _open_and_write(
        self,
        incarnation: str,
        failed: Callable[[str], ev.Event],
        write: Callable[[ZooKeeper, int, bytes], None],
        written: Callable[[Any], None],
    ) -> int:
        """Open a connection (``_open``), then write the registration that names it with
        ``write`` and pass ZooKeeper's answer to ``written``; a connection that did not open is
        dropped and posted as ``failed``. Returns the connection's number."""

        def opened(error: str, name: str) -> None:
            if error:
                self._drop_connection()
                self.post(failed(error))
                return
            data = self._registration(incarnation, name).encode()
            self.client.call(lambda zk, session: write(zk, session, data), self.bound(written))

        return self._open(incarnation, opened)

    def _open(self, incarnation: str, done: Callable[[str, str], None]) -> int:
        """Open a connection and take the liveness queue on it, then ``done(error, name)``;
        returns its number."""
        client = _Client(self, next(self._connection_numbers))
        connection = self._connect_named(client)
        client.connection = connection
        if connection is None:
            self.later(0.01, lambda: done("connection refused", ""))
            return client.number
        self.connection = connection
        self._keep_contact(connection, BrokerContact())
        liveness = f"alive.{self.worker_id}.{incarnation}"
        connection.declare_exclusive(liveness, self.bound(lambda e: done(e, connection.name)))
        return client.number

    def _connect_named(self, client: _Client) -> Connection | None:
        """``hashq._io.amqp.connect_named``: each attempt under the incarnation's next name. A
        node that refuses an attempt after its handshake began (``refusing``, the fault
        refused-reconnect) reports a connection of that name closed; the next node is tried."""
        while self.refusing > 0:
            self.refusing -= 1
            attempt = self.broker.connect(next(self._names), _Refused(), self.amqp_link)
            if attempt is not None:
                self.broker.close_connection(attempt, "NOT_ALLOWED - vhost not found")
        return self.broker.connect(next(self._names), client, self.amqp_link)

    def _keep_contact(self, connection: Connection, contact: BrokerContact) -> None:
        """``hashq.worker.contact.ContactKeeper``: one round trip at a time while the client's
        end is open, the next ``RENEW_SECONDS`` after the previous was sent or at its answer if
        that came later (none while the process is frozen)."""
        if not connection.client_open:
            self.contacts.pop(connection, None)
            return
        self.contacts[connection] = contact
        sent = self.world.now

        def answered(error: str) -> None:
            if error:
                self.contacts.pop(connection, None)
                return
            contact.answered(sent)
            self.runner.pump()
            wait = max(0.0, sent + RENEW_SECONDS - self.world.now)
            self.later(wait, lambda: self._keep_contact(connection, contact))

        connection.ping(self.bound(answered))

    def _heard(self, connection: Connection) -> bool:
        contact = self.contacts.get(connection)
        return contact is not None and contact.fresh(self.world.now)

    def _reconnect(self) -> None:
        if self.on_reconnect is not None:
            armed, self.on_reconnect = self.on_reconnect, None
            armed()
        self._drop_connection()
        incarnation = self.machine.incarnation

        def announced(answer: Any) -> None:
            if isinstance(answer, ZkError):
                gone = not isinstance(answer, ConnectionLoss)
                self._drop_connection()
                self.post(ev.LinkFailed(type(answer).__name__, registration_gone=gone))
                return
            self._read_assignment_then(lambda: self._link_up(ev.LinkUp(connection)))

        def announce(zk: ZooKeeper, session: int, data: bytes) -> None:
            _announce(zk, session, self.worker_id, incarnation, data)

        # The runtime's number of the connection (events name it).
        connection = self._open_and_write(incarnation, ev.LinkFailed, announce, announced)

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

    def _ask_queue(self, action: ev.AskQueue) -> None:
        told = [False]  # the answer, or no answer once ``ask_queue`` would have given up

        def answered(answer: tuple[int, int] | None) -> None:
            if not told[0]:
                told[0] = True
                self.post(ev.QueueAnswered(action.lease, answer))

        self.later(QUEUE_ANSWER_WITHIN, lambda: answered(None))

        connection = self.connection
        if connection is None:
            self.later(0, lambda: answered(None))
        else:
            connection.stat(self.broker.bucket_queue(action.bucket), self.bound(answered))

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
            self.runner.connection_gone(connection)

    def connection_closed(self, connection: Connection, number: int) -> None:
        if connection is self.connection:
            self.connection = None
            self.runner.connection_gone(connection)
        self.post(ev.LinkLost(number))


class _Refused:
    """The client of an attempt the node refused: the worker never used it."""

    def delivered(self, channel: int, tag: int, msg: Msg, redelivered: bool) -> None:
        pass

    def channel_closed(self, channel: int, reason: str) -> None:
        pass

    def consumer_cancelled(self, channel: int) -> None:
        pass

    def connection_closed(self, reason: str) -> None:
        pass


class _Client:
    """The broker's calls into the worker, each run inside its process."""

    def __init__(self, worker: SimWorker, number: int) -> None:
        self._worker = worker
        self._runner = worker.runner  # its leases, which deliveries and lost channels concern
        self.number = number
        self.connection: Connection | None = None

    def delivered(self, channel: int, tag: int, msg: Msg, redelivered: bool) -> None:
        self._worker.run(lambda: self._runner.delivered(self._conn(), channel, tag, msg))

    def channel_closed(self, channel: int, reason: str) -> None:
        timeout = "timed out" in reason
        self._worker.run(lambda: self._runner.channel_lost(self._conn(), channel, reason, timeout))

    def consumer_cancelled(self, channel: int) -> None:
        self._worker.run(
            lambda: self._runner.channel_lost(self._conn(), channel, "consumer cancelled", False)
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
