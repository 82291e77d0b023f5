"""Where a consumer's CPU goes: ``python -m tools.bench.profile``.

The consume-alone step (docs/benchmarks.md), for the raw aiormq consumer, the same with its
deliveries handed over without aiormq's task each (``raw-direct``: ``tools.bench.raw``) and a
hashq worker in turn: ``--messages`` published first over 10,000 keys, then the consumer
started on the full queues while py-spy samples it (``--nonblocking``: the process is never
stopped to be read).
From its 2,000th message to its last, the consumer's rate and CPU (from /proc), and its CPU per
1,000 messages split by the layer each sample's innermost frame is in: aiormq, asyncio, pamqp,
hashq's worker runtime, its machines, ... Then hashq's own functions, by their own time.

Samples are few (about 1,500 for a hashq worker at 100,000 messages): a layer's figure is good
to about a tenth of itself, a function's to about a third. The folded stacks are kept in
``--out`` for a flame graph.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from hashq._io.command import logging_from_args, run_command, settings_flags
from hashq.settings import Settings
from tools.bench.raw import Shape
from tools.bench.rig import Rig, bench_app

KEYS = 10_000
RATE = 250  # py-spy samples a second
LAYERS = (  # the first that a frame's file path contains
    ("pamqp/", "pamqp: frames decoded and encoded"),
    ("aiormq/", "aiormq: connection reader, channels, futures"),
    ("aio_pika/", "aio-pika"),
    ("hashq/worker/machine/", "hashq worker machines: leases, lanes"),
    ("hashq/worker/", "hashq worker runtime: runners, acks, jobs, leases"),
    ("hashq/", "hashq, other"),
    ("tools/bench/", "the bench's handler and its record"),
    ("asyncio/", "asyncio: loop, tasks, futures, transports"),
    ("selectors.py", "asyncio: loop, tasks, futures, transports"),
)


def layer(frame: str) -> str:
    """The layer of one py-spy frame, ``function (path:line)``."""
    for part, name in LAYERS:
        if part in frame:
            return name
    return "other"


def folded(path: Path) -> list[tuple[list[str], int]]:
    """py-spy's raw output: each stack's frames, outermost first, and its sample count."""
    stacks = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        stacks.append((stack.split(";"), int(count)))
    return stacks


def by_layer(stacks: list[tuple[list[str], int]], per_1k: float) -> dict[str, float]:
    """CPU ms per 1,000 messages of each layer, by the innermost frame of each sample."""
    counts: collections.Counter[str] = collections.Counter()
    for frames, count in stacks:
        counts[layer(frames[-1])] += count
    total = sum(counts.values()) or 1
    return {name: per_1k * count / total for name, count in counts.most_common()}


def hashq_functions(stacks: list[tuple[list[str], int]], per_1k: float) -> dict[str, float]:
    """CPU ms per 1,000 messages of each hashq function, by its own time."""
    counts: collections.Counter[str] = collections.Counter()
    for frames, count in stacks:
        if "hashq/" in frames[-1]:
            counts[re.sub(r":\d+\)$", ")", frames[-1])] += count
    total = sum(count for _, count in stacks) or 1
    return {name: per_1k * count / total for name, count in counts.most_common(12)}


async def profile_one(settings: Settings, consumer: str, messages: int, out: Path) -> float:
    """Drain ``messages`` with ``consumer`` under py-spy; print and return its CPU ms per
    1,000 messages."""
    async with Rig(settings, out / consumer, settings.zk_session_timeout) as rig:
        if consumer.startswith("raw"):
            await rig.publish_raw(messages, KEYS)
            name = rig.raw_consumer(shape=Shape(direct=consumer == "raw-direct"))
        else:
            rig.coordinator()
            await rig.publish(messages, KEYS)
            name = rig.worker("worker-1")
        pid = rig.fleet.processes[name].pid
        samples = out / f"{consumer}.folded"
        spy = _sample(pid, samples)
        window = await rig.measured(messages, {consumer: pid})
        spy.send_signal(signal.SIGINT)
        spy.wait(30)
    per_1k = window.ms_per_1k(consumer)
    rate = window.messages / window.seconds
    print(f"\n{consumer}: {rate:,.0f} msg/s, {per_1k:.1f} ms CPU per 1,000 messages")
    stacks = folded(samples)
    for name, ms in by_layer(stacks, per_1k).items():
        print(f"  {ms:6.1f}  {name}")
    if consumer == "hashq":
        print("  hashq's functions, by their own time:")
        for name, ms in hashq_functions(stacks, per_1k).items():
            print(f"  {ms:6.2f}  {name}")
    return per_1k


def _sample(pid: int, into: Path) -> subprocess.Popen[bytes]:
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
    argv = [spy, "record", "--nonblocking", "--rate", str(RATE), "--format", "raw"]
    return subprocess.Popen(
        [*argv, "-p", str(pid), "-o", str(into)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def profile(settings: Settings, args: argparse.Namespace) -> int:
    out = Path(args.out or tempfile.mkdtemp(prefix="hashq-profile-"))
    ratios: dict[str, list[float]] = {"raw": [], "raw-direct": []}
    async with bench_app(settings.model_copy(update={"app": "profile"})) as app:
        for round_ in range(args.rounds):
            folder = out / f"round-{round_ + 1}"
            raw = await profile_one(app, "raw", args.messages, folder)
            direct = await profile_one(app, "raw-direct", args.messages, folder)
            hashq = await profile_one(app, "hashq", args.messages, folder)
            ratios["raw"].append(hashq / raw)
            ratios["raw-direct"].append(hashq / direct)
    print(f"\nworker CPU / raw consumer CPU: {', '.join(f'{r:.2f}' for r in ratios['raw'])}")
    print(
        "worker CPU / raw consumer CPU, its deliveries handed over as a worker's: "
        + ", ".join(f"{r:.2f}" for r in ratios["raw-direct"])
    )
    print(f"folded stacks in {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench.profile",
        description="Where a consumer's CPU goes: raw aiormq against a hashq worker.",
        parents=[settings_flags()],
    )
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument(
        "--rounds", type=int, default=2, help="raw, raw-direct, then hashq, this many times"
    )
    parser.add_argument("--out", help="folder for the folded stacks (default: a temp one)")
    args = parser.parse_args(argv)
    logging_from_args(args, default_level="WARNING")
    return run_command(profile, args, parser.prog, Settings)


if __name__ == "__main__":
    sys.exit(main())
