"""The coordinator runtime: kazoo, the management API and asyncio around
``hashq_coordinator.machine.core.CoordinatorMachine``.

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
from dataclasses import replace
from typing import Any

from kazoo.client import KazooState
from kazoo.recipe.watchers import ChildrenWatch

from hashq._io.health import health_endpoints
from hashq._io.zk import close_zk, start_zk, zk_client
from hashq.provision import ensure_topology
from hashq.records import Paths
from hashq.topology import Topology
from hashq_coordinator import leader
from hashq_coordinator.crashes import CrashFeed
from hashq_coordinator.election import Election
from hashq_coordinator.fencing.fencer import Fencer
from hashq_coordinator.machine import events as cm
from hashq_coordinator.machine.core import CoordinatorMachine
from hashq_coordinator.machine.events import Role
from hashq_coordinator.machine.fencebook import Incarnation, Sighting
from hashq_coordinator.metrics import CoordinatorMetrics, read_depths
from hashq_coordinator.settings import CoordinatorSettings
from hashq_coordinator.store import Store

log = logging.getLogger(__name__)

TICK_SECONDS = 0.5
MANAGEMENT_SECONDS = 5.0  # how often it checks it can fence; the leader reads queue depths too


__all__ = ["Coordinator", "Role"]


class Coordinator:
    """A coordinator, whole from its constructor: nothing is connected until ``run``."""

    def __init__(self, settings: CoordinatorSettings) -> None:
        self.settings = settings
        self.me = settings.coordinator_id or (
            f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"
        )
        self.topology = Topology.from_settings(settings)
        self._paths = Paths(settings.app)
        self._events: asyncio.Queue[cm.Event] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._zk = zk_client(settings, "coordinator")
        self._store = Store(self._zk, self._paths, self.topology.buckets)
        self._election = Election(
            self._zk, self._paths.election, self.me, f"the leadership of app {settings.app!r}"
        )
        self._stopped = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.metrics = CoordinatorMetrics()
        self.fencer = Fencer(settings, self.me, self.metrics, self._tick, on_done=self._fence_done)
        self.machine = CoordinatorMachine(
            self.me,
            self.topology.buckets,
            settle=settings.settle,
            drain_timeout=settings.drain_timeout,
            fence_grace=settings.fence_grace,
            crash_grace=settings.crash_grace,
            ask_returns=settings.early_grant and self.topology.queue_type == "quorum",
            book=self.fencer.book,
        )
        self.crashes = CrashFeed(settings, self.post)
        self._measure()

    @property
    def role(self) -> Role:
        return Role.STOPPED if self._stopped else self.machine.role

    def _measure(self) -> None:
        """Gauges read when scraped."""
        self.metrics.leader.set_function(lambda: 1 if self.role is Role.LEADER else 0)
        self.metrics.zk_connected.set_function(lambda: 1 if self.zk_connected else 0)
        self.metrics.can_fence.set_function(lambda: 0 if self.fencer.cannot_fence else 1)
        self.metrics.workers.set_function(lambda: len(self.machine.members))
        self.metrics.in_transit.set_function(self.machine.in_transit)
        self.metrics.crash_detection.set_function(lambda: 1 if self.crashes.listening else 0)

    @property
    def zk_connected(self) -> bool:
        return bool(self._zk.connected)

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
        self.topology = await ensure_topology(self.settings, check_bindings=False)
        self.machine.buckets = self._store.buckets = self.topology.buckets  # the record's
        await self.fencer.probe()
        await asyncio.to_thread(start_zk, self._zk, self.settings)
        self._zk.add_listener(self._on_session)
        ChildrenWatch(self._zk, self._paths.workers, self._on_children)
        ChildrenWatch(self._zk, self._paths.releases, self._on_children)
        helpers = [
            asyncio.ensure_future(self._election.campaign(self._standing_by, self._won)),
            asyncio.ensure_future(self._watch_management()),
            asyncio.ensure_future(self.crashes.run()),
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
            await asyncio.to_thread(close_zk, self._zk)

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
        grants, expelled = self.machine.grants_made, self.machine.expelled
        for action in self.machine.handle(event, time.monotonic()):
            await self._do(action)
        self.metrics.grants.inc(self.machine.grants_made - grants)
        self.metrics.expelled.inc(self.machine.expelled - expelled)

    async def _do(self, action: cm.Action) -> None:
        if isinstance(action, cm.Observe):
            self.post(
                await leader.observe(
                    self._store, action, self.fencer.gone, self.fencer.holds_nothing
                )
            )
        elif isinstance(action, cm.Commit):
            self.post(await leader.commit(self._store, action))
        elif isinstance(action, cm.Fence):
            self.fencer.start_fence(action.incarnation)
        elif isinstance(action, cm.Wake):
            self._loop.call_later(action.after, self._tick)
        elif isinstance(action, cm.Resign):
            self.fencer.cancel_all()
        elif isinstance(action, cm.Claim):
            self._background(self._claim())
        elif isinstance(action, cm.GiveBack):
            self._background(self._election.give_back())

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

    async def _watch_management(self) -> None:
        """Check the management API can fence; while leading, also read each bucket queue's
        depth (the lag) for the metrics."""
        while True:
            await asyncio.sleep(MANAGEMENT_SECONDS)
            await self.fencer.probe()
            if self.role is Role.LEADER:  # over the count last read (a resize grows it)
                topology = replace(self.topology, buckets=self._store.buckets)
                await read_depths(self.metrics, self.fencer.management, topology)

    # ------------------------------------------------------------ election
    def _standing_by(self) -> bool:
        return self.role is Role.CANDIDATE

    def _won(self) -> None:
        self.post(cm.LockAcquired())

    async def _claim(self) -> None:
        self.post(await leader.claim(self._store, self.me))

    async def _resign(self, why: str) -> None:
        """Stopping: fences under way are abandoned and the lock goes back, bounded (the
        session, and the lock node with it, ends when the process closes its client)."""
        self.fencer.cancel_all()
        if self.machine.role is not Role.CANDIDATE:
            self.machine.handle(cm.StepDown(why), time.monotonic())
        await self._election.resign()
