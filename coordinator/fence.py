"""Cutting a worker incarnation off RabbitMQ through the management API.

Force-closing its connection returns every message it held unacknowledged to its queues, in
order, and ends its consumers, so single-active-consumer lets the next owner in. The API lists a
new connection only after up to a few seconds, so absence from the list is believed only once
the incarnation has been registered for longer than that lag.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from hashq.errors import ServiceUnavailable
from hashq.management import Management
from hashq.protocol import worker_connection_name

log = logging.getLogger(__name__)


async def fence(
    management: Management,
    worker_id: str,
    incarnation: str,
    registered_at: float | None,
    lag: float,
) -> int:
    """Close every connection of the incarnation; returns how many were closed."""
    name = worker_connection_name(worker_id, incarnation)
    if registered_at is not None:
        wait = registered_at + lag - time.time()
        if wait > 0:
            await asyncio.sleep(wait)
    while True:
        try:
            listed: list[dict[str, Any]] = await asyncio.to_thread(management.connections)
            matches = [c for c in listed if _name_of(c) == name]
            for connection in matches:
                await asyncio.to_thread(
                    management.close_connection,
                    connection["name"],
                    f"hashq: worker {worker_id} incarnation {incarnation} fenced",
                )
        except ServiceUnavailable as exc:
            log.warning("fencing %s: %s; retrying", name, exc)
            await asyncio.sleep(1.0)
            continue
        return len(matches)


def _name_of(connection: dict[str, Any]) -> str | None:
    properties = connection.get("client_properties") or {}
    name = properties.get("connection_name") or connection.get("user_provided_name")
    return str(name) if name else None
