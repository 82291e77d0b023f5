"""``make chaos``: hashq under churn, beside the naive designs it replaces.

For each design (hashq; ``split``: the consistent-hash exchange re-split among consumers;
``lock``: one queue with a per-key lock), the same workload and the same seeded fault schedule:
several workers (plus two coordinators for hashq) and two publishers, one of them a plain AMQP
client, run as separate processes while faults kill, stop and restart them and restart RabbitMQ
and ZooKeeper. The checker (``tools.checker``) then reads what was confirmed, executed, dead-
lettered and left in queues.

Exit status 0 only if, for hashq, nothing was lost or reordered, no two executions of one key
overlapped within one epoch, and no execution started at an epoch older than its bucket's
newest (``tools.checker``). The baselines' counts are reported, not judged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hashq.settings import Settings, load_settings
from tools import SERVICES_SCRIPT, say
from tools.broker_env import (
    consumer_timeout_settings,
    rabbit_eval,
    restore_rabbit_env,
    set_rabbit_env,
)
from tools.chaos.clock import OFFSET_VARIABLE, Clocks, true_offset
from tools.chaos.designs import DESIGNS, Design, leftovers
from tools.chaos.faults import DRAIN_SECONDS, FAULT_KINDS, SESSION_SECONDS, Chaos
from tools.chaos.network import Network
from tools.chaos.poison import Poisons, draw_keys, worker_env
from tools.chaos.recovery import recoveries
from tools.chaos.report import print_table
from tools.chaos.resizes import Resizes
from tools.chaos.tally import Tally
from tools.checker import judge
from tools.executions import read_all, read_appended
from tools.launcher import Fleet
from tools.polling import eventually


class Files:
    """Where one design's run keeps its records."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.record = folder / "executions.jsonl"
        self.confirmed = [folder / "confirmed-1.jsonl", folder / "confirmed-2.jsonl"]
        if any(path.exists() for path in [self.record, *self.confirmed]):
            # Records of an earlier run would be judged with this one's.
            raise SystemExit(f"chaos: {folder} holds records of an earlier run; choose --out")


async def run_design(
    design: Design, settings: Settings, args: argparse.Namespace
) -> dict[str, Any]:
    files = Files(Path(args.out) / design.name)
    await design.prepare(settings)
    poisons, resizes, following = None, None, None
    if design.coordinated and args.poison:  # the baselines have no parking
        keys = draw_keys(args.seed, args.keys, args.poison)
        poisons = Poisons(settings, files.folder, keys, args.duration, args.seed)
    fleet = Fleet(
        settings,
        files.folder,
        {
            "HASHQ_ZK_SESSION_TIMEOUT": str(SESSION_SECONDS),
            "HASHQ_DRAIN_TIMEOUT": str(DRAIN_SECONDS),  # the publishers' holds outlast it
            "HASHQ_CHAOS_RECORD": str(files.record),
            OFFSET_VARIABLE: repr(true_offset()),  # records keep true times under a stepped clock
            **(worker_env(poisons.path) if poisons else {}),
        },
    )
    counts = [int(count) for count in args.resize.split(",") if count]
    if design.coordinated and counts:  # the baselines cannot grow
        resizes = Resizes(fleet, counts, args.duration)
    schedule = args.faults.split(",") if args.faults else None
    network = Network(settings)
    clocks = Clocks(files.folder)
    if clocks.library is None:
        say(
            "chaos: libfaketime is not installed (apt-get install faketime): clock steps do nothing"
        )
    chaos = Chaos(
        fleet, network, clocks, design, settings, args.seed, schedule, broker_settings(args)
    )
    say(f"{design.title}: {args.duration:g}s of faults, seed {args.seed}; files in {files.folder}")
    try:
        if design.coordinated:
            for _ in range(2):
                await chaos.start("coordinator")
        for _ in range(args.workers):
            await chaos.start("worker")
        for number, client in enumerate(design.clients(), start=1):
            name = f"publisher-{number}"
            argv = publisher_argv(design, settings, args, files, number, client)
            fleet.start(name, *argv, env=await network.attach(name))
        tally = Tally(files.confirmed, files.record)
        following = asyncio.ensure_future(resizes.follow()) if resizes else None
        await faults_until(chaos, args, tally, poisons)
        await drain_until_done(chaos, tally, args.drain, poisons, resizes)
    finally:
        if following is not None:
            following.cancel()
        await asyncio.to_thread(fleet.stop_all)
        await network.close()
    executions = read_appended(files.record)
    dead = await leftovers(settings, [q for q in [design.dead_letter_queue(settings)] if q])
    parking = poisons.parking_queues() if poisons else []
    grown = resizes.final_count if resizes else None
    final = settings.model_copy(update={"buckets": grown}) if grown else settings
    queued = await leftovers(settings, design.queues(final) + parking)
    verdict = judge(read_all(files.confirmed), executions, dead, queued)
    if not args.keep:
        await design.remove(settings)
    return {
        "title": design.title,
        "faults": chaos.log,
        "verdict": verdict.to_json(),
        "recovery": recoveries(chaos.log, executions),
        "workload": workload(executions, files.folder),
        "poison": poisons.report(files.folder) if poisons else None,
        "resizes": resizes.report() if resizes else None,
    }


