"""The resize step: the pause ``hashq resize`` imposes on the keys it moves, against the backlog
the old buckets hold at the switch, in one run. For each burst, an app of ``OLD`` buckets, one
coordinator and one worker running ``sleepy`` (1 to 5 ms, 4 at once), publishing at ``RATE``
per second throughout; the resize to ``NEW`` buckets runs in this process, and the burst is
published as it declares the new queues, so that it is still queued in the old buckets at the
switch (the routing over ``NEW``). Figures: the old buckets' backlog at the switch; the seconds
from the switch to the commit, to the first start in a new bucket and to the last new bucket's
first start; and how long the oldest message of a new bucket waited (publish to start): the
longest a moved key waited. A publish returned during the switch is counted, not sent again."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from hashq.admin.resize import resize
from hashq.admin.status import gather_status
from hashq.errors import BatchPublishError
from hashq.publisher import Outgoing, Publisher
from hashq.settings import Settings
from tools.bench.probe import stamp
from tools.bench.rig import Rig, bench_app, keys

OLD, NEW = 8, 16
RATE = 500.0  # per second, all through the step
BURSTS = (0, 5_000, 20_000)
CONCURRENCY = "4"  # handlers at once in the worker: about 1,300 msg/s, so that a burst queues
KEYS = 10_000


async def resize_pause(settings: Settings, folder: Path, quick: bool) -> dict[str, Any]:
    results: dict[str, Any] = {
        "old": OLD,
        "new": NEW,
        "rate_per_s": RATE,
        "concurrency": int(CONCURRENCY),
        "points": [],
    }
    for burst in BURSTS[:2] if quick else BURSTS:
        app = settings.model_copy(
            update={"app": f"bench-resize-{burst}-{time.strftime('%H%M%S')}", "buckets": OLD}
        )
        async with bench_app(app):
            results["points"].append(await _one(app, folder / f"burst-{burst}", burst))
    return results


async def _one(settings: Settings, folder: Path, burst: int) -> dict[str, Any]:
    async with Rig(settings, folder, 10.0) as rig:
        rig.coordinator()
        rig.worker("worker-1", "tools.bench.probe:sleepy", "--concurrency", CONCURRENCY)
        await rig.consuming(["worker-1"])
        said: dict[str, float] = {}
        declaring, switched = asyncio.Event(), asyncio.Event()

        def say(line: str) -> None:
            said.setdefault(line.split(" ")[0], time.time())
            if line.startswith("declaring"):
                declaring.set()
            if line.startswith("the routing is over"):
                switched.set()

        stop = asyncio.Event()
        steady = asyncio.ensure_future(_publish_steadily(settings, stop))
        await asyncio.sleep(2.0)
        resizing = asyncio.ensure_future(resize(settings.model_copy(update={"buckets": NEW}), say))
        await declaring.wait()
        returned = await _publish(settings, burst)
        await switched.wait()
        backlog = (await gather_status(settings)).total_messages
        await resizing
        await asyncio.sleep(3.0)
        stop.set()
        returned += await steady
        await rig.drained()
        return _figures(rig, said["the"], said["committed:"], backlog, burst, returned)


def _figures(
    rig: Rig, switched: float, committed: float, backlog: int, burst: int, returned: int
) -> dict[str, Any]:
    firsts: dict[int, tuple[float, float]] = {}  # new bucket -> (first start, its publish time)
    for line in rig.lines():
        for bucket, (_, first, _, published) in line["buckets"].items():
            if int(bucket) >= OLD and (int(bucket) not in firsts or first < firsts[int(bucket)][0]):
                firsts[int(bucket)] = (first, published)
    starts = [first for first, _ in firsts.values()]
    return {
        "burst": burst,
        "backlog_at_switch": backlog,
        "commit_s": round(committed - switched, 3),
        "first_new_start_s": round(min(starts) - switched, 3) if starts else None,
        "last_new_first_start_s": round(max(starts) - switched, 3) if starts else None,
        "moved_wait_max_s": round(max(s - p for s, p in firsts.values()), 3) if firsts else None,
        "new_buckets_started": len(firsts),
        "returned_in_switch": returned,
    }


async def _publish(settings: Settings, count: int) -> int:
    """``count`` messages as fast as they go; returns how many were returned (the switch)."""
    chosen, returned = keys(KEYS, seed=6), 0
    async with Publisher(settings) as publisher:
        for start in range(0, count, 1_000):
            batch = [Outgoing(next(chosen), stamp()) for _ in range(min(1_000, count - start))]
            try:
                await publisher.publish_many(batch)
            except BatchPublishError as failed:
                returned += len(failed.failures)
    return returned


async def _publish_steadily(settings: Settings, stop: asyncio.Event) -> int:
    """``RATE`` per second until ``stop``; returns how many were returned (the switch)."""
    chosen = keys(KEYS, seed=5)
    sent = returned = 0
    started = time.monotonic()
    async with Publisher(settings) as publisher:
        while not stop.is_set():
            due = int(RATE * (time.monotonic() - started)) - sent
            if due > 0:
                try:
                    await publisher.publish_many(
                        Outgoing(next(chosen), stamp()) for _ in range(due)
                    )
                except BatchPublishError as failed:
                    returned += len(failed.failures)
                sent += due
            await asyncio.sleep(0.01)
    return returned
