"""RabbitMQ at the edge: plain (never self-reconnecting) aio-pika connections with a name and a
clear, secret-free error when the broker cannot be reached.

Connections are deliberately not robust: a connection that reconnects and re-subscribes on its
own is how a fenced worker turns into a zombie. Whoever owns a connection decides when to open
a new one.

With a cluster's nodes listed, a connection goes to the first of them that answers, starting
from a random one so that a fleet's connections spread over the nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import random
import socket
import uuid
from collections.abc import Iterator
from typing import TypeGuard

import aio_pika
from aio_pika.abc import AbstractConnection
from aiormq.exceptions import (
    AMQPConnectionError,
    InvalidFrameError,
    ProbableAuthenticationError,
)

from hashq._io.tls import tls_context
from hashq.errors import ServiceUnavailable
from hashq.records import QUEUE_ANSWER_WITHIN
from hashq.settings import Settings, redact_url

log = logging.getLogger(__name__)


def connection_name(role: str) -> str:
    """A name unique to this process and call, shown by the management API and rabbitmqctl."""
    return f"hashq-{role}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def connect_amqp(settings: Settings, name: str) -> AbstractConnection:
    """An open connection named ``name`` to one of ``settings.amqp_urls``."""
    connection, _ = await connect_named(settings, itertools.repeat(name))
    return connection


async def connect_named(settings: Settings, names: Iterator[str]) -> tuple[AbstractConnection, str]:
    """An open connection to one of ``settings.amqp_urls`` and its name: each attempt takes the
    next of ``names``. A node that fails an attempt after the handshake began (a vhost refused,
    a node shutting down, an answer too late) still reports a connection of that name closed on
    its event exchange; the leader counts a fenced worker's broker contact from such a report
    (docs/protocol.md), so a worker's connection name must never mean two connections."""
    urls = settings.amqp_urls
    start = random.randrange(len(urls))
    failures: list[str] = []
    for url in urls[start:] + urls[:start]:
        name = next(names)
        try:
            return await _connect(url, settings, name), name
        except ServiceUnavailable as exc:
            failures.append(str(exc))
    if len(failures) == 1:
        raise ServiceUnavailable(failures[0])
    raise ServiceUnavailable(f"no RabbitMQ node answered: {'; '.join(failures)}")


async def _connect(url: str, settings: Settings, name: str) -> AbstractConnection:
    where = redact_url(url)
    try:
        connection = await asyncio.wait_for(
            aio_pika.connect(
                url,
                client_properties={"connection_name": name},
                ssl_context=tls_context(settings) if url.startswith("amqps:") else None,
            ),
            timeout=settings.connect_timeout,
        )
    except ProbableAuthenticationError:
        raise ServiceUnavailable(f"RabbitMQ at {where} refused the credentials") from None
    except TimeoutError:
        raise ServiceUnavailable(
            f"RabbitMQ at {where} did not answer within {settings.connect_timeout:g}s"
        ) from None
    except InvalidFrameError:  # aiormq's word for a Connection.Close answering the open
        raise ServiceUnavailable(
            f"RabbitMQ at {where} closed the connection as it opened: does the vhost exist, "
            "and may the user use it?"
        ) from None
    except (AMQPConnectionError, OSError) as exc:
        raise ServiceUnavailable(
            f"RabbitMQ at {where} cannot be reached: {_first_line(exc)}"
        ) from None
    answer_every_close(connection)
    return connection


def answer_every_close(connection: AbstractConnection) -> None:
    """Let ``connection`` always queue its answer to the broker's ``Channel.Close`` (and to a
    ``Connection.Close``, though aiormq's writer may stop before sending that one: the
    connection ends either way).

    aiormq queues those answers with ``put_nowait`` on the connection's write queue, which holds
    at most 10 frames, and drops an answer silently when it is full; frames sent without waiting
    for the socket (hashq's acknowledgements and publishes) fill it. A channel whose close is not
    answered stays open on the broker: it remains its queue's single active consumer, holding
    what it was delivered, so the bucket consumed again on a new channel gets nothing until the
    connection closes (the chaos run's stalled buckets: tests/integration/test_amqp.py), and a
    channel opened later under its number ends the connection. Unbounded, the queue never
    refuses an answer; what hashq sends is bounded elsewhere (each bucket's prefetch window, the
    publisher's confirms in flight)."""
    underlay = getattr(connection, "transport", None)
    queue = getattr(getattr(underlay, "connection", None), "write_queue", None)
    if not isinstance(queue, asyncio.Queue) or not hasattr(queue, "_maxsize"):
        log.warning("aiormq's write queue not found: a close of the broker may go unanswered")
        return
    queue._maxsize = 0  # asyncio.Queue's bound (0: none); nothing public sets it after creation


def connection_usable(connection: AbstractConnection | None) -> TypeGuard[AbstractConnection]:
    """True while ``connection`` can carry frames. After a server-forced close aio-pika may
    leave ``is_closed`` False; the underlying aiormq connection tells."""
    if connection is None or connection.is_closed:
        return False
    underlay = getattr(connection, "transport", None)
    return underlay is not None and not underlay.connection.is_closed


async def close_quietly(connection: AbstractConnection, within: float = 5.0) -> None:
    """Close ``connection``, bounded in time and silent: one whose peer is gone may neither
    answer the close nor fail it."""
    try:
        await asyncio.wait_for(connection.close(), timeout=within)
    except Exception as exc:
        log.debug("closing connection: %r", exc)


async def declare_passive(connection: AbstractConnection, queue: str) -> tuple[int, int]:
    """A passive declare of ``queue`` on a channel of its own, closed however it ends (a
    question its asker stopped waiting for included): the queue's ready messages and consumers.
    Raises what the broker said (``ChannelNotFoundEntity``: no such queue;
    ``ChannelLockedResource``: another connection's exclusive queue)."""
    channel = await connection.channel()
    try:
        declared = await channel.declare_queue(queue, passive=True)
        answer = declared.declaration_result
        return answer.message_count or 0, answer.consumer_count or 0
    finally:
        if not channel.is_closed:  # bounded: a broker that does not answer holds no caller
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(channel.close()), QUEUE_ANSWER_WITHIN)


async def ask_queue(
    connection: AbstractConnection | None, queue: str, within: float = QUEUE_ANSWER_WITHIN
) -> tuple[int, int] | None:
    """``declare_passive`` of ``queue`` for a caller that treats every failure alike: None if
    the connection is not usable, the broker refused, or no answer came within ``within``."""
    if not connection_usable(connection):
        return None
    try:
        return await asyncio.wait_for(declare_passive(connection, queue), within)
    except Exception as exc:  # every failure means the same here: no word from the queue
        log.debug("asking queue %s: %r", queue, exc)
        return None


def _first_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]