def broker_settings(args: argparse.Namespace) -> dict[str, int]:
    """What the run sets in the broker, again after each restart of it."""
    return (
        consumer_timeout_settings(int(args.consumer_timeout * 1000))
        if args.consumer_timeout
        else {}
    )


def workload(executions: list[dict[str, Any]], logs: Path) -> dict[str, int]:
    """What the holds and clock steps did: executions longer than the drain timeout (in threads,
    and not), bucket channels the broker closed for its consumer_timeout (each logged once by a
    worker), executions in a process whose wall clock was stepped, and executions whose
    handler's first line came more than half a second after the worker let them begin (a
    process stopped in between: judged from the worker's start, so counted here to be seen)."""
    long = [run for run in executions if run["end"] - run["start"] > DRAIN_SECONDS]
    late = [run for run in executions if run.get("first_line", run["start"]) - run["start"] > 0.5]
    said = "past the broker's consumer_timeout"
    return {
        "past_drain_timeout": len(long),
        "past_drain_timeout_in_threads": sum(1 for run in long if run.get("thread")),
        "under_stepped_clock": sum(1 for run in executions if run.get("clock_off")),
        "late_first_lines": len(late),
        "consumer_timeouts": sum(
            path.read_text(errors="replace").count(said) for path in logs.glob("worker-*.log")
        ),
    }


def publisher_argv(
    design: Design,
    settings: Settings,
    args: argparse.Namespace,
    files: Files,
    number: int,
    client: str,
) -> list[str]:
    return [
        "-m",
        "tools.chaos.publish",
        "--client",
        client,
        "--exchange",
        design.exchange(settings),
        "--prefix",
        f"p{number}",
        "--keys",
        str(args.keys),
        "--rate",
        str(args.rate / 2),
        "--seconds",
        str(args.duration * 4),  # a cap: the harness stops them when the faults end
        "--seed",
        str(args.seed + number),
        "--confirmed",
        str(files.confirmed[number - 1]),
        "--hold-every",
        str(args.hold_every * 2),  # two publishers
    ]


async def faults_until(
    chaos: Chaos, args: argparse.Namespace, tally: Tally, poisons: Poisons | None
) -> None:
    """Faults for ``--duration`` seconds, and a given schedule to its end even past them (how
    long its faults take depends on the machine), then the publishers are told to stop: the
    load lasts as long as the faults, the last one included."""
    started = time.monotonic()
    next_fault = started + args.warmup
    while time.monotonic() - started < args.duration or chaos.schedule:
        if time.monotonic() >= next_fault:
            await chaos.one()
            next_fault = time.monotonic() + chaos.rng.uniform(args.gap / 2, args.gap * 1.5)
        await asyncio.to_thread(progress, chaos.fleet, tally, started)  # the links go on
        if poisons:
            await poisons.tick(time.monotonic() - started)
        await asyncio.sleep(2.0)
    if (overrun := time.monotonic() - started - args.duration) > 1:
        capped = (
            " (the publishers stopped at their cap, 4x --duration)"
            if overrun > 3 * args.duration
            else ""
        )
        say(f"chaos: the faults ran {overrun:.0f}s past --duration{capped}")
    for publisher in chaos.fleet.alive("publisher"):
        chaos.fleet.signal(publisher, signal.SIGTERM)  # each confirms its last batch and exits


async def drain_until_done(
    chaos: Chaos, tally: Tally, within: float, poisons: Poisons | None, resizes: Resizes | None
) -> None:
    """Wait (up to ``within`` seconds) until everything confirmed was executed, releasing the
    poison keys, mended, as long as any is parked, and every resize is done."""
    if len(chaos.fleet.alive("worker")) < 2:
        await chaos.start("worker")
    started = time.monotonic()
    deadline = started + within
    if poisons:
        poisons.mend_all(0.0)
    # The publishers stop on their own; their last batch is confirmed and recorded after the
    # faults end. Comparing before they exit would miss it, and stop the workers too early.
    for publisher in chaos.fleet.alive("publisher"):
        await asyncio.to_thread(chaos.fleet.processes[publisher].wait, deadline - time.monotonic())

    async def all_executed() -> bool:
        if poisons:
            await poisons.release_parked(time.monotonic() - started)
        if resizes and not resizes.done:
            return False
        return await asyncio.to_thread(executed_all)  # reading the records blocks; links do not

    def executed_all() -> bool:
        tally.look()
        if tally.left:
            say(f"draining: {len(tally.left):,} confirmed messages not yet executed")
        return not tally.left

    left = deadline - time.monotonic()
    if not await eventually(all_executed, left, every=3.0, or_last=True):
        say("stopped waiting: what is still queued counts as unfinished, the rest as lost")


