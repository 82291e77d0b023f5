"""The messages of one ``Publisher.publish_many`` in flight: what became of each, and their
confirm deadline.

One timer for the whole batch instead of one per message: messages go out in order with the
same timeout, so the oldest unconfirmed one is always the first to expire. A message is
reported unconfirmed between ``confirm_timeout`` and a quarter of it (at most 1 s) later.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from pamqp import commands as spec

from hashq.errors import BatchPublishError, Failure, PublishError, PublishUnconfirmed

Prepared = tuple[str, bytes, spec.Basic.Properties]  # key, body, properties: what is sent


class InFlight:
    """Tracks the sending of each message of a batch, by its index in the batch."""

    def __init__(
        self,
        window: asyncio.Semaphore,
        confirm_timeout: float,
        on_confirmed: Callable[[int], None] | None,
    ) -> None:
        self._window = window
        self._timeout = confirm_timeout
        self._on_confirmed = on_confirmed
        self._pending: set[asyncio.Future[str | PublishError]] = set()
        self._sent: deque[tuple[float, int, Prepared, asyncio.Future[str | PublishError]]]
        self._sent = deque()
        self._expired: dict[int, PublishError] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._confirmed: dict[int, str] = {}
        self._unexpected: list[BaseException] = []
        self._failures: list[Failure] = []

    def track(
        self, index: int, prepared: Prepared, sending: asyncio.Future[str | PublishError]
    ) -> None:
        """``sending`` holds the window slot taken for message ``index``, until it is done."""
        self._pending.add(sending)
        self._sent.append((asyncio.get_running_loop().time(), index, prepared, sending))
        sending.add_done_callback(lambda done: self._finished(index, done))
        if self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._sweep())

    def refused(self, index: int, error: PublishError) -> None:
        """Message ``index`` was not sent at all."""
        self._failures.append(Failure(index, error))

    def cancel(self) -> None:
        for sending in self._pending:
            sending.cancel()
        self._stop_sweeping()

    async def settled(self) -> None:
        """Wait until every message sent has its outcome."""
        try:
            if self._pending:
                await asyncio.wait(self._pending)
        finally:
            self._stop_sweeping()

    def outcome(self) -> list[str]:
        """The confirmed ids in batch order, or the error that says what was not confirmed."""
        if self._unexpected:
            raise self._unexpected[0]
        confirmed = [self._confirmed[i] for i in sorted(self._confirmed)]
        if self._failures:
            self._failures.sort(key=lambda failure: failure.index)
            raise BatchPublishError(self._failures, confirmed)
        return confirmed

    def _finished(self, index: int, done: asyncio.Future[str | PublishError]) -> None:
        self._pending.discard(done)
        self._window.release()
        if done.cancelled():
            if (expired := self._expired.pop(index, None)) is not None:
                self._failures.append(Failure(index, expired))
            return
        if (error := done.exception()) is not None:
            self._unexpected.append(error)
            return
        outcome = done.result()
        if isinstance(outcome, PublishError):
            self._failures.append(Failure(index, outcome))
        else:
            self._confirmed[index] = outcome
            if self._on_confirmed is not None:
                self._on_confirmed(len(self._confirmed))

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(1.0, self._timeout / 4))
            self.expire(loop.time())

    def expire(self, now: float) -> None:
        """Cancel the sending of every message unconfirmed for ``confirm_timeout`` by ``now``."""
        while self._sent:
            sent_at, index, prepared, sending = self._sent[0]
            if not sending.done() and now - sent_at < self._timeout:
                return
            self._sent.popleft()
            self._give_up(index, prepared, sending, f"no confirm within {self._timeout:g}s")

    def abandon(self, reason: str) -> None:
        """The channel is gone: every message not confirmed yet is reported unconfirmed now,
        not at its deadline. A send can be stuck behind a frame write that will never happen."""
        while self._sent:
            _, index, prepared, sending = self._sent.popleft()
            self._give_up(index, prepared, sending, reason)

    def _give_up(
        self,
        index: int,
        prepared: Prepared,
        sending: asyncio.Future[str | PublishError],
        reason: str,
    ) -> None:
        if sending.done():
            return
        key, _, properties = prepared
        self._expired[index] = PublishUnconfirmed(
            reason, key=key, message_id=str(properties.message_id)
        )
        sending.cancel()

    def _stop_sweeping(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
