"""What the leader's ZooKeeper reads cost at scale: ``python -m tools.bench.zk_reads``.

The leader looks at the registrations at each observation (every 0.5 s, and again at once
after a busy one): it reads every one when it is elected, and then only those a watch says
changed; it reads every bucket record when it is elected (``hashq_coordinator.store``). This
writes ``--workers`` registrations and ``--buckets`` records under an app of its own on the
configured ZooKeeper, times the store's reads of them (each read asked at once, then the
answers taken in order), a look with nothing changed, and the same nodes' reads alone, without
decoding them. It removes the app after.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from kazoo.client import KazooClient

from hashq.records import BucketRecord, Paths, Registration
from hashq.settings import Settings, load_settings
from hashq_coordinator.store import Store

ROUNDS = 5


def timed(read: Callable[[], Any]) -> tuple[int, list[float]]:
    """How many items ``read`` returns, and its milliseconds in each of ``ROUNDS`` rounds."""
    times, got = [], None
    for _ in range(ROUNDS):
        began = time.monotonic()
        got = read()
        times.append(1000 * (time.monotonic() - began))
    return len(got or ()), times


def populate(zk: KazooClient, paths: Paths, workers: int, buckets: int) -> None:
    for path in (paths.workers, paths.buckets, paths.releases, paths.assignments):
        zk.ensure_path(path)
    for number in range(workers):
        name = f"worker-{number:05d}"
        registration = Registration(name, f"i{number}", 32, connection=f"hashq-worker-{number}")
        zk.create(paths.worker(name), registration.encode())
    for bucket in range(buckets):
        zk.create(paths.bucket(bucket), BucketRecord().encode())


def measure(settings: Settings, workers: int, buckets: int) -> None:
    zk = KazooClient(hosts=settings.zk_hosts)
    zk.start()
    paths = Paths(f"zk-reads-{time.strftime('%H%M%S')}")
    try:
        populate(zk, paths, workers, buckets)
        store = Store(zk, paths, buckets)
        store.workers()  # every registration known, and watched

        def pipelined(nodes: list[str]) -> list[Any]:
            pending = [zk.get_async(node) for node in nodes]
            return [answer.get() for answer in pending]

        reads = {
            f"every registration ({workers:,}), as a new leader reads them": lambda: Store(
                zk, paths, buckets
            ).workers(),
            "a look at them with nothing changed, as the leader's every 0.5 s": store.workers,
            f"every bucket record ({buckets:,}), as a new leader reads them": store.records,
            "the registrations' nodes alone, not decoded": lambda: pipelined(
                [paths.worker(name) for name in zk.get_children(paths.workers)]
            ),
            "the bucket records' nodes alone, not decoded": lambda: pipelined(
                [paths.bucket(bucket) for bucket in range(buckets)]
            ),
        }
        for name, read in reads.items():
            count, times = timed(read)
            runs = ", ".join(f"{ms:.0f}" for ms in times)
            print(f"{name}: {count:,} read, median {statistics.median(times):.0f} ms ({runs})")
    finally:
        zk.delete(paths.root, recursive=True)
        zk.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.zk_reads", description=__doc__)
    parser.add_argument("--workers", type=int, default=1_000)
    parser.add_argument("--buckets", type=int, default=4_096)
    args = parser.parse_args(argv)
    measure(load_settings(), args.workers, args.buckets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
