"""``hashq-worker package.module:handler``: run a worker.

Settings: the shared ``HASHQ_`` ones plus the worker's (``--concurrency``, ``--prefetch``, ...).
SIGTERM or SIGINT drains every bucket, releases, deregisters and exits 0; a second signal exits
at once (130), and the broker returns the unacknowledged messages to their queues, in order.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from hashq._io.command import (
    EXIT_INTERRUPTED,
    add_version,
    logging_from_args,
    run_command,
    settings_flags,
)
from hashq._io.logs import add_context
from hashq.errors import ConfigError
from hashq.message import Handler
from hashq.routing import App, check_handler
from hashq.settings import WorkerSettings
from hashq.worker.runtime import Worker

log = logging.getLogger(__name__)


def load_handler(spec: str) -> Handler | App:
    """The callable (or ``hashq.App``) named by ``package.module:attribute``, checked before
    any message: a module that is missing or fails to import, a missing attribute, one that is
    no callable and one that cannot be called with one message each raise their own
    ``ConfigError`` line."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"handler {spec!r} is not of the form package.module:function")
    handler: Any = _import_handler_module(module_name)
    for part in attribute.split("."):
        if not hasattr(handler, part):
            raise ConfigError(f"handler {spec!r}: {module_name!r} has no attribute {part!r}")
        handler = getattr(handler, part)
    if isinstance(handler, App):
        return handler  # each of its handlers was checked as it was registered
    check_handler(spec, handler)
    result: Handler = handler
    return result


def _import_handler_module(name: str) -> ModuleType:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and f"{name}.".startswith(f"{exc.name}."):
            raise ConfigError(
                f"handler module {name!r} not found (in the current directory or sys.path)"
            ) from None
        raise ConfigError(
            f"handler module {name!r} failed to import: it imports {exc.name!r}, not installed"
        ) from None
    except Exception as exc:  # the user's module raised while importing
        raise ConfigError(f"handler module {name!r} failed to import: {_raised(exc)}") from None


def _raised(exc: Exception) -> str:
    """``file:line: Type: text`` of an exception raised while importing a module."""
    if isinstance(exc, SyntaxError):
        return f"{exc.filename}:{exc.lineno}: SyntaxError: {exc.msg}"
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno}: " if frames else ""
    return f"{where}{type(exc).__name__}: {exc}"


async def serve(settings: WorkerSettings, args: argparse.Namespace) -> int:
    handler = load_handler(args.handler)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(number: int) -> None:
        if stop.is_set():
            log.warning("second signal: exiting now; unacknowledged messages return to queues")
            os._exit(EXIT_INTERRUPTED)
        log.info("%s: draining every bucket, then exiting", signal.Signals(number).name)
        stop.set()

    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, on_signal, number)
    worker = Worker(settings, handler)
    add_context(worker=worker.worker_id)
    await worker.run(stop)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hashq-worker",
        usage="%(prog)s [options] package.module:function",
        description="Process the buckets granted to this worker, in order per key.",
        parents=[settings_flags(WorkerSettings)],
    )
    add_version(parser)
    parser.add_argument("handler", help="the handler, as package.module:function")
    args = parser.parse_args(argv)
    logging_from_args(args)
    return run_command(serve, args, parser.prog, WorkerSettings)


if __name__ == "__main__":
    sys.exit(main())
