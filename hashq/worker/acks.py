"""Batched acknowledgements: ``AckWindow`` (pure) says which delivery tags of a channel to
acknowledge and how; ``Acker`` sends what it says, from one task per bucket lease.

A message's acknowledgement may go out a few milliseconds after its handler finished, and
after the next message of its key started. A crash in between redelivers the unacknowledged
messages in their queue order, so each key replays in order from its first unacknowledged
message: at-least-once, never reordered. (Even one awaited ack per message only waits for the
socket write, not for the broker, so the window existed before; batching widens it.)
"""

from __future__ import annotations

import asyncio
import logging

import aiormq.abc

log = logging.getLogger(__name__)

ACK_DELAY = 0.02  # seconds a finished message may wait for its acknowledgement to be sent


class AckWindow:
    """Which delivery tags to acknowledge, and how: one ``multiple`` ack for the longest prefix
    of completed tags (tags of one channel are 1, 2, 3, ...; messages complete out of order),
    and single acks for tags that stay complete beyond a gap across two batches (a key held up
    by retries must not hold up the acknowledgements, and so the prefetch window, of the rest).
    """

    def __init__(self, batch: int) -> None:
        self._batch = batch
        self._acked = 0  # every tag up to here is acknowledged
        self._contiguous = 0  # every tag up to here is complete
        self._ahead: set[int] = set()  # complete, beyond the first gap
        self._single: set[int] = set()  # of those, acknowledged one by one
        self._waited: set[int] = set()  # ahead, unacknowledged, at the last take

    def complete(self, tag: int) -> bool:
        """Mark ``tag`` complete; True when a batch is due."""
        self._ahead.add(tag)
        while self._contiguous + 1 in self._ahead:
            self._contiguous += 1
            self._ahead.discard(self._contiguous)
        return self._contiguous - self._acked >= self._batch or len(self._ahead) >= self._batch

    def take(self) -> tuple[int, list[int]]:
        """The tag to acknowledge ``multiple`` up to (0: none), and tags to acknowledge singly.

        The multiple tag is never one acknowledged before: the broker would close the channel.
        """
        upto = self._contiguous
        while upto > self._acked and upto in self._single:
            upto -= 1
        prefix = upto if upto > self._acked else 0
        self._single = {tag for tag in self._single if tag > self._contiguous}
        self._acked = self._contiguous
        stragglers = sorted((self._waited & self._ahead) - self._single)
        self._single.update(stragglers)
        self._waited = self._ahead - self._single
        return prefix, stragglers

    @property
    def pending(self) -> bool:
        return self._contiguous > self._acked or bool(self._ahead - self._single)


class Acker:
    """Sends one channel's acknowledgements from a task of its own.

    Runners only call ``complete``, which never waits: a runner that awaited a send on a
    connection that just died would hold up every job behind it. One sender also keeps frames
    in the order of the takes; a single ack reaching the broker after a ``multiple`` ack that
    covered it would make the broker close the channel.
    """

    def __init__(self, channel: aiormq.abc.AbstractChannel, batch: int, bucket: int) -> None:
        self._channel = channel
        self._bucket = bucket
        self._window = AckWindow(batch)
        self._due = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._closing = False
        self._sending = asyncio.Lock()  # one take's frames at a time, in the order of the takes
        self._task = asyncio.ensure_future(self._run())

    def complete(self, tag: int) -> None:
        """``tag`` was handled: acknowledge it with the next batch."""
        if self._window.complete(tag):
            self._due.set()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(ACK_DELAY, self._due.set)

    async def flush(self, within: float) -> None:
        """Send every acknowledgement still owed, waiting at most ``within`` seconds (a dead
        connection may never take them; those messages are then redelivered). Then stop.
        Safe to call twice: a lease may be closed by a drain and a cut-off at once."""
        if self._task.done():
            return
        self._closing = True
        self._due.set()
        # asyncio.wait, not wait_for: it neither cancels the sender nor raises its outcome.
        _, late = await asyncio.wait({self._task}, timeout=within)
        if late:
            log.debug("bucket %d: acknowledgements not sent within %gs", self._bucket, within)
        self.stop()

    def stop(self) -> None:
        """Stop sending now (the channel is closed or about to be)."""
        if self._timer is not None:
            self._timer.cancel()
        self._task.cancel()

    async def _run(self) -> None:
        try:
            while True:
                await self._due.wait()
                self._due.clear()
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                await self._send()
                if self._closing:
                    await self._send()  # the second take sends what is complete beyond a gap
                    return
                if self._window.pending:
                    self._timer = asyncio.get_running_loop().call_later(ACK_DELAY, self._due.set)
        except Exception as exc:  # the channel is gone: its unacknowledged messages go back
            log.debug("bucket %d: acknowledging failed: %r", self._bucket, exc)

    async def sync(self, prefetch: int) -> None:
        """Send every acknowledgement owed now, then ask the channel a question whose answer
        comes only after the broker took them in (``basic.qos`` again: it changes nothing for
        a consumer already there). Raises if the channel is gone: those messages went back."""
        await self._send()
        await self._channel.basic_qos(prefetch_count=prefetch)

    async def _send(self) -> None:
        async with self._sending:
            await self._send_taken()

    async def _send_taken(self) -> None:
        upto, singles = self._window.take()
        if upto:
            await self._channel.basic_ack(upto, multiple=True, wait=False)
        for tag in singles:
            await self._channel.basic_ack(tag, wait=False)
