"""``make bench`` (``python -m tools.bench.run``): every step in one run, so that ratios compare
figures taken minutes apart on the same machine. Progress goes to stderr; the figures to a JSON
file (and, with ``--json``, to stdout as one object)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from hashq._io.command import logging_from_args, run_command, settings_flags
from hashq.settings import Settings
from tools import say
from tools.bench import steps
from tools.bench.hot import hot_key
from tools.bench.plot import plot
from tools.bench.resize import NEW as RESIZE_NEW
from tools.bench.resize import OLD as RESIZE_OLD
from tools.bench.resize import resize_pause
from tools.bench.rig import bench_app
from tools.bench.scale import scale_out
from tools.bench.steps import THROUGHPUT_PREFETCH, Plan

NOOP = "tools.bench.probe:noop"
SLEEPY = "tools.bench.probe:sleepy"
SLEEPY_BUCKETS = 4
SLEEPY_MESSAGES = 20_000
HOT_KEY_SECONDS, HOT_KEY_SECONDS_QUICK = 20.0, 6.0


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = 0
    with contextlib.suppress(OSError, ValueError):
        memory = int(Path("/proc/meminfo").read_text().split()[1]) // 1024
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_mb": memory,
        "system": platform.platform(),
        "python": platform.python_version(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


async def run_bench(settings: Settings, plan: Plan, folder: Path) -> dict[str, Any]:
    app = settings.model_copy(update={"app": f"bench-{time.strftime('%H%M%S')}"})
    results: dict[str, Any] = {"machine": machine(), "plan": asdict(plan), "buckets": app.buckets}
    async with bench_app(app):
        say("1. raw aiormq publisher and consumer")
        raw = results["raw"] = await steps.throughput(app, folder / "raw", plan, "raw")
        say(f"    {raw}")
        fast = plan.for_throughput()
        say(f"2. hashq publisher and worker, no-op handler, prefetch {fast.prefetch}")
        hashq = results["hashq"] = await steps.throughput(app, folder / "hashq", fast, NOOP)
        say(f"    {hashq}")
        say("   the consuming side alone: queues filled first, then the consumer started")
        raw.update(await steps.drain(app, folder / "raw-drain", plan, "raw"))
        hashq.update(await steps.drain(app, folder / "hashq-drain", fast, NOOP))
        default = results["hashq_default"] = await steps.drain(
            app, folder / "hashq-drain-default", plan, NOOP
        )
        say(
            f"    raw {raw['consumed_per_s']}/s, hashq {hashq['consumed_per_s']}/s "
            f"(at prefetch {plan.prefetch or 'default'}: {default['consumed_per_s']}/s)"
        )
        rate = hashq["end_to_end_per_s"] / 2
        if not plan.quick:
            say(f"    latency at {rate:.0f}/s (half the maximum)")
            results["latency"] = await steps.steady(app, folder / "latency", plan, rate)
            say(f"    {results['latency']}")
        say(f"3. handover: a second worker joins under {rate:.0f}/s")
        results["handover"] = await steps.handover(app, folder / "handover", plan, rate)
        say(f"    {results['handover']}")
        say(f"4. failover: kill -9 of a worker under {rate:.0f}/s")
        # The default session first: ``failover_s`` is its figure (a crash is heard from the
        # broker, not from the session's expiry).
        sessions = [plan.session] if plan.quick else [plan.session, plan.short_session]
        results["failover"] = []
        for session in sessions:
            result = await steps.failover(
                app, folder / f"failover-{session:g}s", plan, rate, session
            )
            results["failover"].append(result)
            say(f"    {result}")
        if not plan.quick:
            await full_only(app, plan, folder, results)
    if not plan.quick:
        await sleepy(settings, plan, folder, results)
        await hot(settings, plan, folder, results)
        await grow(settings, plan, folder, results)
        await scale(settings, plan, folder, results)
    results["summary"] = summary(results)
    return results


async def full_only(app: Settings, plan: Plan, folder: Path, results: dict[str, Any]) -> None:
    rate = results["hashq"]["end_to_end_per_s"] / 2
    say(f"4b. failover: SIGSTOP of a worker under {rate:.0f}/s (its session, then a fence)")
    results["failover_sigstop"] = await steps.failover(
        app, folder / "failover-sigstop", plan, rate, plan.session, signal.SIGSTOP
    )
    say(f"    {results['failover_sigstop']}")
    say(f"3b. handover with 50 ms handlers under {rate / 10:.0f}/s")
    results["handover_50ms"] = await steps.handover(
        app, folder / "handover-50ms", plan, rate / 10, "tools.bench.probe:slow50"
    )
    say(f"    {results['handover_50ms']}")
    say(f"5. memory: a worker after messages of {plan.distinct_keys:,} distinct keys")
    results["many_keys"] = await steps.many_keys(app, folder / "many-keys", plan)
    say(f"    {results['many_keys']}")
    say(f"6. the seed workload: 5,000 events/s for {plan.seed_seconds:g}s")
    results["seed_workload"] = await steps.seed_workload(app, folder / "seed", plan)
    say(f"    {results['seed_workload']}")


async def sleepy(settings: Settings, plan: Plan, folder: Path, results: dict[str, Any]) -> None:
    """Handlers that wait 1-5 ms on 4 buckets: per-key parallelism inside a bucket against one
    message at a time per bucket (``--prefetch 1``)."""
    few = settings.model_copy(
        update={"app": f"bench-sleepy-{time.strftime('%H%M%S')}", "buckets": SLEEPY_BUCKETS}
    )
    smaller = replace(plan, messages=SLEEPY_MESSAGES)
    say(f"7. handlers sleeping 1-5 ms, {SLEEPY_BUCKETS} buckets")
    async with bench_app(few):
        per_key = await steps.throughput(few, folder / "sleepy-per-key", smaller, SLEEPY)
        one_at_a_time = await steps.throughput(
            few, folder / "sleepy-one-at-a-time", smaller, SLEEPY, "--prefetch", "1"
        )
    results["sleepy"] = {
        "buckets": SLEEPY_BUCKETS,
        "per_key_per_s": per_key["end_to_end_per_s"],
        "one_at_a_time_per_bucket_per_s": one_at_a_time["end_to_end_per_s"],
        "speedup": round(per_key["end_to_end_per_s"] / one_at_a_time["end_to_end_per_s"], 2),
    }
    say(f"    {results['sleepy']}")


async def hot(settings: Settings, plan: Plan, folder: Path, results: dict[str, Any]) -> None:
    seconds = HOT_KEY_SECONDS_QUICK if plan.quick else HOT_KEY_SECONDS
    say(f"8. a hot key at twice its handler's rate beside 1,000 cold keys, {seconds:g}s each way")
    results["hot_key"] = await hot_key(settings, folder / "hot-key", seconds)
    say(f"    {results['hot_key']}")


async def grow(settings: Settings, plan: Plan, folder: Path, results: dict[str, Any]) -> None:
    say(f"9. hashq resize from {RESIZE_OLD} to {RESIZE_NEW} buckets under load, by backlog")
    results["resize"] = await resize_pause(settings, folder / "resize", plan.quick)
    say(f"    {results['resize']}")


async def scale(settings: Settings, plan: Plan, folder: Path, results: dict[str, Any]) -> None:
    say("10. scale-out: consuming alone with 1 worker, then 2, each pinned to a core")
    app = settings.model_copy(update={"app": f"bench-scale-{time.strftime('%H%M%S')}"})
    async with bench_app(app):
        results["scale_out"] = await scale_out(app, folder / "scale-out", plan)
    say(f"    {results['scale_out']}")


def summary(results: dict[str, Any]) -> dict[str, Any]:
    raw, hashq = results["raw"]["end_to_end_per_s"], results["hashq"]["end_to_end_per_s"]
    return {
        "raw_msgs_per_s": raw,
        "hashq_msgs_per_s": hashq,
        "ratio": round(hashq / raw, 3),
        "raw_consumed_per_s": results["raw"]["consumed_per_s"],
        "hashq_consumed_per_s": results["hashq"]["consumed_per_s"],
        **_drain_ratios(results, "hashq"),
        "throughput_prefetch": results["plan"]["throughput_prefetch"],
        **_drain_ratios(results, "hashq_default", "_default"),
        "handover_pause_ms_max": results["handover"]["pause_ms_max"],
        "unmoved_throughput_ratio": results["handover"]["unmoved_throughput_ratio"],
        "failover_s": results["failover"][0]["failover_s_max"],
    }


def _drain_ratios(results: dict[str, Any], side: str, suffix: str = "") -> dict[str, Any]:
    """hashq consuming alone (``side``: at its throughput setting, or ``hashq_default``)
    against the raw consumer: its rate, and the CPU per message of the consumer and the
    broker."""
    return {
        f"consume_ratio{suffix}": _ratio(results, "consumed_per_s", side),
        f"consumer_cpu_ratio{suffix}": _ratio(results, "drain_consumer_cpu_ms_per_1k", side),
        f"broker_cpu_ratio{suffix}": _ratio(results, "drain_broker_cpu_ms_per_1k", side),
    }


def _ratio(results: dict[str, Any], figure: str, side: str) -> float | None:
    """``side``'s ``figure`` against the raw side's (None: not measured)."""
    raw, hashq = results["raw"].get(figure), results[side].get(figure)
    return round(hashq / raw, 3) if raw and hashq is not None else None


def print_summary(results: dict[str, Any]) -> None:
    rows = [
        ("raw end to end, msg/s", results["raw"]["end_to_end_per_s"]),
        ("hashq end to end, msg/s", results["hashq"]["end_to_end_per_s"]),
        ("ratio (target >= 0.9)", results["summary"]["ratio"]),
        ("raw publish, msg/s", results["raw"]["published_per_s"]),
        ("hashq publish, msg/s", results["hashq"]["published_per_s"]),
        ("raw consume alone, msg/s", results["raw"]["consumed_per_s"]),
        ("hashq consume alone, msg/s", results["hashq"]["consumed_per_s"]),
    ]
    rows += [
        (f"{side} {role} CPU, ms per 1,000 msgs", results[side][f"{role}_cpu_ms_per_1k"])
        for side in ("raw", "hashq")
        for role in ("publisher", "consumer", "broker")
        if f"{role}_cpu_ms_per_1k" in results[side]
    ]
    rows += [
        (f"{side} {role} CPU consuming alone, ms per 1,000", results[side][figure])
        for side in ("raw", "hashq")
        for role in ("consumer", "broker")
        if (figure := f"drain_{role}_cpu_ms_per_1k") in results[side]
    ]
    rows.append(("worker CPU / raw consumer CPU, alone", results["summary"]["consumer_cpu_ratio"]))
    rows += [
        ("hashq consume alone, run's prefetch", results["hashq_default"]["consumed_per_s"]),
        ("  its ratio", results["summary"]["consume_ratio_default"]),
        ("  its worker CPU / raw consumer CPU", results["summary"]["consumer_cpu_ratio_default"]),
    ]
    rows += [
        ("handover pause, max ms", results["handover"]["pause_ms_max"]),
        ("unmoved throughput ratio", results["handover"]["unmoved_throughput_ratio"]),
    ]
    rows += [
        (f"failover, session {item['session_s']:g}s, max s", item["failover_s_max"])
        for item in results["failover"]
    ]
    if "failover_sigstop" in results:
        rows.append(
            ("failover after SIGSTOP, max s", results["failover_sigstop"]["failover_s_max"])
        )
        rows.append(
            ("handover pause, 50 ms handlers, max ms", results["handover_50ms"]["pause_ms_max"])
        )
    if "hot_key" in results:
        hot = results["hot_key"]
        rows.append(("hot key: cold p99 ms without", hot["share_0"]["cold_p99_ms"]))
        rows.append(("hot key: cold p99 ms with isolation", hot["share_0.5"]["cold_p99_ms"]))
    if "scale_out" in results:
        scaled = results["scale_out"]
        rows += [
            (f"{count}: msg per worker CPU-second", scaled[key]["per_worker_core_per_s"])
            for key, count in (("one", "1 worker"), ("two", "2 workers"))
        ]
    for point in results.get("resize", {}).get("points", []):
        rows.append(
            (
                f"resize, backlog {point['backlog_at_switch']:,}: moved wait s",
                point["moved_wait_max_s"],
            )
        )
    if "latency" in results:
        rows.append(("latency p50 ms", results["latency"]["p50_ms"]))
        rows.append(("latency p99 ms", results["latency"]["p99_ms"]))
    for label, value in rows:
        print(f"  {label:<34} {value}", file=sys.stderr)


async def bench(settings: Settings, args: argparse.Namespace) -> int:
    sizes = {"prefetch": args.prefetch, "throughput_prefetch": args.throughput_prefetch}
    plan = Plan.quick_plan(**sizes) if args.quick else Plan(**sizes)
    folder = Path(args.out or tempfile.mkdtemp(prefix="hashq-bench-"))
    alone = {"hot_key": hot, "resize": grow, "scale_out": scale}
    if step := next((name for name in alone if getattr(args, name)), None):  # that step alone
        with contextlib.redirect_stdout(sys.stderr):
            results: dict[str, Any] = {"machine": machine()}
            await alone[step](settings, plan, folder, results)
        (folder / "bench.json").write_text(json.dumps(results, indent=2))
        print(json.dumps(results[step]) if args.json else f"  {folder / 'bench.json'}")
        return 0
    with contextlib.redirect_stdout(sys.stderr):  # stdout is kept for --json
        results = await run_bench(settings, plan, folder)
    (folder / "bench.json").write_text(json.dumps(results, indent=2))
    print_summary(results)
    print(f"  figures: {folder / 'bench.json'}", file=sys.stderr)
    picture = Path(args.plot) if args.plot else folder / "bench.png"
    try:
        plot(results, folder, picture)
    except ImportError:
        print(
            "  no plot: matplotlib is not installed (pip install 'hashq[bench]')", file=sys.stderr
        )
    else:
        print(f"  plot: {picture}", file=sys.stderr)
    if args.json:
        print(json.dumps(results["summary"]))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tools.bench.run`` (``make bench``): hashq against the raw broker, one run."""
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench.run",
        description="Measure hashq against the raw broker on this machine.",
        parents=[settings_flags()],
    )
    parser.add_argument("--quick", action="store_true", help="a reduced run, under a minute")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument("--out", help="folder for the figures and records (default: a temp one)")
    parser.add_argument("--plot", help="where to write the PNG plot (default: in --out)")
    parser.add_argument(
        "--hot-key", action="store_true", help="only the hot-key step (with --quick: 6 s each way)"
    )
    parser.add_argument(
        "--resize", action="store_true", help="only the resize step (with --quick: two backlogs)"
    )
    parser.add_argument(
        "--scale-out", action="store_true", help="only the scale-out step (1 worker, then 2)"
    )
    parser.add_argument(
        "--prefetch",
        type=int,
        help="the hashq workers' prefetch per bucket (default: their own, 32), except in the "
        "steps compared with the raw side; the hot-key and resize steps keep their own settings",
    )
    parser.add_argument(
        "--throughput-prefetch",
        type=int,
        default=THROUGHPUT_PREFETCH,
        help="the worker's prefetch in the end-to-end and consume-alone steps, compared with a "
        f"raw consumer tuned for throughput (default: {THROUGHPUT_PREFETCH}, hashq's documented "
        "throughput setting); its consume-alone at --prefetch is reported beside it",
    )
    args = parser.parse_args(argv)
    logging_from_args(args)
    return run_command(bench, args, parser.prog, Settings)


if __name__ == "__main__":
    sys.exit(main())
