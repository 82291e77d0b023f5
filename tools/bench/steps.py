"""The benchmark's steps. Each starts its consumers as real processes on the bench app, drives
load, and returns its figures as a dict; ``Plan`` says how big each step is."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hashq.admin.status import gather_status
from hashq.settings import Settings
from tools.bench import figures
from tools.bench.raw import Shape
from tools.bench.rig import Rig, broker_pid, cpu_seconds, machine_cpu, resident_mb

# hashq's documented throughput setting (docs/operations.md, HASHQ_PREFETCH), for the steps
# compared with a raw consumer tuned for throughput (one channel, a prefetch of 1,000, acks
# every 100).
THROUGHPUT_PREFETCH = 128


@dataclass(frozen=True)
class Plan:
    """Sizes of one benchmark run."""

    messages: int = 100_000
    keys: int = 10_000
    steady_seconds: float = 30.0
    session: float = 10.0  # the default ZooKeeper session timeout
    short_session: float = 2.0
    distinct_keys: int = 1_000_000
    seed_seconds: float = 60.0
    quick: bool = False
    prefetch: int | None = None  # the workers' HASHQ_PREFETCH (None: their default, 32)
    # The worker's prefetch in the steps compared with the raw consumer, which is tuned for
    # throughput: its consuming alone at ``prefetch`` is measured beside it.
    throughput_prefetch: int = THROUGHPUT_PREFETCH

    @classmethod
    def quick_plan(
        cls, prefetch: int | None = None, throughput_prefetch: int = THROUGHPUT_PREFETCH
    ) -> Plan:
        return cls(
            messages=20_000,
            steady_seconds=6.0,
            quick=True,
            prefetch=prefetch,
            throughput_prefetch=throughput_prefetch,
        )

    def for_throughput(self) -> Plan:
        """The plan of the steps compared with the raw side: hashq at its throughput setting."""
        return replace(self, prefetch=self.throughput_prefetch)

    def worker_flags(self) -> tuple[str, ...]:
        """Flags every hashq worker of the run gets, before a step's own."""
        return ("--prefetch", str(self.prefetch)) if self.prefetch is not None else ()


async def throughput(
    settings: Settings, folder: Path, plan: Plan, consumer: str, *flags: str
) -> dict[str, Any]:
    """Publish ``plan.messages`` as fast as possible while ``consumer`` consumes them.

    ``consumer``: "raw" (the raw aiormq consumer, fed by the raw publisher), or a hashq
    handler (fed by hashq's publisher) run by one worker with ``flags``.
    """
    async with Rig(settings, folder, plan.session, plan.worker_flags()) as rig:
        if consumer == "raw":
            name = rig.raw_consumer()
            await rig.consuming(None)
        else:
            rig.coordinator()
            name = rig.worker("worker-1", consumer, *flags)
            await rig.consuming(["worker-1"])
        cpu = CpuMeter(rig.fleet.processes[name].pid, settings)
        started = time.time()
        publish = rig.publish_raw if consumer == "raw" else rig.publish
        publish_seconds = await publish(plan.messages, plan.keys)
        await rig.caught_up(plan.messages, within=max(120, plan.messages / 200))
        lines = rig.lines()
        return {
            "messages": plan.messages,
            "published_per_s": round(plan.messages / publish_seconds),
            "end_to_end_per_s": round(plan.messages / (figures.last_start(lines) - started)),
            **cpu.ms_per_1k(plan.messages),
        }


class CpuMeter:
    """CPU used from now on by the consumer process, by this process (the publisher), and by
    the broker when it runs on this machine."""

    def __init__(self, consumer_pid: int, settings: Settings) -> None:
        self._pids = {"consumer": consumer_pid}
        broker = broker_pid(settings)
        if broker is not None:
            self._pids["broker"] = broker
        self._before = self._now()

    def _now(self) -> dict[str, float]:
        used = {role: cpu_seconds(pid) for role, pid in self._pids.items()}
        return {**used, "publisher": time.process_time()}

    def ms_per_1k(self, messages: int) -> dict[str, float]:
        """CPU milliseconds per 1,000 messages, by role."""
        now = self._now()
        per = 1000 * 1000 / messages
        return {
            f"{role}_cpu_ms_per_1k": round((now[role] - was) * per, 1)
            for role, was in self._before.items()
        }


