"""Virtual time: one heap of timed callbacks, run one at a time in (time, order) order, and the
seeded random source every choice is drawn from. Nothing reads a real clock, so a seed replays
exactly."""

from __future__ import annotations

import heapq
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from tools.checker import Violation

__all__ = ["POLL_SECONDS", "Violation", "World"]

log = logging.getLogger("sim")

POLL_SECONDS = 0.25  # how often ``World.when`` looks


@dataclass(order=True)
class _Timer:
    when: float
    order: int
    action: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)


class World:
    current: World | None = None  # the one running (for log lines on virtual time)

    def __init__(self, seed: int) -> None:
        World.current = self
        self.rng = random.Random(seed)
        self.now = 0.0
        self.steps = 0
        self._heap: list[_Timer] = []
        self._order = 0
        self.trace: list[str] = []  # what happened, newest last (for a failing seed's report)
        self._ids = 0

    def unique(self) -> int:
        """A number never given before in this run (incarnations are unique for good, as the
        random ones of production are)."""
        self._ids += 1
        return self._ids

    def after(self, delay: float, action: Callable[[], None]) -> _Timer:
        self._order += 1
        timer = _Timer(self.now + max(0.0, delay), self._order, action)
        heapq.heappush(self._heap, timer)
        return timer

    def when(self, condition: Callable[[], bool], then: Callable[[], None]) -> None:
        """``then`` once ``condition`` holds, looked at now and every ``POLL_SECONDS`` of
        virtual time (for faults and restarts that wait on the cluster's state)."""
        if condition():
            then()
        else:
            self.after(POLL_SECONDS, lambda: self.when(condition, then))

    def latency(self, low: float = 0.0005, high: float = 0.01) -> float:
        return self.rng.uniform(low, high)

    def note(self, text: str) -> None:
        self.trace.append(f"{self.now:9.3f} {text}")
        log.info("%s", text)

    def run_until(self, end: float, each: Callable[[], None] | None = None) -> None:
        """Run callbacks due before ``end``; ``each`` runs after every one (the invariants)."""
        while self._heap and self._heap[0].when <= end:
            timer = heapq.heappop(self._heap)
            if timer.cancelled:
                continue
            self.now = timer.when
            self.steps += 1
            timer.action()
            if each is not None:
                each()
        self.now = max(self.now, end)
