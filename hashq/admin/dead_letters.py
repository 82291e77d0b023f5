"""``hashq dead-letters list|replay|purge``: the operator's tools for the dead-letter queue.

Every tool walks the queue once, front to back, taking each message off it and deciding:
- keep it: it is published again to the back of the dead-letter queue;
- replay it: it is published to ``hashq.<app>`` with its key, so it goes to the back of its
  key's stream, without the ``x-hashq-*`` failure headers (``x-hashq-replayed`` counts replays).

Each publish is confirmed before the message it copies is acknowledged, so an interrupted tool
loses nothing: at worst a message is both kept and replayed, or kept twice. The walk takes
exactly the messages that were queued when it began, so it ends even while workers add more;
those wait behind it. Listing walks the queue too, rather than peeking and handing messages
back: a quorum queue counts each hand-back as a delivery, and newer RabbitMQ versions drop a
message after 20.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiormq
from aiormq.abc import DeliveredMessage
from pamqp import commands as spec

from hashq._io.amqp import connect_amqp, connection_name
from hashq.errors import MessageNacked, PublishUnconfirmed
from hashq.routing import TYPE_HEADER
from hashq.settings import Settings
from hashq.topology import Topology

FAILURE_PREFIX = "x-hashq-"
REPLAYED = "x-hashq-replayed"


class Fate(enum.Enum):
    """What ``walk`` does with each dead letter."""

    KEEP = "keep"
    REPLAY = "replay"


@dataclass(frozen=True)
class DeadLetter:
    """One message of the dead-letter queue, as an operator reads it."""

    position: int
    message_id: str
    key: str
    reason: str
    headers: dict[str, Any] = field(repr=False)
    body: bytes = field(repr=False)

    @classmethod
    def of(cls, position: int, delivery: DeliveredMessage) -> DeadLetter:
        properties = delivery.header.properties
        headers = dict(properties.headers or {})
        key = str(headers.get("x-hashq-key") or delivery.routing_key or "")
        return cls(
            position=position,
            message_id=str(properties.message_id or ""),
            key=key,
            reason=str(headers.get("x-hashq-reason", "")),
            headers=headers,
            body=delivery.body,
        )

    def summary(self) -> dict[str, Any]:
        """What ``list`` shows: who, why, where and when, without the traceback."""
        h = self.headers
        return {
            "position": self.position,
            "message_id": self.message_id,
            "key": self.key,
            "reason": self.reason,
            "error": f"{h.get('x-hashq-error-type', '')}: {h.get('x-hashq-error', '')}".strip(": "),
            "bucket": h.get("x-hashq-bucket"),
            "epoch": h.get("x-hashq-epoch"),
            "attempts": h.get("x-hashq-attempts"),
            "last_failure": h.get("x-hashq-last-failure"),
            "replayed": h.get(REPLAYED, 0),
            "bytes": len(self.body),
        }


@dataclass
class Walk:
    """What one walk over the queue did."""

    seen: list[DeadLetter] = field(default_factory=list)
    replayed: int = 0


async def walk(settings: Settings, decide: Callable[[DeadLetter], Fate]) -> Walk:
    """Take every message queued now off the dead-letter queue, once, and keep or replay it."""
    topology = Topology.from_settings(settings)
    connection = await connect_amqp(settings, connection_name("dead-letters"))
    try:
        opened = await connection.channel(publisher_confirms=True, on_return_raises=True)
        channel = await opened.get_underlay_channel()
        declared = await channel.queue_declare(topology.dead_letter_queue, passive=True)
        result = Walk()
        for position in range(1, (declared.message_count or 0) + 1):
            got = await channel.basic_get(topology.dead_letter_queue, no_ack=False)
            if not isinstance(got.delivery, spec.Basic.GetOk):
                break  # emptied by someone else meanwhile
            letter = DeadLetter.of(position, got)
            result.seen.append(letter)
            if decide(letter) is Fate.REPLAY:
                await _confirmed(channel, topology.exchange, letter.key, _replayed(got))
                result.replayed += 1
            else:
                await _confirmed(channel, "", topology.dead_letter_queue, _kept(got))
            await channel.basic_ack(got.delivery.delivery_tag or 0)
        return result
    finally:
        await connection.close()


async def purge(settings: Settings) -> int:
    """Delete every message of the dead-letter queue; returns how many there were."""
    topology = Topology.from_settings(settings)
    connection = await connect_amqp(settings, connection_name("dead-letters"))
    try:
        channel = await (await connection.channel()).get_underlay_channel()
        purged = await channel.queue_purge(topology.dead_letter_queue)
        return int(purged.message_count or 0)
    finally:
        await connection.close()


def _kept(got: DeliveredMessage) -> tuple[bytes, spec.Basic.Properties]:
    return got.body, got.header.properties


def _replayed(got: DeliveredMessage) -> tuple[bytes, spec.Basic.Properties]:
    old = got.header.properties
    headers = {  # what the failure added goes; the job's own type (hashq.App) stays
        k: v
        for k, v in (old.headers or {}).items()
        if not k.startswith(FAILURE_PREFIX) or k == TYPE_HEADER
    }
    before = (old.headers or {}).get(REPLAYED, 0)
    headers[REPLAYED] = (before if isinstance(before, int) else 0) + 1
    properties = spec.Basic.Properties(
        headers=headers,
        message_id=old.message_id,
        content_type=old.content_type,
        delivery_mode=2,
    )
    return got.body, properties


async def _confirmed(
    channel: aiormq.abc.AbstractChannel,
    exchange: str,
    routing_key: str,
    message: tuple[bytes, spec.Basic.Properties],
) -> None:
    body, properties = message
    try:
        outcome = await channel.basic_publish(
            body,
            exchange=exchange,
            routing_key=routing_key,
            properties=properties,
            mandatory=True,
            timeout=30,
        )
    except Exception as exc:
        raise PublishUnconfirmed(
            f"not confirmed ({type(exc).__name__}); the message stays in the dead-letter queue",
            key=routing_key,
            message_id=str(properties.message_id),
        ) from None
    if not isinstance(outcome, spec.Basic.Ack):
        raise MessageNacked(
            "refused by the broker; the message stays in the dead-letter queue",
            key=routing_key,
            message_id=str(properties.message_id),
        )


def render(letters: list[DeadLetter]) -> str:
    """A table for a terminal, one line per dead letter."""
    if not letters:
        return "no dead letters"
    lines = [f"{'#':>4}  {'message id':<32}  {'key':<20}  {'reason':<14}  attempts  error"]
    for letter in letters:
        row = letter.summary()
        lines.append(
            f"{row['position']:>4}  {row['message_id'][:32]:<32}  {row['key'][:20]:<20}  "
            f"{row['reason'][:14]:<14}  {row['attempts'] or '-':>8}  {row['error'][:60]}"
        )
    return "\n".join(lines)


def as_json(letters: list[DeadLetter]) -> str:
    return json.dumps([letter.summary() for letter in letters], indent=2, default=str)
