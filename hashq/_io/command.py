"""What every command shares (``hashq``, ``hashq-worker``, ``hashq-coordinator``, the tools):
flags named like the settings, settings built once from them, logging, the event loop, and
errors mapped to one line and an exit status.

Settings come from ``HASHQ_`` variables and from flags of the same names; flags win. Exit
status: 0 done, 1 a service or a message failed, 2 bad settings, input or topology (nothing
was changed), 130 interrupted. Errors are one line on stderr, without a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from hashq._io import logs
from hashq._io.tls import tls_context
from hashq.errors import ConfigError, HashqError
from hashq.settings import Settings, load_settings

S = TypeVar("S", bound=Settings)
Command = Callable[[S, argparse.Namespace], Coroutine[Any, Any, int]]  # settings, args -> status

EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def settings_flags(kind: type[Settings] = Settings) -> argparse.ArgumentParser:
    """A parent parser with one flag per setting, named like it: ``buckets`` is ``--buckets`` and
    ``HASHQ_BUCKETS``. Absent flags leave no attribute, so they may stand before or after the
    command without one overwriting the other."""
    parent = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    group = parent.add_argument_group("settings (each also read from HASHQ_<NAME>)")
    for name, info in kind.model_fields.items():
        group.add_argument(
            "--" + name.replace("_", "-"),
            dest=f"setting_{name}",
            metavar=name.upper(),
            help=info.description,
        )
    group.add_argument("--log-level", choices=LOG_LEVELS, help="default INFO; also HASHQ_LOG_LEVEL")
    group.add_argument(
        "--log-format", choices=LOG_FORMATS, help="text (default) or json; also HASHQ_LOG_FORMAT"
    )
    return parent


def settings_from_args(args: argparse.Namespace, kind: type[S]) -> S:
    given: dict[str, Any] = {
        name.removeprefix("setting_"): value
        for name, value in vars(args).items()
        if name.startswith("setting_") and value is not None
    }
    settings = load_settings(kind, **given)
    tls_context(settings)  # unusable TLS files are refused here once, not at every reconnect
    return settings


def logging_from_args(args: argparse.Namespace, default_level: str = "INFO") -> None:
    """Logging for a command: ``--log-level`` and ``--log-format``, else ``HASHQ_LOG_LEVEL``
    and ``HASHQ_LOG_FORMAT``, else ``default_level`` and text."""
    level = getattr(args, "log_level", None) or os.environ.get("HASHQ_LOG_LEVEL", default_level)
    chosen = getattr(args, "log_format", None) or os.environ.get("HASHQ_LOG_FORMAT", "text")
    if level not in LOG_LEVELS:
        _refuse(f"setting log_level: {level!r} is not one of {', '.join(LOG_LEVELS)}")
    if chosen not in LOG_FORMATS:
        _refuse(f"setting log_format: {chosen!r} is not one of {', '.join(LOG_FORMATS)}")
    logs.setup_logging(level, chosen)


def _refuse(line: str) -> None:
    print(line, file=sys.stderr)
    sys.exit(EXIT_CONFIG)


def run_loop(main: Coroutine[Any, Any, int], choice: str) -> int:
    """Run ``main`` on asyncio's own loop, or on uvloop if chosen.

    asyncio is the default: uvloop measured no faster for the worker (docs/benchmarks.md), and
    it runs due timers before I/O. After a process freeze, a handler that was sleeping then
    finishes before the worker reads that its connection was closed.
    """
    if choice == "uvloop":
        try:
            import uvloop
        except ImportError:
            main.close()
            raise ConfigError(
                "setting event_loop: uvloop is not installed (pip install 'hashq[uvloop]')"
            ) from None
        return uvloop.run(main)
    return asyncio.run(main)


def run_command(command: Command[S], args: argparse.Namespace, prog: str, kind: type[S]) -> int:
    """Run ``command`` with settings built from ``args``; map errors to one line and a status."""
    try:
        settings = settings_from_args(args, kind)
        return run_loop(command(settings, args), settings.event_loop)
    except ConfigError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except HashqError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
