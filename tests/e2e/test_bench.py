"""``python -m tools.bench.run --quick --json`` against the real servers: one JSON object on
stdout with every summary figure, measured (not asserted fast: speed is the benchmark's to
report)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hashq.settings import Settings
from tools.launcher import child_environment

SUMMARY = {
    "raw_msgs_per_s",
    "hashq_msgs_per_s",
    "ratio",
    "consume_ratio",
    "consumer_cpu_ratio",
    "broker_cpu_ratio",
    "throughput_prefetch",
    "consume_ratio_default",
    "consumer_cpu_ratio_default",
    "handover_pause_ms_max",
    "unmoved_throughput_ratio",
    "failover_s",
}


def test_quick_bench_prints_one_json_object_with_every_figure(
    settings: Settings, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tools.bench.run", "--quick", "--json", "--out", str(tmp_path)],
        env=child_environment(settings, HASHQ_BUCKETS="16"),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)  # nothing else on stdout
    assert set(summary) >= SUMMARY, summary
    assert summary["raw_msgs_per_s"] > 0 and summary["hashq_msgs_per_s"] > 0, summary
    assert summary["ratio"] == round(summary["hashq_msgs_per_s"] / summary["raw_msgs_per_s"], 3)
    assert summary["consumer_cpu_ratio"] > 0, summary  # the worker's CPU, consuming alone
    assert summary["consumer_cpu_ratio_default"] > 0, summary  # ... at its default prefetch
    assert summary["handover_pause_ms_max"] is not None, done.stderr[-3000:]
    assert summary["failover_s"] is not None, done.stderr[-3000:]
    full = json.loads((tmp_path / "bench.json").read_text())
    assert summary["throughput_prefetch"] == full["plan"]["throughput_prefetch"] == 128, summary
    assert summary["consume_ratio_default"] == round(
        full["hashq_default"]["consumed_per_s"] / full["raw"]["consumed_per_s"], 3
    )
    assert full["failover"][0]["recovered"] == full["failover"][0]["buckets"] > 0, full
    assert full["handover"]["moved_buckets"] > 0, full
    assert (tmp_path / "bench.png").stat().st_size > 10_000


def test_scale_out_runs_one_worker_then_two_each_on_a_core(
    settings: Settings, tmp_path: Path
) -> None:
    command = ["-m", "tools.bench.run", "--scale-out", "--quick", "--json", "--out", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, *command],
        env=child_environment(settings, HASHQ_BUCKETS="16"),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    scaled = json.loads(done.stdout)
    assert [scaled[n]["workers"] for n in ("one", "two")] == [1, 2], scaled
    assert len(scaled["two"]["worker_cpu_s"]) == 2 and min(scaled["two"]["worker_cpu_s"]) > 0
    assert scaled["per_core_ratio"] == round(
        scaled["two"]["per_worker_core_per_s"] / scaled["one"]["per_worker_core_per_s"], 3
    )
