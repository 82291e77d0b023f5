"""What a fence costs on a broker with many connections: ``python -m tools.bench.fences``.

A fence lists the broker's connections through the management API to find an incarnation's
(``hashq_coordinator.fencing.cutoff``), and every coordinator checks every few seconds that it
can list them (``Fencer.probe``). This opens ``--connections`` other connections, one named as
a worker incarnation's, waits for the management API to list them, then times each way of
asking (median of ``ROUNDS``, with the broker's CPU per ask when it runs here) and the fence
itself, which closes the worker's connection. Needs a file-descriptor limit above the count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiormq

from hashq._io.management import FIRST_CONNECTION, Management
from hashq.records import worker_connection_name
from hashq.settings import Settings, load_settings
from hashq_coordinator.fencing.cutoff import LISTED_COLUMNS, WITH_PROPERTIES, fence
from tools.bench.rig import broker_pid, cpu_seconds
from tools.polling import eventually

ROUNDS = 5
IDLE_SECONDS = 5.0  # the broker's own CPU with this many idle connections, measured first
OPENING_AT_ONCE = 64


async def open_many(url: str, count: int) -> list[aiormq.Connection]:
    gate = asyncio.Semaphore(OPENING_AT_ONCE)

    async def one(number: int) -> aiormq.Connection:
        async with gate:
            name = f"bench-filler-{number}"
            return await aiormq.connect(url, client_properties={"connection_name": name})

    return list(await asyncio.gather(*(one(n) for n in range(count))))


def timed(ask: Callable[[], Any], pid: int | None) -> str:
    """Median milliseconds of ``ask`` over ``ROUNDS``, the broker's CPU per ask, the reply's
    items."""
    times, cpu, reply = [], [], None
    for _ in range(ROUNDS):
        began, broker = time.monotonic(), cpu_seconds(pid) if pid else 0.0
        reply = ask()
        times.append(1000 * (time.monotonic() - began))
        cpu.append(1000 * (cpu_seconds(pid) - broker) if pid else 0.0)
    items = len(reply) if isinstance(reply, list) else 1
    return (
        f"median {statistics.median(times):.0f} ms ({', '.join(f'{t:.0f}' for t in times)}), "
        f"broker CPU {statistics.median(cpu):.0f} ms, {items:,} item(s)"
        + (f", {len(json.dumps(reply)):,} bytes of JSON" if reply is not None else "")
    )


async def measure(settings: Settings, count: int) -> None:
    url = settings.amqp_urls[0]
    began = time.monotonic()
    fillers = await open_many(url, count)
    print(f"opened {count:,} connections in {time.monotonic() - began:.1f} s")
    worker = await aiormq.connect(
        url, client_properties={"connection_name": worker_connection_name("bench", "i1")}
    )
    management, pid = Management(settings, timeout=120), broker_pid(settings)
    named = worker_connection_name("bench", "i1")

    def listed() -> bool:
        return any(c.get("user_provided_name") == named for c in management.connections())

    await eventually(lambda: asyncio.to_thread(listed), within=60, every=1, what="the listing")
    if pid:
        idle = cpu_seconds(pid)
        await asyncio.sleep(IDLE_SECONDS)
        idle = 1000 * (cpu_seconds(pid) - idle) / IDLE_SECONDS
        print(f"the broker with nothing asked: {idle:.0f} ms CPU per second (in the figures below)")
    asks: dict[str, Callable[[], Any]] = {
        "every connection, every column (the fence before)": management.connections,
        "every connection, the columns the fence reads": lambda: management.connections(
            LISTED_COLUMNS
        ),
        "every connection, those columns and the client's properties (the fence's second "
        "listing, when the broker leaves the name out)": lambda: management.connections(
            WITH_PROPERTIES
        ),
        "a page of one, its name only (the probe of a user tagged management)": lambda: (
            management.request("GET", FIRST_CONNECTION)
        ),
        "the probe of a user tagged administrator (who it is)": management.can_list_connections,
    }
    for name, ask in asks.items():
        print(f"{name}: {await asyncio.to_thread(timed, ask, pid)}")
    began, broker = time.monotonic(), cpu_seconds(pid) if pid else 0.0
    closed = await fence(management, "bench", "i1")
    spent = 1000 * (cpu_seconds(pid) - broker) if pid else 0.0
    print(
        f"the fence (once): {closed} closed in {1000 * (time.monotonic() - began):.0f} ms, "
        f"broker CPU {spent:.0f} ms"
    )
    await asyncio.gather(*(c.close() for c in [*fillers, worker]), return_exceptions=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.fences", description=__doc__)
    parser.add_argument("--connections", type=int, default=10_000)
    args = parser.parse_args(argv)
    asyncio.run(measure(load_settings(), args.connections))
    return 0


if __name__ == "__main__":
    sys.exit(main())
