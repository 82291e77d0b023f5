"""The coordinator: one loop that waits on its triggers (stop, a change of workers or releases,
a session change, a finished fence, a tick) and, while it leads, takes one handover step.

Any number of coordinators may run; one leads, through a ZooKeeper lock, and the others stand
by. All state lives in ZooKeeper, so a new leader continues from it, including a handover that
was half done. Every write of the leader checks the leader node's version (see ``store``).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import socket
import time
import uuid
from dataclasses import replace

from kazoo.client import KazooClient, KazooState
from kazoo.recipe.lock import Lock
from kazoo.recipe.watchers import ChildrenWatch

from coordinator.fencing import Fencer
from coordinator.handover import Incarnation, View, assignments, committed_owners, step
from coordinator.planner import plan
from coordinator.settings import CoordinatorSettings
from coordinator.store import Deposed, Member, Store
from hashq.health import health_endpoints
from hashq.metrics import CoordinatorMetrics
from hashq.protocol import PROTOCOL_VERSION, Assignment, BucketRecord, Paths, Registration
from hashq.provision import ensure_topology
from hashq.topology import Topology
from hashq.zk import close_zk, connect_zk

log = logging.getLogger(__name__)

TICK_SECONDS = 0.5
DEPTH_SECONDS = 5.0  # how often the leader reads the queues' depth for the metrics


class Role(enum.Enum):
    CANDIDATE = "candidate"
    """Waiting for the lock: writes nothing."""
    LEADER = "leader"
    """Holds the lock and the current leader epoch: the only one that writes decisions."""
    STOPPED = "stopped"


class Coordinator:
    def __init__(self, settings: CoordinatorSettings) -> None:
        self.settings = settings
        self.me = settings.coordinator_id or (
            f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"
        )
        self.role = Role.CANDIDATE
        self._paths = Paths(settings.app)
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._zk: KazooClient | None = None
        self._store: Store | None = None
        self._lock: Lock | None = None
        self._leader_version = 0
        self._leader_epoch = 0
        self._records: dict[int, BucketRecord] = {}
        self._written: dict[str, Assignment] = {}
        self._members: set[Incarnation] = set()
        self._changed_at = 0.0
        self._refused: set[Incarnation] = set()  # registrations of a newer protocol
        self.metrics = CoordinatorMetrics()
        self.fencer = Fencer(settings, self.me, self.metrics, self._wake.set)
        self._measure()

    def _measure(self) -> None:
        """Gauges read when scraped."""
        in_transit = ("revoking", "fencing")
        self.metrics.leader.set_function(lambda: 1 if self.role is Role.LEADER else 0)
        self.metrics.zk_connected.set_function(lambda: 1 if self.zk_connected else 0)
        self.metrics.can_fence.set_function(lambda: 0 if self.fencer.cannot_fence else 1)
        self.metrics.workers.set_function(lambda: len(self._members))
        self.metrics.in_transit.set_function(
            lambda: sum(1 for r in self._records.values() if r.state in in_transit)
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

    # ------------------------------------------------------------ the loop
    async def run(self, stop: asyncio.Event) -> None:
        async with health_endpoints(self.settings, self.metrics.registry, self.readiness):
            await self._run(stop)

    async def _run(self, stop: asyncio.Event) -> None:
        topology = await ensure_topology(self.settings, check_bindings=False)
        await self.fencer.start(topology)
        zk = await asyncio.to_thread(connect_zk, self.settings)
        self._zk = zk
        self._store = Store(zk, self._paths, topology.buckets)
        zk.add_listener(self._on_session)
        ChildrenWatch(zk, self._paths.workers, self._on_children)
        ChildrenWatch(zk, self._paths.releases, self._on_children)
        campaign = asyncio.ensure_future(self._campaign())
        depths = asyncio.ensure_future(self._watch_management(topology))
        try:
            while not stop.is_set():
                if self.role is Role.LEADER:
                    await self._lead_once()
                await self._wait(stop)
        finally:
            campaign.cancel()
            depths.cancel()
            await asyncio.gather(campaign, depths, return_exceptions=True)
            await self._resign("stopping")
            self.role = Role.STOPPED
            await self.fencer.close()
            await asyncio.to_thread(close_zk, zk)

    async def _wait(self, stop: asyncio.Event) -> None:
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
        await asyncio.wait(waits, timeout=TICK_SECONDS, return_when="FIRST_COMPLETED")
        for waiter in waits:
            waiter.cancel()
        self._wake.clear()

    def _on_children(self, children: list[str]) -> None:
        self._loop.call_soon_threadsafe(self._wake.set)

    def _on_session(self, state: str) -> None:
        if state == KazooState.LOST:
            self._loop.call_soon_threadsafe(self._on_lost)
        self._loop.call_soon_threadsafe(self._wake.set)

    def _on_lost(self) -> None:
        if self.role is Role.LEADER:
            log.warning("coordinator %s: ZooKeeper session lost; no longer leader", self.me)
            self._demote()

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
        """Wait for the lock (a ZooKeeper lock recipe: ephemeral sequential nodes), then lead;
        campaign again after losing the lead."""
        assert self._zk is not None and self._store is not None
        while True:
            if self.role is Role.LEADER:
                await asyncio.sleep(TICK_SECONDS)
                continue
            lock = self._zk.Lock(self._paths.election, self.me)
            self._lock = lock
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
            try:
                leadership, version = await asyncio.to_thread(self._store.claim, self.me)
                records = await asyncio.to_thread(self._store.records)
                written = await asyncio.to_thread(self._store.assignments)
            except Exception as exc:
                # The lock is held: a new one would queue behind it for ever, so give it back.
                log.warning("coordinator %s: taking the lead failed (%r); retrying", self.me, exc)
                await self._give_back(lock)
                await asyncio.sleep(1.0)
                continue
            self._leader_epoch, self._leader_version = leadership.epoch, version
            self._records, self._written = _restarted_clocks(records), written
            self._changed_at = time.monotonic()
            self.role = Role.LEADER
            log.info(
                "coordinator %s: leader of app %r at leader epoch %d (%d buckets in transit)",
                self.me,
                self.settings.app,
                leadership.epoch,
                sum(1 for r in records.values() if r.state in ("revoking", "fencing")),
            )
            self._wake.set()

    async def _give_back(self, lock: Lock) -> None:
        """Release a held lock, retrying until ZooKeeper takes it (once the session is gone, so
        is the lock node, and the release succeeds at once)."""
        while True:
            try:
                await asyncio.wait_for(asyncio.to_thread(lock.release), 5)
                return
            except Exception as exc:
                log.warning("coordinator %s: releasing the lock failed (%r)", self.me, exc)
                await asyncio.sleep(1.0)

    def _demote(self) -> None:
        self.role = Role.CANDIDATE
        self._records, self._written = {}, {}
        self.fencer.cancel_all()

    async def _resign(self, why: str) -> None:
        if self._lock is not None:
            lock, self._lock = self._lock, None
            try:
                # Bounded: with ZooKeeper unreachable the lock goes with the session anyway.
                await asyncio.wait_for(asyncio.to_thread(lock.release), 5)
            except Exception as exc:
                log.debug("releasing the lock: %r", exc)
        if self.role is Role.LEADER:
            log.info("coordinator %s: gives up the lead (%s)", self.me, why)
        self._demote()

    # ------------------------------------------------------------ leading
    async def _lead_once(self) -> None:
        assert self._store is not None
        try:
            members = await asyncio.to_thread(self._store.workers)
            releases = await asyncio.to_thread(self._store.releases)
        except Exception as exc:
            log.warning("coordinator %s: reading state failed: %r", self.me, exc)
            return
        members = self._understood(members)
        live = {worker: member.registration for worker, member in members.items()}
        self._note_membership(members)
        settled = time.monotonic() - self._changed_at >= self.settings.settle
        view = View(
            buckets=self._store.buckets,
            records=self._records,
            workers=live,
            releases=frozenset(releases),
            fenced=self.fencer.covered(),
            now=time.monotonic(),
            revoke_timeout=self.settings.drain_timeout + self.settings.fence_grace,
            fence_grace=self.settings.fence_grace,
        )
        capacities = {worker: registration.capacity for worker, registration in live.items()}
        decision = step(view, plan(view.buckets, capacities, committed_owners(view)), settled)
        for bucket, (owner, waited) in decision.stuck.items():
            log.warning(
                "bucket %d: worker %s did not release within %.0fs; fencing it",
                bucket,
                owner,
                waited,
            )
        try:
            await self._commit(decision.records, live, releases)
        except Deposed as exc:
            log.warning("coordinator %s: %s; standing down", self.me, exc)
            await self._resign("deposed")
            return
        for incarnation in decision.fences:
            self.fencer.start_fence(incarnation)

    async def _commit(
        self,
        changed: dict[int, BucketRecord],
        live: dict[str, Registration],
        releases: dict[tuple[int, int], str],
    ) -> None:
        assert self._store is not None
        records = {**self._records, **changed}
        wanted = assignments(records, live, self._leader_epoch)
        updates = {w: a for w, a in wanted.items() if self._written.get(w) != a}
        removed = [w for w in self._written if w not in live]
        consumed = [
            name
            for (bucket, epoch), name in releases.items()
            if bucket not in records
            or epoch < records[bucket].epoch
            or records[bucket].state == "unassigned"
        ]
        if not (changed or updates or removed or consumed):
            return
        await asyncio.to_thread(
            self._store.commit,
            self._leader_version,
            changed,
            list(self._records),
            updates,
            list(self._written),
            removed,
            consumed,
        )
        for bucket, record in sorted(changed.items()):
            before = self._records.get(bucket, BucketRecord())
            _log_transition(bucket, before, record)
            if record.epoch > before.epoch:
                self.metrics.grants.inc()
        self._records = records
        self._written = {**{w: a for w, a in self._written.items() if w not in removed}, **updates}

    def _understood(self, members: dict[str, Member]) -> dict[str, Member]:
        """The workers whose protocol this coordinator speaks; a newer one gets nothing, since
        it may read grants differently. Said once per incarnation, at ERROR."""
        known = {}
        for worker, member in members.items():
            registration = member.registration
            if registration.version <= PROTOCOL_VERSION:
                known[worker] = member
            elif (worker, registration.incarnation) not in self._refused:
                self._refused.add((worker, registration.incarnation))
                log.error(
                    "worker %s speaks protocol version %d; this coordinator speaks %d: it gets "
                    "no buckets (upgrade the coordinators first)",
                    worker,
                    registration.version,
                    PROTOCOL_VERSION,
                )
        return known

    def _note_membership(self, members: dict[str, Member]) -> None:
        current = {(w, m.registration.incarnation) for w, m in members.items()}
        # Fence bookkeeping keeps incarnations that are live or still named by a bucket record.
        named = {(r.owner, r.incarnation) for r in self._records.values() if r.owner}
        keep = current | {(str(w), str(i)) for w, i in named}
        self.fencer.note({w: m.registration for w, m in members.items()}, keep)
        if current != self._members:
            joined = sorted(w for w, _ in current - self._members)
            left = sorted(w for w, _ in self._members - current)
            log.info(
                "workers: %d live (joined %s, left %s)", len(current), joined or "-", left or "-"
            )
            self._members = current
            self._changed_at = time.monotonic()


def _restarted_clocks(records: dict[int, BucketRecord]) -> dict[int, BucketRecord]:
    """Moving buckets' ``since`` restarted on this process's monotonic clock: the previous
    leader's clock means nothing here, so each pending revoke gets its full time again."""
    now = time.monotonic()
    moving = ("revoking", "fencing")
    return {b: replace(r, since=now) if r.state in moving else r for b, r in records.items()}


def _log_transition(bucket: int, before: BucketRecord, after: BucketRecord) -> None:
    where = f"{after.owner}" + (f" -> {after.target}" if after.target else "")
    log.info(
        "bucket %d: %s -> %s (%s, epoch %d)",
        bucket,
        before.state,
        after.state,
        where if after.owner else "no owner",
        after.epoch,
    )
