"""Figures from what the benchmark consumers recorded (``tools.bench.probe`` lines): pure
functions, no servers.

A line covers one interval of one consumer: ``buckets`` maps a bucket to ``[count, first
start, last start, publish time of the first]`` within the interval (records older than the
fourth field have three), ``latency`` holds sampled seconds from publish to handler start.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tools.executions import read_appended

Line = dict[str, Any]


def read_stats(path: Path) -> list[Line]:
    return read_appended(path)


def consumed(lines: Iterable[Line]) -> int:
    return sum(entry[0] for line in lines for entry in line["buckets"].values())


def last_start(lines: Iterable[Line]) -> float:
    return max((entry[2] for line in lines for entry in line["buckets"].values()), default=0.0)


def percentile(values: list[float], share: float) -> float:
    """The ``share`` (0..1) percentile, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def latency_ms(lines: Iterable[Line], since: float, until: float) -> dict[str, float]:
    samples = [
        value * 1000 for line in lines if since <= line["t0"] < until for value in line["latency"]
    ]
    if not samples:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "samples": 0}
    return {
        "p50_ms": round(percentile(samples, 0.5), 2),
        "p99_ms": round(percentile(samples, 0.99), 2),
        "samples": len(samples),
    }


def starts(lines: Iterable[Line], bucket: int, worker: str | None = None) -> list[float]:
    """Known start times (each interval's first and last) of ``bucket``, by ``worker``."""
    found: list[float] = []
    for line in lines:
        entry = line["buckets"].get(str(bucket))
        if entry is not None and (worker is None or line["worker"] == worker):
            found.extend((entry[1], entry[2]))
    return sorted(found)


def held(lines: Iterable[Line], worker: str, since: float, until: float) -> set[int]:
    """The buckets ``worker`` started messages of between ``since`` and ``until``."""
    return {
        int(bucket)
        for line in lines
        if line["worker"] == worker and line["t1"] >= since and line["t0"] <= until
        for bucket, entry in line["buckets"].items()
        if since <= entry[2] and entry[1] <= until
    }


def handover_gaps(lines: list[Line], moved: Iterable[int], old: str, new: str) -> list[float]:
    """Per moved bucket: the old owner's last start to the new owner's first start, seconds.
    It counts the time the bucket had nothing to run too (at 10 messages a second per bucket,
    about 0.1 s on average), so it overstates the handover at low rates."""
    gaps = []
    for bucket in moved:
        before, after = starts(lines, bucket, old), starts(lines, bucket, new)
        if before and after:
            gaps.append(after[0] - before[-1])
    return gaps


def handover_pauses(lines: list[Line], moved: Iterable[int], old: str, new: str) -> list[float]:
    """Per moved bucket, how long the first message the new owner started waited for the
    handover: from the old owner's last start, or from its publish if it came later, to its
    start (seconds). It includes that message's ordinary latency, a few milliseconds."""
    pauses = []
    for bucket in moved:
        before, first = starts(lines, bucket, old), _first_start(lines, bucket, new)
        if before and first is not None:
            started, published = first
            pauses.append(started - max(before[-1], published))
    return pauses


def _first_start(lines: Iterable[Line], bucket: int, worker: str) -> tuple[float, float] | None:
    """``worker``'s first start of ``bucket`` and that message's publish time (or -inf)."""
    entries = [
        line["buckets"][str(bucket)]
        for line in lines
        if line["worker"] == worker and str(bucket) in line["buckets"]
    ]
    if not entries:
        return None
    first = min(entries, key=lambda entry: entry[1])
    return first[1], first[3] if len(first) > 3 else float("-inf")


def recovery_times(
    lines: list[Line], buckets: Iterable[int], after: float, victim: str
) -> list[float]:
    """Per bucket: from ``after`` to its first start by a worker other than ``victim``."""
    times = []
    for bucket in buckets:
        others = [
            entry[1]
            for line in lines
            if line["worker"] != victim
            and (entry := line["buckets"].get(str(bucket)))
            and entry[1] >= after
        ]
        if others:
            times.append(min(others) - after)
    return times


def rate(lines: Iterable[Line], buckets: set[int], since: float, until: float) -> float:
    """Messages per second started in ``buckets`` in the intervals that begin within
    [since, until): intervals are short (``INTERVAL``), so the edges even out."""
    count = sum(
        entry[0]
        for line in lines
        if since <= line["t0"] < until
        for bucket, entry in line["buckets"].items()
        if int(bucket) in buckets
    )
    return count / (until - since) if until > since else 0.0


def median(values: list[float]) -> float:
    return float(statistics.median(values))
