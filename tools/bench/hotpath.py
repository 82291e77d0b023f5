"""hashq's own CPU per message, without a broker: ``python -m tools.bench.hotpath``.

The consume-alone profile (``tools.bench.profile``) samples a real worker, about 1,500 samples a
run: good to a tenth for a layer and a third for a function, too coarse to tell a change of a
microsecond. This drives a worker's own code with the frames a broker would send, in one
process, timed by the CPU clock over many messages:

- ``plain``: what a plain consumer does per delivery here: aiormq's task per delivery (made the
  way aiormq makes it), and a count of acknowledgements;
- ``hashq``: each delivery into ``BucketLease.deliver`` as the channel's reader calls it
  (``hashq._io.direct``: no task per delivery), the lease's machine, the runners, a no-op
  async handler, the outcome and the ack window, at the worker's default settings (64
  buckets, a prefetch of 32, 32 runners), untraced.

The difference is what hashq adds per message on the client, before the broker's frames are
read: the broker, the socket and aiormq's frame parsing are the same for both and not here.
Deliveries come in bursts of ``--burst`` per pass of the loop, as a read of the socket brings
them; acknowledgements are counted, not sent, by a stand-in channel.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiormq.abc import DeliveredMessage
from pamqp import commands as spec
from pamqp.header import ContentHeader

from hashq.message import Message
from hashq.placement import bucket_of
from hashq.settings import WorkerSettings
from hashq.worker.acks import Acker
from hashq.worker.bucket_lease import BucketLease
from hashq.worker.dead_letter import DeadLetters
from hashq.worker.metrics import WorkerMetrics
from hashq.worker.retry import RetryPolicy
from hashq.worker.runners import Runners

BUCKETS = 64
KEYS = 10_000


class _Channel:
    """What a lease's acker and its liveness checks ask of an aiormq channel."""

    is_closed = False

    def __init__(self) -> None:
        self.acks = 0

    async def basic_ack(self, tag: int, multiple: bool = False, wait: bool = True) -> None:
        self.acks += 1


def _deliveries(count: int) -> list[tuple[int, DeliveredMessage]]:
    """``count`` deliveries over ``KEYS`` keys: (bucket, delivery), tags 1, 2, ... per bucket."""
    rng = random.Random(7)
    tags = [0] * BUCKETS
    made = []
    for _ in range(count):
        key = f"key-{rng.randrange(KEYS)}"
        bucket = bucket_of(key, BUCKETS)
        tags[bucket] += 1
        properties = spec.Basic.Properties(message_id=f"{rng.getrandbits(64):x}", headers={})
        frame = spec.Basic.Deliver("ctag", tags[bucket], False, "hashq.bench", key)
        header = ContentHeader(properties=properties)
        delivery = DeliveredMessage(frame, header, b"{}", None)  # type: ignore[arg-type]
        made.append((bucket, delivery))
    return made


async def _noop(message: Message) -> None:
    return None


async def _feed(
    deliveries: list[tuple[int, DeliveredMessage]],
    consumers: list[Callable[[DeliveredMessage], Any]],
    burst: int,
    done: Callable[[], int],
    in_tasks: bool,
) -> float:
    """Deliver in bursts, each delivery in a task of its own as aiormq does (``in_tasks``) or
    by a call; CPU seconds until ``done()`` counts them all."""
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[Any]] = set()
    began = time.process_time()
    for start in range(0, len(deliveries), burst):
        for bucket, delivery in deliveries[start : start + burst]:
            if in_tasks:
                task = loop.create_task(consumers[bucket](delivery))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            else:
                consumers[bucket](delivery)
        await asyncio.sleep(0)
    while done() < len(deliveries):  # noqa: ASYNC110 - nothing to wait on but the count
        await asyncio.sleep(0)
    return time.process_time() - began


async def plain(deliveries: list[tuple[int, DeliveredMessage]], burst: int) -> float:
    acked = 0

    async def consume(delivery: DeliveredMessage) -> None:
        nonlocal acked
        acked += 1

    return await _feed(deliveries, [consume] * BUCKETS, burst, lambda: acked, in_tasks=True)


async def hashq(deliveries: list[tuple[int, DeliveredMessage]], burst: int) -> float:
    settings = WorkerSettings()
    runners = Runners(
        _noop,
        concurrency=settings.concurrency,
        threads=settings.threads,
        policy=RetryPolicy.from_settings(settings),
        dead_letters=DeadLetters.__new__(DeadLetters),  # never called: nothing fails
        codec=settings.codec,
        metrics=WorkerMetrics(["bench"]),
    )
    leases = []
    for bucket in range(BUCKETS):
        lease = BucketLease(
            bucket, 1, f"hashq.bench.b{bucket}", runners.dispatch, max(1, settings.prefetch // 2)
        )
        channel = _Channel()
        lease._channel = channel  # type: ignore[assignment]
        lease._acker = Acker(channel, max(1, settings.prefetch // 2), bucket)  # type: ignore[arg-type]
        leases.append(lease)
    runners.start()
    try:
        return await _feed(
            deliveries,
            [lease.deliver for lease in leases],
            burst,
            lambda: runners.processed,
            in_tasks=False,
        )
    finally:
        for lease in leases:
            assert lease._acker is not None
            lease._acker.stop()
        await runners.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.hotpath", description=__doc__)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--burst", type=int, default=8, help="deliveries per pass of the loop")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    deliveries = _deliveries(args.messages)
    figures: dict[str, list[float]] = {"plain": [], "hashq": []}
    for _ in range(args.rounds):
        for name, run in (("plain", plain), ("hashq", hashq)):
            seconds = asyncio.run(run(deliveries, args.burst))
            figures[name].append(1e6 * seconds / args.messages)
    for name, us in figures.items():
        runs = ", ".join(f"{u:.2f}" for u in us)
        print(f"{name}: {statistics.median(us):.2f} us per message (runs {runs})")
    extra = statistics.median(figures["hashq"]) - statistics.median(figures["plain"])
    print(f"hashq adds {extra:.2f} us per message ({extra:.1f} ms per 1,000)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
