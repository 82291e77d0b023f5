"""A chaos publisher process. Each key's messages are numbered 0, 1, 2, ...; a key's next
message is published only after the previous one was confirmed, so per-key publish order is
well defined even when a publish fails and is retried. Every confirmed message is appended to
the ``--confirmed`` file as ``{"key", "seq", "id", "at"}`` (one line each, flushed per batch;
``at`` is the wall-clock time the batch's confirms were in).

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
    while not stop.is_set() and time.monotonic() < deadline:
        started = time.monotonic()
        chosen = rng.sample(keys, min(args.batch, len(keys)))  # a key at most once per batch
        batch = [
            Outgoing(key, json.dumps({"seq": next_seq[key]}).encode(), message_id=uuid.uuid4().hex)
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
    asyncio.run(run(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
