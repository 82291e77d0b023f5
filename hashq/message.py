"""What a handler receives, and what a handler is."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Message:
    """One job, as the handler sees it.

    ``epoch`` is the fencing token: it grows every time the bucket changes owner, so a store that
    remembers the highest epoch it saw per key (or per bucket) can refuse a late write from a
    worker that has since been cut off. ``attempt`` counts this worker's attempts, from 1.
    ``data`` is the decoded body when a codec is set (``--codec json``), else None.
    ``started_at`` is the ``time.monotonic()`` at which the worker let this execution begin,
    read just before its last checks that the bucket is still this worker's and that the
    process was not paused (a pause after the read fails them): a handler's first line
    may come later (a thread waits for the interpreter, a process may be paused in between),
    and what it does after such a delay is guarded by ``epoch`` alone.
    """

    key: str
    body: bytes
    headers: dict[str, Any]
    message_id: str | None
    bucket: int
    epoch: int
    redelivered: bool
    attempt: int
    data: Any = None
    started_at: float = field(default=0.0, init=False, compare=False)
    _cancel_event: threading.Event | None = field(default=None, init=False, repr=False)

    @property
    def cancel_event(self) -> threading.Event:
        """Set once the worker gave this message up; a thread handler may wait on it.

        Made on first use, in the event loop's thread (the worker touches it before it starts
        a thread handler): most messages never need one.
        """
        if self._cancel_event is None:
            self._cancel_event = threading.Event()
        return self._cancel_event

    @property
    def cancelled(self) -> bool:
        """True once the worker gave this message up (its bucket was cut off or the drain timed
        out): stop, and do not write anything on its behalf. Async handlers are also cancelled;
        plain functions running in a thread should check this."""
        return self._cancel_event is not None and self._cancel_event.is_set()


MessageHandler = Callable[[Message], Awaitable[None] | None]
Handler = MessageHandler | Callable[[Message, Any], Awaitable[None] | None]
"""What a worker runs for each message: an async function (it runs on the worker's event loop
and is cancelled when its bucket is cut off) or a plain one (it runs in the worker's thread pool
and should watch ``Message.cancelled``). Returning acknowledges the message; raising retries it
(``HASHQ_MAX_ATTEMPTS``, ``HASHQ_ON_FAILURE``). A second parameter with a type receives the body
decoded into that type (``hashq.payloads``)."""


def is_async(handler: object) -> bool:
    """Whether ``handler`` is an async function or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - async callable objects too
    )
