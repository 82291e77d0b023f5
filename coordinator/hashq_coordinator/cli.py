"""``hashq-coordinator``: run a coordinator. Run two or more; one leads, the others stand by.

SIGTERM or SIGINT gives up the lead (a standby takes over at once) and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from hashq._io.command import add_version, logging_from_args, run_command, settings_flags
from hashq._io.logs import add_context
from hashq_coordinator.runtime import Coordinator
from hashq_coordinator.settings import CoordinatorSettings

log = logging.getLogger(__name__)


async def serve(settings: CoordinatorSettings, args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, stop.set)
    coordinator = Coordinator(settings)
    add_context(coordinator=coordinator.me)
    await coordinator.run(stop)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hashq-coordinator",
        usage="%(prog)s [options]",
        description="Assign buckets to live workers; hand each over with drain and fence.",
        parents=[settings_flags(CoordinatorSettings)],
    )
    add_version(parser)
    args = parser.parse_args(argv)
    logging_from_args(args)
    return run_command(serve, args, parser.prog, CoordinatorSettings)


if __name__ == "__main__":
    sys.exit(main())
