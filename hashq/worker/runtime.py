"""The worker runtime: asyncio, aio-pika and kazoo around ``WorkerMachine``.

The loop takes one event at a time (from ZooKeeper's callbacks, the AMQP connection and
channels, the tasks it started, its watchdog, a timer), hands it to the machine, and carries
out the actions the machine returns. Every decision (what to consume, when to drain, release,
reconnect, register again or withdraw) is the machine's; the simulator (``tools/sim/``) runs the
same machine on virtual time. Each action is documented on it (``hashq.worker.machine.events``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Iterator

from aio_pika.abc import AbstractConnection

from hashq._io.amqp import ask_queue, close_quietly, connect_named, connection_usable
from hashq._io.health import health_endpoints
from hashq.errors import ConfigError, RegistrationGone, ServiceUnavailable
from hashq.message import Handler
from hashq.provision import ensure_topology
from hashq.records import Paths, worker_connection_names
from hashq.routing import App
from hashq.settings import WorkerSettings, default_worker_id
from hashq.topology import Topology
from hashq.worker.bucket_lease import BucketLease, LeaseState
from hashq.worker.contact import ContactKeeper
from hashq.worker.dead_letter import DeadLetters
from hashq.worker.machine import events as ev
from hashq.worker.machine.core import WorkerMachine
from hashq.worker.machine.states import WorkerState
from hashq.worker.metrics import WorkerMetrics
from hashq.worker.parking import Mover, ParkedRecords, ParkingSite
from hashq.worker.prepared import PreparedChannels
from hashq.worker.releases import ReleaseWriter
from hashq.worker.runners import Runners
from hashq.worker.session import Membership
from hashq.worker.starvation import StarvationWatch
from hashq.worker.watchdog import PauseWatch

__all__ = ["Worker", "WorkerState", "default_worker_id"]

log = logging.getLogger(__name__)

IDLE_SECONDS = 1.0  # the loop looks at least this often (a consumer the broker cancelled)
REMINDER_SECONDS = 30.0


class Worker:
    def __init__(self, settings: WorkerSettings, handler: Handler | App) -> None:
        if isinstance(handler, App):
            handler.check_runs_as(settings.app)
        self.settings = settings
        self.worker_id = settings.worker_id or default_worker_id()
        self.topology = Topology.from_settings(settings)
        self.machine = WorkerMachine(
            self.worker_id,
            self.topology.buckets,
            settings.drain_timeout,
            stop_within=settings.zk_session_timeout,
            withdraw_after=settings.withdraw_after,
            prove_returns=settings.queue_type == "quorum",
        )
        self._handler = handler
        self._events: asyncio.Queue[ev.Event] = asyncio.Queue()
        self._membership = Membership(settings, self.worker_id, settings.capacity, self.post)
        self._dead_letters = DeadLetters(self.topology, self.worker_id)
        self._mover = Mover(self.topology)
        self._parking: ParkingSite | None = None  # made on the loop, once ZooKeeper is up
        self._connection: AbstractConnection | None = None
        self._contact = ContactKeeper()  # of the current connection: runners start while fresh
        self._leases: dict[int, BucketLease] = {}  # by the machine's lease number
        self._connection_numbers = itertools.count(1)
        self._names: Iterator[str] = iter(())  # the current incarnation's connection names
        self._tasks: set[asyncio.Task[None]] = set()
        self._prepared = PreparedChannels(settings.prefetch)
        self._releases = ReleaseWriter(self._membership.write_releases, self.post, self._start)
        self._watchdog = PauseWatch(settings.zk_session_timeout, self._pause_seen)
        self._reminded = 0.0
        self._fatal: BaseException | None = None  # why the worker cannot go on, if so
        self._starvation = StarvationWatch()
        self.metrics = WorkerMetrics([state.value for state in WorkerState])
        self.metrics.watch(  # read when scraped, so the hot path does not keep them
            grants=lambda: len(self.machine.consuming()),
            leases=self._leases.values,
            zk_connected=lambda: self.machine.zk_link,
            starved=lambda: len(self._starvation.starved),
            contact=self._contact,
        )
        self._runners = Runners.for_worker(  # after the metrics, which they count into
            settings, handler, self._dead_letters, self.metrics, self._watchdog.awake, self._contact
        )

    @property
    def state(self) -> WorkerState:
        return self.machine.state

    def readiness(self) -> tuple[bool, str]:
        """Ready: registered, and consuming every bucket granted to it (perhaps none)."""
        if self.state not in (WorkerState.RUNNING, WorkerState.WAITING):
            return False, f"worker {self.worker_id} is {self.state.value}"
        missing = sorted(set(self.machine.grants()) - set(self.machine.consuming()))
        if missing:
            return False, f"worker {self.worker_id}: granted buckets {missing} not consumed yet"
        if connection_usable(self._connection) and not self._contact.heard():
            return (
                False,
                f"worker {self.worker_id}: RabbitMQ has not answered lately: starts nothing",
            )
        if self._starvation.starved:
            starved = sorted(self._starvation.starved)
            return False, f"worker {self.worker_id}: buckets {starved} get nothing from full queues"
        unread = sorted(lease.bucket for lease in self._leases.values() if lease.parking_unread)
        if unread:
            return False, f"worker {self.worker_id}: buckets {unread} cannot read their parked keys"
        return True, f"worker {self.worker_id} consumes {len(self.machine.consuming())} buckets"

    def post(self, event: ev.Event) -> None:
        self._events.put_nowait(event)

    # ------------------------------------------------------------ the loop
    async def run(self, stop: asyncio.Event) -> None:
        async with health_endpoints(self.settings, self.metrics.registry, self.readiness):
            await self._run(stop)

    async def _run(self, stop: asyncio.Event) -> None:
        self.topology = await ensure_topology(self.settings, check_bindings=False)
        self._runners.start()
        starvation = self._starvation.run(self._leases.values, lambda: self._connection)
        watchers = [asyncio.ensure_future(w) for w in (self._watchdog.run(), starvation)]
        stopping = asyncio.ensure_future(self._post_stop(stop))
        try:
            await self._membership.start()
            records = ParkedRecords(self._membership.zk, Paths(self.settings.app))
            dispatch = self._runners.dispatch
            self._parking = ParkingSite(records, self._mover, self.topology, dispatch, self.metrics)
            self.post(ev.Tick())
            while self.state is not WorkerState.STOPPED:
                await self._handle(await self._next_event())
        finally:
            for watcher in (*watchers, stopping):
                watcher.cancel()
            await self._close_all()
        if self._fatal is not None:
            raise self._fatal

    async def _post_stop(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.post(ev.Stop())

    async def _next_event(self) -> ev.Event:
        wake = self.machine.wake_at
        until = IDLE_SECONDS if wake is None else wake - time.monotonic()
        try:
            return await asyncio.wait_for(self._events.get(), max(0.0, min(IDLE_SECONDS, until)))
        except TimeoutError:
            self._notice_cancelled_consumers()
            self._remind_if_idle()
            return ev.Tick()

    async def _handle(self, event: ev.Event) -> None:
        before = self.state
        # In order, but a run of subscribes at once: a few round trips each, one after another
        # they made most of a handover's pause (32 buckets, 0.5 s under load).
        actions = self.machine.handle(event, time.monotonic())
        if isinstance(event, ev.AssignmentRead):  # channels for the buckets on their way here
            assignment, incarnation = self.machine.assignment, self.machine.incarnation
            incoming = assignment.incoming_for(incarnation) if assignment else ()
            self._prepared.expect(self._connection, incoming, keep=self.machine.grants())
        for subscribes, run in itertools.groupby(actions, lambda a: isinstance(a, ev.Subscribe)):
            if subscribes:  # every one ends before the next event, whatever the others raise
                done = await asyncio.gather(*map(self._do, run), return_exceptions=True)
                for error in (e for e in done if isinstance(e, BaseException)):
                    raise error
            else:
                for action in run:
                    await self._do(action)
        if self.state is not before:
            self.metrics.state = self.state.value
            self._reminded = 0.0
        for number in [n for n in self._leases if n not in self.machine.leases]:
            del self._leases[number]  # the machine is done with it: closed, nothing runs
        self.metrics.handovers = self.machine.counts.handovers
        self.metrics.consumer_timeouts = self.machine.counts.consumer_timeouts
        while self.machine.counts.drain_seconds:
            self.metrics.drain_seconds.observe(self.machine.counts.drain_seconds.pop())

    async def _do(self, action: ev.Action) -> None:
        if isinstance(action, ev.PauseRunners):
            self._runners.pause()
        elif isinstance(action, ev.ResumeRunners):
            self._runners.resume()
        elif isinstance(action, ev.DropConnection):
            await self._drop_connection()
        elif isinstance(action, ev.BeginIncarnation):
            self._start(self._begin_incarnation())
        elif isinstance(action, ev.Reconnect):
            self._start(self._reconnect())
        elif isinstance(action, ev.ConfirmSession):
            self._start(self._confirm(action.asked))
        elif isinstance(action, ev.Subscribe):
            await self._subscribe(action)
        elif isinstance(action, ev.AskQueue):
            self._start(self._ask_queue(action))
        elif isinstance(action, ev.Drain):
            self._start(self._end_lease(action.lease, action.within))
        elif isinstance(action, ev.CutOff):
            self._start(self._end_lease(action.lease, None))
        elif isinstance(action, ev.WriteRelease):
            self._releases.add(action)
        elif isinstance(action, ev.Withdraw):
            await self._drop_connection()
            self._start(self._membership.deregister())
        elif isinstance(action, ev.Deregister):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._membership.deregister(), 5)

    def _start(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        """An action's task ended. One that raised is a bug, not a fault (faults become
        events): the worker says so and exits, rather than wait for an event that never
        comes."""
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        log.error("worker %s: an action failed: %r; exiting", self.worker_id, error, exc_info=error)
        self._fatal = error
        self.post(ev.Stop())

    # ------------------------------------------------------------ incarnations and connections
    async def _begin_incarnation(self) -> None:
        """A new incarnation: its first connection (holding its liveness queue), then its
        registration, which names it."""
        await self._drop_connection()
        incarnation = self._membership.new_incarnation()
        self._names = worker_connection_names(self.worker_id, incarnation)
        try:
            number, name = await self._open_connection(incarnation)
            await self._membership.register(incarnation, name, self.settings.drain_timeout)
        except ConfigError as exc:
            log.error("%s", exc)
            self._fatal = exc
            self.post(ev.Stop())
            return
        except Exception as exc:  # a ZooKeeper or a broker that flaps must not end the worker
            log.warning("registering failed: %r; retrying", exc)
            await self._drop_connection()  # named for an incarnation that never registered
            self.post(ev.RegisterFailed(repr(exc)))
            return
        self.post(ev.Registered(incarnation, number))

    async def _reconnect(self) -> None:
        """A new connection of this incarnation, announced before anything is consumed on it,
        so that a fence finds it."""
        await self._drop_connection()
        incarnation = self.machine.incarnation
        try:
            number, name = await self._open_connection(incarnation)
            read = await self._membership.announce(name)
        except RegistrationGone as exc:
            await self._drop_connection()
            self.post(ev.LinkFailed(str(exc), registration_gone=True))
            return
        except Exception as exc:
            log.debug("reconnecting failed: %r", exc)
            await self._drop_connection()
            self.post(ev.LinkFailed(repr(exc)))
            return
        self.post(read)
        self.post(ev.LinkUp(number))

    async def _open_connection(self, incarnation: str) -> tuple[int, str]:
        """Connect under the incarnation's next unused name, and hold the incarnation's liveness
        queue (``Topology.liveness_queue``) before the connection is named in the registration.
        While an earlier connection of the incarnation still holds it (the broker has not
        noticed that it died), this fails and is retried: two connections of one incarnation
        never consume at once. Returns the connection's number (events name it) and name."""
        connection, name = await connect_named(self.settings, self._names)
        number = next(self._connection_numbers)
        self._connection = connection
        connection.close_callbacks.add(lambda *_: self.post(ev.LinkLost(number)))
        channel = await connection.channel()
        liveness = self.topology.liveness_queue(self.worker_id, incarnation)
        await channel.declare_queue(liveness, exclusive=True, auto_delete=True)
        await channel.close()
        self._contact.start(connection)
        await self._dead_letters.open(connection)
        await self._mover.open(connection)
        return number, name

    async def _drop_connection(self) -> None:
        self._contact.stop()
        self._prepared.close_all()
        if self._connection is not None:
            connection, self._connection = self._connection, None
            await close_quietly(connection)

    async def _confirm(self, asked: int) -> None:
        self.post(ev.SessionConfirmed(asked, await self._membership.probe()))

    # ------------------------------------------------------------ leases
    async def _subscribe(self, action: ev.Subscribe) -> None:
        connection = self._connection
        # Half the prefetch window per ack batch: the broker always has the other half to send.
        ack_batch = max(1, self.settings.prefetch // 2)
        lease = BucketLease(
            action.bucket,
            action.epoch,
            self.topology.queue_name(action.bucket),  # a resize's new ones too
            self._runners.dispatch,
            ack_batch,
            on_closed=lambda: self._channel_closed(action.lease),
            parking=self._parking,
            hot_after=self.settings.hot_after,
            prefetch=self.settings.prefetch,
            say_passed=self._membership.say_passed,
        )
        self._leases[action.lease] = lease
        try:
            if not connection_usable(connection):
                raise ServiceUnavailable("no connection to RabbitMQ")
            ready = await self._prepared.take(connection, action.bucket)
            await lease.open(connection, self.settings.prefetch, ready)
        except Exception as exc:
            self.post(ev.Subscribed(action.lease, False, repr(exc)))
            return
        self.post(ev.Subscribed(action.lease))

    async def _ask_queue(self, action: ev.AskQueue) -> None:
        answer = await ask_queue(self._connection, self.topology.queue_name(action.bucket))
        self.post(ev.QueueAnswered(action.lease, answer))

    def _channel_closed(self, number: int) -> None:
        """The lease's channel closed, by either side: an event only if the broker did it."""
        lease = self._leases.get(number)
        if lease is not None and lease.state is not LeaseState.CLOSED:
            reason = lease.close_reason or "channel lost"
            self.post(ev.ChannelLost(number, reason, lease.consumer_timed_out))

    def _notice_cancelled_consumers(self) -> None:
        for number, lease in self._leases.items():
            if lease.consumer_cancelled:
                self.post(ev.ChannelLost(number, "consumer cancelled by the broker"))

    async def _end_lease(self, number: int, drain_within: float | None) -> None:
        """Drain (or cut off) and close; then ``Closed``, and ``Settled`` once no handler of
        the lease runs any more (a thread cannot be stopped)."""
        lease = self._leases.get(number)
        if lease is None:
            self.post(ev.Closed(number))
            return
        if drain_within is None:
            await lease.close()
        else:
            await lease.drain(drain_within)
        running = lease.running
        self.post(ev.Closed(number, running, lease.close_confirmed))
        if running:
            lease.say_handlers_outlive_it()
            await lease.settled(None)
            self.post(ev.Settled(number))

    # ------------------------------------------------------------ pauses and the end
    def _pause_seen(self, paused: float) -> None:
        self._runners.pause()
        self.post(ev.PauseSeen(paused))

    async def _close_all(self) -> None:
        """Exiting: tasks still under way (a release, a handler thread) get a bounded time."""
        if self._tasks:
            within = self.settings.zk_session_timeout
            _, stuck = await asyncio.wait(set(self._tasks), timeout=within)
            for task in stuck:
                task.cancel()
        await asyncio.gather(*(lease.close() for lease in self._leases.values()))
        await self._membership.close()
        await self._runners.close()
        await self._drop_connection()

    def _remind_if_idle(self) -> None:
        if self.state is WorkerState.WAITING:
            now = time.monotonic()
            if now - self._reminded >= REMINDER_SECONDS or self._reminded == 0.0:
                self._reminded = now
                log.info(
                    "worker %s waits for an assignment: no bucket granted yet "
                    "(is a hashq-coordinator running for app %r?)",
                    self.worker_id,
                    self.settings.app,
                )
