"""The worker writes the releases asked for while one write is under way together, in the next
write (``hashq.worker.releases``): a handover ends many leases within milliseconds."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence

from hashq.worker.machine import events as ev
from hashq.worker.releases import BATCH, ReleaseWriter

Ended = tuple[int, int, str]


class _Store:
    """Writes that end when the test says so."""

    def __init__(self, fail: bool = False) -> None:
        self.writes: list[list[Ended]] = []
        self.go = asyncio.Event()
        self.fail = fail

    async def write(self, ended: Sequence[Ended]) -> None:
        self.writes.append(list(ended))
        await self.go.wait()
        if self.fail:
            raise ConnectionError("ZooKeeper gone")


def _writer(store: _Store) -> tuple[ReleaseWriter, list[ev.Event], set[asyncio.Task[None]]]:
    posted: list[ev.Event] = []
    tasks: set[asyncio.Task[None]] = set()

    def start(work: Awaitable[None]) -> None:
        tasks.add(asyncio.ensure_future(work))

    return ReleaseWriter(store.write, posted.append, start), posted, tasks


async def test_releases_asked_for_during_a_write_go_together_in_the_next() -> None:
    store = _Store()
    writer, posted, tasks = _writer(store)
    writer.add(ev.WriteRelease(1, 0, 3, "i1"))
    await asyncio.sleep(0)
    writer.add(ev.WriteRelease(2, 1, 3, "i1"))
    writer.add(ev.WriteRelease(3, 2, 5, "i1"))
    store.go.set()
    await asyncio.gather(*tasks)
    assert store.writes == [[(0, 3, "i1")], [(1, 3, "i1"), (2, 5, "i1")]]
    assert posted == [ev.ReleaseWritten(n) for n in (1, 2, 3)]
    assert len(tasks) == 1  # one writer at a time


async def test_a_failed_write_fails_each_release_of_its_batch_and_the_next_starts_again() -> None:
    store = _Store(fail=True)
    writer, posted, tasks = _writer(store)
    writer.add(ev.WriteRelease(1, 0, 3, "i1"))
    writer.add(ev.WriteRelease(2, 1, 3, "i1"))
    store.go.set()
    await asyncio.gather(*tasks)
    error = repr(ConnectionError("ZooKeeper gone"))
    assert posted == [ev.ReleaseWritten(1, False, error), ev.ReleaseWritten(2, False, error)]
    writer.add(ev.WriteRelease(3, 0, 3, "i1"))  # the machine's retry
    await asyncio.gather(*tasks)
    assert store.writes[-1] == [(0, 3, "i1")]
    assert len(posted) == 3


async def test_a_transaction_takes_at_most_a_batch_of_releases() -> None:
    """A worker stopping with thousands of buckets must not ask ZooKeeper for a request over
    its 1 MB limit."""
    store = _Store()
    writer, posted, tasks = _writer(store)
    for lease in range(BATCH + 51):
        writer.add(ev.WriteRelease(lease, lease, 1, "i1"))
    store.go.set()
    await asyncio.gather(*tasks)
    assert [len(write) for write in store.writes] == [BATCH, 51]
    assert len(posted) == BATCH + 51
