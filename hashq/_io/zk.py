"""ZooKeeper at the edge: opening a kazoo client with a clear error when it cannot be reached,
and the ACLs of hashq's nodes.

kazoo is blocking and calls back on its own threads; callers run its calls with
``asyncio.to_thread`` and cross back into asyncio with ``loop.call_soon_threadsafe``.

With ``zk_acl_coordinators`` and ``zk_acl_workers`` set (digest ids; each process logs in with
its own ``zk_auth``), nodes are created with these ACLs:
- everything coordinators write (the topology record, bucket records, assignments, the leader
  and the election): coordinators all rights, workers read only. So a worker's credentials
  cannot grant it a bucket.
- ``workers/`` and ``releases/``: workers may also create and delete children there;
- what a worker creates there (its registration, its releases): workers and coordinators all.
ZooKeeper cannot tell workers apart by node name, so one worker's credentials could delete
another's registration (the coordinator then fences it): a denial of service, never two owners.
Without those settings nodes are open, as ZooKeeper creates them by default.
"""

from __future__ import annotations

import logging
from typing import Literal

from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.security import ACL, Permissions, make_acl

from hashq.errors import ServiceUnavailable
from hashq.settings import Settings

log = logging.getLogger(__name__)


Writer = Literal["coordinator", "worker"]  # whose ACL the nodes a client creates get


def acl(settings: Settings, kind: Literal["coordinators", "shared", "workers"]) -> list[ACL] | None:
    """The ACL of a node: written by ``coordinators`` only, ``shared`` (a folder workers add
    to), or made by ``workers``. None (ZooKeeper's open default) without ACL settings."""
    if settings.zk_acl_coordinators is None or settings.zk_acl_workers is None:
        return None
    coordinators = make_acl("digest", settings.zk_acl_coordinators, all=True)
    workers = {
        "coordinators": Permissions.READ,
        "shared": Permissions.READ | Permissions.CREATE | Permissions.DELETE,
        "workers": Permissions.ALL,
    }[kind]
    return [coordinators, ACL(workers, make_acl("digest", settings.zk_acl_workers).id)]


def connect_zk(settings: Settings, writer: Writer) -> KazooClient:
    """A started kazoo client for ``settings.zk_hosts`` (blocking; run it in a thread). Nodes it
    creates get the ACL of what ``writer`` writes unless a call says otherwise. ``hashq init``
    and the tools write as the coordinator does: the topology record and the folders."""
    client = zk_client(settings, writer)
    start_zk(client, settings)
    return client


def zk_client(settings: Settings, writer: Writer) -> KazooClient:
    """A kazoo client for ``settings.zk_hosts``, not connected yet (``start_zk``)."""
    return KazooClient(
        hosts=settings.zk_hosts,
        auth_data=[("digest", settings.zk_auth)] if settings.zk_auth else None,
        default_acl=acl(settings, "coordinators" if writer == "coordinator" else "workers"),
        timeout=settings.zk_session_timeout,
        # Never give up reconnecting: with a bounded retry policy kazoo closes the client for
        # good when ZooKeeper is down a little longer (seen in a chaos run: a 1 s restart of
        # ZooKeeper left every worker and coordinator unable to reconnect).
        connection_retry={"max_tries": -1, "delay": 0.1, "max_delay": 2},
        logger=logging.getLogger("hashq.kazoo"),
    )


def start_zk(client: KazooClient, settings: Settings) -> None:
    """Connect ``client`` (blocking), or ``ServiceUnavailable`` within the connect timeout."""
    try:
        client.start(timeout=settings.connect_timeout)
    except KazooTimeoutError:
        client.close()
        raise ServiceUnavailable(
            f"ZooKeeper at {settings.zk_hosts} did not answer within {settings.connect_timeout:g}s"
        ) from None


def close_zk(client: KazooClient) -> None:
    """Stop and close ``client``, ignoring a connection that is already gone."""
    try:
        client.stop()
    finally:
        client.close()
