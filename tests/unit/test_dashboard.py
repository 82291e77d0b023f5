"""The Grafana dashboard in docs/ asks only for metrics that hashq serves (its own, and the
process and platform metrics every hashq process serves beside them)."""

from __future__ import annotations

import json
import re

from hashq.worker.metrics import WorkerMetrics
from hashq_coordinator.metrics import CoordinatorMetrics
from tools import ROOT

DASHBOARD = ROOT / "docs" / "grafana-dashboard.json"


def served() -> set[str]:
    worker = WorkerMetrics(["running"])
    worker.watch(lambda: 0, lambda: (), lambda: True)
    for counts in (worker.processed, worker.failed, worker.retried, worker.moved):
        counts[0] += 1  # labelled series show only once they have a sample
    worker.dead_lettered[0, "handler-failed"] += 1
    worker.parked[0, "hot"] += 1
    coordinator = CoordinatorMetrics()
    coordinator.queue_depth.labels("0").set(0)
    names = set()
    for registry in (worker.registry, coordinator.registry):
        for family in registry.collect():
            names |= {sample.name for sample in family.samples} | {family.name}
    # Histograms serve _bucket, _sum and _count; counters _total.
    return names | {f"{n}_bucket" for n in names}


def test_every_metric_in_the_dashboard_is_served() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    asked = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\b(?:hashq|process|python)_[a-z_]+", target["expr"])
    }
    assert asked, "no metric found in the dashboard"
    assert asked - served() == set()
