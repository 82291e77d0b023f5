"""Jobs ready to start, and the runner tasks idle for want of one (``hashq.worker.runners``).

An ``asyncio.Queue`` wakes one waiting runner per job put: a future and a task step per
message, about 5 us, a tenth of what a plain consumer spends on a message. Deliveries come in
bursts (everything the connection read in one pass of the loop), so here a job wakes an idle
runner only when no runner is already on its way; that runner takes jobs for as long as their
handlers return without waiting, and each time it takes one while more are queued it wakes
the next idle runner, so that a handler that waits holds up none of the others. A burst of
jobs whose handlers never wait then costs two wakes, not one each; one whose handlers all
wait wakes a runner per job, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class ReadyJobs(Generic[T]):
    """Jobs in the order they became ready; runners take them with ``take`` and, when there
    is none, ``wait`` until one is put."""

    def __init__(self) -> None:
        self._jobs: deque[T] = deque()
        self._idle: deque[asyncio.Future[None]] = deque()
        self._waking = 0  # runners woken that have not taken a job yet

    def __len__(self) -> int:
        return len(self._jobs)

    def put(self, job: T) -> None:
        self._jobs.append(job)
        if not self._waking:
            self._wake()

    def put_back(self, job: T) -> None:
        """A job a runner took and may not start yet (the worker is paused, or the broker
        silent): first again, waking no one (the runners wait for the same reason)."""
        self._jobs.appendleft(job)

    def take(self) -> T | None:
        """The next job, or None; wakes another runner if more jobs are left."""
        if not self._jobs:
            return None
        job = self._jobs.popleft()
        if self._jobs and not self._waking:
            self._wake()
        return job

    async def wait(self) -> None:
        """Until a job is put (or a wake passes on): call ``take`` again then."""
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle.append(woken)
        try:
            await woken
        except asyncio.CancelledError:
            if woken.cancelled():
                with contextlib.suppress(ValueError):  # a wake may have passed over it
                    self._idle.remove(woken)
            else:  # woken and cancelled before it ran: another runner takes its place
                self._waking -= 1
                if self._jobs:
                    self._wake()
            raise
        self._waking -= 1

    def _wake(self) -> None:
        while self._idle:
            idle = self._idle.popleft()
            if not idle.done():
                idle.set_result(None)
                self._waking += 1
                return
