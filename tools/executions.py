"""The records that handlers of the tests, the demo and the chaos run keep of what they
executed, one JSON line per execution, and the readers of such files (the checker's, the
benchmark's)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_descriptors: dict[str, int] = {}


def append_record(variable: str, entry: dict[str, object]) -> None:
    """Append ``entry`` as one JSON line to the file named by the environment ``variable``.

    One ``os.write`` on an ``O_APPEND`` descriptor: atomic between processes, and on disk (in
    the page cache) the moment it returns, so a record survives the writer's kill -9.
    """
    path = os.environ.get(variable)
    if path is None:
        return
    if path not in _descriptors:
        _descriptors[path] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_descriptors[path], (json.dumps(entry) + "\n").encode())


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


def read_all(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The records of every file in ``paths`` (``read_appended``), one file after the other."""
    return [row for path in paths for row in read_appended(path)]


class Growing:
    """An appended file read as it grows, for whoever watches a run while it goes on: each
    call reads only the bytes added since the last one. The chaos harness forwards every link
    of every process through proxies in its own process, so reading its whole record every
    few seconds (hundreds of megabytes by the end of a long run) took a core and held those
    links up for up to 0.9 s at a time: very likely why ZooKeeper sessions expired and consumer
    timeouts fired with no fault in force (the third 30-minute run, docs/guarantees.md). Use
    one instance for ``count`` or for ``records``, not both, and from one thread at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines = 0
        self._offset = 0
        self._partial = b""  # the start of a line whose newline is not there yet

    def _grown(self) -> bytes:
        if not self.path.exists():
            return b""
        with self.path.open("rb") as file:
            file.seek(self._offset)
            grown = file.read()
        self._offset += len(grown)
        return grown

    def count(self) -> int:
        """How many lines the file holds now, without parsing them."""
        self.lines += self._grown().count(b"\n")
        return self.lines

    def records(self) -> list[dict[str, Any]]:
        """The records completed since the last call (as ``read_appended`` reads them)."""
        complete, _, self._partial = (self._partial + self._grown()).rpartition(b"\n")
        return parse_complete_lines(complete.decode(errors="replace"))


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
