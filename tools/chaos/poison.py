"""Poison keys in the chaos run (hashq only): a few keys whose handler fails for a while, so that
hashq parks them (``HASHQ_ON_FAILURE=park``) while the faults go on.

Each poison key is broken from the start. Part way through the run the harness mends it (the
handler stops failing) and releases it, as an operator would (``hashq parked release``); later it
breaks it again, and once the faults end it mends and releases every one, again and again until
none is parked. The checker then judges their messages like any other key's: every confirmed
message executed, in publish order, never two at once in one epoch. A failed execution is
recorded with ``outcome: failed`` and the checker leaves it out (``tools.checker.judge``).
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hashq.admin.parked import change_state
from hashq.errors import ConfigError
from hashq.parked import ParkedState
from hashq.settings import Settings
from hashq.topology import Topology
from tools import say

POISON_VARIABLE = "HASHQ_CHAOS_POISON"  # the file naming the keys whose handler fails now
MEND_SETTLES = 2.0  # seconds after a mend before the release: a failure begun before it lands


class Poisoned(Exception):
    """What the chaos handler raises for a poison key."""


def worker_env(path: Path) -> dict[str, str]:
    """A poison key parks after two quick attempts."""
    return {
        "HASHQ_ON_FAILURE": "park",
        "HASHQ_MAX_ATTEMPTS": "2",
        "HASHQ_RETRY_BASE_DELAY": "0.05",
        "HASHQ_RETRY_MAX_DELAY": "0.1",
        POISON_VARIABLE: str(path),
    }


class PoisonFile:
    """The handler's side: is a key poisoned now? Read again only when the file changed."""

    def __init__(self) -> None:
        self._path = os.environ.get(POISON_VARIABLE)
        self._seen: tuple[int, int] | None = None
        self._keys: frozenset[str] = frozenset()

    def check(self, key: str) -> None:
        if self._path is None:
            return
        try:
            stat = os.stat(self._path)
        except FileNotFoundError:
            return
        if (stat.st_mtime_ns, stat.st_size) != self._seen:
            with open(self._path) as text:
                self._keys = frozenset(text.read().split())
            self._seen = (stat.st_mtime_ns, stat.st_size)
        if key in self._keys:
            raise Poisoned(f"key {key} is poisoned by the chaos run")


@dataclass
class Step:
    at: float  # seconds into the run
    what: str  # "mend" (and release) or "break"
    key: str


class Poisons:
    """The harness's side: the poison keys' schedule, carried out on ``tick``."""

    def __init__(
        self, settings: Settings, folder: Path, keys: list[str], duration: float, seed: int
    ) -> None:
        self.settings, self.keys = settings, keys
        self.path = folder / "poisoned"
        self.broken = set(keys)
        rng = random.Random(seed)
        self.plan = sorted(
            (step for key in keys for step in _steps(rng, key, duration)), key=lambda s: s.at
        )
        self.releases: dict[str, int] = dict.fromkeys(keys, 0)  # releases that found it parked
        self._to_release: dict[str, float] = {}  # key -> when its mend settled
        self._write()

    def _write(self) -> None:
        staged = self.path.with_suffix(".new")
        staged.write_text("".join(f"{key}\n" for key in sorted(self.broken)))
        staged.replace(self.path)  # the handler reads the whole list, or the one before

    async def tick(self, elapsed: float) -> None:
        while self.plan and self.plan[0].at <= elapsed:
            step = self.plan.pop(0)
            if step.what == "break":
                self.broken.add(step.key)
                self._to_release.pop(step.key, None)
            else:
                self.broken.discard(step.key)
                self._to_release[step.key] = elapsed + MEND_SETTLES
            self._write()
            say(f"chaos: poison key {step.key} {'broken' if step.what == 'break' else 'mended'}")
        for key, due in list(self._to_release.items()):
            if due <= elapsed and await self._release(key) is not None:
                del self._to_release[key]

    def mend_all(self, elapsed: float) -> None:
        """The faults ended: no key fails any more, and each is released until none is parked."""
        self.plan.clear()
        self._to_release = dict.fromkeys(self.keys, elapsed + MEND_SETTLES)
        self.broken.clear()
        self._write()

    async def release_parked(self, elapsed: float) -> None:
        """Release every poison key found parked (a failure that began before its mend parks it
        again after its release); called while the run drains."""
        for key in self.keys:
            if key not in self.broken and key not in self._to_release:
                self._to_release[key] = elapsed
        await self.tick(elapsed)

    async def _release(self, key: str) -> bool | None:
        """True: released; False: not parked; None: ZooKeeper did not answer (a fault)."""
        try:
            await change_state(self.settings, key, ParkedState.RELEASING)
        except ConfigError:
            return False
        except Exception as exc:
            logging.getLogger(__name__).debug("releasing %s: %r", key, exc)
            return None
        self.releases[key] += 1
        return True

    def parking_queues(self) -> list[str]:
        topology = Topology.from_settings(self.settings)
        return [topology.parking_queue(key) for key in self.keys]

    def report(self, logs: Path) -> dict[str, Any]:
        said = [path.read_text(errors="replace") for path in logs.glob("worker-*.log")]
        return {
            "keys": self.keys,
            "released": self.releases,
            "parked_failed": sum(text.count("a key is parked") for text in said),
            "hot_steps_aside": sum(text.count("a hot key steps aside") for text in said),
            "flowed_again": sum(text.count("a parked key flows again") for text in said),
        }


def _steps(rng: random.Random, key: str, duration: float) -> list[Step]:
    """Mended in the run's first half, broken again in its second (then mended at its end)."""
    mend = rng.uniform(0.2, 0.5) * duration
    return [Step(mend, "mend", key), Step(rng.uniform(0.6, 0.8) * duration, "break", key)]


def draw_keys(seed: int, keys_per_publisher: int, count: int) -> list[str]:
    """``count`` of the publishers' keys (``tools.chaos.publish`` names them ``p<n>-<NNNNN>``)."""
    rng = random.Random(seed * 7919)
    drawn = rng.sample(range(2 * keys_per_publisher), min(count, 2 * keys_per_publisher))
    return [f"p{1 + n % 2}-{n // 2:05d}" for n in drawn]
