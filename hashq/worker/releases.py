"""Writes the releases the worker's machine asks for (``WriteRelease``), those asked for while
a write is under way together in the next one: a handover ends many leases within
milliseconds, and the next owner of each waits for its release."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from hashq.worker.machine import events as ev

# Releases a transaction at most: ZooKeeper refuses a request over 1 MB (``jute.maxbuffer``),
# and a worker stopping with 4,096 buckets would ask for them all at once.
BATCH = 200

Write = Callable[[Sequence[tuple[int, int, str]]], Awaitable[None]]


class ReleaseWriter:
    """Hands every ``WriteRelease`` to ``write`` and posts a ``ReleaseWritten`` for each: all
    of a batch succeed or fail together (one transaction)."""

    def __init__(
        self,
        write: Write,
        post: Callable[[ev.Event], None],
        start: Callable[[Awaitable[None]], None],
    ) -> None:
        self._write = write
        self._post = post
        self._start = start  # the runtime's: it waits for its tasks when exiting
        self._pending: list[ev.WriteRelease] = []
        self._writing = False

    def add(self, action: ev.WriteRelease) -> None:
        self._pending.append(action)
        if not self._writing:
            self._writing = True
            self._start(self._run())

    async def _run(self) -> None:
        try:
            await self._write_pending()
        finally:
            self._writing = False

    async def _write_pending(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[:BATCH], self._pending[BATCH:]
            try:
                await self._write([(a.bucket, a.epoch, a.incarnation) for a in batch])
            except Exception as exc:
                for action in batch:
                    self._post(ev.ReleaseWritten(action.lease, False, repr(exc)))
                continue
            for action in batch:
                self._post(ev.ReleaseWritten(action.lease))
