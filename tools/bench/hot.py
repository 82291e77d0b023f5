"""The hot-key step: one key published at twice the rate its handler serves, and 1,000 cold
keys in the same bucket, on one worker; the cold keys' latency (publish to handler start) with
hot-key isolation (``--hot-key-share 0.5``: the hot key's surplus steps aside to its parking
queue) against without (``0``: the hot key fills the bucket's prefetch window), in one run."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

from hashq.publisher import Outgoing, Publisher
from hashq.settings import Settings
from tools.bench import figures
from tools.bench.probe import HANDLER_SECONDS, HOT_KEY, stamp
from tools.bench.rig import Rig, bench_app

HOT_RATE = 2 / HANDLER_SECONDS  # per second: twice what one key's handler serves
COLD_RATE = 200.0  # per second, over the cold keys
COLD_KEYS = 1000
SHARES = ("0", "0.5")  # without isolation, then with (HASHQ_HOT_KEY_SHARE)


async def hot_key(settings: Settings, folder: Path, seconds: float) -> dict[str, Any]:
    """Each share on an app of its own, with one bucket (so every key shares its window)."""
    results: dict[str, Any] = {
        "hot_rate_per_s": HOT_RATE,
        "cold_rate_per_s": COLD_RATE,
        "cold_keys": COLD_KEYS,
        "handler_ms": HANDLER_SECONDS * 1000,
        "seconds": seconds,
    }
    for share in SHARES:
        app = settings.model_copy(
            update={
                "app": f"bench-hot-{share.replace('.', '')}-{time.strftime('%H%M%S')}",
                "buckets": 1,
            }
        )
        async with bench_app(app):
            results[f"share_{share}"] = await _one(app, folder / f"share-{share}", share, seconds)
    without, with_ = results["share_0"], results["share_0.5"]
    if without["cold_p99_ms"] and with_["cold_p99_ms"]:
        results["cold_p99_ratio"] = round(without["cold_p99_ms"] / with_["cold_p99_ms"], 1)
    return results


async def _one(settings: Settings, folder: Path, share: str, seconds: float) -> dict[str, Any]:
    async with Rig(settings, folder, 10.0) as rig:
        rig.coordinator()
        rig.worker("worker-1", "tools.bench.probe:hot_or_cold", "--hot-key-share", share)
        await rig.consuming(["worker-1"])
        started = time.time()
        cold = await _publish(settings, seconds)
        published = time.time()
        await rig.caught_up(cold, within=max(120.0, 4 * seconds))
        caught_up = time.time()
        latency = figures.latency_ms(rig.lines(), started + 1, caught_up + 1)
        return {
            "cold_sent": cold,
            "cold_p50_ms": latency["p50_ms"],
            "cold_p99_ms": latency["p99_ms"],
            "samples": latency["samples"],
            "cold_done_s_after_publishing": round(caught_up - published, 2),
        }


async def _publish(settings: Settings, seconds: float) -> int:
    """The hot key at ``HOT_RATE`` and cold keys at ``COLD_RATE``, interleaved, every 10 ms;
    returns how many cold messages were sent."""
    rng = random.Random(4)
    hot = cold = 0
    started = time.monotonic()
    async with Publisher(settings) as publisher:
        while (elapsed := time.monotonic() - started) < seconds:
            due_hot, due_cold = int(HOT_RATE * elapsed) - hot, int(COLD_RATE * elapsed) - cold
            batch = [Outgoing(HOT_KEY, stamp()) for _ in range(due_hot)]
            batch += [
                Outgoing(f"c{rng.randrange(COLD_KEYS):04d}", stamp()) for _ in range(due_cold)
            ]
            rng.shuffle(batch)
            if batch:
                await publisher.publish_many(batch)
            hot, cold = hot + due_hot, cold + due_cold
            await asyncio.sleep(0.01)
    return cold
