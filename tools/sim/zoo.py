"""A model of ZooKeeper and of a kazoo client, as far as hashq relies on them.

- Nodes with versions and modification zxids; ephemeral nodes go with their session;
  sequential nodes; multi-ops that apply all or nothing (version checks included).
- Sessions: a client cut off from the server goes SUSPENDED after a third to two thirds of the
  session timeout (kazoo drops the connection: requests in flight fail with a connection loss,
  whether or not the server applied them); the server expires the session after the timeout.
  A client that gets back finds its session alive (CONNECTED) or expired (LOST, then a new
  session: CONNECTED).
- Watches, as kazoo's DataWatch and ChildrenWatch give them: after every change, and after
  every reconnection, the callback gets a fresh read.
- Server restarts: every client loses its connection; sessions get their full timeout again.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tools.sim.net import Link, Pipe
from tools.sim.world import World


class ZkError(Exception):
    pass


class NoNode(ZkError):
    pass


class NodeExists(ZkError):
    pass


class BadVersion(ZkError):
    pass


class ConnectionLoss(ZkError):
    pass


class SessionExpired(ZkError):
    pass


@dataclass
class Node:
    data: bytes
    version: int
    mzxid: int
    owner: int = 0  # session of an ephemeral node
    children_made: int = 0  # for sequential children


@dataclass(frozen=True)
class Stat:
    version: int
    mzxid: int
    owner: int


class ZooKeeper:
    def __init__(self, world: World) -> None:
        self.world = world
        self.nodes: dict[str, Node] = {"/": Node(b"", 0, 0)}
        self.zxid = 0
        self.sessions: dict[int, Any] = {}  # id -> expiry timer (None while heard from)
        self.up = True
        self.clients: list[ZkClient] = []
        self._ids = itertools.count(1)
        self._held_back: list[str] | None = None

    # ------------------------------------------------------------ sessions
    def open_session(self) -> int:
        session = next(self._ids)
        self.sessions[session] = None
        return session

    def alive(self, session: int) -> bool:
        return session in self.sessions

    def not_heard(self, session: int, timeout: float) -> None:
        """The session's client stopped reaching the server: expire it after ``timeout``."""
        if session in self.sessions and self.sessions[session] is None:
            self.sessions[session] = self.world.after(timeout, lambda: self.expire(session))

    def heard(self, session: int) -> None:
        timer = self.sessions.get(session)
        if timer is not None:
            timer.cancelled = True
            self.sessions[session] = None

    def expire(self, session: int) -> None:
        if self.sessions.pop(session, "gone") == "gone":
            return
        self.world.note(f"zk: session {session} expired")
        for path in [p for p, n in self.nodes.items() if n.owner == session]:
            self._remove(path)

    def restart(self, downtime: float) -> None:
        self.up = False
        for client in list(self.clients):
            client.disconnected()
        paused = list(self.sessions)
        for session in paused:
            self.heard(session)

        def back() -> None:
            self.up = True
            for session in paused:  # each client has its full timeout to come back
                for client in self.clients:
                    if client.session == session and client.alive and client.link.up:
                        break
                else:
                    self.not_heard(session, self._timeout_of(session))
            for client in list(self.clients):
                client.server_back()

        self.world.after(downtime, back)

    def _timeout_of(self, session: int) -> float:
        for client in self.clients:
            if client.session == session:
                return client.timeout
        return 10.0

    # ------------------------------------------------------------ data
    def get(self, path: str) -> tuple[bytes, Stat]:
        node = self.nodes.get(path)
        if node is None:
            raise NoNode(path)
        return node.data, Stat(node.version, node.mzxid, node.owner)

    def children(self, path: str) -> list[str]:
        if path not in self.nodes:
            raise NoNode(path)
        prefix = path.rstrip("/") + "/"
        return sorted(
            p[len(prefix) :]
            for p in self.nodes
            if p.startswith(prefix) and "/" not in p[len(prefix) :]
        )

    def create(
        self,
        path: str,
        data: bytes,
        session: int = 0,
        *,
        sequential: bool = False,
        makepath: bool = True,
    ) -> str:
        parent = path.rsplit("/", 1)[0] or "/"
        if parent not in self.nodes:
            if not makepath:
                raise NoNode(parent)
            self.create(parent, b"", makepath=True)
        if sequential:
            self.nodes[parent].children_made += 1
            path = f"{path}{self.nodes[parent].children_made:010d}"
        if path in self.nodes:
            raise NodeExists(path)
        self.zxid += 1
        self.nodes[path] = Node(data, 0, self.zxid, session)
        self._changed(path)  # a data watch set on a missing node fires when it is created
        self._changed(parent)
        return path

    def set(self, path: str, data: bytes, version: int = -1) -> Stat:
        node = self.nodes.get(path)
        if node is None:
            raise NoNode(path)
        if version not in (-1, node.version):
            raise BadVersion(path)
        self.zxid += 1
        node.data, node.version, node.mzxid = data, node.version + 1, self.zxid
        self._changed(path)
        return Stat(node.version, node.mzxid, node.owner)

    def delete(self, path: str, version: int = -1) -> None:
        node = self.nodes.get(path)
        if node is None:
            raise NoNode(path)
        if version not in (-1, node.version):
            raise BadVersion(path)
        self._remove(path)

    def check(self, path: str, version: int) -> None:
        node = self.nodes.get(path)
        if node is None:
            raise NoNode(path)
        if node.version != version:
            raise BadVersion(path)

    def multi(self, ops: list[Callable[[ZooKeeper], object]]) -> None:
        """All or nothing: ops run on a copy first; any error leaves the tree as it was."""
        saved = ({p: Node(**vars(n)) for p, n in self.nodes.items()}, self.zxid)
        self._held_back = []
        try:
            for op in ops:
                op(self)
        except ZkError:
            self.nodes, self.zxid = saved
            raise
        finally:
            changed, self._held_back = self._held_back, None
        for path in changed:
            self._notify(path)

    def _remove(self, path: str) -> None:
        self.zxid += 1
        del self.nodes[path]
        self._changed(path)
        self._changed(path.rsplit("/", 1)[0] or "/")

    def _changed(self, path: str) -> None:
        self._notify(path)

    def _notify(self, path: str) -> None:
        if self._held_back is not None:
            self._held_back.append(path)  # a multi-op in progress: told once it applied
            return
        for client in self.clients:
            client.watched_changed(path)


