"""Reading jobs as JSON lines, for ``hashq publish``: one object per line,
``{"key": "user-1", "body": ..., "headers": {...}, "message_id": "..."}``.

A string body is sent as its UTF-8 bytes; any other JSON value is sent JSON-encoded.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
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
    body = item["body"]
    raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    headers = item.get("headers") or {}
    if not isinstance(headers, dict):
        raise InvalidMessage(f'line {number}: "headers" must be an object')
    message_id = item.get("message_id")
    if message_id is not None and not isinstance(message_id, str):
        raise InvalidMessage(f'line {number}: "message_id" must be a string')
    return Outgoing(key=key, body=raw, headers=headers, message_id=message_id)


def read_messages(stream: IO[str]) -> Iterator[Outgoing]:
    """Messages from ``stream``, skipping blank lines; ``InvalidMessage`` at the first bad one."""
    for number, text in enumerate(stream, start=1):
        if text.strip():
            yield parse_line(text, number)


def read_appended(path: Path) -> list[dict[str, Any]]:
    """The records in a file that processes append to one JSON line at a time.

    A reader can see the first part of a write before its rest (the kernel copies a write page
    by page), and a kill -9 during a write leaves its first part for good, with the next record
    appended to it. So the last line counts only once its newline is there, and a torn line
    gives the one complete record that ends it, if any.
    """
    if not path.exists():
        return []
    complete, _, _ = path.read_text(errors="replace").rpartition("\n")
    return parse_complete_lines(complete)


def count_lines(path: Path) -> int:
    """How many lines ``path`` holds (0 if it does not exist): a cheap progress count of an
    appended file, without parsing it."""
    if not path.exists():
        return 0
    with path.open("rb") as lines:
        return sum(1 for _ in lines)


def parse_complete_lines(text: str) -> list[dict[str, Any]]:
    """The records in ``text``, complete lines of a file appended to as ``read_appended``
    describes."""
    rows = (_parse_torn(line) for line in text.split("\n") if line.strip())
    return [row for row in rows if row is not None]


def _parse_torn(line: str) -> dict[str, Any] | None:
    start = 0
    while start != -1:
        try:
            row = json.loads(line[start:])
        except json.JSONDecodeError:
            start = line.find("{", start + 1)
            continue
        return row if isinstance(row, dict) else None
    return None


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
