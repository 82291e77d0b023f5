"""A chaos publisher process. Each key's messages are numbered 0, 1, 2, ...; a key's next
message is published only after the previous one was confirmed, so per-key publish order is
well defined even when a publish fails and is retried. Every confirmed message is appended to
the ``--confirmed`` file as ``{"key", "seq", "id", "at"}`` (one line each, flushed per batch;
``at`` is the wall-clock time the batch's confirms were in).

About once every ``--hold-every`` seconds a message asks its handler to take ``hold`` seconds,
drawn from ``--hold`` (longer than the workers' drain timeout), and half the time the key's next
message does too: two long ones in a row keep the second unacknowledged for longer than either,
which is how the run makes the broker's ``consumer_timeout`` fire (``tools.chaos.run``).

``--client hashq`` uses hashq's Publisher (to the app's exchange; ``--exchange`` must name it);
``--client plain`` uses aio-pika directly, as any AMQP client would (mandatory, confirms), to
show that foreign publishers work too, and to feed the naive designs' exchanges.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable

import aio_pika

from hashq.errors import BatchPublishError, HashqError
from hashq.publisher import Outgoing, Publisher
from hashq.settings import Settings, load_settings

Send = Callable[[list[Outgoing]], Awaitable[set[int]]]  # returns indexes confirmed


def _say(line: str) -> None:
    """One line per failed batch: the run's log shows when and why publishing stalled."""
    print(f"{time.strftime('%H:%M:%S')} chaos-publish: {line}", file=sys.stderr, flush=True)


async def hashq_sender(
    settings: Settings, exchange_name: str
) -> tuple[Send, Callable[[], Awaitable[None]]]:
    publisher = Publisher(settings)

    async def send(batch: list[Outgoing]) -> set[int]:
        try:
            await publisher.publish_many(batch)
        except BatchPublishError as exc:
            _say(f"{len(exc.failures)} of {len(batch)} not confirmed: {exc.failures[0].error}")
            failed = {failure.index for failure in exc.failures}
            return set(range(len(batch))) - failed
        except HashqError as exc:
            _say(f"batch of {len(batch)} not sent: {exc}")
            return set()
        return set(range(len(batch)))

    return send, publisher.close


async def plain_sender(
    settings: Settings, exchange_name: str
) -> tuple[Send, Callable[[], Awaitable[None]]]:
    """aio-pika only: routing key = entity key, mandatory, confirms."""
    state: dict[str, object] = {}

    async def exchange() -> aio_pika.abc.AbstractExchange:
        connection = state.get("connection")
        if connection is None or connection.is_closed:  # type: ignore[attr-defined]
            connection = await aio_pika.connect(settings.amqp_urls[0])
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            state["connection"] = connection
            state["exchange"] = await channel.get_exchange(exchange_name)
        return state["exchange"]  # type: ignore[return-value]

    async def send(batch: list[Outgoing]) -> set[int]:
        try:
            target = await exchange()
        except Exception:
            state.pop("connection", None)
            return set()

        async def one(index: int, message: Outgoing) -> int | None:
            try:
                await target.publish(
                    aio_pika.Message(
                        message.body,
                        message_id=message.message_id,
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    ),
                    routing_key=message.key,
                    mandatory=True,
                    timeout=30,
                )
            except Exception:
                state.pop("connection", None)
                return None
            return index

        done = await asyncio.gather(*(one(i, m) for i, m in enumerate(batch)))
        return {index for index in done if index is not None}

    async def close() -> None:
        connection = state.get("connection")
        if connection is not None:
            await connection.close()  # type: ignore[attr-defined]

    return send, close


class Holds:
    """Which messages ask for a long handler: each with probability ``chance``; after one, half
    the time the key's next message too, published in the very next batch, so that it waits
    for the first while its own clock runs (the case that makes ``consumer_timeout`` fire)."""

    def __init__(self, rng: random.Random, chance: float, seconds: tuple[float, float]) -> None:
        self._rng = rng
        self._chance = chance
        self._seconds = seconds
        self._next: dict[str, int] = {}  # key -> the seq that is held too
        self._followers: list[str] = []  # keys whose next message goes in the next batch

    def body(self, key: str, seq: int) -> bytes:
        if self._next.get(key) != seq and self._rng.random() >= self._chance:
            return json.dumps({"seq": seq}).encode()
        if self._rng.random() < 0.5:
            self._next[key] = seq + 1
            self._followers.append(key)
        return json.dumps(
            {"seq": seq, "hold": round(self._rng.uniform(*self._seconds), 2)}
        ).encode()

    def choose(self, rng: random.Random, keys: list[str], size: int) -> list[str]:
        """The keys of the next batch, each at most once: the followers first."""
        followers, self._followers = self._followers, []
        return list(dict.fromkeys(followers + rng.sample(keys, min(size, len(keys)))))[:size]


async def run(args: argparse.Namespace) -> None:
    settings = load_settings()
    sender = hashq_sender if args.client == "hashq" else plain_sender
    send, close = await sender(settings, args.exchange)
    rng = random.Random(args.seed)
    keys = [f"{args.prefix}-{n:05d}" for n in range(args.keys)]
    next_seq = dict.fromkeys(keys, 0)
    stop = asyncio.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(number, stop.set)
    fd = os.open(args.confirmed, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    deadline = time.monotonic() + args.seconds
    interval = args.batch / args.rate
    holds = Holds(rng, 1 / (args.rate * args.hold_every) if args.hold_every else 0.0, args.hold)
    while not stop.is_set() and time.monotonic() < deadline:
        started = time.monotonic()
        chosen = holds.choose(rng, keys, args.batch)
        batch = [
            Outgoing(key, holds.body(key, next_seq[key]), message_id=uuid.uuid4().hex)
            for key in chosen
        ]
        confirmed = await send(batch)
        confirmed_at = round(time.time(), 3)
        lines = []
        for index in sorted(confirmed):
            message = batch[index]
            lines.append(
                json.dumps(
                    {
                        "key": message.key,
                        "seq": next_seq[message.key],
                        "id": message.message_id,
                        "at": confirmed_at,
                    }
                )
            )
            next_seq[message.key] += 1
        if lines:
            os.write(fd, ("\n".join(lines) + "\n").encode())
        await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))
    os.close(fd)
    await close()


def _range(text: str) -> tuple[float, float]:
    low, high = (float(part) for part in text.split(","))
    return low, high


def main() -> int:
    parser = argparse.ArgumentParser(prog="chaos-publish")
    parser.add_argument("--client", choices=["hashq", "plain"], default="hashq")
    parser.add_argument("--exchange", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--confirmed", required=True)
    parser.add_argument("--hold-every", type=float, default=0.0, help="seconds; 0: no holds")
    parser.add_argument("--hold", type=_range, default=(2.5, 3.5), help="MIN,MAX seconds")
    asyncio.run(run(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
