"""The coordinator's ZooKeeper I/O: reading the shared state and committing a decision in one
transaction that also checks the leader node's version, so that a deposed leader (paused,
partitioned, session expired) cannot overwrite a newer leader's decisions. Blocking calls: run
them with ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Mapping

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
)
from kazoo.interfaces import IAsyncResult
from kazoo.protocol.states import Callback, WatchedEvent

from hashq.errors import Deposed, WorkerReturned
from hashq.records import (
    Assignment,
    BucketRecord,
    Leadership,
    Paths,
    Registration,
    parse_release_name,
)
from hashq.topology import Topology
from hashq_coordinator.registrations import Member, Registrations, listed_in_order

log = logging.getLogger(__name__)
# How long a look waits for kazoo's callback thread to run the watch notifications that came
# before its listing; past it, the look reads every registration, as if nothing were known.
# Short: the leader's loop waits for the look, and reading everything is always safe.
WATCHES_RUN_SECONDS = 0.5


class Store:
    def __init__(self, zk: KazooClient, paths: Paths, buckets: int) -> None:
        self.zk = zk
        self.paths = paths
        self.buckets = buckets
        self._alive = f"{paths.root}/leader-session-none"
        self._registrations = Registrations()
        self._callbacks_late = False  # said so (``_watches_run``)
        zk.add_listener(lambda _state: self._registrations.forget())

    # ------------------------------------------------------------ reading
    def bucket_count(self) -> int:
        """The topology record's bucket count, which a resize raises (``hashq.resizing``);
        the records read from now on are those of every bucket it names."""
        data, _ = self.zk.get(self.paths.topology)
        self.buckets = Topology.from_record(data).buckets
        return self.buckets

    def workers(self) -> dict[str, Member]:
        """Every registration with its node's version: one listing, then a read of only those
        new or changed since their last read (``hashq_coordinator.registrations``)."""
        names = self.zk.get_children(self.paths.workers)
        if not self._watches_run():
            self._registrations.forget()
        kept, unread, generation = self._registrations.unread(names)
        read = {}
        paths = map(self.paths.worker, unread)
        for name, answer in zip(unread, self._read_all(paths, self._changed), strict=True):
            with contextlib.suppress(NoNodeError, ValueError, TypeError):
                data, stat = answer.get()
                read[name] = Member(Registration.decode(data), int(stat.version))
        self._registrations.remember(generation, read)
        return listed_in_order(names, kept, read)

    def _changed(self, event: WatchedEvent) -> None:
        if event.path:
            self._registrations.changed(event.path.rsplit("/", 1)[-1])
        else:  # kazoo dropped its watchers (a lost connection or session): none is left
            self._registrations.forget()

    def _watches_run(self) -> bool:
        """Wait until kazoo's callback thread has run every notification queued before now: it
        runs them one at a time, in the order they arrived. Said once when it stops keeping up,
        and once when it is back."""
        passed = threading.Event()
        self.zk.handler.dispatch_callback(Callback("watch", passed.set, ()))
        ran = passed.wait(WATCHES_RUN_SECONDS)
        if ran is self._callbacks_late:
            self._callbacks_late = not ran
            if ran:
                log.info("kazoo's callback thread keeps up again: registrations read as changed")
            else:
                log.warning(
                    "kazoo's callback thread is over %.0f s behind: every look reads every "
                    "registration until it keeps up",
                    WATCHES_RUN_SECONDS,
                )
        return ran

    def _read_all(self, paths: Iterable[str], watch: object = None) -> list[IAsyncResult]:
        """Every node's read asked at once, answered in order: one round trip's wait for them
        all, not one each (ZooKeeper answers a session's requests in the order they came).
        Each answer's ``get()`` gives the data and stat, or raises as ``zk.get`` would."""
        return [self.zk.get_async(path, watch=watch) for path in paths]

    def releases(self) -> dict[tuple[int, int], str]:
        """(bucket, epoch) -> node name of every release written."""
        found = {}
        for name in self.zk.get_children(self.paths.releases):
            parsed = parse_release_name(name)
            if parsed is not None:
                found[parsed] = name
        return found

    def records(self) -> dict[int, BucketRecord]:
        records = {}
        reads = self._read_all(map(self.paths.bucket, range(self.buckets)))
        for bucket, read in enumerate(reads):
            with contextlib.suppress(NoNodeError):
                records[bucket] = BucketRecord.decode(read.get()[0])
        return records

    def assignments(self) -> dict[str, Assignment]:
        found = {}
        names = self.zk.get_children(self.paths.assignments)
        reads = self._read_all(map(self.paths.assignment, names))
        for name, read in zip(names, reads, strict=True):
            with contextlib.suppress(NoNodeError, ValueError, KeyError):
                found[name] = Assignment.decode(read.get()[0])
        return found

    # ------------------------------------------------------------ leading
    def claim(self, me: str) -> tuple[Leadership, int]:
        """Become leader: raise the leader epoch with a compare-and-set, and tie the lead to this
        session with an ephemeral node; returns the leadership and the leader node's version,
        which every later write checks (with the ephemeral node's existence)."""
        self._registrations.forget()  # a new lead reads every registration
        leadership, version = self._raise_epoch(me)
        self._alive = f"{self.paths.root}/leader-session-{leadership.epoch:010d}"
        self.zk.create(self._alive, me.encode(), ephemeral=True)
        return leadership, version

    def _raise_epoch(self, me: str) -> tuple[Leadership, int]:
        while True:
            try:
                data, stat = self.zk.get(self.paths.leader)
                leadership = Leadership(me, Leadership.decode(data).epoch + 1)
                stat = self.zk.set(self.paths.leader, leadership.encode(), version=stat.version)
                return leadership, int(stat.version)
            except NoNodeError:
                with contextlib.suppress(NodeExistsError):
                    self.zk.create(self.paths.leader, Leadership(me, 1).encode())
                    _, stat = self.zk.get(self.paths.leader)
                    return Leadership(me, 1), int(stat.version)
            except BadVersionError:
                continue

    def commit(
        self,
        leader_version: int,
        records: Mapping[int, BucketRecord],
        known_records: Iterable[int],
        assignments: Mapping[str, Assignment],
        known_assignments: Iterable[str],
        removed_assignments: Iterable[str],
        consumed_releases: Iterable[str],
        expelled: Mapping[str, int] | None = None,
    ) -> None:
        """Write a decision atomically, or raise ``Deposed`` (another leads) or
        ``WorkerReturned`` (an expelled worker's registration changed: nothing written)."""
        transaction = self.zk.transaction()
        transaction.check(self.paths.leader, leader_version)
        # Gone with the session: a leader whose session expired cannot write, even if kazoo
        # has already reconnected with a new session.
        transaction.check(self._alive, 0)
        expelled = dict(expelled or {})
        for worker, version in expelled.items():  # right after the checks: see ``_refused``
            transaction.delete(self.paths.worker(worker), version=version)
        existing = set(known_records)
        for bucket, record in records.items():
            path = self.paths.bucket(bucket)
            if bucket in existing:
                transaction.set_data(path, record.encode())
            else:
                transaction.create(path, record.encode())
        written = set(known_assignments)
        for worker, assignment in assignments.items():
            path = self.paths.assignment(worker)
            if worker in written:
                transaction.set_data(path, assignment.encode())
            else:
                transaction.create(path, assignment.encode())
        for worker in removed_assignments:
            transaction.delete(self.paths.assignment(worker))
        for name in consumed_releases:
            transaction.delete(f"{self.paths.releases}/{name}")
        try:
            results = transaction.commit()
        except KazooException as exc:
            raise Deposed(f"ZooKeeper refused the leader's write: {type(exc).__name__}") from None
        _refused(results, list(expelled))


def _refused(results: list[object], expelled: list[str]) -> None:
    """Raise for a refused transaction. kazoo reports the operations before the one that failed
    as ``RolledBackError`` and those after it as ``RuntimeInconsistency``: the failed one is the
    first other exception. The two checks come first, then one delete per expelled worker."""
    for index, result in enumerate(results):
        if isinstance(result, Exception) and not isinstance(result, RolledBackError):
            if 2 <= index < 2 + len(expelled):
                raise WorkerReturned(
                    f"the registration of {expelled[index - 2]} changed since it was read"
                    f" ({type(result).__name__})"
                )
            raise Deposed(f"the leader's write was refused: {type(result).__name__}")
    if any(isinstance(result, Exception) for result in results):
        raise Deposed("the leader's write was refused")
