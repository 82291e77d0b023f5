"""What every command shares (``hashq``, ``hashq-worker``, ``hashq-coordinator``, the tools):
flags named like the settings, settings built once from them, logging, the event loop, and
errors mapped to one line and an exit status.

Settings come from ``HASHQ_`` variables and from flags of the same names; flags win; a
``HASHQ_`` variable that is no setting of any command draws one warning line. Exit status: 0
done, 1 a service or a message failed, 2 bad settings, input or topology (nothing was changed),
130 interrupted, 141 the reader of standard output went away (``hashq status | head``). Errors
are one line on stderr, without a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import typing
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from pydantic.fields import FieldInfo

from hashq._io import logs
from hashq._io.tls import tls_context
from hashq.errors import ConfigError, HashqError
from hashq.settings import (
    ServiceSettings,
    Settings,
    WorkerSettings,
    load_settings,
    unknown_variables,
    variable_of,
)

S = TypeVar("S", bound=Settings)
Command = Callable[[S, argparse.Namespace], Coroutine[Any, Any, int]]  # settings, args -> status

EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130
EXIT_PIPE_CLOSED = 141  # as a shell reports a process ended by SIGPIPE
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

log = logging.getLogger(__name__)


def settings_flags(kind: type[Settings] = Settings) -> argparse.ArgumentParser:
    """A parent parser with one flag per setting, named like it: ``buckets`` is ``--buckets`` and
    ``HASHQ_BUCKETS``; each flag's help gives its default, its allowed values and its variable.
    Flags are grouped by the settings class that defines them (``section``). Absent flags leave
    no attribute, so they may stand before or after the command without one overwriting the
    other."""
    parent = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    groups: dict[str, Any] = {}
    for name, info in kind.model_fields.items():
        section = _defined_in(kind, name).section
        group = groups.get(section) or groups.setdefault(
            section, parent.add_argument_group(section)
        )
        choices = _choices(info)
        group.add_argument(
            "--" + name.replace("_", "-"),
            dest=f"setting_{name}",
            metavar="{" + ",".join(choices) + "}" if choices else name.upper(),
            help=_flag_help(name, info, choices),
        )
    group = parent.add_argument_group("logging")
    levels = "HASHQ_LOG_LEVEL; default INFO"
    group.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, help=levels)
    group.add_argument("--log-format", choices=LOG_FORMATS, help="HASHQ_LOG_FORMAT; default text")
    return parent


def _defined_in(kind: type[Settings], name: str) -> type[Settings]:
    """The most derived class of ``kind``'s that declares field ``name`` itself."""
    for cls in kind.__mro__:
        if name in vars(cls).get("__annotations__", {}):
            return typing.cast(type[Settings], cls)
    return kind


def _choices(info: FieldInfo) -> list[str]:
    """The values a ``Literal`` field allows (none for any other)."""
    if typing.get_origin(info.annotation) is typing.Literal:
        return [str(value) for value in typing.get_args(info.annotation)]
    return []


def _flag_help(name: str, info: FieldInfo, choices: list[str]) -> str:
    value = info.default
    default = "unset" if value is None else f"{value:g}" if isinstance(value, float) else value
    allowed = f"one of {', '.join(choices)}; " if choices else ""
    return f"{info.description} ({allowed}{variable_of(name)}; default {default})"


def add_version(parser: argparse.ArgumentParser) -> None:
    """``--version``: ``hashq.__version__``, the one place it is written (the package's
    metadata reads it too)."""
    from hashq import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")


def every_settings_kind() -> list[type[Settings]]:
    """Every command's settings, the coordinator's too where it is installed, so that a
    variable meant for one command (an environment shared by all) is no unknown in another.
    Imported here only for its field names: the worker does not depend on the coordinator."""
    kinds: list[type[Settings]] = [Settings, ServiceSettings, WorkerSettings]
    try:
        from hashq_coordinator.settings import CoordinatorSettings
    except ImportError:
        return kinds
    return [*kinds, CoordinatorSettings]


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
    level = level.upper()
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

    def with_settings() -> int:
        for line in unknown_variables(os.environ, every_settings_kind()):
            log.warning(line)
        settings = settings_from_args(args, kind)
        return run_loop(command(settings, args), settings.event_loop)

    return run_reporting(with_settings, prog)


def run_reporting(body: Callable[[], int], prog: str) -> int:
    """Run ``body`` (a command, with settings or without: ``hashq zk-digest`` needs none, so a
    bad variable cannot stop it); map errors to one line and a status."""
    try:
        status = body()
        sys.stdout.flush()  # here, not at the interpreter's exit, where a closed pipe cannot be met
        return status
    except BrokenPipeError:
        # Whoever read standard output stopped (``| head``): no traceback, and nothing more
        # written there, the interpreter's last flush included.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE_CLOSED
    except ConfigError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except HashqError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
