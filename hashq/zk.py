"""ZooKeeper at the edge: opening a kazoo client with a clear error when it cannot be reached.

kazoo is blocking and calls back on its own threads; callers run its calls with
``asyncio.to_thread`` and cross back into asyncio with ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import logging

from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from hashq.errors import ServiceUnavailable
from hashq.settings import Settings

log = logging.getLogger(__name__)


def connect_zk(settings: Settings) -> KazooClient:
    """A started kazoo client for ``settings.zk_hosts`` (blocking; run it in a thread)."""
    client = KazooClient(
        hosts=settings.zk_hosts,
        timeout=settings.zk_session_timeout,
        # Never give up reconnecting: with a bounded retry policy kazoo closes the client for
        # good when ZooKeeper is down a little longer (seen in a chaos run: a 1 s restart of
        # ZooKeeper left every worker and coordinator unable to reconnect).
        connection_retry={"max_tries": -1, "delay": 0.1, "max_delay": 2},
        logger=logging.getLogger("hashq.kazoo"),
    )
    try:
        client.start(timeout=settings.connect_timeout)
    except KazooTimeoutError:
        client.close()
        raise ServiceUnavailable(
            f"ZooKeeper at {settings.zk_hosts} did not answer within {settings.connect_timeout:g}s"
        ) from None
    return client


def close_zk(client: KazooClient) -> None:
    """Stop and close ``client``, ignoring a connection that is already gone."""
    try:
        client.stop()
    finally:
        client.close()
