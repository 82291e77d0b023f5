"""The worker's ZooKeeper side: its registration, the watch on its assignment, its session
state, and the releases it writes.

kazoo calls back on its own threads. Every callback crosses into asyncio with
``call_soon_threadsafe`` to ``_take_session`` or ``_take_assignment``, which store the newest
value and wake the worker's loop; the loop reads the values, never the callbacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
import uuid
from collections.abc import Callable
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

from hashq.errors import ConfigError, HashqError, ServiceUnavailable
from hashq.protocol import Assignment, Paths, Registration, Release
from hashq.settings import Settings
from hashq.zk import close_zk, connect_zk

log = logging.getLogger(__name__)


class Session(enum.Enum):
    """The worker's ZooKeeper session, as it bears on what the worker may do."""

    CONNECTED = "connected"
    """Registered and watching: may start and acknowledge messages of its grants."""
    SUSPENDED = "suspended"
    """Connection lost, session perhaps alive: start nothing new; in-flight ones may finish."""
    LOST = "lost"
    """Session expired: its grants are void. Cut off every bucket, then register afresh."""


class RegistrationGone(HashqError):
    """The registration is no longer this incarnation's (the session expired)."""


class Membership:
    """Registration and assignment of one worker id; wakes ``changed`` on every change."""

    def __init__(
        self, settings: Settings, worker_id: str, capacity: int, wake: asyncio.Event
    ) -> None:
        self._settings = settings
        self._paths = Paths(settings.app)
        self.worker_id = worker_id
        self.capacity = capacity
        self.incarnation = ""
        self.session = Session.CONNECTED
        self.assignment: Assignment | None = None
        self._assignment_zxid = -1  # of the newest assignment taken: older ones are stale
        self._registration: Registration | None = None
        self._doubts = 0  # pauses and disconnects seen: a verdict asked for before one is stale
        self.changed = wake
        self.on_unsafe: Callable[[], None] | None = None
        self._loop = asyncio.get_running_loop()
        self._zk: KazooClient | None = None

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        zk = await asyncio.to_thread(connect_zk, self._settings, "worker")
        zk.add_listener(self._on_state)
        DataWatch(zk, self._paths.assignment(self.worker_id), self._on_assignment)
        self._zk = zk

    @staticmethod
    def new_incarnation() -> str:
        return uuid.uuid4().hex[:8]

    @property
    def zk_connected(self) -> bool:
        return self._zk is not None and bool(self._zk.connected)

    async def register(self, incarnation: str, connection_name: str, drain_timeout: float) -> None:
        """Create the ephemeral registration of a new incarnation."""
        self.incarnation = incarnation
        registration = Registration(
            worker_id=self.worker_id,
            incarnation=self.incarnation,
            capacity=self.capacity,
            connection=connection_name,
            host=_hostname(),
            pid=_pid(),
            drain_timeout=drain_timeout,
        )
        await asyncio.to_thread(self._create_registration, registration)
        self._registration = registration
        self.session = Session.CONNECTED
        log.info("worker %s registered (incarnation %s)", self.worker_id, self.incarnation)

    def _create_registration(self, registration: Registration) -> None:
        assert self._zk is not None
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

    async def announce(self, connection_name: str) -> None:
        """Name a new AMQP connection of this incarnation in its registration, then read the
        assignment afresh. Nothing may be consumed on the connection before both: a fence of
        this incarnation then waits until the management API can list the connection, and the
        grants consumed on it are at least as new as the announcement.

        Raises ``RegistrationGone`` if the registration is no longer ours."""
        assert self._registration is not None
        announced = replace(self._registration, connection=connection_name)
        await asyncio.to_thread(self._replace_registration, announced)
        self._registration = announced
        data, stat = await asyncio.to_thread(self._read_assignment)
        self._take_assignment(data, stat)

    def _replace_registration(self, registration: Registration) -> None:
        assert self._zk is not None
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
        assert self._zk is not None
        try:
            return self._zk.get(self._paths.assignment(self.worker_id))  # type: ignore[no-any-return]
        except NoNodeError:
            return None, None

    def _owned_by_us(self, path: str) -> bool:
        assert self._zk is not None
        try:
            _, stat = self._zk.get(path)
        except NoNodeError:
            return False
        return bool(stat.ephemeralOwner == self._zk.client_id[0])

    async def deregister(self) -> None:
        if self._zk is None:
            return
        try:
            await asyncio.to_thread(self._zk.delete, self._paths.worker(self.worker_id))
        except Exception as exc:
            log.debug("deregistering: %r", exc)

    async def close(self) -> None:
        if self._zk is not None:
            zk, self._zk = self._zk, None
            await asyncio.to_thread(close_zk, zk)

    def suspect(self) -> None:
        """The process may have been paused: act as SUSPENDED until ``confirm`` says otherwise."""
        self._doubts += 1
        if self.session is Session.CONNECTED:
            self.session = Session.SUSPENDED
        self.changed.set()

    async def confirm(self) -> None:
        """While SUSPENDED: ask ZooKeeper whether our registration (hence our session) lives.
        An answer is dropped if a pause or a disconnect was seen while it was on its way: the
        session may have expired after ZooKeeper answered (the worker then asks again)."""
        doubts = self._doubts
        try:
            verdict = await asyncio.wait_for(asyncio.to_thread(self._probe), 5)
        except TimeoutError:
            verdict = Session.SUSPENDED
        if doubts != self._doubts:
            return
        if self.session is Session.SUSPENDED and verdict is not Session.SUSPENDED:
            log.info("worker %s: ZooKeeper session %s", self.worker_id, verdict.value)
            self.session = verdict
            self.changed.set()

    def _probe(self) -> Session:
        if self._zk is None or not self._zk.connected:
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

    # ------------------------------------------------------------ what the loop reads
    def grants(self) -> dict[int, int]:
        """Bucket -> epoch this incarnation may consume now (none unless CONNECTED)."""
        if self.session is not Session.CONNECTED or self.assignment is None:
            return {}
        return self.assignment.grants_for(self.incarnation)

    async def write_release(self, bucket: int, epoch: int, within: float | None = None) -> None:
        """Record that this incarnation holds nothing of ``bucket`` at ``epoch`` any more.
        Retried until ZooKeeper takes it, the session is lost, or ``within`` seconds pass (when
        shutting down: the coordinator fences the bucket once the session expires)."""
        release = Release(self.worker_id, self.incarnation, bucket, epoch)
        deadline = None if within is None else time.monotonic() + within
        while True:
            try:
                await asyncio.to_thread(self._create, self._paths.release(bucket, epoch), release)
                log.info("bucket %d epoch %d released by %s", bucket, epoch, self.worker_id)
                return
            except Exception as exc:
                if self.session is Session.LOST or (
                    deadline is not None and time.monotonic() > deadline
                ):
                    log.warning("bucket %d epoch %d: release not written (%r)", bucket, epoch, exc)
                    return
                log.warning("bucket %d: writing the release failed (%r); retrying", bucket, exc)
                await asyncio.sleep(0.5)

    def _create(self, path: str, release: Release) -> None:
        if self._zk is None:
            raise ServiceUnavailable("ZooKeeper client closed")
        # Already there if written before: a release is written once per bucket and epoch.
        with contextlib.suppress(NodeExistsError):
            self._zk.create(path, release.encode(), makepath=True)

    # ------------------------------------------------------------ kazoo threads -> loop
    def _on_state(self, state: str) -> None:
        session = {
            KazooState.CONNECTED: Session.CONNECTED,
            KazooState.SUSPENDED: Session.SUSPENDED,
            KazooState.LOST: Session.LOST,
        }[state]
        self._loop.call_soon_threadsafe(self._take_session, session)

    def _on_assignment(self, data: bytes | None, stat: Any) -> None:
        self._loop.call_soon_threadsafe(self._take_assignment, data, stat)

    def _take_assignment(self, data: bytes | None, stat: Any) -> None:
        """Keep the assignment read, unless a newer one was kept already (the watch and
        ``announce`` read it from different threads, so they may arrive out of order)."""
        zxid = -1 if stat is None else int(stat.mzxid)
        if stat is not None and zxid < self._assignment_zxid:
            return
        assignment = None
        if data:
            try:
                assignment = Assignment.decode(data)
            except (ValueError, KeyError, TypeError) as exc:
                log.error("unreadable assignment for %s: %r", self.worker_id, exc)
        self._assignment_zxid = max(zxid, self._assignment_zxid)
        self.assignment = assignment
        self.changed.set()

    def _take_session(self, value: Session) -> None:
        # LOST sticks until the worker has registered again: a later CONNECTED belongs to a new
        # session whose registration does not exist yet. CONNECTED after SUSPENDED is taken
        # only from ``confirm``, which checks the registration is still ours.
        if value is not Session.CONNECTED:
            self._doubts += 1
            if self.session is not Session.LOST:
                self.session = value
            if self.on_unsafe is not None:
                self.on_unsafe()  # start nothing more before the loop has looked
        self.changed.set()


def _hostname() -> str:
    import socket

    return socket.gethostname()


def _pid() -> int:
    import os

    return os.getpid()