def progress(fleet: Fleet, tally: Tally, started: float) -> None:
    tally.look()
    say(
        f"{time.monotonic() - started:5.0f}s  confirmed {tally.sent:,}"
        f"  executed {tally.executions:,}"
        f"  workers {len(fleet.alive('worker'))}  coordinators {len(fleet.alive('coordinator'))}"
    )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    app = args.app or f"chaos-{args.seed}-{time.strftime('%H%M%S')}"
    settings = load_settings(app=app, buckets=str(args.buckets))
    results = {}
    before = await asyncio.to_thread(set_rabbit_env, rabbit_eval, broker_settings(args))
    try:
        for name in args.designs.split(","):
            results[name] = await run_design(DESIGNS[name], settings, args)
    finally:
        await asyncio.to_thread(restore_rabbit_env, rabbit_eval, before)
    return {
        "app": app,
        "seed": args.seed,
        "duration": args.duration,
        "rate": args.rate,
        "keys": 2 * args.keys,
        "designs": results,
    }


def servers_not_answering() -> str:
    """What ``tools/services.sh status`` says of a server that does not answer ("" if both
    answer): the run restarts them through that script, so it needs them up before it starts."""
    done = subprocess.run(
        ["bash", str(SERVICES_SCRIPT), "status"], capture_output=True, text=True, check=False
    )
    if done.returncode == 0:
        return ""
    lines = [" ".join(line.split()) for line in done.stdout.splitlines() if "not answering" in line]
    return "; ".join(lines) or done.stderr.strip() or f"status exited {done.returncode}"


def main() -> int:
    parser = argparse.ArgumentParser(prog="chaos")
    parser.add_argument("--duration", type=float, default=float(os.environ.get("DURATION", 60)))
    parser.add_argument("--seed", type=int, default=int(os.environ.get("SEED", 1)))
    parser.add_argument(
        "--designs", default="hashq,split,lock", help="comma-separated: hashq, split, lock"
    )
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--keys", type=int, default=2000, help="keys per publisher")
    parser.add_argument("--rate", type=float, default=600.0, help="messages/s, both publishers")
    parser.add_argument("--buckets", type=int, default=16)
    parser.add_argument("--gap", type=float, default=8.0, help="mean seconds between faults")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument(
        "--faults",
        help="comma-separated fault kinds to carry out in this order, and no others, instead of "
        f"drawing them: {', '.join(FAULT_KINDS)}",
    )
    parser.add_argument("--drain", type=float, default=180.0, help="seconds to wait at the end")
    parser.add_argument(
        "--hold-every",
        type=float,
        default=5.0,
        help="mean seconds between messages whose handler outlasts the drain timeout; 0: none",
    )
    parser.add_argument(
        "--consumer-timeout",
        type=float,
        default=4.0,
        help="the broker's consumer_timeout during the run, seconds (0: the broker's own); "
        "above the longest hold, below two of them",
    )
    parser.add_argument(
        "--poison", type=int, default=3, help="keys whose handler fails for a while (hashq only)"
    )
    parser.add_argument(
        "--resize",
        default="",
        help="comma-separated bucket counts to grow to during the run, e.g. 24,64 (hashq only)",
    )
    parser.add_argument("--app")
    parser.add_argument("--out")
    parser.add_argument("--keep", action="store_true", help="keep queues and ZooKeeper state")
    args = parser.parse_args()
    unknown = set(args.designs.split(",")) - set(DESIGNS)
    if unknown:
        parser.error(f"unknown design(s) {', '.join(sorted(unknown))}; known: {', '.join(DESIGNS)}")
    unknown = set(args.faults.split(",") if args.faults else []) - set(FAULT_KINDS)
    if unknown:
        known = ", ".join(FAULT_KINDS)
        parser.error(f"unknown fault(s) {', '.join(sorted(unknown))}; known: {known}")
    down = servers_not_answering()
    if down:
        say(f"chaos: the servers must answer before the run ({down}); start them: make services")
        return 2
    args.out = args.out or tempfile.mkdtemp(prefix="hashq-chaos-")
    report = asyncio.run(run(args))
    path = Path(args.out, "report.json")
    path.write_text(json.dumps(report, indent=2))
    print_table(report["designs"])
    say(f"report: {path}")
    hashq = report["designs"].get("hashq")
    resized = all(r["seconds"] is not None for r in (hashq or {}).get("resizes") or [])
    clean = hashq is None or (hashq["verdict"]["clean"] and resized)
    print("\n  " + ("hashq: CLEAN" if clean else "hashq: FAILED"))
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
