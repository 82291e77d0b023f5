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
from collections.abc import Sequence
from typing import Any

from hashq._io.command import EXIT_INTERRUPTED, logging_from_args, run_command, settings_flags
from hashq._io.logs import add_context
from hashq.errors import ConfigError
from hashq.message import Handler
from hashq.settings import WorkerSettings
from hashq.worker.runtime import Worker

log = logging.getLogger(__name__)


def load_handler(spec: str) -> Handler:
    """The callable named by ``package.module:attribute``."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"handler {spec!r} is not of the form package.module:function")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"handler module {module_name!r} cannot be imported: {exc}") from None
    handler: Any = module
    for part in attribute.split("."):
        handler = getattr(handler, part, None)
    if not callable(handler):
        raise ConfigError(f"{spec!r} is not a callable in module {module_name!r}")
    result: Handler = handler
    return result


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
        description="Process the buckets granted to this worker, in order per key.",
        parents=[settings_flags(WorkerSettings)],
    )
    parser.add_argument("handler", help="the handler, as package.module:function")
    args = parser.parse_args(argv)
    logging_from_args(args)
    return run_command(serve, args, parser.prog, WorkerSettings)


if __name__ == "__main__":
    sys.exit(main())
