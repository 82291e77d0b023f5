"""The benchmark's plot (PNG): throughput side by side, the handover as it happened, and the
failover times. Needs matplotlib (``pip install 'hashq[bench]'``)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from tools.bench.figures import Line, read_stats


def per_second(lines: list[Line], buckets: set[int]) -> dict[int, int]:
    """Messages started per whole second in ``buckets``."""
    counts: dict[int, int] = defaultdict(int)
    for line in lines:
        for bucket, entry in line["buckets"].items():
            if int(bucket) in buckets:
                counts[int(line["t0"])] += entry[0]
    return counts


def plot(results: dict[str, Any], folder: Path, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.5))
    bars = {
        "raw": results["raw"]["end_to_end_per_s"],
        "hashq": results["hashq"]["end_to_end_per_s"],
    }
    if "sleepy" in results:
        bars["1-5 ms, per key"] = results["sleepy"]["per_key_per_s"]
        bars["1-5 ms, 1/bucket"] = results["sleepy"]["one_at_a_time_per_bucket_per_s"]
    left.bar(list(bars), list(bars.values()), color=["grey", "tab:blue", "tab:green", "tab:red"])
    left.set_title("end to end, messages/s")
    left.tick_params(axis="x", labelrotation=20)

    lines = read_stats(folder / "handover" / "stats.jsonl")
    start = int(min((line["t0"] for line in lines), default=0))
    workers = {"worker-1": "tab:blue", "worker-2": "tab:orange"}
    for worker, colour in workers.items():
        own = [line for line in lines if line["worker"] == worker]
        series = per_second(own, {int(b) for line in own for b in line["buckets"]})
        seconds = sorted(series)
        middle.plot([s - start for s in seconds], [series[s] for s in seconds], color=colour)
    middle.axvline(results["handover"]["joined_at"] - start, color="grey", linestyle=":")
    middle.set_title("handover: messages/s per worker (dotted: worker-2 starts)")
    middle.legend(list(workers))
    middle.set_xlabel("seconds")

    labels = [f"session {item['session_s']:g}s" for item in results["failover"]]
    values = [item["failover_s_max"] or 0 for item in results["failover"]]
    right.bar(labels, values, color="tab:purple")
    right.set_title("failover after kill -9: worst bucket, s")
    figure.suptitle(f"hashq bench, {results['machine']['cpus']} CPUs, {results['machine']['when']}")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
