"""``SyncPublisher``: the publisher for code without an event loop (Django, Flask, scripts).

It is ``hashq.Publisher`` itself, run on an event loop in a thread of its own, so it has the
same confirms, the same errors (``MessageNacked``, ``MessageUnroutable``, ``PublishUnconfirmed``,
``BatchPublishError``, ``TopologyMismatch``) and the same guarantee: a call returns once the
broker confirmed its message, and raises otherwise. It is thread-safe: calls from any number of
threads share one connection and run concurrently; one thread's messages of a key keep that
thread's order, since each call returns only once its message is confirmed.

A process that forks (gunicorn, uwsgi, multiprocessing) gets a publisher of its own in the
child at the first call there: a connection cannot be shared across a fork.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, TypeVar

from hashq.errors import ConfigError, PublishUnconfirmed
from hashq.publisher import Outgoing, Publisher
from hashq.settings import Settings

T = TypeVar("T")
CLOSE_CHECK_SECONDS = 1.0  # how often a waiting call looks whether close() stopped the loop


class SyncPublisher:
    """Use as ``with SyncPublisher(settings) as publisher: publisher.publish(key, body)``; it
    connects at the first call if not entered."""

    def __init__(self, settings: Settings, *, max_in_flight: int = 1000) -> None:
        self._settings = settings
        self._max_in_flight = max_in_flight
        self._lock = threading.Lock()  # starting and closing
        self._pid = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._publisher: Publisher | None = None
        forget = weakref.WeakMethod(self._forget_after_fork)
        os.register_at_fork(after_in_child=lambda: (method := forget()) and method())

    def __enter__(self) -> SyncPublisher:
        self.connect()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def connect(self) -> None:
        """Open the connection and check the exchange exists (does nothing if already open)."""
        self._call(lambda publisher: publisher.connect())

    def publish(
        self,
        key: str,
        body: object,
        *,
        headers: Mapping[str, Any] | None = None,
        message_id: str | None = None,
        job_type: str | None = None,
    ) -> str:
        """Publish one message; returns its message id once the broker confirmed it."""
        return self._call(
            lambda publisher: publisher.publish(
                key, body, headers=headers, message_id=message_id, job_type=job_type
            )
        )

    def publish_many(
        self,
        messages: Iterable[Outgoing],
        *,
        on_confirmed: Callable[[int], None] | None = None,
    ) -> list[str]:
        """Publish a batch, pipelined, as ``Publisher.publish_many`` does. ``messages`` is read
        in the publisher's thread; ``on_confirmed`` is called there too."""
        return self._call(
            lambda publisher: publisher.publish_many(messages, on_confirmed=on_confirmed)
        )

    def close(self) -> None:
        """Close the connection and end the publisher's thread; a later call opens them again.
        A call still waiting for its confirm raises ``PublishUnconfirmed``."""
        if threading.current_thread() is self._thread:
            raise ConfigError("SyncPublisher closed from its own thread (an on_confirmed?)")
        with self._lock:
            loop, thread, publisher = self._loop, self._thread, self._publisher
            self._loop = self._thread = self._publisher = None
            if loop is None or thread is None or publisher is None or self._pid != os.getpid():
                return
            asyncio.run_coroutine_threadsafe(publisher.close(), loop).result()
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    def _call(self, call: Callable[[Publisher], Coroutine[Any, Any, T]]) -> T:
        if threading.current_thread() is self._thread:
            raise ConfigError("SyncPublisher called from its own thread (an on_confirmed?)")
        loop, publisher = self._running()
        coroutine = call(publisher)
        try:
            future = asyncio.run_coroutine_threadsafe(coroutine, loop)
        except RuntimeError:  # closed by another thread since _running
            coroutine.close()
            raise _closed_under_the_call() from None
        while True:  # a close() in another thread may stop the loop under this call
            try:
                return future.result(timeout=CLOSE_CHECK_SECONDS)
            except concurrent.futures.TimeoutError:
                if loop.is_closed() or not loop.is_running():
                    future.cancel()
                    raise _closed_under_the_call() from None

    def _running(self) -> tuple[asyncio.AbstractEventLoop, Publisher]:
        """The loop and the publisher, started in this process if they are not."""
        with self._lock:
            if self._loop is None or self._publisher is None or self._pid != os.getpid():
                self._start()
            assert self._loop is not None and self._publisher is not None
            return self._loop, self._publisher

    def _forget_after_fork(self) -> None:
        """In a forked child: the parent's loop, thread and lock are not this process's."""
        self._lock = threading.Lock()
        self._loop = self._thread = self._publisher = None

    def _start(self) -> None:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="hashq-publisher", daemon=True)
        thread.start()

        async def make() -> Publisher:  # its locks and semaphore belong to that loop
            return Publisher(self._settings, max_in_flight=self._max_in_flight)

        self._publisher = asyncio.run_coroutine_threadsafe(make(), loop).result()
        self._loop, self._thread, self._pid = loop, thread, os.getpid()


def _closed_under_the_call() -> PublishUnconfirmed:
    return PublishUnconfirmed(
        "the publisher was closed before the broker confirmed; the message may or may not be "
        "queued",
        key="-",
        message_id="-",
    )
