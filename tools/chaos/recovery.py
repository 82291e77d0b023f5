"""Time from each fault until every bucket it affected processed again, from the fault log and
the execution records alone.

- a worker killed, stopped or terminated: the buckets it executed in the ``WINDOW`` seconds
  before the fault; recovered when another worker starts a message there;
- a worker started: recovered when it starts its first message (how soon a newcomer gets to
  work; the buckets it receives later, in other rebalances, do not count);
- a leader killed, a server restarted, a link cut, held or slowed: every bucket active in the
  window; recovered at the first start after the fault ended (``until``), counted from the
  fault's beginning. For a fault that lasts, ``after_heal_s`` counts from its end instead:
  how long the buckets took to make progress again once it healed.

A bucket with no such execution within ``HORIZON`` seconds counts as unrecovered.

``stalls``: for each bucket, the longest stretch between two starts, with the faults in force
meanwhile. The publishers send to every bucket all the time, so a bucket that starts nothing
has messages waiting (unless the publishers themselves are held up, as in a broker restart).
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections import defaultdict
from typing import Any

WINDOW = 5.0
HORIZON = 120.0
LEAVING = ("kill -9 worker", "SIGTERM worker", "SIGSTOP worker")


class Timeline:
    """Executions by bucket, sorted by start."""

    def __init__(self, executions: list[dict[str, Any]]) -> None:
        runs: dict[Any, list[tuple[float, str]]] = defaultdict(list)
        for run in executions:
            runs[run["bucket"]].append((run["start"], run["worker"]))
        self.runs = {bucket: sorted(items) for bucket, items in runs.items()}
        self.starts = {bucket: [start for start, _ in items] for bucket, items in self.runs.items()}

    def active(self, since: float, until: float, worker: str | None = None) -> set[Any]:
        found = set()
        for bucket, items in self.runs.items():
            first = bisect.bisect_left(self.starts[bucket], since)
            for start, who in items[first:]:
                if start > until:
                    break
                if worker is None or who == worker:
                    found.add(bucket)
                    break
        return found

    def first(self, bucket: Any, after: float, accept: Any) -> float | None:
        items = self.runs.get(bucket, [])
        for start, who in items[bisect.bisect_right(self.starts.get(bucket, []), after) :]:
            if start > after + HORIZON:
                return None
            if accept(who):
                return start
        return None


def recovery(fault: dict[str, Any], timeline: Timeline) -> dict[str, Any]:
    """The affected buckets of one fault and how long until each processed again."""
    at, target = fault["wall"], fault["target"]
    if fault["fault"] in LEAVING:
        buckets = timeline.active(at - WINDOW, at, target)
        times = [timeline.first(b, at, lambda who: who != target) for b in buckets]
    elif fault["fault"] == "start worker":
        buckets = timeline.active(at, at + HORIZON, target)
        firsts = [t for b in buckets if (t := timeline.first(b, at, lambda who: who == target))]
        times = [min(firsts)] if firsts else [None]
    else:
        buckets = timeline.active(at - WINDOW, at)
        times = [timeline.first(b, fault.get("until", at), lambda _: True) for b in buckets]
    delays = [round(t - at, 2) for t in times if t is not None]
    result = {
        "fault": fault["fault"],
        "target": target,
        "at": fault["at"],
        "buckets": len(buckets),
        "recovered_s": max(delays) if delays else None,
        "unrecovered": sum(1 for t in times if t is None),
    }
    if "until" in fault and delays:
        result["after_heal_s"] = round(max(0.0, at + max(delays) - fault["until"]), 2)
    return result


def stalls(
    faults: list[dict[str, Any]], timeline: Timeline, worst: int = 5
) -> list[dict[str, Any]]:
    """The ``worst`` buckets by their longest stretch without a start, with what was in force."""
    longest = []
    for bucket, starts in timeline.starts.items():
        gaps = [(b - a, a, b) for a, b in itertools.pairwise(starts)]
        if gaps:
            longest.append((max(gaps), bucket))
    found = []
    for (seconds, began, ended), bucket in sorted(longest, reverse=True)[:worst]:
        causes = [
            f"{f['fault']} {f['target']}".rstrip()
            for f in faults
            if f["wall"] <= ended and f.get("until", f["wall"]) >= began - WINDOW
        ]
        found.append(
            {"bucket": bucket, "seconds": round(seconds, 2), "from": began, "causes": causes}
        )
    return found


def recoveries(faults: list[dict[str, Any]], executions: list[dict[str, Any]]) -> dict[str, Any]:
    """Per fault, and per kind of fault: how many, the median and worst time to recover."""
    timeline = Timeline(executions)
    each = [recovery(fault, timeline) for fault in faults]
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for item in each:
        by_kind[item["fault"]].append(item)
    summary = {}
    for kind, items in sorted(by_kind.items()):
        times = [item["recovered_s"] for item in items if item["recovered_s"] is not None]
        summary[kind] = {
            "faults": len(items),
            "median_s": round(statistics.median(times), 2) if times else None,
            "worst_s": max(times) if times else None,
            "unrecovered_buckets": sum(item["unrecovered"] for item in items),
        }
        healed = [item["after_heal_s"] for item in items if "after_heal_s" in item]
        if healed:
            summary[kind]["worst_after_heal_s"] = max(healed)
    return {"faults": each, "by_kind": summary, "stalls": stalls(faults, timeline)}
