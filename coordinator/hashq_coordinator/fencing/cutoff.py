"""Cutting a worker incarnation off RabbitMQ through the management API.

Force-closing its connections returns every message they held unacknowledged to their queues,
in order, and ends their consumers, so single-active-consumer lets the next owner in.

Two facts make a fence sound:
- A worker names every AMQP connection of an incarnation (``hashq-worker-<id>-<incarnation>-<n>``)
  and announces each in its registration before it consumes anything on it; a fence closes
  every listed connection of the incarnation, whatever its number.
- The API lists a new connection only after up to ``HASHQ_MANAGEMENT_LAG`` seconds, so absence
  from the list proves nothing about a young connection. A fence therefore lists only once the
  incarnation's newest announced connection has been known to this coordinator for longer than
  that lag (``Sighting``, on this process's monotonic clock: no clocks of other machines).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from hashq._io.management import Management
from hashq.records import incarnation_connections
from hashq_coordinator.machine.fencebook import Sighting

log = logging.getLogger(__name__)

RETRY_SECONDS = 1.0
# The broker's name of a connection (what closing it takes) and the name its client gave it.
# Asking for these columns alone costs the broker a fifth to a quarter of a full listing's
# time at 10,000 connections (docs/benchmarks.md). Some brokers leave ``user_provided_name``
# out (rabbitmq-server#5816, the metrics collector disabled): a listing in which no connection
# has it is asked again with the client's properties, where the name is too.
LISTED_COLUMNS = ("name", "user_provided_name")
WITH_PROPERTIES = (*LISTED_COLUMNS, "client_properties")
Trouble = Callable[[str | None], None]  # told why fencing fails, and None once it works again


async def wait_until_listable(current: Callable[[], Sighting], lag: float) -> Sighting:
    """Wait until the newest announced connection has been known for ``lag`` seconds; a newer
    announcement during the wait restarts it. Returns the sighting the wait covered."""
    while True:
        sighting = current()
        remaining = sighting.since + lag - time.monotonic()
        if remaining <= 0:
            return sighting
        await asyncio.sleep(remaining)


async def fence(
    management: Management,
    worker_id: str,
    incarnation: str,
    trouble: Trouble | None = None,
    gone: Callable[[], Awaitable[bool]] | None = None,
) -> int:
    """Close every listed connection of the incarnation; returns how many were closed. Retries,
    whatever goes wrong, until the management API lets it finish, or until ``gone`` says no
    connection of the incarnation is left (then 0); ``trouble`` hears why it cannot."""
    pattern = incarnation_connections(worker_id, incarnation)
    reason = f"hashq: worker {worker_id} incarnation {incarnation} fenced"
    while True:
        try:
            listed = await asyncio.to_thread(management.connections, LISTED_COLUMNS)
            if not any("user_provided_name" in connection for connection in listed):
                listed = await asyncio.to_thread(management.connections, WITH_PROPERTIES)
            matches = [c for c in listed if pattern.fullmatch(_name_of(c) or "")]
            for connection in matches:
                await asyncio.to_thread(close_connection, management, connection["name"], reason)
        except Exception as exc:  # any failure leaves the fence undone: it must be retried
            if trouble is not None:
                trouble(f"fencing worker {worker_id} failed: {exc}")
            if gone is not None and await gone():
                return 0
            await asyncio.sleep(RETRY_SECONDS)
            continue
        if trouble is not None:
            trouble(None)
        return len(matches)


def close_connection(management: Management, name: str, reason: str) -> None:
    """Force-close the connection the broker calls ``name`` (blocking): every message it held
    unacknowledged returns to its queue, in order, and its consumers end."""
    path = f"/api/connections/{quote(name, safe='')}"
    management.request("DELETE", path, headers={"X-Reason": reason})


def _name_of(connection: dict[str, Any]) -> str | None:
    properties = connection.get("client_properties") or {}
    name = properties.get("connection_name") or connection.get("user_provided_name")
    return str(name) if name else None
