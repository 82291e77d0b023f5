"""The worker's ZooKeeper side: its registration, the watch on its assignment, the releases
it writes and the questions it asks about its session. I/O only: what the answers mean is
decided by ``hashq.worker.machine.core.WorkerMachine``.

kazoo calls back on its own threads. Every callback crosses into asyncio with
``call_soon_threadsafe`` and becomes an event for the worker's loop (``post``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.recipe.watchers import DataWatch

from hashq._io.zk import close_zk, start_zk, zk_client
from hashq.errors import ConfigError, RegistrationGone, ServiceUnavailable
from hashq.records import BROKER_CONTACT_SECONDS, Assignment, Paths, Registration, Release
from hashq.resizing import passed_name
from hashq.settings import Settings
from hashq.worker.machine.events import (
    AssignmentRead,
    Event,
    RegistrationDeleted,
    Session,
    SessionChanged,
)

log = logging.getLogger(__name__)


__all__ = ["Membership", "Session"]


class Membership:
    """Registration and assignment of one worker id; posts what happens to ``post``."""

    def __init__(
        self, settings: Settings, worker_id: str, capacity: int, post: Callable[[Event], None]
    ) -> None:
        self._settings = settings
        self._paths = Paths(settings.app)
        self.worker_id = worker_id
        self.capacity = capacity
        self.incarnation = ""
        self._registration: Registration | None = None
        self._post = post
        self._loop = asyncio.get_running_loop()
        self._zk: KazooClient = zk_client(settings, "worker")
        self._open = False  # started and not closed: the client may be asked
        self._seen = ""  # the incarnation the registration node last named

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        await asyncio.to_thread(start_zk, self._zk, self._settings)
        self._open = True
        self._zk.add_listener(self._on_state)
        DataWatch(self._zk, self._paths.assignment(self.worker_id), self._on_assignment)
        DataWatch(self._zk, self._paths.worker(self.worker_id), self._on_registration)

    @property
    def zk(self) -> KazooClient:
        """The client, for the records of parked keys (``hashq.worker.parking``)."""
        return self._zk

    @staticmethod
    def new_incarnation() -> str:
        return uuid.uuid4().hex[:8]

    async def register(self, incarnation: str, connection_name: str, drain_timeout: float) -> None:
        """Create the ephemeral registration of a new incarnation."""
        registration = Registration(
            worker_id=self.worker_id,
            incarnation=incarnation,
            capacity=self.capacity,
            connection=connection_name,
            host=_hostname(),
            pid=_pid(),
            drain_timeout=drain_timeout,
            session_timeout=self._settings.zk_session_timeout,
            contact_seconds=BROKER_CONTACT_SECONDS,
        )
        await asyncio.to_thread(self._create_registration, registration)
        self.incarnation = incarnation
        self._registration = registration
        log.info("worker %s registered (incarnation %s)", self.worker_id, self.incarnation)

    def _create_registration(self, registration: Registration) -> None:
        path = self._paths.worker(self.worker_id)
        deadline = time.monotonic() + 3 * self._settings.zk_session_timeout
        while True:
            try:
                self._zk.create(path, registration.encode(), ephemeral=True, makepath=True)
                return
            except NodeExistsError:
                if self._owned_by_us(path):
                    self._zk.set(path, registration.encode())
                    return
                if time.monotonic() > deadline:
                    raise ConfigError(
                        f"worker id {self.worker_id!r} is registered by another live process"
                    ) from None
                log.info("waiting for an earlier registration of %s to expire", self.worker_id)
                time.sleep(1)

    async def announce(self, connection_name: str) -> AssignmentRead:
        """Name a new AMQP connection of this incarnation in its registration, then read the
        assignment afresh (returned). Nothing may be consumed on the connection before both: a
        fence of this incarnation then waits until the management API can list the
        connection, and the grants consumed on it are at least as new as the announcement.

        Raises ``RegistrationGone`` if the registration is no longer ours."""
        if self._registration is None:  # deregistered meanwhile (a withdrawal): try again later
            raise ServiceUnavailable(f"worker {self.worker_id}: not registered")
        announced = replace(self._registration, connection=connection_name)
        await asyncio.to_thread(self._replace_registration, announced)
        self._registration = announced
        data, stat = await asyncio.to_thread(self._read_assignment)
        return self._assignment_read(data, stat)

    def _replace_registration(self, registration: Registration) -> None:
        path = self._paths.worker(self.worker_id)
        try:
            data, stat = self._zk.get(path)
            if stat.ephemeralOwner != self._zk.client_id[0]:
                raise RegistrationGone(f"worker {self.worker_id}: registration of another session")
            if Registration.decode(data).incarnation != registration.incarnation:
                raise RegistrationGone(f"worker {self.worker_id}: registration of another life")
            self._zk.set(path, registration.encode(), version=stat.version)
        except (NoNodeError, SessionExpiredError, BadVersionError):
            raise RegistrationGone(f"worker {self.worker_id}: registration gone") from None

    def _read_assignment(self) -> tuple[bytes | None, Any]:
        try:
            return self._zk.get(self._paths.assignment(self.worker_id))  # type: ignore[no-any-return]
        except NoNodeError:
            return None, None

    def _owned_by_us(self, path: str) -> bool:
        try:
            _, stat = self._zk.get(path)
        except NoNodeError:
            return False
        return bool(stat.ephemeralOwner == self._zk.client_id[0])

    async def deregister(self) -> None:
        """Delete this incarnation's registration (its grants end with it)."""
        self.incarnation, self._registration = "", None
        if not self._open:
            return
        try:
            await asyncio.to_thread(self._zk.delete, self._paths.worker(self.worker_id))
        except Exception as exc:
            log.debug("deregistering: %r", exc)

    async def close(self) -> None:
        if self._open:
            self._open = False
            await asyncio.to_thread(close_zk, self._zk)

    async def probe(self, within: float = 5.0) -> Session:
        """Whether the registration (hence the session) is still this incarnation's:
        SUSPENDED when ZooKeeper does not answer within ``within`` seconds."""
        try:
            return await asyncio.wait_for(asyncio.to_thread(self._probe), within)
        except TimeoutError:
            return Session.SUSPENDED

    def _probe(self) -> Session:
        if not self._open or not self._zk.connected:
            return Session.SUSPENDED
        try:
            data, stat = self._zk.get(self._paths.worker(self.worker_id))
        except NoNodeError:
            return Session.LOST
        except SessionExpiredError:
            return Session.LOST
        except KazooException:
            return Session.SUSPENDED
        ours = stat.ephemeralOwner == self._zk.client_id[0]
        current = Registration.decode(data).incarnation == self.incarnation
        return Session.CONNECTED if ours and current else Session.LOST

    async def write_releases(self, ended: Sequence[tuple[int, int, str]]) -> None:
        """Record that each ``(bucket, epoch, incarnation)`` holds nothing of its bucket at its
        epoch any more (once: the caller decides whether to try again), in one transaction:
        a handover ends many leases at once, and one write each, a thread each, made the
        last of 32 wait about 50 ms under load."""
        releases = [Release(self.worker_id, inc, bucket, epoch) for bucket, epoch, inc in ended]
        await asyncio.to_thread(self._create_all, releases)
        for release in releases:
            log.info(
                "bucket %d epoch %d released by %s", release.bucket, release.epoch, self.worker_id
            )

    def _create_all(self, releases: Sequence[Release]) -> None:
        if not self._open:
            raise ServiceUnavailable("ZooKeeper client closed")
        if len(releases) > 1:
            transaction = self._zk.transaction()
            for release in releases:
                transaction.create(self._path(release), release.encode())
            results = transaction.commit()
            if not any(isinstance(result, Exception) for result in results):
                return
        for release in releases:  # one was written before, or the parent is missing
            # Already there if written before: a release is written once per bucket and epoch.
            with contextlib.suppress(NodeExistsError):
                self._zk.create(self._path(release), release.encode(), makepath=True)

    def _path(self, release: Release) -> str:
        return self._paths.release(release.bucket, release.epoch)

    async def say_passed(self, bucket: int, new: int) -> None:
        """Bucket ``bucket`` finished everything before its marker of the resize to ``new``
        buckets (``hashq.resizing``). No resize record: a copy of an earlier resize's marker,
        which counts for nothing."""
        path = f"{self._paths.resize}/{passed_name(new, bucket)}"
        await asyncio.to_thread(self._create_quietly, path)
        log.info("bucket %d passed its marker of the resize to %d buckets", bucket, new)

    def _create_quietly(self, path: str) -> None:
        if not self._open:
            raise ServiceUnavailable("ZooKeeper client closed")
        with contextlib.suppress(NodeExistsError, NoNodeError):
            self._zk.create(path, b"")

    # ------------------------------------------------------------ kazoo threads -> loop
    def _on_state(self, state: str) -> None:
        session = {
            KazooState.CONNECTED: Session.CONNECTED,
            KazooState.SUSPENDED: Session.SUSPENDED,
            KazooState.LOST: Session.LOST,
        }[state]
        self._loop.call_soon_threadsafe(self._post, SessionChanged(session))

    def _on_registration(self, data: bytes | None, stat: Any) -> None:
        """The registration node changed: its deletion while the session lives means the
        coordinator expelled this incarnation (``RegistrationDeleted``; the machine ignores
        the deletions it made itself)."""
        if data:
            try:
                self._seen = Registration.decode(data).incarnation
            except (ValueError, KeyError, TypeError):
                return
        elif self._seen:
            deleted, self._seen = self._seen, ""
            self._loop.call_soon_threadsafe(self._post, RegistrationDeleted(deleted))

    def _on_assignment(self, data: bytes | None, stat: Any) -> None:
        self._loop.call_soon_threadsafe(self._post, self._assignment_read(data, stat))

    def _assignment_read(self, data: bytes | None, stat: Any) -> AssignmentRead:
        assignment = None
        if data:
            try:
                assignment = Assignment.decode(data)
            except (ValueError, KeyError, TypeError) as exc:
                log.error("unreadable assignment for %s: %r", self.worker_id, exc)
        return AssignmentRead(-1 if stat is None else int(stat.mzxid), assignment)


def _hostname() -> str:
    import socket

    return socket.gethostname()


def _pid() -> int:
    import os

    return os.getpid()
