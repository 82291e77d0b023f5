"""What the broker spends on how a consumer meets it: ``python -m tools.bench.shapes``.

A hashq worker consumes each bucket on a channel of its own, each with a prefetch of 32 and
acknowledgements sent ``multiple`` every 16 (half the window) or after 20 ms. A plain consumer
has one channel for every queue, a prefetch of 1,000 and acks every 100. Which of those costs
the broker what? The raw consumer (``tools.bench.raw``, no ordering logic) is run in each shape
on the consume-alone step (``tools.bench.steps.drain``: the queues filled first), and the CPU
per 1,000 messages of the consumer and the broker is reported for each, from its 2,000th
message on. Rounds alternate the shapes, so that a slower minute of the machine falls on all.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from hashq._io.command import logging_from_args, run_command, settings_flags
from hashq.settings import Settings
from tools.bench import steps
from tools.bench.raw import Shape
from tools.bench.rig import bench_app

SHAPES = {
    "one channel, prefetch 1,000, acks every 100 (the raw baseline)": Shape(),
    "one channel, prefetch 2,048, acks every 16": Shape(prefetch=2048, ack_every=16),
    "a channel per bucket, prefetch 32, acks every 16 (a worker's)": Shape(True, 32, 16),
    "a channel per bucket, prefetch 128, acks every 64": Shape(True, 128, 64),
}


async def compare(settings: Settings, args: argparse.Namespace) -> int:
    out = Path(args.out or tempfile.mkdtemp(prefix="hashq-shapes-"))
    plan = steps.Plan(messages=args.messages)
    async with bench_app(settings.model_copy(update={"app": "shapes"})) as app:
        for round_ in range(args.rounds):
            print(f"round {round_ + 1}: msg/s, consumer and broker CPU ms per 1,000 messages")
            for number, (name, shape) in enumerate(SHAPES.items()):
                folder = out / f"round-{round_ + 1}" / f"shape-{number}"
                got = await steps.drain(app, folder, plan, "raw", shape)
                print(
                    f"  {got['consumed_per_s']:>7,}  {got['drain_consumer_cpu_ms_per_1k']:5.1f}"
                    f"  {got.get('drain_broker_cpu_ms_per_1k', float('nan')):5.1f}  {name}",
                    flush=True,
                )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench.shapes",
        description="The broker's CPU by how a consumer meets it: channels, prefetch, acks.",
        parents=[settings_flags()],
    )
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", help="folder for the records (default: a temp one)")
    args = parser.parse_args(argv)
    logging_from_args(args, default_level="WARNING")
    return run_command(compare, args, parser.prog, Settings)


if __name__ == "__main__":
    sys.exit(main())