Watch = Callable[[], None]


class ZkClient:
    """A kazoo client: one session at a time, requests over the current connection, watches
    re-read after every change and reconnection, and a listener told CONNECTED, SUSPENDED or
    LOST."""

    def __init__(
        self,
        zk: ZooKeeper,
        link: Link,
        timeout: float,
        listener: Callable[[str], None],
    ) -> None:
        self.zk = zk
        self.world = zk.world
        self.link = link
        self.timeout = timeout
        self._listener = listener
        self.session = 0
        self.state = "closed"
        self.alive = True  # False once its process crashed or it was closed
        self._up: Pipe | None = None
        self._down: Pipe | None = None
        self._pending: dict[int, Callable[[Any], None]] = {}
        self._calls = itertools.count(1)
        self._watches: dict[str, list[Watch]] = {}
        zk.clients.append(self)

    @property
    def connected(self) -> bool:
        return self.state == "connected"

    def start(self) -> None:
        self._connect()

    def close(self) -> None:
        if self.alive and self.session and self.zk.alive(self.session) and self.link.up:
            self.zk.expire(self.session)  # a clean close ends the session at once
        self.crash()

    def crash(self) -> None:
        """The process died: its connection drops; the server expires the session later."""
        if not self.alive:
            return
        self.alive = False
        self._drop_connection()
        if self.session:
            self.zk.not_heard(self.session, self.timeout)
        self.zk.clients.remove(self)

    # ------------------------------------------------------------ requests
    def call(self, request: Callable[[ZooKeeper, int], Any], done: Callable[[Any], None]) -> None:
        """Run ``request(server, session)`` at the server; ``done`` gets its result or the
        ``ZkError`` it raised (``ConnectionLoss`` if the connection dropped meanwhile)."""
        if not self.connected or self._up is None:
            self.world.after(0, lambda: done(ConnectionLoss("not connected")))
            return
        number = next(self._calls)
        self._pending[number] = done
        session, down = self.session, self._down

        def at_server() -> None:
            if not self.zk.alive(session):
                answer: Any = SessionExpired()
            else:
                try:
                    answer = request(self.zk, session)
                except ZkError as exc:
                    answer = exc
            assert down is not None
            down.send(lambda: self._answer(number, answer))

        self._up.send(at_server)

    def _answer(self, number: int, answer: Any) -> None:
        done = self._pending.pop(number, None)
        if done is not None:
            done(answer)

    def watch(self, path: str, read: Watch) -> None:
        """Call ``read`` now and after every change of ``path`` (or its children)."""
        self._watches.setdefault(path, []).append(read)
        if self.connected:
            read()

    def watched_changed(self, path: str) -> None:
        if not self.alive or self._down is None:
            return
        for read in self._watches.get(path, []):
            self._down.send(lambda read=read: read() if self.connected else None)  # type: ignore[misc]

    # ------------------------------------------------------------ connection
    def _connect(self) -> None:
        if not self.alive or not self.zk.up or not self.link.up:
            return
        self._up, self._down = Pipe(self.world, self.link), Pipe(self.world, self.link)
        lost = bool(self.session) and not self.zk.alive(self.session)
        if lost:
            self.state = "lost"
            self._listener("lost")
        if not self.session or lost:
            self.session = self.zk.open_session()
        self.zk.heard(self.session)
        self.state = "connected"
        self._listener("connected")
        for reads in list(self._watches.values()):
            for read in reads:
                read()

    def _drop_connection(self) -> None:
        for pipe in (self._up, self._down):
            if pipe is not None:
                pipe.close()
        self._up = self._down = None
        pending, self._pending = self._pending, {}
        for done in pending.values():
            self.world.after(0, lambda done=done: done(ConnectionLoss("connection lost")))  # type: ignore[misc]

    def disconnected(self) -> None:
        """The connection dropped (kazoo noticed): SUSPENDED, and try again."""
        if not self.alive or self.state != "connected":
            return
        self._drop_connection()
        self.state = "suspended"
        self._listener("suspended")
        self._retry()

    def _retry(self) -> None:
        def again() -> None:
            if self.alive and self.state != "connected":
                if self.zk.up and self.link.up:
                    self._connect()
                else:
                    self._retry()

        self.world.after(self.world.rng.uniform(0.05, 0.5), again)

    def partitioned(self) -> None:
        """Cut off from the server: kazoo notices after a while; the server expires the
        session after the timeout."""
        session = self.session
        self.zk.not_heard(session, self.timeout)
        delay = self.timeout * self.world.rng.uniform(1 / 3, 2 / 3)
        self.world.after(delay, lambda: self.disconnected() if not self.link.up else None)

    def healed(self) -> None:
        if self.alive and self.state == "connected" and self.session:
            self.zk.heard(self.session)

    def server_back(self) -> None:
        if self.alive and self.state != "connected":
            self._retry()
