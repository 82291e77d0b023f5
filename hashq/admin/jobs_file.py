"""Reading jobs as JSON lines, for ``hashq publish``: one object per line,
``{"key": "user-1", "body": ..., "headers": {...}, "message_id": "...", "type": "..."}``
(``type``: the job type, for a ``hashq.App``).

A string body is sent as its UTF-8 bytes; any other JSON value is sent JSON-encoded.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import IO, Any

from hashq.errors import InvalidMessage
from hashq.publisher import Outgoing, check_key


def parse_line(text: str, number: int) -> Outgoing:
    """The message on line ``number``, or ``InvalidMessage`` saying what is wrong with it."""
    try:
        item: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidMessage(f"line {number}: not JSON ({exc.msg})") from None
    if not isinstance(item, dict) or "key" not in item or "body" not in item:
        raise InvalidMessage(f'line {number}: expected an object with "key" and "body"')
    try:
        key = check_key(item["key"])
    except InvalidMessage as exc:
        raise InvalidMessage(f"line {number}: {exc}") from None
    headers = item.get("headers") or {}
    if not isinstance(headers, dict):
        raise InvalidMessage(f'line {number}: "headers" must be an object')
    message_id = item.get("message_id")
    if message_id is not None and not isinstance(message_id, str):
        raise InvalidMessage(f'line {number}: "message_id" must be a string')
    job_type = item.get("type")
    if job_type is not None and not isinstance(job_type, str):
        raise InvalidMessage(f'line {number}: "type" must be a string')
    # A str goes as its UTF-8 bytes, any other value as JSON (hashq.payloads.encode).
    return Outgoing(key, item["body"], headers, message_id, job_type)


def read_messages(stream: IO[str]) -> Iterator[Outgoing]:
    """Messages from ``stream``, skipping blank lines; ``InvalidMessage`` at the first bad one."""
    for number, text in enumerate(stream, start=1):
        if text.strip():
            yield parse_line(text, number)


class Progress:
    """A one-line progress display on stderr, redrawn at most a few times a second."""

    def __init__(self, enabled: bool, label: str = "confirmed") -> None:
        self._enabled = enabled
        self._label = label
        self._started = time.monotonic()
        self._drawn = 0.0
        self.count = 0

    def update(self, count: int) -> None:
        self.count = count
        now = time.monotonic()
        if self._enabled and now - self._drawn >= 0.2:
            self._drawn = now
            sys.stderr.write(f"\r{self._label} {count:,} ({self.rate():,.0f}/s)")
            sys.stderr.flush()

    def rate(self) -> float:
        return self.count / max(time.monotonic() - self._started, 1e-9)

    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def finish(self) -> None:
        if self._enabled and self._drawn:
            sys.stderr.write("\n")
