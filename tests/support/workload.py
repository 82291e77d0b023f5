"""The workload of the worker and coordinator tests: keys whose messages are numbered in publish
order, interleaved at random, published with confirms."""

from __future__ import annotations

import json
import random

from hashq.publisher import Outgoing, Publisher
from hashq.settings import Settings


def workload(keys: int, per_key: int, seed: int = 7) -> tuple[list[Outgoing], dict[str, int]]:
    """Messages of ``keys`` keys, each numbered 0..per_key-1, interleaved at random; and how many
    each key has (what ``tools.checker.check`` expects)."""
    rng = random.Random(seed)
    order = [key for key in range(keys) for _ in range(per_key)]
    rng.shuffle(order)
    counters = [0] * keys
    messages = []
    for key in order:
        body = json.dumps({"seq": counters[key]}).encode()
        messages.append(Outgoing(f"k{key:05d}", body))
        counters[key] += 1
    return messages, {f"k{key:05d}": per_key for key in range(keys)}


async def publish(settings: Settings, messages: list[Outgoing]) -> None:
    async with Publisher(settings) as publisher:
        await publisher.publish_many(messages)
