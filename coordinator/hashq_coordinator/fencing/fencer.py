"""The leader's fences: carrying them out, and whether it can fence at all.

A fence of an incarnation is done when every connection of it that could consume is closed:
- the broker says no connection of it is left (``hashq_coordinator.fencing.liveness``), at
  once; else
- the management API listed its connections once the newest announced one was listable, and
  each listed one was closed (``hashq_coordinator.fencing.cutoff``).

What each fence covered, and which connection each incarnation announced since when, is kept
by ``hashq_coordinator.machine.fencebook.FenceBook``, which the simulator drives too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from hashq._io.management import Management
from hashq.records import Registration
from hashq.topology import Topology
from hashq_coordinator.fencing.cutoff import fence, wait_until_listable
from hashq_coordinator.fencing.liveness import Liveness
from hashq_coordinator.machine.fencebook import FenceBook, Incarnation, Sighting
from hashq_coordinator.metrics import CoordinatorMetrics
from hashq_coordinator.settings import CoordinatorSettings

log = logging.getLogger(__name__)


class Fencer:
    def __init__(
        self,
        settings: CoordinatorSettings,
        me: str,
        metrics: CoordinatorMetrics,
        wake: Callable[[], None],
        book: FenceBook | None = None,
        on_done: Callable[[Incarnation, Sighting], None] | None = None,
        liveness: Liveness | None = None,
    ) -> None:
        self._settings = settings
        self._me = me
        self._metrics = metrics
        self._wake = wake
        self.management = Management(settings)
        self._liveness = liveness or Liveness(settings, Topology.from_settings(settings))
        self.book = book or FenceBook()
        # Told when a fence is done: the coordinator's machine records it in the book.
        self._on_done = on_done or (lambda i, s: self.book.done(i, s, time.monotonic()))
        self._fencing: dict[Incarnation, asyncio.Task[None]] = {}
        # Why fencing cannot work, as the probe and as the last fence found it: a probe that
        # passes does not clear a fence that still fails (nor the reverse).
        self._troubles: dict[str, str | None] = {"probe": None, "fence": None}
        self.cannot_fence: str | None = None  # the first of those reasons, if any

    async def close(self) -> None:
        self.cancel_all()
        await self._liveness.close()

    # ------------------------------------------------------------ what the leader saw
    def note(self, workers: Mapping[str, Registration], keep: set[Incarnation]) -> None:
        now = time.monotonic()
        self.book.note(workers, keep, now, now)

    def covered(self) -> frozenset[Incarnation]:
        return self.book.covered()

    def sighting(self, incarnation: Incarnation) -> Sighting:
        return self.book.sighting(incarnation, time.monotonic())

    # ------------------------------------------------------------ fencing
    def start_fence(self, incarnation: Incarnation) -> None:
        if incarnation not in self._fencing:
            self._fencing[incarnation] = asyncio.ensure_future(self._cut_off(incarnation))

    async def finished(self, incarnation: Incarnation) -> None:
        """Wait for the fence of ``incarnation`` under way, if any."""
        task = self._fencing.get(incarnation)
        if task is not None:
            await asyncio.shield(task)

    def cancel_all(self) -> None:
        for task in self._fencing.values():
            task.cancel()
        self._fencing.clear()

    async def _cut_off(self, incarnation: Incarnation) -> None:
        worker, life = incarnation
        try:
            covered = self.sighting(incarnation)
            listed = not await self._gone(incarnation)
            closed = 0  # unless listed: the broker says no connection of it is left
            if listed:
                covered = await wait_until_listable(
                    lambda: self.sighting(incarnation), self._settings.management_lag
                )
                gone = lambda: self._gone(incarnation)  # noqa: E731 - asked at each retry
                closed = await fence(self.management, worker, life, self.trouble, gone)
                self.trouble(None)  # done: this fence no longer says it cannot (the probe may)
            # A worker that stopped leaves no connection: no news (a rolling restart of 1,000
            # said it 1,000 times); one that had to be looked for in the listing is.
            log.log(
                logging.WARNING if listed else logging.INFO,
                "fenced worker %s incarnation %s (%s)",
                worker,
                life,
                f"{closed} connection(s) closed" if closed else "no connection left",
            )
            self._metrics.fences.inc()
            self._on_done(incarnation, covered)
        finally:
            if self._fencing.get(incarnation) is asyncio.current_task():
                del self._fencing[incarnation]
            self._wake()

    async def gone(self, worker: str, life: str) -> bool:
        """Whether the broker says the incarnation has no connection left (False: it has one,
        or the broker cannot be asked), for the crash rule's question."""
        return await self._gone((worker, life))

    async def holds_nothing(self, bucket: int) -> bool:
        """Whether the bucket queue proves it took back all a fenced owner held."""
        return await self._liveness.holds_nothing(bucket)

    async def _gone(self, incarnation: Incarnation) -> bool:
        """Whether the broker says the incarnation has no connection left; only asked of
        workers that hold a liveness queue."""
        if not self.sighting(incarnation).liveness:
            return False
        return await self._liveness.gone(*incarnation)

    # ------------------------------------------------------------ can it fence at all
    async def probe(self) -> None:
        """Whether the management API lists connections, which closing a live worker's needs:
        checked at start and every few seconds, for readiness and metrics."""
        try:
            await asyncio.to_thread(self.management.can_list_connections)
        except Exception as exc:
            self.trouble(f"the management API does not list connections: {exc}", "probe")
        else:
            self.trouble(None, "probe")

    def trouble(self, problem: str | None, found_by: str = "fence") -> None:
        """Record whether fencing works, as the probe or a fence (``found_by``) found it; said
        once when it stops working and once when it works again, not at every retry."""
        self._troubles[found_by] = problem
        why = next((reason for reason in self._troubles.values() if reason), None)
        if why and not self.cannot_fence:
            log.error(
                "coordinator %s cannot fence: %s; a stuck worker's buckets stay where they are, "
                "and a dead one's move only once the broker has dropped its connection, until "
                "the management API answers (HASHQ_MANAGEMENT_URL)",
                self._me,
                why,
            )
        elif why is None and self.cannot_fence:
            log.info("coordinator %s: the management API answers; fencing works again", self._me)
        self.cannot_fence = why
