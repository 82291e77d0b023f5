"""A bucket channel's deliveries handed to the worker at once: in the connection's reader, or
else in the channel's, never in a task each.

aiormq's connection reader puts every frame of a channel in the channel's queue of at most
``frame_buffer`` frames (10), waiting while it is full; the channel's reader task takes them
out and runs every consumer callback in a task of its own (``Channel._on_deliver_frame``). For
a worker reading 64 bucket channels on one connection that costs twice over: a queue put and
get, and a wake of the channel's task, per frame (three a message), and the whole connection
waits whenever one channel's queue is full, so it reads in small steps and the broker, kept
waiting on the socket, spends more per message too. A bucket lease's callback
(``BucketLease.deliver``) never waits: it puts the delivery in its lane and returns. So:

- **In the connection's reader** (``_InReader``): the channel queue's ``put`` is replaced, on
  that queue alone, by one that reads a delivery's frames (``basic.deliver``, its content
  header, its body frames) as they come and calls the callback with the whole message, without
  queueing them. It does so only while the queue is empty: a frame still queued (a reply, a
  cancel, a delivery begun there) is ahead of the delivery, which then goes behind it.
  Everything else goes to the queue as before. A frame the channel's reader has taken but still
  handles may be passed: a broker's ``basic.cancel`` waiting to be answered (its consumer is
  forgotten before that wait, so a delivery read meanwhile is dropped, as aiormq drops it), a
  ``channel.close`` (after which the broker sends nothing more). Two deliveries never pass each
  other: the next one comes only after the last frame of the one before, and the channel's
  reader finishes that one without waiting once it takes that frame.
- **In the channel's reader**, for a delivery that went to the queue: the channel's
  ``_on_deliver_frame`` (aiormq 6 and 7 look it up on the channel each time) is replaced with
  one that reads the message as aiormq does and calls the callback, without aiormq's task.

Either way the lease's order is the channel's, which its machine restores anyway. What this
relies on is checked first, names and signatures; if it is not there (another aiormq), the
channel stays as it is and the callback runs in aiormq's tasks, slower but the same, and the
worker says so once. ``tests/unit/test_direct.py`` fails if aiormq's readers stop calling what
is replaced, or read a delivery otherwise. A bucket channel has one consumer, the lease's:
every delivery to a consumer of the channel goes to the callback; one to a consumer cancelled
meanwhile, or on a channel closed meanwhile, is read and dropped, and goes back to the queue
when the channel closes, as in aiormq.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any

import aiormq.abc
from aiormq.abc import DeliveredMessage
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

log = logging.getLogger(__name__)

# What is called, with the parameters it is called with.
_NEEDED = {"_on_deliver_frame": ["frame"], "_get_frame": [], "_read_content": ["frame", "header"]}
_said: list[bool] = []  # whether the slower path was reported (once a process)


def supported(channel: object) -> bool:
    """Whether ``channel`` has what ``deliver_directly`` relies on, as it relies on it."""
    if not isinstance(getattr(channel, "consumers", None), dict):
        return False
    for name, parameters in _NEEDED.items():
        method = getattr(channel, name, None)
        try:
            if method is None or list(inspect.signature(method).parameters) != parameters:
                return False
        except (TypeError, ValueError):  # no signature to read
            return False
    return True


def deliver_directly(
    channel: aiormq.abc.AbstractChannel, callback: Callable[[DeliveredMessage], None]
) -> bool:
    """Call ``callback`` in the connection's reader, or else the channel's, for each delivery
    to one of ``channel``'s consumers; False (and the channel unchanged) if this aiormq has not
    what it takes."""
    if not supported(channel):
        if not _said:
            _said.append(True)
            log.info("aiormq's channel reader is not as expected: deliveries go through its tasks")
        return False
    underlay: Any = channel  # its protected members, checked above

    async def on_deliver_frame(frame: spec.Basic.Deliver) -> None:
        header = await underlay._get_frame()
        if not isinstance(header, ContentHeader):
            raise ValueError(f"Unexpected frame {header!r} instead of ContentHeader", header)
        _hand_over(underlay, callback, await underlay._read_content(frame, header))

    underlay._on_deliver_frame = on_deliver_frame
    frames = getattr(underlay, "frames", None)
    if type(frames) is asyncio.Queue:  # aiormq's own, its ``put`` the one the reader calls
        frames.put = _InReader(underlay, frames, callback).put  # type: ignore[method-assign]
    return True


class _InReader:
    """A channel queue's ``put``, as aiormq's connection reader calls it for each frame of the
    channel: a delivery arriving while the queue is empty is read here, frame by frame, and
    handed over whole; any other frame, and a delivery behind a queued frame, is queued."""

    def __init__(
        self,
        channel: Any,
        queue: asyncio.Queue[tuple[int, Any]],
        callback: Callable[[DeliveredMessage], None],
    ) -> None:
        self._channel = channel
        self._queue_put = queue.put  # the queue's own, waiting while it is full
        self._queue = queue
        self._callback = callback
        self._held: list[tuple[int, Any]] = []  # the delivery being read: its frames so far
        self._header: ContentHeader | None = None
        self._size = 0  # body bytes read so far

    async def put(self, item: tuple[int, Any]) -> None:
        frame = item[1]
        if not self._held:
            if isinstance(frame, spec.Basic.Deliver) and self._queue.empty():
                self._held.append(item)
            else:
                await self._queue_put(item)
        elif self._header is None and isinstance(frame, ContentHeader):
            self._held.append(item)
            self._header = frame
            if not frame.body_size:
                self._read()
        elif self._header is not None and isinstance(frame, ContentBody):
            self._held.append(item)
            self._size += len(frame.value)
            if self._size >= (self._header.body_size or 0):
                self._read()
        else:  # out of place: queued after the frames it interrupts, for aiormq's reader to
            # fail the channel on, as it would have
            held, self._held, self._header, self._size = self._held, [], None, 0
            for queued in (*held, item):
                await self._queue_put(queued)

    def _read(self) -> None:
        (_, frame), (_, header), *body = self._held
        self._held, self._header, self._size = [], None, 0
        parts = [part.value for _, part in body]
        whole = parts[0] if len(parts) == 1 else b"".join(parts)
        message = DeliveredMessage(delivery=frame, header=header, body=whole, channel=self._channel)
        _hand_over(self._channel, self._callback, message)


def _hand_over(
    channel: Any, callback: Callable[[DeliveredMessage], None], message: DeliveredMessage
) -> None:
    """``callback(message)``, unless its consumer was cancelled or its channel closed meanwhile:
    the message goes back to the queue when the channel closes, as in aiormq."""
    frame = message.delivery
    assert isinstance(frame, spec.Basic.Deliver), frame
    if frame.consumer_tag not in channel.consumers or channel.is_closed:
        return
    try:
        callback(message)
    except Exception:  # as aiormq's task would: said, and the reader goes on
        log.exception("a delivery's callback failed")
