"""The coordinator runtime: kazoo, the management API and asyncio around
``hashq_coordinator.machine.CoordinatorMachine``.

Any number of coordinators may run; one leads, through a ZooKeeper lock, and the others stand
by. All state lives in ZooKeeper, so a new leader continues from it, including a handover that
was half done. Every write of the leader checks the leader node's version (see ``store``).
The loop feeds the machine its events (a tick, a change of workers or releases, a session
change, an observation read, a commit's outcome, a finished fence) and carries out its actions;
what to commit and whom to fence is the machine's decision, which the simulator runs too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Coroutine
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.recipe.lock import Lock
from kazoo.recipe.watchers import ChildrenWatch

from hashq._io.health import health_endpoints
from hashq._io.zk import close_zk, connect_zk
from hashq.provision import ensure_topology
from hashq.records import Paths
from hashq.topology import Topology
from hashq.worker.metrics import CoordinatorMetrics
from hashq_coordinator import machine as cm
from hashq_coordinator.fencebook import Incarnation, Sighting
from hashq_coordinator.fencing import Fencer
from hashq_coordinator.machine import CoordinatorMachine, Role
from hashq_coordinator.settings import CoordinatorSettings
from hashq_coordinator.store import Deposed, Store

log = logging.getLogger(__name__)

TICK_SECONDS = 0.5
DEPTH_SECONDS = 5.0  # how often the leader reads the queues' depth for the metrics


__all__ = ["Coordinator", "Role"]


class Coordinator:
    def __init__(self, settings: CoordinatorSettings) -> None:
        self.settings = settings
        self.me = settings.coordinator_id or (
            f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"
        )
        self._paths = Paths(settings.app)
        self._events: asyncio.Queue[cm.Event] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._zk: KazooClient | None = None
        self._store: Store | None = None
        self._lock: Lock | None = None
        self._stopped = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.metrics = CoordinatorMetrics()
        self.machine: CoordinatorMachine | None = None  # once the topology is known
        self.fencer = Fencer(settings, self.me, self.metrics, self._tick, on_done=self._fence_done)
        self._measure()

    @property
    def role(self) -> Role:
        if self._stopped:
            return Role.STOPPED
        return self.machine.role if self.machine is not None else Role.CANDIDATE

    def _measure(self) -> None:
        """Gauges read when scraped."""
        self.metrics.leader.set_function(lambda: 1 if self.role is Role.LEADER else 0)
        self.metrics.zk_connected.set_function(lambda: 1 if self.zk_connected else 0)
        self.metrics.can_fence.set_function(lambda: 0 if self.fencer.cannot_fence else 1)
        self.metrics.workers.set_function(lambda: len(self.machine.members) if self.machine else 0)
        self.metrics.in_transit.set_function(
            lambda: self.machine.in_transit() if self.machine else 0
        )

    @property
    def zk_connected(self) -> bool:
        return self._zk is not None and bool(self._zk.connected)

    def readiness(self) -> tuple[bool, str]:
        """Ready: connected to ZooKeeper, leading or standing by, and able to fence (without
        the management API no dead or stuck worker's buckets can move)."""
        if self.role is Role.STOPPED or not self.zk_connected:
            return False, f"coordinator {self.me}: not connected to ZooKeeper"
        if self.fencer.cannot_fence:
            return False, f"coordinator {self.me}: cannot fence: {self.fencer.cannot_fence}"
        return True, f"coordinator {self.me}: {self.role.value}"

    def post(self, event: cm.Event) -> None:
        self._events.put_nowait(event)

    def _tick(self) -> None:
        self.post(cm.Tick())

    def _fence_done(self, incarnation: Incarnation, covered: Sighting) -> None:
        self.post(cm.FenceDone(incarnation, covered))

    # ------------------------------------------------------------ the loop
    async def run(self, stop: asyncio.Event) -> None:
        async with health_endpoints(self.settings, self.metrics.registry, self.readiness):
            await self._run(stop)

    async def _run(self, stop: asyncio.Event) -> None:
        topology = await ensure_topology(self.settings, check_bindings=False)
        self.machine = CoordinatorMachine(
            self.me,
            topology.buckets,
            settle=self.settings.settle,
            drain_timeout=self.settings.drain_timeout,
            fence_grace=self.settings.fence_grace,
            book=self.fencer.book,
        )
        await self.fencer.start(topology)
        zk = await asyncio.to_thread(connect_zk, self.settings)
        self._zk = zk
        self._store = Store(zk, self._paths, topology.buckets)
        zk.add_listener(self._on_session)
        ChildrenWatch(zk, self._paths.workers, self._on_children)
        ChildrenWatch(zk, self._paths.releases, self._on_children)
        helpers = [
            asyncio.ensure_future(self._campaign()),
            asyncio.ensure_future(self._watch_management(topology)),
        ]
        try:
            while not stop.is_set():
                await self._handle(await self._next_event(stop))
        finally:
            for helper in [*helpers, *self._tasks]:
                helper.cancel()
            await asyncio.gather(*helpers, *self._tasks, return_exceptions=True)
            await self._resign("stopping")
            self._stopped = True
            await self.fencer.close()
            await asyncio.to_thread(close_zk, zk)

    async def _next_event(self, stop: asyncio.Event) -> cm.Event:
        stopping = asyncio.ensure_future(stop.wait())
        getting = asyncio.ensure_future(self._events.get())
        done, _ = await asyncio.wait(
            [stopping, getting], timeout=TICK_SECONDS, return_when="FIRST_COMPLETED"
        )
        stopping.cancel()
        if getting in done:
            return getting.result()
        getting.cancel()
        return cm.Tick()

    async def _handle(self, event: cm.Event) -> None:
        assert self.machine is not None
        grants = self.machine.grants_made
        for action in self.machine.handle(event, time.monotonic()):
            await self._do(action)
        self.metrics.grants.inc(self.machine.grants_made - grants)

    async def _do(self, action: cm.Action) -> None:
        assert self._store is not None and self.machine is not None
        if isinstance(action, cm.Observe):
            try:
                members = await asyncio.to_thread(self._store.workers)
                releases = await asyncio.to_thread(self._store.releases)
            except Exception as exc:
                self.post(cm.ObserveFailed(repr(exc)))
                return
            workers = {worker: member.registration for worker, member in members.items()}
            self.post(cm.Observed(workers, releases))
        elif isinstance(action, cm.Commit):
            await self._commit(action)
        elif isinstance(action, cm.Fence):
            self.fencer.start_fence(action.incarnation)
        elif isinstance(action, cm.Resign):
            self.fencer.cancel_all()
        elif isinstance(action, cm.Claim):
            self._background(self._claim())
        elif isinstance(action, cm.GiveBack):
            self._background(self._give_back())

    async def _commit(self, commit: cm.Commit) -> None:
        assert self._store is not None
        try:
            await asyncio.to_thread(
                self._store.commit,
                commit.version,
                commit.records,
                commit.known_records,
                commit.assignments,
                commit.known_assignments,
                commit.removed,
                commit.consumed,
            )
        except Deposed as exc:
            self.post(cm.Deposed(str(exc)))
            return
        self.post(cm.Committed())

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_children(self, children: list[str]) -> None:
        self._loop.call_soon_threadsafe(self._tick)

    def _on_session(self, state: str) -> None:
        if state == KazooState.LOST:
            self._loop.call_soon_threadsafe(self.post, cm.SessionLost())
        self._loop.call_soon_threadsafe(self._tick)

    async def _watch_management(self, topology: Topology) -> None:
        """Check the management API can fence; while leading, also read each bucket queue's
        depth (the lag) for the metrics."""
        while True:
            await asyncio.sleep(DEPTH_SECONDS)
            await self.fencer.probe()
            if self.role is not Role.LEADER:
                continue
            try:
                depths = await asyncio.to_thread(self.fencer.management.queue_depths)
            except Exception as exc:
                log.debug("reading queue depths: %r", exc)
                continue
            for bucket, name in enumerate(topology.bucket_queues()):
                self.metrics.queue_depth.labels(str(bucket)).set(depths.get(name, 0))
            self.metrics.dead_letters.set(depths.get(topology.dead_letter_queue, 0))

    # ------------------------------------------------------------ election
    async def _campaign(self) -> None:
        """Wait for the lock (a ZooKeeper lock recipe: ephemeral sequential nodes) whenever
        this coordinator neither leads nor holds it; the machine decides what follows."""
        assert self._zk is not None
        while True:
            if self.role is not Role.CANDIDATE or self._lock is not None:
                await asyncio.sleep(TICK_SECONDS)
                continue
            lock = self._zk.Lock(self._paths.election, self.me)
            log.info(
                "coordinator %s: standing by for the leadership of app %r",
                self.me,
                self.settings.app,
            )
            try:
                await asyncio.to_thread(lock.acquire)
            except asyncio.CancelledError:
                lock.cancel()  # ends the acquire still waiting in its thread
                raise
            except Exception as exc:
                log.warning("coordinator %s: campaign failed (%r); retrying", self.me, exc)
                await asyncio.sleep(1.0)
                continue
            self._lock = lock
            self.post(cm.LockAcquired())

    async def _claim(self) -> None:
        assert self._store is not None
        try:
            leadership, version = await asyncio.to_thread(self._store.claim, self.me)
            records = await asyncio.to_thread(self._store.records)
            written = await asyncio.to_thread(self._store.assignments)
        except Exception as exc:
            self.post(cm.ClaimFailed(repr(exc)))
            return
        self.post(cm.Elected(leadership.epoch, version, records, written))

    async def _give_back(self) -> None:
        """Release the held lock, retrying until ZooKeeper takes it (once the session is gone,
        so is the lock node, and the release succeeds at once); only then campaign again."""
        lock = self._lock
        while lock is not None:
            try:
                await asyncio.wait_for(asyncio.to_thread(lock.release), 5)
                break
            except Exception as exc:
                log.warning("coordinator %s: releasing the lock failed (%r)", self.me, exc)
                await asyncio.sleep(1.0)
        await asyncio.sleep(1.0)  # a claim that keeps failing is not retried in a tight loop
        if self._lock is lock:
            self._lock = None

    async def _resign(self, why: str) -> None:
        """Stopping: fences under way are abandoned and the lock goes back, bounded (the
        session, and the lock node with it, ends when the process closes its client)."""
        self.fencer.cancel_all()
        if self.machine is not None and self.machine.role is not Role.CANDIDATE:
            self.machine.handle(cm.StepDown(why), time.monotonic())
        lock, self._lock = self._lock, None
        if lock is not None:
            try:
                await asyncio.wait_for(asyncio.to_thread(lock.release), 5)
            except Exception as exc:
                log.debug("releasing the lock: %r", exc)
