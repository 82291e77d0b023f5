"""Dead-lettering a message on purpose: why it failed goes into its headers, the publish is
confirmed, and only then is the original acknowledged."""

from __future__ import annotations

import time
import traceback
from datetime import UTC, datetime
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange

from hashq.errors import ServiceUnavailable
from hashq.topology import Topology
from hashq.worker.jobs import Job

TRACEBACK_CHARS = 2000


def failure_headers(
    job: Job, reason: str, error: BaseException | None, worker_id: str
) -> dict[str, Any]:
    """The headers a dead letter carries: the original ones plus ``x-hashq-*`` saying why."""
    original = dict(job.delivery.header.properties.headers or {})
    now = time.time()
    headers: dict[str, Any] = {
        **original,
        "x-hashq-reason": reason,
        "x-hashq-key": job.key,
        "x-hashq-bucket": job.lease.bucket,
        "x-hashq-epoch": job.lease.epoch,
        "x-hashq-attempts": job.attempt,
        "x-hashq-worker": worker_id,
        "x-hashq-first-failure": _iso(job.first_failure or now),
        "x-hashq-last-failure": _iso(now),
    }
    if error is not None:
        text = "".join(traceback.format_exception(error))
        headers["x-hashq-error-type"] = type(error).__name__
        headers["x-hashq-error"] = str(error)[:1000]
        headers["x-hashq-traceback"] = text[-TRACEBACK_CHARS:]
    return headers


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat(timespec="milliseconds")


class DeadLetters:
    """Publishes to the app's dead-letter exchange with publisher confirms."""

    def __init__(self, topology: Topology, worker_id: str) -> None:
        self._topology = topology
        self._worker_id = worker_id
        self._channel: AbstractChannel | None = None
        self._exchange: AbstractExchange | None = None

    async def open(self, connection: AbstractConnection) -> None:
        self._channel = await connection.channel(publisher_confirms=True)
        self._exchange = await self._channel.get_exchange(
            self._topology.dead_letter_exchange, ensure=False
        )

    async def publish(self, job: Job, reason: str, error: BaseException | None) -> None:
        """Raises if the broker did not confirm; then the original must not be acknowledged."""
        if self._exchange is None or self._channel is None or self._channel.is_closed:
            raise ServiceUnavailable("no channel for dead letters")
        properties = job.delivery.header.properties
        message = aio_pika.Message(
            body=job.delivery.body,
            headers=failure_headers(job, reason, error, self._worker_id),
            message_id=properties.message_id,
            content_type=properties.content_type,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        await self._exchange.publish(message, routing_key=job.key, timeout=30)
