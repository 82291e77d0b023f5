"""``make chaos``: hashq under churn. Two coordinators, several workers and two publishers (one
of them a plain AMQP client) run as separate processes while a fault schedule drawn from the
seed kills, stops and restarts them, and restarts RabbitMQ and ZooKeeper. At the end the
checker (``chaos.checker``) reads what was confirmed, executed and dead-lettered.

Exit status 0 only if nothing was lost or reordered and no two executions of one key overlapped
within one epoch.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaos.checker import Verdict, judge, read_lines
from hashq.amqp import connect_amqp, connection_name
from hashq.provision import ensure_topology
from hashq.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parent.parent
SERVICES = ROOT / "scripts" / "services.sh"
SESSION_SECONDS = 4.0


class Cast:
    """The processes of one run, by name."""

    def __init__(self, settings: Settings, scratch: Path, record: Path) -> None:
        self._env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("HASHQ_")},
            **settings.environment(),
            "HASHQ_ZK_SESSION_TIMEOUT": str(SESSION_SECONDS),
            "HASHQ_CHAOS_RECORD": str(record),
        }
        self._scratch = scratch
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._serial = 0

    def start(self, kind: str, *args: str) -> str:
        self._serial += 1
        name = f"{kind}-{self._serial}"
        command = {
            "worker": ["-m", "hashq.worker_cli", "chaos.handler:record", "--worker-id", name],
            "coordinator": ["-m", "coordinator.cli", "--coordinator-id", name],
            "publisher": ["-m", "chaos.publish", *args],
        }[kind]
        log = (self._scratch / f"{name}.log").open("ab")
        self.processes[name] = subprocess.Popen(
            [sys.executable, *command],
            env={**self._env, "HASHQ_WORKER_ID": name},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        return name

    def alive(self, kind: str) -> list[str]:
        return [
            name
            for name, process in self.processes.items()
            if name.startswith(kind) and process.poll() is None
        ]

    def signal(self, name: str, number: int) -> None:
        if self.processes[name].poll() is None:
            self.processes[name].send_signal(number)

    def stop_all(self, within: float = 45) -> None:
        for name in self.processes:
            self.signal(name, signal.SIGCONT)
            self.signal(name, signal.SIGTERM)
        deadline = time.monotonic() + within
        for process in self.processes.values():
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


class Chaos:
    def __init__(self, cast: Cast, settings: Settings, rng: random.Random) -> None:
        self.cast = cast
        self.settings = settings
        self.rng = rng
        self.log: list[dict[str, Any]] = []
        self._started = time.monotonic()

    def note(self, fault: str, target: str = "", counts: bool = True) -> None:
        """Log a fault (``counts``) or the end of one (not counted again)."""
        self.log.append(
            {
                "at": round(time.monotonic() - self._started, 2),
                "fault": fault,
                "target": target,
                "counts": counts,
            }
        )
        say(f"fault: {fault} {target}".rstrip())

    async def one(self) -> None:
        faults: list[tuple[str, Callable[[], Any]]] = [
            ("kill -9 worker", self.kill_worker),
            ("start worker", self.start_worker),
            ("SIGTERM worker", self.term_worker),
            ("SIGSTOP worker past its session", self.stop_worker),
            ("kill -9 leader", self.kill_leader),
            ("restart RabbitMQ", lambda: self.restart("rabbitmq")),
            ("restart ZooKeeper", lambda: self.restart("zookeeper")),
        ]
        _, action = self.rng.choice(faults)
        result = action()
        if asyncio.iscoroutine(result):
            await result

    def _victim(self) -> str | None:
        workers = self.cast.alive("worker")
        if len(workers) <= 1:
            self.start_worker()
            return None
        return self.rng.choice(workers)

    def kill_worker(self) -> None:
        victim = self._victim()
        if victim:
            self.cast.signal(victim, signal.SIGKILL)
            self.note("kill -9 worker", victim)

    def start_worker(self) -> None:
        self.note("start worker", self.cast.start("worker"))

    def term_worker(self) -> None:
        victim = self._victim()
        if victim:
            self.cast.signal(victim, signal.SIGTERM)
            self.note("SIGTERM worker", victim)

    async def stop_worker(self) -> None:
        victim = self._victim()
        if victim:
            self.cast.signal(victim, signal.SIGSTOP)
            self.note("SIGSTOP worker", victim)
            await asyncio.sleep(SESSION_SECONDS * 2.5)
            self.cast.signal(victim, signal.SIGCONT)
            self.note("SIGCONT worker", victim, counts=False)

    async def kill_leader(self) -> None:
        leader = await asyncio.to_thread(read_leader, self.settings)
        if leader and leader in self.cast.processes:
            self.cast.signal(leader, signal.SIGKILL)
            self.note("kill -9 leader", leader)
            self.cast.start("coordinator")

    async def restart(self, service: str) -> None:
        self.note(f"restart {service}", "begins")
        done = await asyncio.to_thread(
            subprocess.run, ["bash", str(SERVICES), "restart", service], capture_output=True
        )
        if done.returncode != 0:  # a harness fault, not hashq's: bring the service back
            say(f"restart of {service} failed: {done.stderr.decode(errors='replace').strip()}")
            done = await asyncio.to_thread(
                subprocess.run, ["bash", str(SERVICES), "up", service], capture_output=True
            )
        self.note(f"restart {service}", "done" if done.returncode == 0 else "FAILED", counts=False)


def read_leader(settings: Settings) -> str | None:
    from hashq.protocol import Leadership, Paths
    from hashq.zk import close_zk, connect_zk

    try:
        zk = connect_zk(settings)
    except Exception:
        return None
    try:
        return Leadership.decode(zk.get(Paths(settings.app).leader)[0]).leader
    except Exception:
        return None
    finally:
        close_zk(zk)


def say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')}  {text}", flush=True)


async def dead_letters(settings: Settings) -> set[tuple[str, int]]:
    found: set[tuple[str, int]] = set()
    connection = await connect_amqp(settings, connection_name("chaos-dlq"))
    async with connection:
        channel = await connection.channel()
        queue = await channel.get_queue(f"hashq.{settings.app}.dead")
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            found.add((str(message.routing_key), int(json.loads(message.body)["seq"])))
    return found


async def run(args: argparse.Namespace) -> int:
    app = args.app or f"chaos-{args.seed}-{time.strftime('%H%M%S')}"
    settings = load_settings(app=app, buckets=str(args.buckets))
    # The checker must see only this run: an app name used before would mix old records in.
    await ensure_topology(settings)
    scratch = Path(args.out or tempfile.mkdtemp(prefix="hashq-chaos-"))
    await asyncio.to_thread(scratch.mkdir, parents=True, exist_ok=True)
    record = scratch / "executions.jsonl"
    cast = Cast(settings, scratch, record)
    rng = random.Random(args.seed)
    chaos = Chaos(cast, settings, rng)
    say(f"app {app}, seed {args.seed}, {args.duration:g}s of faults; files in {scratch}")
    confirmed_files = [scratch / "confirmed-hashq.jsonl", scratch / "confirmed-plain.jsonl"]
    try:
        for _ in range(2):
            cast.start("coordinator")
        for _ in range(args.workers):
            cast.start("worker")
        for client, path in zip(("hashq", "plain"), confirmed_files, strict=True):
            cast.start(
                "publisher",
                "--client",
                client,
                "--prefix",
                client,
                "--keys",
                str(args.keys),
                "--rate",
                str(args.rate / 2),
                "--seconds",
                str(args.duration),
                "--seed",
                str(args.seed),
                "--confirmed",
                str(path),
            )
        await faults_until(chaos, args, confirmed_files, record)
        await drain_until_done(cast, confirmed_files, record, settings)
    finally:
        cast.stop_all()
    verdict = judge(read_lines(confirmed_files), read_lines([record]), await dead_letters(settings))
    report = {
        "app": app,
        "seed": args.seed,
        "duration": args.duration,
        "faults": chaos.log,
        "hashq": verdict.to_json(),
    }
    (scratch / "report.json").write_text(json.dumps(report, indent=2))
    print_table(verdict, sum(1 for fault in chaos.log if fault["counts"]))
    say(f"report: {scratch / 'report.json'}")
    return 0 if verdict.clean else 1


async def faults_until(
    chaos: Chaos, args: argparse.Namespace, confirmed: list[Path], record: Path
) -> None:
    started = time.monotonic()
    next_fault = started + args.warmup
    while time.monotonic() - started < args.duration:
        if time.monotonic() >= next_fault:
            await chaos.one()
            next_fault = time.monotonic() + chaos.rng.uniform(args.gap / 2, args.gap * 1.5)
        progress(chaos.cast, confirmed, record, started)
        await asyncio.sleep(2.0)


async def drain_until_done(
    cast: Cast, confirmed: list[Path], record: Path, settings: Settings
) -> None:
    if len(cast.alive("worker")) < 2:
        cast.start("worker")
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        sent = {(r["key"], r["seq"]) for r in read_lines(confirmed)}
        done = {(r["key"], r["seq"]) for r in read_lines([record])}
        if sent <= done:
            return
        say(f"draining: {len(sent - done):,} confirmed messages not yet executed")
        await asyncio.sleep(3.0)
    say("gave up waiting: the checker will count what is missing")


def progress(cast: Cast, confirmed: list[Path], record: Path, started: float) -> None:
    sent = sum(_lines(path) for path in confirmed)
    say(
        f"{time.monotonic() - started:5.0f}s  confirmed {sent:,}  executed {_lines(record):,}  "
        f"workers {len(cast.alive('worker'))}  coordinators {len(cast.alive('coordinator'))}"
    )


def _lines(path: Path) -> int:
    if not path.exists():
        return 0
    with path.open("rb") as lines:
        return sum(1 for _ in lines)


def print_table(verdict: Verdict, faults: int) -> None:
    rows = [
        ("faults injected", faults),
        ("confirmed", verdict.confirmed),
        ("executions", verdict.executions),
        ("keys", verdict.keys),
        ("lost", verdict.lost),
        ("reordered", verdict.reordered),
        ("overlapping, same epoch", verdict.overlapping_same_epoch),
        ("overlapping, fenced zombie", verdict.overlapping_zombie),
        ("duplicates", verdict.duplicates),
        ("dead-lettered", verdict.dead_lettered),
    ]
    print()
    for label, value in rows:
        print(f"  {label:<28} {value:>10,}")
    for kind, examples in verdict.examples.items():
        print(f"  e.g. {kind}: {'; '.join(examples[:3])}")
    print("\n  " + ("CLEAN" if verdict.clean else "FAILED"))


def main() -> int:
    parser = argparse.ArgumentParser(prog="chaos")
    parser.add_argument("--duration", type=float, default=float(os.environ.get("DURATION", 60)))
    parser.add_argument("--seed", type=int, default=int(os.environ.get("SEED", 1)))
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--keys", type=int, default=2000, help="keys per publisher")
    parser.add_argument(
        "--rate", type=float, default=600.0, help="messages per second, all publishers"
    )
    parser.add_argument("--buckets", type=int, default=16)
    parser.add_argument("--gap", type=float, default=8.0, help="mean seconds between faults")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--app")
    parser.add_argument("--out")
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
