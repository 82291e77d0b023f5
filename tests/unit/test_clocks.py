"""No decision of hashq reads the wall clock: every timeout, deadline and pause is measured on
the monotonic clock, which a step of the host's clock (NTP, an operator) does not move. The
chaos run steps workers' and the leader's wall clocks by minutes (tools/chaos/clock.py), but a
step only matters if it lands while a timer runs; this reads the code for what a run might
miss. The wall clock is read only for what is shown to people."""

from __future__ import annotations

import ast
from pathlib import Path

from tools import ROOT

PACKAGES = [ROOT / "hashq", ROOT / "coordinator" / "hashq_coordinator"]
WALL_CLOCK = {("time", "time"), ("time", "time_ns"), ("datetime", "now"), ("datetime", "utcnow")}
# Timestamps in dead-letter headers (x-hashq-first-failure, x-hashq-last-failure), for people.
# And when a hot key stepped aside, in its parked record (``hashq parked list``).
SHOWN_TO_PEOPLE = {"hashq/worker/jobs.py", "hashq/worker/dead_letter.py", "hashq/worker/parking.py"}


def _wall_clock_reads(path: Path) -> list[int]:
    """Lines of ``path`` that call time.time(), time.time_ns(), datetime.now() or utcnow()."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
            if (name, node.func.attr) in WALL_CLOCK:
                lines.append(node.lineno)
    return lines


def test_no_decision_reads_the_wall_clock() -> None:
    found = {
        f"{path.relative_to(ROOT)}:{line}"
        for package in PACKAGES
        for path in sorted(package.rglob("*.py"))
        if str(path.relative_to(ROOT)) not in SHOWN_TO_PEOPLE
        for line in _wall_clock_reads(path)
    }
    assert found == set(), "the wall clock steps; measure time on time.monotonic()"


def test_the_allowed_reads_are_still_there() -> None:
    """So that the list above cannot outlive what it allows."""
    for name in SHOWN_TO_PEOPLE:
        assert _wall_clock_reads(ROOT / name), name
