"""Detecting that the worker process itself was paused (docs/protocol.md, "Detecting that the
worker itself was paused"): a process stopped (SIGSTOP, a long GC, a starved VM) may come back
after its session expired, holding deliveries it must not start. A tick that comes much too
late means such a pause: start nothing until ZooKeeper confirms the session."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

TICK_SECONDS = 0.1


class PauseWatch:
    def __init__(self, session_timeout: float, paused: Callable[[float], None]) -> None:
        self._last_tick = time.monotonic()
        self._limit = max(0.5, session_timeout / 4)
        self._paused = paused  # told how long the pause was, after the runners were paused

    async def run(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            now = time.monotonic()
            last = self._last_tick
            if now - last > self._limit:
                # Pause first, then let runners see a fresh tick: never the other way round.
                self._paused(now - last)
            self._last_tick = now

    def awake(self) -> bool:
        """False if the watchdog has not ticked for longer than a pause (checked by runners
        before they start a job)."""
        return time.monotonic() - self._last_tick <= self._limit
