"""Wall-clock steps for the chaos run's processes, through libfaketime (Debian's ``faketime``).

Each worker and coordinator starts with libfaketime preloaded and a timestamp file of its own
holding ``+0``; a clock fault writes an offset of plus or minus minutes into one process's file
(libfaketime reads it again within a second) and ``+0`` at the heal. Only ``CLOCK_REALTIME``
steps, as it does when NTP or an operator steps a host's clock; ``CLOCK_MONOTONIC`` cannot step
on Linux, and libfaketime leaves it alone (``FAKETIME_DONT_FAKE_MONOTONIC``).

libfaketime 0.9.10 makes ``clock_nanosleep`` fail with EINVAL when the monotonic clock is not
faked, which breaks ``time.sleep``; ``tools/chaos/faketime/sitecustomize.py`` gives such
processes a ``time.sleep`` that waits in ``select`` instead. Nothing else is replaced."""

from __future__ import annotations

import glob
import os
import time
from pathlib import Path

SHIM = Path(__file__).resolve().parent / "faketime"
# The true wall clock at monotonic zero, which every process of the machine shares: execution
# records take their times from it, so that a stepped process still records true times.
OFFSET_VARIABLE = "HASHQ_CHAOS_CLOCK_OFFSET"


def true_offset() -> float:
    """The true wall clock minus the monotonic one (the harness's, passed to its children)."""
    given = os.environ.get(OFFSET_VARIABLE)
    return float(given) if given else time.time() - time.monotonic()


def libfaketime() -> str | None:
    """The library's path, or None where the package is not installed."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return found[0] if found else None


class Clocks:
    """One timestamp file per process, in ``folder``."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self.library = libfaketime()
        self.offsets: dict[str, float] = {}

    def environment(self, process: str) -> dict[str, str]:
        """The variables that put ``process`` under a clock of its own (none without the
        library)."""
        if self.library is None:
            return {}
        stamp = self._file(process)
        stamp.write_text("+0\n")
        path = os.pathsep.join(p for p in (str(SHIM), os.environ.get("PYTHONPATH", "")) if p)
        return {
            "LD_PRELOAD": self.library,
            "FAKETIME_TIMESTAMP_FILE": str(stamp),
            "FAKETIME_CACHE_DURATION": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "PYTHONPATH": path,
        }

    def step(self, process: str, seconds: float) -> bool:
        """Step ``process``'s wall clock by ``seconds`` from true time; whether it could."""
        stamp = self._file(process)
        if self.library is None or not stamp.exists():
            return False
        stamp.write_text(f"{seconds:+.0f}\n")
        self.offsets[process] = seconds
        return True

    def heal(self, process: str) -> None:
        if self.offsets.pop(process, None) is not None:
            self._file(process).write_text("+0\n")

    def _file(self, process: str) -> Path:
        return self._folder / f"clock-{process}"
