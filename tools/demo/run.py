"""``make run``: the live demo of the main job.

Two coordinators and two workers run ``tools.demo.videos:transcode`` while a publisher streams
uploads of a thousand users. Part way, a third worker joins, the app grows to twice its buckets
(``hashq resize``), one worker is stopped gracefully (SIGTERM) and one is killed (SIGKILL) while a
fourth joins. The status is shown as it changes;
at the end the checker reads what the handlers recorded and reports published, processed,
keys, order violations and lost messages. Exit status 0 only if nothing was lost or reordered.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

from examples.publish_uploads import publish_until_confirmed, upload_batch
from hashq._io.command import logging_from_args, run_command, settings_flags
from hashq.admin.apps import remove_app
from hashq.admin.status import gather_status
from hashq.provision import ensure_topology
from hashq.publisher import Publisher
from hashq.settings import Settings
from tools import say
from tools.checker import check
from tools.executions import Growing
from tools.launcher import Fleet


def start(fleet: Fleet, name: str, buckets: int) -> None:
    if name == "resize":
        fleet.start(name, "-m", "hashq.admin.cli", "resize", "--buckets", str(2 * buckets))
        say(f"hashq resize --buckets {2 * buckets}")
        return
    if name.startswith("coordinator"):
        fleet.start(name, "-m", "hashq_coordinator.cli", "--coordinator-id", name)
    else:
        handler = "tools.demo.videos:transcode"
        fleet.start(name, "-m", "hashq.worker.cli", handler, "--worker-id", name)
    say(f"started {name}")


async def publish_stream(
    settings: Settings, users: int, rate: float, seconds: float, published: dict[str, int]
) -> None:
    """Uploads of ``users`` users at about ``rate`` per second, numbered per user
    (``examples.publish_uploads``: what was not confirmed goes again before the next batch)."""
    rng = random.Random(7)
    deadline = time.monotonic() + seconds
    async with Publisher(settings) as publisher:
        while time.monotonic() < deadline:
            batch = upload_batch(rng, users, int(rate / 10), published)
            await publish_until_confirmed(publisher, batch)
            await asyncio.sleep(0.1)


async def show_status(settings: Settings, record: Growing, published: dict[str, int]) -> None:
    status = await gather_status(settings)
    workers = ", ".join(
        f"{worker}:{len(status.held_by(worker))}" for worker in sorted(status.ownership.workers)
    )
    leader = status.ownership.leader.leader if status.ownership.leader else "none"
    moving = f"moving {status.in_transit}" if status.in_transit else "no handover"
    resize = status.ownership.resize
    if resize is not None and resize.under_way:
        moving += f" | resize to {resize.new}: {resize.phase.value}"
    processed = await asyncio.to_thread(record.count)
    say(
        f"leader {leader} | {len(status.buckets)} buckets | workers {workers or '-'} | {moving}"
        f" | queued {status.total_messages:,}"
        f" | published {sum(published.values()):,} | processed {processed:,}"
    )


async def demo(settings: Settings, args: argparse.Namespace) -> int:
    await ensure_topology(settings)
    scratch = Path(tempfile.mkdtemp(prefix="hashq-demo-"))
    record = scratch / "executions.jsonl"
    fleet = Fleet(
        settings,
        scratch,
        {
            "HASHQ_ZK_SESSION_TIMEOUT": "3",  # a killed worker's buckets move within seconds
            "HASHQ_DEMO_RECORD": str(record),
        },
    )
    published: dict[str, int] = {}
    say(f"app {settings.app}: {settings.buckets} buckets; logs and records in {scratch}")
    try:
        for name in ("coordinator-1", "coordinator-2", "worker-1", "worker-2"):
            start(fleet, name, settings.buckets)
        await asyncio.sleep(3)
        publisher = asyncio.ensure_future(
            publish_stream(settings, args.users, args.rate, args.seconds, published)
        )
        timeline = [
            (0.25, "worker-3", None),
            (0.35, "resize", None),
            (0.5, "worker-1", signal.SIGTERM),
            (0.75, "worker-2", signal.SIGKILL),
            (0.75, "worker-4", None),
        ]
        started, growing = time.monotonic(), Growing(record)
        # Every event of the timeline is played, even when the publisher and the workers finish
        # early: a short run must still show the kill it promises.
        while (
            timeline or not publisher.done() or fleet.alive("resize") or _behind(record, published)
        ):
            elapsed = (time.monotonic() - started) / args.seconds
            while timeline and timeline[0][0] <= elapsed:
                _, name, number = timeline.pop(0)
                if number is None:
                    start(fleet, name, settings.buckets)
                else:
                    fleet.signal(name, number)
                    say(f"sent {signal.Signals(number).name} to {name}")
            await show_status(settings, growing, published)
            if time.monotonic() - started > args.seconds + 90:
                say("giving up waiting for the workers")
                break
            next_event = started + timeline[0][0] * args.seconds if timeline else float("inf")
            await asyncio.sleep(max(0.1, min(2.5, next_event - time.monotonic())))
        await publisher
        await show_status(settings, growing, published)
    finally:
        fleet.stop_all(within=40)
        if args.keep:
            say(f"kept app {settings.app}")
        else:
            await remove_app(settings)
    return report(record, published)


def _behind(record: Path, published: dict[str, int]) -> bool:
    return bool(check(record, published).lost)


def report(record: Path, published: dict[str, int]) -> int:
    result = check(record, published)
    total = sum(published.values())
    print()
    print(f"  published          {total:>8,}")
    print(f"  processed          {total - len(result.lost):>8,}")
    repeats = len(result.duplicates)
    print(f"  executions         {result.executions:>8,}  (redelivered repeats: {repeats})")
    print(f"  keys               {len(published):>8,}")
    print(f"  order violations   {len(result.reordered):>8,}")
    print(f"  overlapping runs   {len(result.overlaps):>8,}")
    print(f"  lost               {len(result.lost):>8,}")
    healthy = not (result.lost or result.reordered or result.overlaps)
    print("\n  " + ("OK: every user's uploads in order, none lost" if healthy else "FAILED"))
    return 0 if healthy else 1


def main() -> int:
    parser = argparse.ArgumentParser(prog="hashq-demo", parents=[settings_flags()])
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--rate", type=float, default=400.0, help="uploads per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long to publish")
    parser.add_argument("--keep", action="store_true", help="keep the app's queues afterwards")
    if "HASHQ_APP" not in os.environ:
        parser.set_defaults(setting_app=f"demo-{time.strftime('%Y%m%d%H%M%S')}")
    if "HASHQ_BUCKETS" not in os.environ:
        parser.set_defaults(setting_buckets="16")
    args = parser.parse_args()
    logging_from_args(args, default_level="WARNING")
    with contextlib.suppress(KeyboardInterrupt):
        return run_command(demo, args, parser.prog, Settings)
    return 130


if __name__ == "__main__":
    sys.exit(main())
