"""``make run``: the demo. Creates the topology of app ``demo``, publishes a sample workload
(events of many users, each user's events numbered in order) and shows the bucket depths.

Workers and the coordinator will consume these buckets; until they run, the messages wait in
their queues, each user's events in one bucket, in publish order.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

from hashq.cli import run_command, settings_flags, setup_logging
from hashq.provision import ensure_topology
from hashq.publisher import Outgoing, Publisher
from hashq.settings import Settings
from hashq.status import gather_status, render_table


def sample_workload(events: int, users: int, seed: int) -> list[Outgoing]:
    """``events`` small JSON events spread over ``users`` keys, numbered per key from 1."""
    rng = random.Random(seed)
    sequence: dict[str, int] = {}
    messages = []
    for _ in range(events):
        key = f"user-{rng.randrange(users):05d}"
        sequence[key] = sequence.get(key, 0) + 1
        body = {"user": key, "seq": sequence[key], "action": rng.choice(["view", "buy", "like"])}
        messages.append(Outgoing(key=key, body=json.dumps(body).encode()))
    return messages


async def demo(settings: Settings, args: argparse.Namespace) -> int:
    topology = await ensure_topology(settings)
    print(f"topology: exchange {topology.exchange} -> {topology.buckets} bucket queues")
    messages = sample_workload(args.events, args.users, args.seed)
    started = time.monotonic()
    async with Publisher(settings) as publisher:
        await publisher.publish_many(messages)
    elapsed = time.monotonic() - started
    print(
        f"published and confirmed {len(messages):,} events of {args.users:,} users "
        f"in {elapsed:.1f}s ({len(messages) / elapsed:,.0f}/s)\n"
    )
    print(render_table(await gather_status(settings)))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="hashq-demo", parents=[settings_flags()])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--users", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=1)
    if "HASHQ_APP" not in os.environ:
        parser.set_defaults(setting_app="demo")
    args = parser.parse_args()
    setup_logging(getattr(args, "log_level", "INFO"))
    return run_command(demo, args, parser.prog)


if __name__ == "__main__":
    sys.exit(main())
