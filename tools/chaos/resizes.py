"""Resizes in the chaos run (hashq only): ``hashq resize --buckets N`` for each count of
``--resize`` (say ``24,64`` from 16), under the load and the faults. The first is killed with
-9 once it says its markers are out (old buckets still finishing) and run again; any run that
ends otherwise than with exit status 0 (a server restarted under it, or a refusal while a
poison key that would move is parked) is run again 5 s later, until the app has the count. The
checker then judges every key as usual: a key that moved must have run its messages in order
across its old and new bucket.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from tools import say
from tools.launcher import Fleet

MARKERS_OUT = "markers sent"
AGAIN_AFTER = 5.0  # seconds before a run that failed (a server restarting, a refusal) is repeated


@dataclass
class Resize:
    count: int
    at: float  # seconds into the run
    runs: int = 0
    killed: int = 0
    started: float | None = None  # monotonic, of the first run
    took: float | None = None  # seconds from the first run's start to the count committed


class Resizes:
    def __init__(self, fleet: Fleet, counts: list[int], duration: float) -> None:
        self._fleet = fleet
        self._todo = [
            Resize(count, duration * (n + 1) / (len(counts) + 1)) for n, count in enumerate(counts)
        ]
        self._running: str | None = None
        self._again_at = 0.0  # monotonic: not before then

    async def follow(self) -> None:
        """Tick every 0.2 s until every resize is done (the kill at the barrier must not miss
        a barrier that passes quickly)."""
        started = time.monotonic()
        while not self.done:
            self.tick(time.monotonic() - started)
            await asyncio.sleep(0.2)

    def tick(self, elapsed: float) -> None:
        """Start the next resize when its time came, kill the first one at its barrier once,
        and run again one that ended without finishing."""
        current = next((r for r in self._todo if r.took is None), None)
        if current is None or (current.runs == 0 and elapsed < current.at):
            return
        name = self._running
        process = self._fleet.processes.get(name) if name else None
        if process is None:
            if time.monotonic() >= self._again_at:
                self._start(current)
            return
        if process.alive:
            if current is self._todo[0] and current.killed == 0 and MARKERS_OUT in process.output():
                process.kill()
                current.killed += 1
                say(f"chaos: {name} killed with -9 at its barrier; running it again")
            return
        if process.wait(0) == 0:
            assert current.started is not None
            current.took = time.monotonic() - current.started
            say(f"chaos: the app has {current.count} buckets ({current.took:.1f}s)")
            self._running = None
            return
        self._running, self._again_at = None, time.monotonic() + AGAIN_AFTER

    def _start(self, resize: Resize) -> None:
        resize.runs += 1
        resize.started = resize.started or time.monotonic()
        self._running = f"resize-{resize.count}-{resize.runs}"
        argv = ["-m", "hashq.admin.cli", "resize", "--buckets", str(resize.count)]
        self._fleet.start(self._running, *argv)
        say(f"chaos: hashq resize --buckets {resize.count} (run {resize.runs})")

    @property
    def done(self) -> bool:
        return all(r.took is not None for r in self._todo)

    @property
    def final_count(self) -> int | None:
        finished = [r.count for r in self._todo if r.took is not None]
        return max(finished) if finished else None

    def report(self) -> list[dict[str, Any]]:
        return [
            {"buckets": r.count, "runs": r.runs, "killed": r.killed, "seconds": r.took}
            for r in self._todo
        ]
