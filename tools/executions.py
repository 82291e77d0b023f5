"""The record every demo and chaos handler keeps of what it executed."""

from __future__ import annotations

import json
import os

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
