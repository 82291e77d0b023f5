"""Scale-out: do workers' rates add up? ``python -m tools.bench.run --scale-out``.

The consume-alone step (queues filled first) with 1 worker and then 2, each worker pinned to a
core of its own (``os.sched_setaffinity``), the last cores first. This machine has two cores
and the broker runs on them too, so the total rate cannot double here. What is compared is the
rate per worker core: messages consumed per CPU-second of the workers. If two workers each
take as many messages per CPU-second as one did, a worker added on a core of its own adds its
rate, and the app's rate grows with its workers until the broker is the limit.

The coordinator starts once every worker is registered, so that its first assignment shares
the buckets out and no handover falls in the measurement.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hashq.admin.status import gather_status
from hashq.settings import Settings
from tools.bench.rig import Rig
from tools.bench.steps import Plan
from tools.polling import eventually


async def consume_with(
    settings: Settings, folder: Path, plan: Plan, workers: int
) -> dict[str, Any]:
    """``plan.messages`` consumed by ``workers`` pinned workers: their rate, their CPU and the
    rate per worker core, from the ``SKIPPED``-th message on (``Rig.measured``)."""
    async with Rig(settings, folder, plan.session, plan.worker_flags()) as rig:
        await rig.publish(plan.messages, plan.keys)
        names = [rig.worker(f"worker-{number + 1}") for number in range(workers)]
        cores = sorted(os.sched_getaffinity(0))
        pids = [rig.fleet.processes[name].pid for name in names]
        for number, pid in enumerate(pids):
            os.sched_setaffinity(pid, {cores[-1 - number % len(cores)]})
        await _registered(settings, workers)
        rig.coordinator()
        window = await rig.measured(plan.messages, dict(zip(names, pids, strict=True)))
    return {
        "workers": workers,
        "consumed_per_s": round(window.messages / window.seconds),
        "worker_cpu_s": [round(seconds, 2) for seconds in window.cpu.values()],
        "per_worker_core_per_s": round(window.messages / sum(window.cpu.values())),
    }


async def _registered(settings: Settings, workers: int) -> None:
    async def all_there() -> bool:
        return len((await gather_status(settings)).ownership.workers) >= workers

    await eventually(all_there, 30, every=0.2, what=f"{workers} workers registered")


async def scale_out(settings: Settings, folder: Path, plan: Plan) -> dict[str, Any]:
    """1 worker, then 2: the rate per worker core of each, and its ratio (2 against 1)."""
    one = await consume_with(settings, folder / "one-worker", plan, 1)
    two = await consume_with(settings, folder / "two-workers", plan, 2)
    return {
        "one": one,
        "two": two,
        "per_core_ratio": round(two["per_worker_core_per_s"] / one["per_worker_core_per_s"], 3),
    }
