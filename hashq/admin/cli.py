"""``hashq``: the admin command (init, publish, status, where, dead-letters, parked, apps delete,
zk-digest).

Flags, settings, logging and exit statuses as every command has them: ``hashq._io.command``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hashq._io.command import (
    add_version,
    logging_from_args,
    run_command,
    run_reporting,
    settings_flags,
)
from hashq.admin import commands as admin
from hashq.settings import Settings


def build_parser() -> argparse.ArgumentParser:
    common = settings_flags()
    parser = argparse.ArgumentParser(
        prog="hashq",
        usage="%(prog)s [options] COMMAND ...",
        description="Administer a hashq app: topology, publishing, status, dead letters, parked "
        "keys, deletion.",
        parents=[common],
    )
    add_version(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str, operands: str = "") -> argparse.ArgumentParser:
        usage = f"hashq {name} [options]{operands}"  # not every setting's flag, as argparse would
        return commands.add_parser(name, help=help, usage=usage, parents=[common])

    init = command("init", "create the topology, or check the existing one")
    init.set_defaults(func=admin.init)

    publish = command(
        "publish", 'publish JSON lines {"key": ..., "body": ...} from stdin or a file', " [FILE]"
    )
    publish.add_argument("file", nargs="?", default="-", help="input file ('-' for stdin)")
    publish.add_argument(
        "--max-in-flight",
        type=int,
        default=1000,
        help="messages sent and not yet confirmed, at most (default 1000)",
    )
    publish.add_argument("--quiet", action="store_true", help="no progress line")
    publish.set_defaults(func=admin.publish)

    status = command("status", "show the topology and bucket depths")
    status.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    status.add_argument(
        "--watch",
        type=_seconds,
        nargs="?",
        const=2.0,
        default=0.0,
        metavar="SECONDS",
        help="show it again every SECONDS (2 if not given) until interrupted",
    )
    status.set_defaults(func=admin.status)

    resize = command(
        "resize", "grow a running app to --buckets M, keeping every key's order", " --buckets M"
    )
    resize.set_defaults(func=admin.resize)

    where = command("where", "which bucket each key lands in, and who holds it", " KEY...")
    where.add_argument("keys", nargs="+", metavar="KEY", help="an entity key (routing key)")
    where.add_argument("--json", action="store_true", help="a JSON list, for scripts")
    where.set_defaults(func=admin.where)

    apps = command("apps", "delete an app once nothing runs on it", " delete")
    apps_actions = apps.add_subparsers(dest="action", required=True, metavar="ACTION")
    delete = apps_actions.add_parser(
        "delete",
        help="its queues (and their messages), exchanges and ZooKeeper state",
        usage="hashq apps delete [options]",
        parents=[common],
    )
    delete.add_argument("--yes", action="store_true", help="do not ask")
    apps.set_defaults(func=admin.apps)

    # Offline: no settings, so that no variable (set for the other commands) can stop it.
    digest = commands.add_parser(
        "zk-digest", help="the digest id of user:password, for the ZooKeeper ACL settings"
    )
    digest.add_argument("credentials", help="user:password")
    digest.set_defaults(offline=admin.zk_digest)

    dead = command("dead-letters", "list, replay or purge the dead-letter queue", " ACTION")
    actions = dead.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, help: str) -> argparse.ArgumentParser:
        usage = f"hashq dead-letters {name} [options]"
        return actions.add_parser(name, help=help, usage=usage, parents=[common])

    listing = action("list", "show the dead letters and why")
    listing.add_argument("--json", action="store_true", help="a JSON list, for scripts")
    listing.add_argument("--limit", type=int, default=0, help="show only the first N")
    replay = action("replay", "publish chosen ones to the back of their key's stream")
    replay.add_argument("--id", action="append", help="a message id (repeatable)")
    replay.add_argument("--key", action="append", help="every dead letter of a key (repeatable)")
    replay.add_argument("--reason", action="append", help="e.g. handler-failed (repeatable)")
    replay.add_argument("--all", action="store_true", help="every dead letter")
    purge = action("purge", "delete every dead letter")
    purge.add_argument("--yes", action="store_true", help="do not ask")
    dead.set_defaults(func=admin.dead_letters)

    parked = command("parked", "list, show, release or drop parked keys", " ACTION")
    parked_actions = parked.add_subparsers(dest="action", required=True, metavar="ACTION")

    def parked_action(name: str, help: str, operands: str = "") -> argparse.ArgumentParser:
        usage = f"hashq parked {name} [options]{operands}"
        return parked_actions.add_parser(name, help=help, usage=usage, parents=[common])

    listing = parked_action("list", "the parked keys, how many messages wait, since when, why")
    show = parked_action("show", "one parked key", " KEY")
    show.add_argument("key", metavar="KEY")
    for shown in (listing, show):
        shown.add_argument("--json", action="store_true", help="a JSON list, for scripts")
    release = parked_action("release", "run its parked messages in order, then let it flow", " KEY")
    release.add_argument("key", metavar="KEY")
    drop = parked_action("drop", "dead-letter its parked messages, then let it flow", " KEY")
    drop.add_argument("key", metavar="KEY")
    drop.add_argument("--yes", action="store_true", help="do not ask")
    parked.set_defaults(func=admin.parked)

    return parser


def _seconds(text: str) -> float:
    value = float(text)
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text} is not from 0.1 to 3600 seconds")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "offline", None):
        return run_reporting(lambda: int(args.offline(args)), parser.prog)
    logging_from_args(args)
    return run_command(args.func, args, parser.prog, Settings)


if __name__ == "__main__":
    sys.exit(main())
