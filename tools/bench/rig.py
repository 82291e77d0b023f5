"""The benchmark's set-up: an app of its own, consumer processes (hashq workers and
coordinators, or the raw consumer) started and stopped for real, publishing, and waiting for
the consumers to catch up."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from hashq.admin.apps import remove_app
from hashq.admin.status import gather_status
from hashq.provision import ensure_topology
from hashq.publisher import Outgoing, Publisher
from hashq.settings import Settings
from tools.bench.figures import Line, consumed, read_stats
from tools.bench.probe import stamp
from tools.bench.raw import Shape, publish_raw
from tools.executions import parse_complete_lines
from tools.launcher import Fleet
from tools.polling import eventually

BATCH = 1000
SKIPPED = 2_000  # messages a consumer takes before it is measured: its start is not counted


@dataclass(frozen=True)
class Window:
    """What consumers did from their ``SKIPPED``-th message on (``Rig.measured``)."""

    messages: int
    seconds: float
    cpu: dict[str, float]  # CPU seconds of each process measured, by the name it was given

    def ms_per_1k(self, name: str) -> float:
        """CPU milliseconds per 1,000 messages of process ``name``."""
        return round(1_000_000 * self.cpu[name] / self.messages, 1)


def keys(count: int, seed: int = 1) -> Iterator[str]:
    """An endless stream of keys drawn from ``count`` distinct ones."""
    rng = random.Random(seed)
    names = [f"k{n:07d}" for n in range(count)]
    while True:
        yield names[rng.randrange(count)]


class Rig:
    """One benchmark step's processes and their records, in ``folder``."""

    def __init__(
        self, settings: Settings, folder: Path, session: float, worker_flags: tuple[str, ...] = ()
    ) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.settings = settings
        self.folder = folder
        self._worker_flags = worker_flags  # before each worker's own, which win
        self.stats = folder.resolve() / "stats.jsonl"  # the children run from the repository
        self.stats.unlink(missing_ok=True)  # a rerun into the same folder starts afresh
        self._read_up_to = 0
        self._consumed = 0
        self.fleet = Fleet(
            settings,
            folder,
            {"HASHQ_BENCH_STATS": str(self.stats), "HASHQ_ZK_SESSION_TIMEOUT": f"{session:g}"},
        )

    async def __aenter__(self) -> Rig:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self.fleet.stop_all, 30)

    def coordinator(self, name: str = "coordinator-1") -> str:
        return self.fleet.start(name, "-m", "hashq_coordinator.cli", "--coordinator-id", name)

    def worker(self, name: str, handler: str = "tools.bench.probe:noop", *flags: str) -> str:
        argv = ("-m", "hashq.worker.cli", handler, "--worker-id", name)
        return self.fleet.start(name, *argv, *self._worker_flags, *flags)

    def raw_consumer(self, name: str = "raw", shape: Shape | None = None) -> str:
        """The raw consumer, shaped as a plain client (``shape`` None) or as ``shape`` says."""
        env = shape.environment() if shape is not None else None
        return self.fleet.start(name, "-m", "tools.bench.raw", env=env)

    def lines(self) -> list[Line]:
        return read_stats(self.stats)

    async def consuming(self, workers: list[str] | None, within: float = 60) -> None:
        """Until every bucket queue has a consumer (and, for hashq ``workers``, each holds a
        share and no handover is in progress)."""

        async def every_bucket_taken() -> bool:
            status = await gather_status(self.settings)
            return all(queue.consumers >= 1 for queue in status.buckets) and (
                workers is None
                or (all(status.held_by(w) for w in workers) and not status.in_transit)
            )

        await eventually(every_bucket_taken, within, every=0.2, what="every bucket consumed")

    async def caught_up(self, total: int, within: float = 120) -> None:
        await eventually(
            self.consumed_so_far,
            within,
            every=0.1,
            until=lambda n: n >= total,
            what=f"{total:,} consumed",
        )

    async def measured(self, total: int, pids: Mapping[str, int]) -> Window:
        """Until ``total`` are consumed: the messages, seconds and CPU of each of ``pids`` from
        the ``SKIPPED``-th message on (a consumer's start, imports included, is not counted)."""
        await self.caught_up(SKIPPED, within=60)
        skipped, began = self.consumed_so_far(), time.monotonic()
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        await self.caught_up(total, within=max(120, total / 200))
        took = time.monotonic() - began
        used = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
        return Window(total - skipped, took, used)

    def consumed_so_far(self) -> int:
        """Messages consumed, reading only what the consumers appended since the last call (the
        benchmark's own CPU counts as the publisher's)."""
        if not self.stats.exists():
            return 0
        with self.stats.open("rb") as records:
            records.seek(self._read_up_to)
            complete, _, _ = records.read().rpartition(b"\n")
        self._read_up_to += len(complete) + 1 if complete else 0
        self._consumed += consumed(parse_complete_lines(complete.decode(errors="replace")))
        return self._consumed

    async def drained(self, within: float = 120) -> None:
        """Until the bucket queues are empty and the consumers' records are written. For runs
        where a killed consumer's last records are lost, so counting cannot tell."""
        empty_since: list[float] = []  # since when the queues are empty, if they are

        async def empty_for_a_second() -> bool:
            status = await gather_status(self.settings)
            if status.total_messages:
                empty_since.clear()
                return False
            empty_since[:] = empty_since or [time.monotonic()]
            return time.monotonic() - empty_since[0] >= 1.0

        await eventually(empty_for_a_second, within, every=0.2, what="empty bucket queues")

    async def publish_raw(self, count: int, key_count: int) -> float:
        """Publish ``count`` messages with the raw publisher; returns the seconds it took."""
        started = time.time()
        chosen = keys(key_count)
        await publish_raw(self.settings, ((next(chosen), stamp()) for _ in range(count)))
        return time.time() - started

    async def publish(self, count: int, key_count: int, distinct: bool = False) -> float:
        """Publish ``count`` messages with hashq's publisher; returns the seconds it took.
        ``distinct``: every message has a key of its own."""
        started = time.time()
        chosen = (f"u{n:08d}" for n in range(count)) if distinct else keys(key_count)
        async with Publisher(self.settings) as publisher:
            left = count
            while left > 0:
                size = min(BATCH, left)
                await publisher.publish_many([Outgoing(next(chosen), stamp()) for _ in range(size)])
                left -= size
        return time.time() - started

    async def publish_steadily(
        self, rate: float, seconds: float, key_count: int, sizes: tuple[int, int] = (100, 100)
    ) -> int:
        """Publish at about ``rate`` per second for ``seconds``, bodies of ``sizes`` bytes
        (lowest, highest); returns how many were sent."""
        chosen = keys(key_count, seed=2)
        size = random.Random(3)
        sent = 0
        started = time.monotonic()
        async with Publisher(self.settings) as publisher:
            while (elapsed := time.monotonic() - started) < seconds:
                due = int(rate * elapsed) - sent
                if due > 0:
                    batch = [
                        Outgoing(next(chosen), stamp(size.randint(*sizes)))
                        for _ in range(min(due, BATCH))
                    ]
                    await publisher.publish_many(batch)
                    sent += len(batch)
                await asyncio.sleep(0.01)
        return sent


@contextlib.asynccontextmanager
async def bench_app(settings: Settings) -> AsyncIterator[Settings]:
    """The benchmark's app: its topology made first, everything of it removed after."""
    await ensure_topology(settings)
    try:
        yield settings
    finally:
        await remove_app(settings)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds used by process ``pid`` so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def broker_pid(settings: Settings) -> int | None:
    """The broker's process, when it runs on this machine (``listener_pid``)."""
    return listener_pid(urlsplit(settings.amqp_urls[0]).port or 5672)


def listener_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` on this machine (Linux, needs the right to read
    its descriptors), or None: the broker's, to count its CPU when it runs here."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(table).read_text().splitlines()[1:]:
                fields = row.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in fd_dir.iterdir()):
                return int(fd_dir.parent.name)
    return None


def resident_mb(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def machine_cpu() -> tuple[float, float]:
    """Busy and total jiffies of all CPUs so far (Linux)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return float(sum(values) - idle), float(sum(values))
