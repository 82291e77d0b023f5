"""``hashq``: the admin command (init, publish, status, dead-letters, zk-digest, bench).

Settings come from ``HASHQ_`` variables and from flags of the same names; flags win. Exit
status: 0 done, 1 a service or a message failed, 2 bad settings, input or topology (nothing
was changed), 130 interrupted. Errors are one line on stderr, without a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from hashq import logs
from hashq.errors import ConfigError, HashqError
from hashq.settings import Settings, load_settings
from hashq.tls import tls_context

Command = Callable[[Settings, argparse.Namespace], Coroutine[Any, Any, int]]

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


def settings_from_args(args: argparse.Namespace, kind: type[Settings] = Settings) -> Settings:
    given: dict[str, Any] = {
        name.removeprefix("setting_"): value
        for name, value in vars(args).items()
        if name.startswith("setting_") and value is not None
    }
    settings = load_settings(kind, **given)
    tls_context(settings)  # unusable TLS files are refused here once, not at every reconnect
    return settings


def setup_logging(args: argparse.Namespace, default_level: str = "INFO") -> None:
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


def run_command(
    command: Command, args: argparse.Namespace, prog: str, kind: type[Settings] = Settings
) -> int:
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


def build_parser() -> argparse.ArgumentParser:
    from hashq import admin

    common = settings_flags()
    parser = argparse.ArgumentParser(
        prog="hashq",
        description="Administer a hashq app: topology, publishing, status, dead letters.",
        parents=[common],
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help, parents=[common])

    init = command("init", "create the topology, or check the existing one")
    init.set_defaults(func=admin.init)

    publish = command(
        "publish", 'publish JSON lines {"key": ..., "body": ...} from stdin or a file'
    )
    publish.add_argument("file", nargs="?", default="-", help="input file ('-' for stdin)")
    publish.add_argument("--max-in-flight", type=int, default=1000)
    publish.add_argument("--quiet", action="store_true", help="no progress line")
    publish.set_defaults(func=admin.publish)

    status = command("status", "show the topology and bucket depths")
    status.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    status.set_defaults(func=admin.status)

    digest = command("zk-digest", "the digest id of user:password, for the ZooKeeper ACL settings")
    digest.add_argument("credentials", help="user:password")
    digest.set_defaults(func=admin.zk_digest)

    dead = command("dead-letters", "list, replay or purge the dead-letter queue")
    actions = dead.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="show the dead letters and why", parents=[common])
    listing.add_argument("--json", action="store_true", help="a JSON list, for scripts")
    listing.add_argument("--limit", type=int, default=0, help="show only the first N")
    replay = actions.add_parser(
        "replay", help="publish chosen ones to the back of their key's stream", parents=[common]
    )
    replay.add_argument("--id", action="append", help="a message id (repeatable)")
    replay.add_argument("--key", action="append", help="every dead letter of a key (repeatable)")
    replay.add_argument("--reason", action="append", help="e.g. handler-failed (repeatable)")
    replay.add_argument("--all", action="store_true", help="every dead letter")
    purge = actions.add_parser("purge", help="delete every dead letter", parents=[common])
    purge.add_argument("--yes", action="store_true", help="do not ask")
    dead.set_defaults(func=admin.dead_letters)

    bench = command("bench", "measure hashq against the raw broker on this machine")
    bench.add_argument("--quick", action="store_true", help="a reduced run, under a minute")
    bench.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    bench.add_argument("--out", help="folder for the figures and records (default: a temp one)")
    bench.add_argument("--plot", help="where to write the PNG plot (default: in --out)")
    bench.set_defaults(func=_bench)
    return parser


async def _bench(settings: Settings, args: argparse.Namespace) -> int:
    from hashq.bench.run import bench  # only this command needs it

    return await bench(settings, args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args)
    return run_command(args.func, args, parser.prog)


if __name__ == "__main__":
    sys.exit(main())
