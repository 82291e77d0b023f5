"""``hashq parked list|show|release|drop``: the operator's tools for parked keys.

A parked key's state is its record in ZooKeeper (``hashq.parked``); its messages wait in its
parking queue. ``release`` and ``drop`` only change the record's state, with the version they
read (so that a write of the bucket's owner in between is not lost): the owner of the key's
bucket sees the change and does the work, in order (docs/protocol.md, "Parked keys").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError

from hashq._io.amqp import ask_queue, close_quietly, connect_amqp, connection_name
from hashq._io.zk import close_zk, connect_zk
from hashq.errors import ConfigError
from hashq.parked import ParkedRecord, ParkedState, key_digest
from hashq.records import Paths
from hashq.settings import Settings
from hashq.topology import Topology


@dataclass(frozen=True)
class Parked:
    """A parked key, as the operator sees it: its record and how many messages wait."""

    record: ParkedRecord
    messages: int | None  # ready in its parking queue (None: the queue did not answer)

    def summary(self) -> dict[str, Any]:
        record = self.record
        return {
            "key": record.key,
            "bucket": record.bucket,
            "state": record.state.value,
            "messages": self.messages,
            "since": _iso(record.since),
            "reason": record.reason,
            "worker": record.worker,
        }


async def parked_keys(settings: Settings, key: str | None = None) -> list[Parked]:
    """Every parked key of the app (or ``key`` only), with its parking queue's depth."""
    topology = Topology.from_settings(settings)
    records = await asyncio.to_thread(_read, settings, key)
    connection = await connect_amqp(settings, connection_name("parked"))
    try:
        found = []
        for record in records:
            answer = await ask_queue(connection, topology.parking_queue(record.key))
            found.append(Parked(record, answer[0] if answer is not None else None))
        return found
    finally:
        await close_quietly(connection)


def _names(zk: KazooClient, paths: Paths, key: str | None) -> list[str]:
    """The record names of the app's parked keys, or of ``key`` only: found by the key's digest,
    whatever bucket count these settings name (a resize may have changed the app's)."""
    try:
        names = sorted(zk.get_children(paths.parked))
    except NoNodeError:
        return []
    return names if key is None else [n for n in names if n.endswith(f"-{key_digest(key)}")]


def readable_records(zk: KazooClient, paths: Paths) -> list[ParkedRecord]:
    """Every parked key's record that can be read now: one released meanwhile, or damaged
    (``hashq parked list`` names it), is passed over."""
    records = []
    for name in _names(zk, paths, None):
        path = f"{paths.parked}/{name}"
        with contextlib.suppress(NoNodeError, ValueError):
            records.append(ParkedRecord.read(path, zk.get(path)[0]))
    return records


def _read(settings: Settings, key: str | None) -> list[ParkedRecord]:
    paths = Paths(settings.app)
    zk = connect_zk(settings, "coordinator")
    try:
        names = _names(zk, paths, key)
        records = []
        for path in (f"{paths.parked}/{name}" for name in names):
            try:
                records.append(ParkedRecord.read(path, zk.get(path)[0]))
            except NoNodeError:
                continue  # released meanwhile
            except ValueError as exc:
                raise ConfigError(
                    f"{exc}: its bucket starts nothing until it is mended "
                    "(docs/operations.md, the metric hashq_buckets_parking_unread)"
                ) from None
        return records
    finally:
        close_zk(zk)


async def change_state(settings: Settings, key: str, state: ParkedState) -> ParkedRecord:
    """Set ``key``'s record to ``state``; ``ConfigError`` if the key is not parked."""
    return await asyncio.to_thread(_change_state, settings, key, state)


def _change_state(settings: Settings, key: str, state: ParkedState) -> ParkedRecord:
    paths = Paths(settings.app)
    zk: KazooClient = connect_zk(settings, "coordinator")
    try:
        found = _names(zk, paths, key)
        if not found:
            raise ConfigError(f"key {key!r} is not parked in app {settings.app!r}")
        path = f"{paths.parked}/{found[0]}"
        while True:
            try:
                data, stat = zk.get(path)
                record = ParkedRecord.decode(data)
                if record.state is not state:
                    zk.set(path, record.to(state).encode(), stat.version)
                return record.to(state)
            except NoNodeError:
                raise ConfigError(f"key {key!r} is not parked in app {settings.app!r}") from None
            except BadVersionError:
                continue  # its owner wrote it meanwhile: read it again
    finally:
        close_zk(zk)


def render(parked: list[Parked]) -> str:
    if not parked:
        return "no parked keys"
    rows = [("KEY", "BUCKET", "STATE", "MESSAGES", "SINCE", "REASON")]
    for one in parked:
        s = one.summary()
        messages = "?" if s["messages"] is None else f"{s['messages']:,}"
        rows.append((s["key"], str(s["bucket"]), s["state"], messages, s["since"], s["reason"]))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join(
        "  ".join([*(cell.ljust(widths[i]) for i, cell in enumerate(row[:5])), row[5]]).rstrip()
        for row in rows
    )


def as_json(parked: list[Parked]) -> str:
    return json.dumps([one.summary() for one in parked], indent=2)


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat(timespec="seconds") if moment else ""
