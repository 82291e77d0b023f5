"""RabbitMQ at the edge: plain (never self-reconnecting) aio-pika connections with a name and a
clear, secret-free error when the broker cannot be reached.

Connections are deliberately not robust: a connection that reconnects and re-subscribes on its
own is how a fenced worker turns into a zombie. Whoever owns a connection decides when to open
a new one.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid

import aio_pika
from aio_pika.abc import AbstractConnection
from aiormq.exceptions import AMQPConnectionError, ProbableAuthenticationError

from hashq.errors import ServiceUnavailable
from hashq.settings import Settings


def connection_name(role: str) -> str:
    """A name unique to this process and call, shown by the management API and rabbitmqctl."""
    return f"hashq-{role}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def connect_amqp(settings: Settings, name: str) -> AbstractConnection:
    """An open connection to ``settings.amqp_url`` named ``name``."""
    where = settings.amqp_url_redacted
    try:
        return await asyncio.wait_for(
            aio_pika.connect(settings.amqp_url, client_properties={"connection_name": name}),
            timeout=settings.connect_timeout,
        )
    except ProbableAuthenticationError:
        raise ServiceUnavailable(f"RabbitMQ at {where} refused the credentials") from None
    except TimeoutError:
        raise ServiceUnavailable(
            f"RabbitMQ at {where} did not answer within {settings.connect_timeout:g}s"
        ) from None
    except (AMQPConnectionError, OSError) as exc:
        raise ServiceUnavailable(
            f"RabbitMQ at {where} cannot be reached: {_first_line(exc)}"
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]
