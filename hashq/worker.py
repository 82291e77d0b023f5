"""The worker: one loop that waits on its triggers (stop, a change of assignment or of the
ZooKeeper session, a lost AMQP connection, a finished drain) and then makes what it consumes
match what ZooKeeper grants it.

It consumes a bucket only while its current incarnation holds a grant for it at that epoch.
A lost AMQP connection never brings consumers back by itself: after reconnecting, the loop
subscribes again only what the assignment still grants, at the same epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import socket
import time
import uuid

from aio_pika.abc import AbstractConnection

from hashq.amqp import close_quietly, connect_amqp, connection_usable
from hashq.bucket import BucketLease, LeaseState
from hashq.deadletter import DeadLetters
from hashq.health import health_endpoints
from hashq.membership import Membership, RegistrationGone, Session
from hashq.metrics import WorkerMetrics
from hashq.protocol import worker_connection_name
from hashq.provision import ensure_topology
from hashq.retry import OnFailure, RetryPolicy
from hashq.runner import Handler, Runners
from hashq.settings import WorkerSettings
from hashq.topology import Topology

log = logging.getLogger(__name__)

REMINDER_SECONDS = 30.0
RECONNECT_SECONDS = 1.0
CONFIRM_SECONDS = 0.3
TICK_SECONDS = 0.1


class WorkerState(enum.Enum):
    STARTING = "starting"
    """Connecting and checking the topology; holds nothing."""
    WAITING = "waiting"
    """Registered, granted nothing: consumes nothing, waits for the coordinator."""
    RUNNING = "running"
    """Registered: consumes exactly its granted buckets."""
    SUSPENDED = "suspended"
    """ZooKeeper unreachable, session perhaps alive: starts nothing new."""
    FENCED = "fenced"
    """Session lost: every bucket was cut off; registering afresh."""
    STOPPING = "stopping"
    """Draining every bucket, then releasing and deregistering."""
    STOPPED = "stopped"


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"


class Worker:
    def __init__(self, settings: WorkerSettings, handler: Handler) -> None:
        self.settings = settings
        self.worker_id = settings.worker_id or default_worker_id()
        self.topology = Topology.from_settings(settings)
        self.state = WorkerState.STARTING
        self._handler = handler
        self._wake = asyncio.Event()
        self._membership = Membership(settings, self.worker_id, settings.capacity, self._wake)
        self._dead_letters = DeadLetters(self.topology, self.worker_id)
        self._runners: Runners | None = None
        self._connection: AbstractConnection | None = None
        self._connections_opened = 0  # by this incarnation: each is named with its number
        self._reconnect_attempts = 0  # since the connection was last usable
        self._leases: dict[int, BucketLease] = {}
        self._revoking: dict[int, BucketLease] = {}  # draining; each has a task writing its release
        self._revoke_tasks: set[asyncio.Task[None]] = set()
        self._held: dict[BucketLease, asyncio.Task[None]] = {}  # see _hold
        self._reminded = 0.0
        self._confirming: asyncio.Future[None] | None = None
        self._last_tick = time.monotonic()
        self._pause_limit = max(0.5, settings.zk_session_timeout / 4)
        self.metrics = WorkerMetrics([state.value for state in WorkerState])
        self.metrics.watch(  # read when scraped, so the hot path does not keep them
            grants=lambda: len(self._leases),
            running=lambda: sum(lease.running for lease in self._all_leases()),
            waiting=lambda: sum(lease.waiting for lease in self._all_leases()),
            zk_connected=lambda: self._membership.session is Session.CONNECTED,
        )

    def _all_leases(self) -> list[BucketLease]:
        return [*self._leases.values(), *self._revoking.values()]

    def readiness(self) -> tuple[bool, str]:
        """Ready: registered, and consuming every bucket granted to it (perhaps none)."""
        if self.state not in (WorkerState.RUNNING, WorkerState.WAITING):
            return False, f"worker {self.worker_id} is {self.state.value}"
        consumed = {b for b, lease in self._leases.items() if lease.state is not LeaseState.CLOSED}
        missing = sorted(set(self._membership.grants()) - consumed)
        if missing:
            return False, f"worker {self.worker_id}: granted buckets {missing} not consumed yet"
        return True, f"worker {self.worker_id} consumes {len(self._leases)} buckets"

    # ------------------------------------------------------------ the loop
    async def run(self, stop: asyncio.Event) -> None:
        async with health_endpoints(self.settings, self.metrics.registry, self.readiness):
            await self._run(stop)

    async def _run(self, stop: asyncio.Event) -> None:
        await ensure_topology(self.settings, check_bindings=False)
        self._runners = Runners(
            self._handler,
            concurrency=self.settings.concurrency,
            threads=self.settings.threads,
            policy=self._policy(),
            dead_letters=self._dead_letters,
            codec=self.settings.codec,
            metrics=self.metrics,
            awake=self._awake,
            keys_in_clear=self.settings.log_keys == "clear",
        )
        self._membership.on_unsafe = self._runners.pause
        watchdog = asyncio.ensure_future(self._watch_for_pauses())
        try:
            await self._membership.start()
            await self._begin_incarnation()
            while not stop.is_set():
                await self._reconcile()
                await self._wait(stop)
        finally:
            watchdog.cancel()
            await self._shut_down()

    def _confirm_soon(self) -> None:
        """Ask ZooKeeper, in the background, whether the session survived; the answer wakes the
        loop. One question at a time."""
        if self._confirming is None or self._confirming.done():
            self._confirming = asyncio.ensure_future(self._confirm_after(CONFIRM_SECONDS))

    async def _confirm_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        await self._membership.confirm()
        self._wake.set()

    def _awake(self) -> bool:
        """False when the pause watchdog has not ticked for too long: the process was stopped
        and may not have noticed yet that its session expired."""
        return time.monotonic() - self._last_tick <= self._pause_limit

    async def _watch_for_pauses(self) -> None:
        """A process stopped (SIGSTOP, a long GC, a starved VM) may come back after its session
        expired, holding deliveries it must not start. A tick that comes much too late means
        such a pause: start nothing until ZooKeeper confirms the session."""
        while True:
            await asyncio.sleep(TICK_SECONDS)
            now = time.monotonic()
            last = self._last_tick
            if now - last > self._pause_limit:
                # Pause first, then let runners see a fresh tick: never the other way round.
                assert self._runners is not None
                self._runners.pause()
                log.warning(
                    "worker %s was paused for %.1fs; checking its session",
                    self.worker_id,
                    now - last,
                )
                self._membership.suspect()
            self._last_tick = now

    async def _wait(self, stop: asyncio.Event) -> None:
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
        await asyncio.wait(waits, timeout=RECONNECT_SECONDS * 5, return_when="FIRST_COMPLETED")
        for waiter in waits:
            waiter.cancel()
        self._wake.clear()

    async def _reconcile(self) -> None:
        session = self._membership.session
        if session is Session.LOST:
            await self._fence_self()
            return
        assert self._runners is not None
        if session is Session.SUSPENDED:
            self._runners.pause()
            self._transition(WorkerState.SUSPENDED)
            self._confirm_soon()
            return
        self._runners.resume()
        if not await self._ensure_connection():
            return
        grants = self._membership.grants()
        await self._release_ungranted(grants)
        await self._subscribe_granted(grants)
        self._transition(WorkerState.RUNNING if self._leases else WorkerState.WAITING)
        self._remind_if_idle()

    async def _release_ungranted(self, grants: dict[int, int]) -> None:
        for bucket, lease in list(self._leases.items()):
            if grants.get(bucket) != lease.epoch:
                del self._leases[bucket]
                self._revoking[bucket] = lease
                task = asyncio.ensure_future(self._revoke(lease))
                self._revoke_tasks.add(task)
                task.add_done_callback(self._revoke_tasks.discard)
            elif not lease.channel_alive or lease.consumer_cancelled:
                await self._resubscribe_when_settled(bucket, lease)

    async def _resubscribe_when_settled(self, bucket: int, lease: BucketLease) -> None:
        """A granted bucket whose channel is gone (the connection dropped, or the broker closed
        the channel) is subscribed again once none of its handlers runs any more."""
        if lease.consumer_timed_out and lease.state is not LeaseState.CLOSED:
            self.metrics.consumer_timeouts += 1
            log.error(
                "bucket %d: RabbitMQ closed its channel because a message stayed unacknowledged "
                "past the broker's consumer_timeout (%s); every message held went back and "
                "counts as a delivery. Set consumer_timeout above the longest handler, and off "
                "with HASHQ_ON_FAILURE=block (docs/operations.md)",
                bucket,
                lease.close_reason,
            )
        if lease.state is not LeaseState.CLOSED:
            what = "consumer cancelled by the broker" if lease.channel_alive else "channel lost"
            log.warning("bucket %d: %s; subscribing again", bucket, what)
            await lease.close()
        if lease.running:
            self._hold(lease)
        else:
            del self._leases[bucket]  # _subscribe_granted subscribes it again

    def _hold(self, lease: BucketLease) -> None:
        """A closed lease whose handlers still run (a thread cannot be stopped; an async handler
        may ignore its cancellation) keeps its bucket: it is neither subscribed again at its
        epoch nor released until they return, so that no message runs beside its own
        redelivery. The loop is woken when they have."""
        if lease in self._held:
            return
        log.warning(
            "bucket %d epoch %d: %d handler(s) still run after the bucket's channel closed; it "
            "waits for them before it is consumed again or released",
            lease.bucket,
            lease.epoch,
            lease.running,
            extra=lease.log_fields,
        )

        async def wake_when_settled() -> None:
            await lease.settled(None)
            self._held.pop(lease, None)
            self._wake.set()

        self._held[lease] = asyncio.ensure_future(wake_when_settled())

    async def _subscribe_granted(self, grants: dict[int, int]) -> None:
        held = {lease.bucket for lease in self._held}
        for bucket, epoch in sorted(grants.items()):
            if bucket in self._leases or bucket in self._revoking or bucket in held:
                continue
            if not 0 <= bucket < self.topology.buckets:
                log.error("granted bucket %d, which does not exist; ignored", bucket)
                continue
            await self._subscribe(bucket, epoch)

    async def _subscribe(self, bucket: int, epoch: int) -> None:
        assert self._connection is not None and self._runners is not None
        queue = self.topology.bucket_queue(bucket)
        # Half the prefetch window per ack batch: the broker always has the other half to send.
        ack_batch = max(1, self.settings.prefetch // 2)
        lease = BucketLease(
            bucket, epoch, queue, self._runners.dispatch, ack_batch, on_closed=self._wake.set
        )
        try:
            await lease.open(self._connection, self.settings.prefetch)
        except Exception as exc:
            log.warning("bucket %d: subscribing failed: %r", bucket, exc)
            await lease.close()
            return
        self._leases[bucket] = lease
        log.info("bucket %d epoch %d: consuming", bucket, epoch, extra=lease.log_fields)

    async def _revoke(self, lease: BucketLease, give_up_after: float | None = None) -> None:
        """Drain, close, then release: nothing of the bucket is acknowledged after the release."""
        log.info(
            "bucket %d epoch %d: revoked; draining",
            lease.bucket,
            lease.epoch,
            extra=lease.log_fields,
        )
        began = time.monotonic()
        incarnation = self._membership.incarnation
        try:
            await lease.drain(self.settings.drain_timeout)
            if lease.running:
                self._hold(lease)
            if not await lease.settled(give_up_after):
                return  # exiting: the coordinator fences the bucket once the session is gone
            if self._membership.incarnation != incarnation:
                return  # that life's grants are void: the coordinator fences, not a release
            await self._membership.write_release(lease.bucket, lease.epoch, give_up_after)
            self.metrics.handovers += 1
            self.metrics.drain_seconds.observe(time.monotonic() - began)
        finally:
            self._revoking.pop(lease.bucket, None)
            self._wake.set()

    # ------------------------------------------------------------ connections and sessions
    async def _begin_incarnation(self) -> None:
        """A new incarnation: its first connection, then its registration, which names it."""
        incarnation = self._membership.new_incarnation()
        self._connections_opened, self._reconnect_attempts = 1, 0
        name = worker_connection_name(self.worker_id, incarnation)
        await self._open_connection(name, incarnation)
        try:
            await self._membership.register(incarnation, name, self.settings.drain_timeout)
        except BaseException:
            await self._drop_connection()  # named for an incarnation that never registered
            raise

    async def _open_connection(self, name: str, incarnation: str) -> None:
        """Connect, and hold the incarnation's liveness queue (``Topology.liveness_queue``)
        before the connection is named in the registration. While an earlier connection of the
        incarnation still holds it (the broker has not noticed that it died), this fails and is
        retried: two connections of one incarnation never consume at once."""
        self._connection = await connect_amqp(self.settings, name)
        self._connection.close_callbacks.add(lambda *_: self._wake.set())
        channel = await self._connection.channel()
        liveness = self.topology.liveness_queue(self.worker_id, incarnation)
        await channel.declare_queue(liveness, exclusive=True, auto_delete=True)
        await channel.close()
        await self._dead_letters.open(self._connection)

    async def _ensure_connection(self) -> bool:
        """Reopen a lost AMQP connection under the same name; False while it cannot be had."""
        if connection_usable(self._connection):
            return True
        # Said once per outage, not at every attempt; readiness shows it meanwhile.
        say = log.warning if self._reconnect_attempts == 0 else log.debug
        self._reconnect_attempts += 1
        say("AMQP connection lost; cutting off every bucket and reconnecting")
        await self._cut_off_all()
        await self._drop_connection()
        self._connections_opened += 1
        incarnation = self._membership.incarnation
        name = worker_connection_name(self.worker_id, incarnation, self._connections_opened)
        try:
            await self._open_connection(name, incarnation)
            # Announced before anything is consumed on it, so that a fence finds it.
            await self._membership.announce(name)
        except RegistrationGone as exc:
            log.warning("%s; the session is lost", exc)
            self._membership.session = Session.LOST
            await self._drop_connection()
            self._wake.set()
            return False
        except Exception as exc:
            say("reconnecting failed (%s); retrying every %gs", exc, RECONNECT_SECONDS)
            await self._drop_connection()
            await asyncio.sleep(RECONNECT_SECONDS)
            self._wake.set()
            return False
        if self._reconnect_attempts > 1:
            log.info("AMQP connection back after %d attempts", self._reconnect_attempts)
        self._reconnect_attempts = 0
        return True

    async def _drop_connection(self) -> None:
        if self._connection is not None:
            connection, self._connection = self._connection, None
            await close_quietly(connection)

    async def _fence_self(self) -> None:
        """Session lost: the grants are void. Cut everything off, then register afresh."""
        if self.state is not WorkerState.FENCED:
            self._transition(WorkerState.FENCED)
            await self._cut_off_all()
            await self._drop_connection()
            for lease in self._all_leases():  # void now; a bucket still running waits for it
                if lease.running:
                    self._hold(lease)
            self._leases.clear()
        if not self._membership.zk_connected:
            asyncio.get_running_loop().call_later(0.2, self._wake.set)
            return
        try:
            await self._begin_incarnation()
        except Exception as exc:  # a ZooKeeper that flaps meanwhile must not end the worker
            log.warning("registering again failed: %r; retrying", exc)
            await asyncio.sleep(RECONNECT_SECONDS)
            self._wake.set()

    async def _cut_off_all(self) -> None:
        """Close every bucket now: their unacknowledged messages go back to the queues. The
        leases stay where they are for the caller to decide: after a lost connection, a bucket
        still granted at its epoch is subscribed again and one that is not is released, each
        only once none of its handlers runs any more (``_resubscribe_when_settled``,
        ``_revoke``); after a lost session they are void (``_fence_self``)."""
        await asyncio.gather(*(lease.close() for lease in self._all_leases()))

    async def _shut_down(self) -> None:
        self._transition(WorkerState.STOPPING)
        leases = list(self._leases.values())
        self._leases.clear()
        # Exiting must not hang on an unreachable ZooKeeper, nor on a handler that does not
        # return: releases get a bounded time, and what is left then is fenced.
        limit = self.settings.zk_session_timeout
        if self._membership.session is Session.CONNECTED:
            await asyncio.gather(*(self._revoke(lease, limit) for lease in leases))
        else:
            await asyncio.gather(*(lease.close() for lease in leases))
        pending = [*self._revoke_tasks, *self._held.values()]
        if pending:
            _, stuck = await asyncio.wait(pending, timeout=limit)
            for task in stuck:
                task.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._membership.deregister(), 5)
        await self._membership.close()
        if self._runners is not None:
            await self._runners.close()
        if self._connection is not None:
            await close_quietly(self._connection)
        self._transition(WorkerState.STOPPED)

    # ------------------------------------------------------------ helpers
    def _policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_attempts=self.settings.max_attempts,
            base_delay=self.settings.retry_base_delay,
            max_delay=self.settings.retry_max_delay,
            on_failure=OnFailure(self.settings.on_failure),
        )

    def _transition(self, state: WorkerState) -> None:
        if state is self.state:
            return
        grants = {lease.bucket: lease.epoch for lease in self._leases.values()}
        log.info(
            "worker %s: %s -> %s (incarnation %s, grants %s)",
            self.worker_id,
            self.state.value,
            state.value,
            self._membership.incarnation or "-",
            grants or "none",
        )
        self.state = state
        self.metrics.state = state.value
        self._reminded = 0.0

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
