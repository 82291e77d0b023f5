"""The checker of what handlers recorded: one JSON line per execution with at least ``key``,
``seq`` (the message's number within its key, from 0 in publish order), ``start``, ``end`` and
``outcome``. It reads only those records, not the code that produced them."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hashq.admin.jobs_file import read_appended


@dataclass
class Report:
    """What the records say about order, overlap and loss."""

    executions: int = 0
    missing: list[tuple[str, int]] = field(default_factory=list)
    skipped_ahead: list[str] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    repeats: list[dict[str, Any]] = field(default_factory=list)


def read_records(path: Path) -> list[dict[str, Any]]:
    return read_appended(path)


def check(path: Path, expected: dict[str, int]) -> Report:
    """``expected``: key -> number of messages, numbered 0..n-1 in publish order.

    - missing: a message with no successful execution;
    - skipped_ahead: an execution of seq n before any execution of n-1 (reordering);
    - overlaps: two executions of one key overlapping in time;
    - repeats: executions of a seq already executed (at-least-once redeliveries).
    """
    report = Report()
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in read_records(path):
        if record["outcome"] == "ok":
            by_key[record["key"]].append(record)
            report.executions += 1
    for key, count in expected.items():
        runs = sorted(by_key.get(key, []), key=lambda r: r["start"])
        done: set[int] = set()
        latest: dict[str, Any] | None = None  # the run that ends last so far
        for run in runs:
            if latest is not None and run["start"] < latest["end"]:
                report.overlaps.append(f"{key}: {latest['seq']} and {run['seq']}")
            if latest is None or run["end"] > latest["end"]:
                latest = run
        for run in runs:
            seq = run["seq"]
            if seq in done:
                report.repeats.append(run)
            elif seq > 0 and seq - 1 not in done:
                report.skipped_ahead.append(f"{key}: {seq} before {seq - 1}")
            done.add(seq)
        report.missing.extend((key, seq) for seq in range(count) if seq not in done)
    return report
