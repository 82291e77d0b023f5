"""The admin commands behind ``hashq``: each takes the settings and the parsed flags and returns
an exit status."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Iterator
from typing import IO, Any

from kazoo.security import make_digest_acl_credential

from hashq.admin import dead_letters as dlq
from hashq.admin import parked as parking
from hashq.admin import resize as resizing
from hashq.admin.apps import delete_app
from hashq.admin.jobs_file import Progress, read_messages
from hashq.admin.status import AppStatus, gather_status, render_table, render_where
from hashq.errors import BatchPublishError, ConfigError, InvalidMessage, ServiceUnavailable
from hashq.parked import ParkedState
from hashq.provision import ensure_topology
from hashq.publisher import Publisher
from hashq.settings import Settings

CLEAR_SCREEN = "\x1b[H\x1b[2J"  # before each look of status --watch on a terminal


async def init(settings: Settings, args: argparse.Namespace) -> int:
    topology = await ensure_topology(settings, exact_count=True)
    print(
        f"app {topology.app}: exchange {topology.exchange} with {topology.buckets} "
        f"{topology.queue_type} bucket queues, dead letters in {topology.dead_letter_queue}: ready"
    )
    return 0


async def resize(settings: Settings, args: argparse.Namespace) -> int:
    """``hashq resize --buckets M`` (or ``HASHQ_BUCKETS``): never the default count."""
    if not hasattr(args, "setting_buckets") and "HASHQ_BUCKETS" not in os.environ:
        raise ConfigError("say how many buckets the app grows to: hashq resize --buckets M")
    await resizing.resize(settings)
    return 0


async def publish(settings: Settings, args: argparse.Namespace) -> int:
    await ensure_topology(settings, check_bindings=False)
    progress = Progress(enabled=not args.quiet and sys.stderr.isatty())
    failed = 0
    stopped: InvalidMessage | None = None
    async with Publisher(settings, max_in_flight=args.max_in_flight) as publisher:
        with _open_input(args.file) as stream:
            try:
                await publisher.publish_many(read_messages(stream), on_confirmed=progress.update)
            except BatchPublishError as exc:
                failed = len(exc.failures)
                for failure in exc.failures[:5]:
                    print(f"hashq: message {failure.index + 1}: {failure.error}", file=sys.stderr)
            except InvalidMessage as exc:
                stopped = exc
    progress.finish()
    print(
        f"published {progress.count:,} messages to hashq.{settings.app}, {failed:,} failed, "
        f"in {progress.elapsed():.1f}s ({progress.rate():,.0f}/s)",
        file=sys.stderr,
    )
    if stopped is not None:
        raise InvalidMessage(
            f"stopped at bad input: {stopped}; the {progress.count:,} messages confirmed before "
            "it stay published"
        )
    return 1 if failed else 0


@contextlib.contextmanager
def _open_input(path: str) -> Iterator[IO[str]]:
    if path == "-":
        yield sys.stdin
        return
    try:
        stream = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise InvalidMessage(f"cannot read {path}: {exc.strerror}") from None
    with stream:
        yield stream


async def status(settings: Settings, args: argparse.Namespace) -> int:
    """The status once, or with ``--watch`` every so many seconds until interrupted; a service
    that does not answer meanwhile is one line, and the watch goes on."""
    if not args.watch:
        _print_status(await gather_status(settings), args)
        return 0
    interrupted = _interrupt_flag()
    while not interrupted.is_set():
        await _unless_interrupted(_watched_status(settings, args), interrupted)
        await _unless_interrupted(asyncio.sleep(args.watch), interrupted)
    raise KeyboardInterrupt  # one line and status 130 (``run_reporting``)


async def _watched_status(settings: Settings, args: argparse.Namespace) -> None:
    try:
        state = await gather_status(settings)
    except ServiceUnavailable as exc:
        print(f"hashq: {exc}", file=sys.stderr, flush=True)
        return
    if sys.stdout.isatty():
        print(CLEAR_SCREEN, end="")
    _print_status(state, args)


def _print_status(state: AppStatus, args: argparse.Namespace) -> None:
    text = json.dumps(state.to_json(), indent=2) if args.json else render_table(state)
    print(text, flush=True)


def _interrupt_flag() -> asyncio.Event:
    """An event that SIGINT sets, in place of asyncio's own handler, which cancels the main
    task wherever it is: a cancellation landing inside aiormq's opening of a channel, or lost
    in a ``wait_for``, left the watch running after Ctrl-C (3 of 40 interrupts at random
    moments) or ended it with a traceback (1 of 40)."""
    interrupted = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, interrupted.set)
    return interrupted


async def _unless_interrupted(work: Coroutine[Any, Any, None], interrupted: asyncio.Event) -> None:
    """Run ``work`` until it ends or ``interrupted`` is set; then it is cancelled, and what it
    raises on its way out does not matter: the command is ending."""
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(interrupted.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if task.done():
        task.result()
        return
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


async def where(settings: Settings, args: argparse.Namespace) -> int:
    """``hashq where KEY...``: which bucket each key lands in, and who holds it now."""
    state = await gather_status(settings)
    if args.json:
        buckets = state.to_json()["buckets"]
        rows = []
        for key in args.keys:
            row = dict(buckets[state.topology.bucket_of(key)])
            rows.append({"key": key, "bucket": row.pop("index"), **row})
        print(json.dumps(rows, indent=2))
    else:
        print(render_where(state, args.keys))
    return 0


async def apps(settings: Settings, args: argparse.Namespace) -> int:
    """``hashq apps delete``."""
    return await delete_app(settings, args.yes)


async def dead_letters(settings: Settings, args: argparse.Namespace) -> int:
    """``hashq dead-letters list|replay|purge``."""
    await ensure_topology(settings, check_bindings=False)
    if args.action == "purge":
        return await _purge(settings, args.yes)
    chosen = _selection(args) if args.action == "replay" else None
    if args.action == "replay" and chosen is None:
        raise ConfigError("replay needs --id, --key, --reason or --all to say which")

    def decide(letter: dlq.DeadLetter) -> dlq.Fate:
        if chosen is not None and chosen(letter):
            return dlq.Fate.REPLAY
        return dlq.Fate.KEEP

    result = await dlq.walk(settings, decide)
    if args.action == "list":
        shown = result.seen[: args.limit] if args.limit else result.seen
        print(dlq.as_json(shown) if args.json else dlq.render(shown))
        return 0
    print(
        f"replayed {result.replayed:,} of {len(result.seen):,} dead letters to "
        f"hashq.{settings.app}; the others stay, in their order"
    )
    return 0


async def parked(settings: Settings, args: argparse.Namespace) -> int:
    """``hashq parked list|show|release|drop``."""
    if args.action in ("list", "show"):
        found = await parking.parked_keys(settings, args.key if args.action == "show" else None)
        if args.action == "show" and not found:
            raise ConfigError(f"key {args.key!r} is not parked in app {settings.app!r}")
        print(parking.as_json(found) if args.json else parking.render(found))
        return 0
    if args.action == "drop" and not _confirmed(
        f"dead-letter every parked message of key {args.key!r}?", args.yes
    ):
        return 1
    state = ParkedState.RELEASING if args.action == "release" else ParkedState.DROPPING
    record = await parking.change_state(settings, args.key, state)
    what = "run in order" if state is ParkedState.RELEASING else "go to the dead-letter queue"
    print(
        f"key {args.key!r} (bucket {record.bucket}) is {state.value}: its parked messages "
        f"{what}, then it flows again ('hashq parked list' shows it until then)"
    )
    return 0


def _confirmed(question: str, yes: bool) -> bool:
    if yes:
        return True
    print(f"{question} type 'yes': ", end="", file=sys.stderr, flush=True)
    if sys.stdin.readline().strip() == "yes":
        return True
    print("nothing changed", file=sys.stderr)
    return False


def _selection(args: argparse.Namespace) -> Callable[[dlq.DeadLetter], bool] | None:
    ids, keys, reasons = set(args.id or []), set(args.key or []), set(args.reason or [])
    if args.all:
        return lambda letter: True
    if not (ids or keys or reasons):
        return None
    return lambda letter: letter.message_id in ids or letter.key in keys or letter.reason in reasons


async def _purge(settings: Settings, confirmed: bool) -> int:
    queue = f"hashq.{settings.app}.dead"
    if not _confirmed(f"delete every message in {queue}?", confirmed):
        return 1
    print(f"deleted {await dlq.purge(settings):,} dead letters from {queue}")
    return 0


def zk_digest(args: argparse.Namespace) -> int:
    """Print ``user:digest`` for ``HASHQ_ZK_ACL_COORDINATORS`` or ``HASHQ_ZK_ACL_WORKERS``."""
    user, colon, password = str(args.credentials).partition(":")
    if not (user and colon):
        raise ConfigError("zk-digest needs user:password")
    print(make_digest_acl_credential(user, password))
    return 0
