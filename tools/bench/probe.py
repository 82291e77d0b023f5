"""What a benchmark consumer records, without slowing the hot path: per bucket, how many
messages it started, the first and last start time and the first one's publish time, and a
sample of end-to-end latencies (publish to handler start). One JSON line per interval of
``INTERVAL`` seconds is appended to the file named by ``HASHQ_BENCH_STATS`` with a single
write, so it survives kill -9 but for the last interval.

Bodies carry their publish time: ``stamp()`` makes one, ``published_at()`` reads it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time

from hashq.message import Message

INTERVAL = 0.1
LATENCY_SAMPLES = 50  # per interval
BODY_BYTES = 100


def stamp(size: int = BODY_BYTES) -> bytes:
    """A body of ``size`` bytes that starts with its publish time."""
    return f"{time.time():.6f}".encode().ljust(size, b".")


def published_at(body: bytes) -> float:
    return float(body[:17])


class Stats:
    """Counts per bucket and sampled latencies, flushed every ``INTERVAL`` seconds."""

    def __init__(self, path: str | None, worker: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if path else None
        self._worker = worker
        self._reset(time.time())
        self._timer: asyncio.TimerHandle | None = None

    def _reset(self, now: float) -> None:
        self._started = now
        self._buckets: dict[int, list[float]] = {}
        self._latencies: list[float] = []
        self._seen = 0

    def add(self, bucket: int, body: bytes) -> None:
        now = time.time()
        entry = self._buckets.get(bucket)
        if entry is None:  # the first start's publish time: how long that message waited
            self._buckets[bucket] = [1, now, now, published_at(body)]
        else:
            entry[0] += 1
            entry[2] = now
        self._seen += 1
        # Reservoir sampling keeps the sample uniform however many messages the interval has.
        if len(self._latencies) < LATENCY_SAMPLES:
            self._latencies.append(now - published_at(body))
        elif (slot := random.randrange(self._seen)) < LATENCY_SAMPLES:
            self._latencies[slot] = now - published_at(body)
        if now - self._started >= INTERVAL:
            self.flush(now)
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(INTERVAL, self.flush)

    def flush(self, now: float | None = None) -> None:
        now = now or time.time()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._fd is not None and self._buckets:
            line = {
                "worker": self._worker,
                "t0": self._started,
                "t1": now,
                "buckets": self._buckets,
                "latency": [round(value, 6) for value in self._latencies],
            }
            os.write(self._fd, (json.dumps(line) + "\n").encode())
        self._reset(now)


_stats: Stats | None = None


def _recorder() -> Stats:
    global _stats
    if _stats is None:
        worker = os.environ.get("HASHQ_WORKER_ID", str(os.getpid()))
        _stats = Stats(os.environ.get("HASHQ_BENCH_STATS"), worker)
    return _stats


async def noop(msg: Message) -> None:
    """The handler of the throughput runs: records, does nothing."""
    _recorder().add(msg.bucket, msg.body)


async def sleepy(msg: Message) -> None:
    """A handler that waits 1 to 5 ms, as one calling a fast service would."""
    _recorder().add(msg.bucket, msg.body)
    await asyncio.sleep(random.uniform(0.001, 0.005))


async def slow50(msg: Message) -> None:
    """A handler that takes 50 ms, for the handover pause with work in flight."""
    _recorder().add(msg.bucket, msg.body)
    await asyncio.sleep(0.05)


HOT_KEY = "hot"
HANDLER_SECONDS = 0.005


async def hot_or_cold(msg: Message) -> None:
    """A handler that takes 5 ms; records only the cold keys (every key but ``HOT_KEY``), whose
    latency the hot-key step measures."""
    if msg.key != HOT_KEY:
        _recorder().add(msg.bucket, msg.body)
    await asyncio.sleep(HANDLER_SECONDS)
