"""Tooling that is not installed with the package: the deterministic simulator (``sim``), the
chaos run (``chaos``), the benchmarks (``bench``), the demo of ``make run`` (``demo``), the one
process launcher, the one checker of what handlers executed, and the servers' script."""

import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository's root
SERVICES_SCRIPT = ROOT / "tools" / "services.sh"  # starts, stops and kills the test servers


def say(text: str) -> None:
    """One line of a tool's progress, with the time of day."""
    print(f"{time.strftime('%H:%M:%S')}  {text}", flush=True)