async def drain(
    settings: Settings, folder: Path, plan: Plan, consumer: str, shape: Shape | None = None
) -> dict[str, Any]:
    """The consuming side alone: ``plan.messages`` published first, then ``consumer`` ("raw",
    shaped as ``shape`` says, or a hashq handler run by one worker) started on the full queues;
    messages per second from its first start to its last, and the CPU per 1,000 messages of
    the consumer and the broker from its ``SKIPPED``-th message on (``Rig.measured``)."""
    async with Rig(settings, folder, plan.session, plan.worker_flags()) as rig:
        if consumer == "raw":
            await rig.publish_raw(plan.messages, plan.keys)
            name = rig.raw_consumer(shape=shape)
        else:
            rig.coordinator()
            await rig.publish(plan.messages, plan.keys)
            name = rig.worker("worker-1", consumer)
        pids = {"consumer": rig.fleet.processes[name].pid}
        if (broker := broker_pid(settings)) is not None:
            pids["broker"] = broker
        window = await rig.measured(plan.messages, pids)
        lines = rig.lines()
        first = min(entry[1] for line in lines for entry in line["buckets"].values())
        return {
            "consumed_per_s": round(plan.messages / (figures.last_start(lines) - first)),
            **{f"drain_{role}_cpu_ms_per_1k": window.ms_per_1k(role) for role in pids},
        }


async def steady(settings: Settings, folder: Path, plan: Plan, rate: float) -> dict[str, Any]:
    """End-to-end latency at a steady ``rate``, one worker with a no-op handler."""
    async with Rig(settings, folder, plan.session, plan.worker_flags()) as rig:
        rig.coordinator()
        rig.worker("worker-1")
        await rig.consuming(["worker-1"])
        started = time.time()
        sent = await rig.publish_steadily(rate, plan.steady_seconds, plan.keys)
        await rig.caught_up(sent)
        # The first second warms up connections and caches; it is left out.
        latency = figures.latency_ms(rig.lines(), started + 1, time.time())
        return {"rate_per_s": round(rate), "sent": sent, **latency}


async def handover(
    settings: Settings,
    folder: Path,
    plan: Plan,
    rate: float,
    handler: str = "tools.bench.probe:noop",
) -> dict[str, Any]:
    """Under a steady load on one worker, a second joins: the pause of each moved bucket, and
    the throughput of the buckets that stayed, during the handover against before it."""
    async with Rig(settings, folder, plan.session, plan.worker_flags()) as rig:
        rig.coordinator()
        rig.worker("worker-1", handler)
        await rig.consuming(["worker-1"])
        loaded = time.time() + 0.5  # the load's first half second warms up: left out
        load = asyncio.ensure_future(rig.publish_steadily(rate, plan.steady_seconds, plan.keys))
        await asyncio.sleep(plan.steady_seconds / 3)
        joined = time.time()
        rig.worker("worker-2", handler)
        sent = await load
        await rig.caught_up(sent)
        lines = rig.lines()
        moved = figures.held(lines, "worker-2", joined, time.time())
        stayed = figures.held(lines, "worker-1", joined - 2, joined) - moved
        pauses = figures.handover_pauses(lines, moved, "worker-1", "worker-2")
        gaps = figures.handover_gaps(lines, moved, "worker-1", "worker-2")
        done = max((figures.starts(lines, b, "worker-2")[0] for b in moved), default=joined + 1)
        before = figures.rate(lines, stayed, max(loaded, joined - 3), joined)
        during = figures.rate(lines, stayed, joined, max(done, joined + 1))
        return {
            "rate_per_s": round(rate),
            "joined_at": joined,
            "moved_buckets": len(moved),
            "pause_ms_max": round(max(pauses) * 1000, 1) if pauses else None,
            "pause_ms_median": round(figures.median(pauses) * 1000, 1) if pauses else None,
            "gap_ms_max": round(max(gaps) * 1000, 1) if gaps else None,
            # moved buckets whose first message waited from the old owner's last start: the
            # others' pause is that message's own wait (the bucket had nothing to run)
            "waited_whole_gap": sum(1 for p, g in zip(pauses, gaps, strict=True) if p >= g - 1e-6),
            "handover_s": round(done - joined, 2),
            "unmoved_per_s_before": round(before),
            "unmoved_per_s_during": round(during),
            "unmoved_throughput_ratio": round(during / before, 3) if before else None,
        }


