"""An example publisher: uploads of ``--users`` users at about ``--rate`` a second, numbered per
user, until ``--count`` uploads (0: for ever). Settings come from ``HASHQ_`` variables (and
``HASHQ_SECRETS_DIR``), as for every hashq command.

    python -m examples.publish_uploads --users 1000 --rate 200

A batch holds one upload per user at most, and what was not confirmed (returned while a resize
switches the routing, or while the broker restarts) is published again before the next batch:
each user's order holds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import time

from hashq import BatchPublishError, Outgoing, Publisher, ServiceUnavailable, load_settings

log = logging.getLogger("examples.publish_uploads")

BATCHES_PER_SECOND = 10


def upload_batch(
    rng: random.Random, users: int, size: int, published: dict[str, int]
) -> list[Outgoing]:
    """Up to ``size`` uploads of different users, each numbered after that user's last."""
    batch: dict[str, Outgoing] = {}
    for _ in range(size):
        user = f"user-{rng.randrange(users):04d}"
        if user in batch:
            continue
        seq = published.get(user, 0)
        published[user] = seq + 1
        body = {"seq": seq, "video": f"{user}/clip-{seq}.mp4"}
        batch[user] = Outgoing(user, json.dumps(body).encode())
    return list(batch.values())


async def publish_until_confirmed(publisher: Publisher, batch: list[Outgoing]) -> None:
    """Publish ``batch``, then again what was not confirmed, in its order, until all is."""
    while batch:
        try:
            await publisher.publish_many(batch)
            return
        except BatchPublishError as failed:
            batch = [batch[failure.index] for failure in failed.failures]
        except ServiceUnavailable as exc:
            log.warning("%s; trying again", exc)
        await asyncio.sleep(0.2)


async def publish(users: int, rate: float, count: int) -> int:
    settings = load_settings()
    rng = random.Random()
    published: dict[str, int] = {}
    sent = 0
    async with Publisher(settings) as publisher:
        while count == 0 or sent < count:
            size = max(1, int(rate / BATCHES_PER_SECOND))
            if count:
                size = min(size, count - sent)
            began = time.monotonic()
            batch = upload_batch(rng, users, size, published)
            await publish_until_confirmed(publisher, batch)
            sent += len(batch)
            if sent % (size * 50) < size:
                log.info("%d uploads published and confirmed", sent)
            await asyncio.sleep(max(0.0, 1 / BATCHES_PER_SECOND - (time.monotonic() - began)))
    log.info("%d uploads published and confirmed", sent)
    return sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=200, help="uploads a second, about")
    parser.add_argument("--count", type=int, default=0, help="stop after this many (0: never)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    asyncio.run(publish(args.users, args.rate, args.count))


if __name__ == "__main__":
    main()
