"""Log output: the standard text lines, or one JSON object per line for log collectors.

A JSON line has ``time`` (UTC, ISO 8601), ``level``, ``logger`` and ``message``, the process's
context (``worker`` or ``coordinator``: its id) and, when the call passed them in ``extra``,
``bucket`` and ``epoch``. Keys of messages are never logged in clear at INFO or above.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import sys
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FIELDS = ("worker", "coordinator", "bucket", "epoch")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        created = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
        entry: dict[str, Any] = {
            "time": created.isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            if (value := getattr(record, name, None)) is not None:
                entry[name] = value
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class Context(logging.Filter):
    """Adds fixed fields (``worker=...``) to every record that passes the handler."""

    def __init__(self, **fields: str) -> None:
        super().__init__()
        self._fields = fields

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in self._fields.items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


def setup_logging(level: str, log_format: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.getLogger("hashq.kazoo").setLevel(max(logging.WARNING, logging.getLevelName(level)))
    logging.getLogger("aio_pika").setLevel(logging.WARNING)
    logging.getLogger("asyncio").setLevel(logging.WARNING)  # "Using selector" before any context
    # aiormq logs each failed connect at ERROR; hashq reports it once, in one line.
    logging.getLogger("aiormq").setLevel(logging.CRITICAL)


def add_context(**fields: str) -> None:
    """Say ``fields`` (the process's id) on every line from now on."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(Context(**fields))


def key_for_log(key: str, clear: bool) -> str:
    """``key`` as log lines show it: a short hash unless the operator asked for keys in clear
    (keys are often user or device ids)."""
    if clear:
        return key
    return "#" + hashlib.sha256(key.encode()).hexdigest()[:12]