async def failover(
    settings: Settings,
    folder: Path,
    plan: Plan,
    rate: float,
    session: float,
    how: signal.Signals = signal.SIGKILL,
) -> dict[str, Any]:
    """Under a steady load on two workers, one is killed (kill -9) or stopped (``how``
    SIGSTOP, resumed once the load ends): seconds until each of its buckets processes again on
    the other, with ZooKeeper sessions of ``session`` seconds. A crash is heard from the broker;
    a stopped process keeps its connection, so its buckets wait for its session and a fence."""
    async with Rig(settings, folder, session, plan.worker_flags()) as rig:
        rig.coordinator()
        rig.worker("worker-1")
        rig.worker("worker-2")
        await rig.consuming(["worker-1", "worker-2"])
        # The coordinator trusts the management API's list of connections only for workers
        # registered longer than its listing lag (6 s): a worker killed sooner is waited for.
        # Workers live longer than that; so does the victim here.
        settled = 7.0
        seconds = max(plan.steady_seconds, settled + session * 2 + 5)
        load = asyncio.ensure_future(rig.publish_steadily(rate, seconds, plan.keys))
        await asyncio.sleep(settled)
        victim = rig.fleet.processes["worker-2"]
        lost = (await gather_status(settings)).held_by("worker-2")
        killed = time.time()
        os.kill(victim.pid, how)
        await load
        if how is signal.SIGSTOP:
            os.kill(victim.pid, signal.SIGCONT)
        await rig.drained()  # the victim's last records died with it: counting cannot tell
        times = figures.recovery_times(rig.lines(), lost, killed, "worker-2")
        return {
            "session_s": session,
            "signal": how.name,
            "buckets": len(lost),
            "recovered": len(times),
            "failover_s_max": round(max(times), 2) if times else None,
            "failover_s_median": round(figures.median(times), 2) if times else None,
        }


async def many_keys(settings: Settings, folder: Path, plan: Plan) -> dict[str, Any]:
    """A worker's resident memory before and after messages of ``plan.distinct_keys`` keys."""
    async with Rig(settings, folder, plan.session, plan.worker_flags()) as rig:
        rig.coordinator()
        rig.worker("worker-1")
        await rig.consuming(["worker-1"])
        pid = rig.fleet.processes["worker-1"].pid
        await rig.publish(10_000, 0, distinct=True)  # warm up: connections, lanes, caches
        await rig.caught_up(10_000)
        before = resident_mb(pid)
        await rig.publish(plan.distinct_keys, 0, distinct=True)
        await rig.caught_up(10_000 + plan.distinct_keys, within=plan.distinct_keys / 100)
        after = resident_mb(pid)
        return {
            "keys": plan.distinct_keys,
            "rss_mb_before": round(before, 1),
            "rss_mb_after": round(after, 1),
            "growth_mb": round(after - before, 1),
        }


async def seed_workload(settings: Settings, folder: Path, plan: Plan) -> dict[str, Any]:
    """About 5,000 events per second of 50-200 bytes from 100,000 clients for a minute: does
    one worker keep up, and at what CPU (its own, and the whole machine's)."""
    async with Rig(settings, folder, plan.session, plan.worker_flags()) as rig:
        rig.coordinator()
        rig.worker("worker-1")
        await rig.consuming(["worker-1"])
        pid = rig.fleet.processes["worker-1"].pid
        cpu_before, machine_before, started = cpu_seconds(pid), machine_cpu(), time.time()
        sent = await rig.publish_steadily(5000, plan.seed_seconds, 100_000, sizes=(50, 200))
        published, cpu_after, machine_after = time.time(), cpu_seconds(pid), machine_cpu()
        await rig.caught_up(sent, within=300)
        lag = figures.last_start(rig.lines()) - published
        busy, total = (machine_after[0] - machine_before[0], machine_after[1] - machine_before[1])
        return {
            "target_per_s": 5000,
            "published_per_s": round(sent / (published - started)),
            "behind_at_end_s": round(max(0.0, lag), 2),
            "worker_cpu_percent": round(100 * (cpu_after - cpu_before) / (published - started)),
            "machine_cpu_percent": round(100 * busy / total) if total else None,
        }
