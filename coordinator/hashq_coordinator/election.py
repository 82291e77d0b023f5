"""The election: one ZooKeeper lock (kazoo's recipe: ephemeral sequential nodes under
``/hashq/<app>/election``) that a coordinator holds from before it claims the lead until it
gives the lead up. I/O only: whether to campaign, and what holding the lock leads to, is
``hashq_coordinator.machine.core.CoordinatorMachine``'s decision.

What is safe in each state:
- not holding: campaign; nothing of the lead may be done;
- holding: the machine may claim the lead (``Claim``); a claim that fails, or a lead that ends,
  gives the lock back (``give_back``) before the next campaign, so that another coordinator
  can win meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.recipe.lock import Lock

log = logging.getLogger(__name__)

RETRY_SECONDS = 1.0  # between failed campaigns, and before campaigning again after giving back


class Election:
    """This coordinator's lock in the election of ``path``."""

    def __init__(self, zk: KazooClient, path: str, me: str, what: str) -> None:
        self._zk = zk
        self._path = path
        self._me = me
        self._what = what  # said in the log: "the leadership of app 'x'"
        self._lock: Lock | None = None

    async def campaign(self, standing_by: Callable[[], bool], won: Callable[[], None]) -> None:
        """Forever: whenever ``standing_by()`` and the lock is not held, wait for the lock;
        ``won()`` once it is held."""
        while True:
            if not standing_by() or self._lock is not None:
                await asyncio.sleep(0.5)
                continue
            lock = self._zk.Lock(self._path, self._me)
            log.info("coordinator %s: standing by for %s", self._me, self._what)
            try:
                await asyncio.to_thread(lock.acquire)
            except asyncio.CancelledError:
                lock.cancel()  # ends the acquire still waiting in its thread
                raise
            except Exception as exc:
                log.warning("coordinator %s: campaign failed (%r); retrying", self._me, exc)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            self._lock = lock
            won()

    async def give_back(self) -> None:
        """Release the held lock, retrying until ZooKeeper takes it (once the session is gone,
        so is the lock node, and the release succeeds at once); only then campaign again."""
        lock = self._lock
        while lock is not None:
            try:
                await asyncio.wait_for(asyncio.to_thread(lock.release), 5)
                break
            except Exception as exc:
                log.warning("coordinator %s: releasing the lock failed (%r)", self._me, exc)
                await asyncio.sleep(RETRY_SECONDS)
        await asyncio.sleep(RETRY_SECONDS)  # a claim that keeps failing is not retried in a loop
        if self._lock is lock:
            self._lock = None

    async def resign(self) -> None:
        """Stopping: give the lock back once, bounded (the session, and the lock node with it,
        ends when the process closes its client anyway)."""
        lock, self._lock = self._lock, None
        if lock is not None:
            try:
                await asyncio.wait_for(asyncio.to_thread(lock.release), 5)
            except Exception as exc:
                log.debug("releasing the lock: %r", exc)
