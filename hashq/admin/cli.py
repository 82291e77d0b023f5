"""``hashq``: the admin command (init, publish, status, dead-letters, zk-digest).

Flags, settings, logging and exit statuses as every command has them: ``hashq._io.command``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hashq._io.command import logging_from_args, run_command, settings_flags
from hashq.admin import commands as admin
from hashq.settings import Settings


def build_parser() -> argparse.ArgumentParser:
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

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging_from_args(args)
    return run_command(args.func, args, parser.prog, Settings)


if __name__ == "__main__":
    sys.exit(main())
