"""Writing grants into ZooKeeper the way the coordinator does (docs/protocol.md), so that the
worker can be tested against a real ZooKeeper without the coordinator."""

from __future__ import annotations

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from hashq.records import Assignment, BucketRecord, BucketState, Paths, Registration, Release
from hashq.resizing import ResizePhase, ResizeRecord
from tests.support.helpers import open_zk
from tools.polling import wait_until


class Grants:
    def __init__(self, zk_hosts: str, app: str) -> None:
        self.zk: KazooClient = open_zk(zk_hosts)
        self.paths = Paths(app)
        self.zk.ensure_path(self.paths.assignments)
        self.zk.ensure_path(self.paths.buckets)

    def close(self) -> None:
        self.zk.stop()
        self.zk.close()

    def workers(self) -> dict[str, Registration]:
        try:
            names = self.zk.get_children(self.paths.workers)
        except NoNodeError:
            return {}
        found = {}
        for name in names:
            try:
                found[name] = Registration.decode(self.zk.get(self.paths.worker(name))[0])
            except NoNodeError:
                continue
        return found

    def wait_for_workers(self, count: int, within: float = 30) -> list[Registration]:
        workers = wait_until(
            self.workers,
            within,
            every=0.1,
            until=lambda w: len(w) >= count,
            what=f"{count} workers",
        )
        return sorted(workers.values(), key=lambda r: r.worker_id)

    def wait_for_worker(self, worker_id: str, within: float = 30) -> Registration:
        return wait_until(
            lambda: self.workers().get(worker_id), within, every=0.1, what=f"worker {worker_id}"
        )

    def assign(
        self, worker: Registration, grants: dict[int, int], incoming: tuple[int, ...] = ()
    ) -> None:
        """Make ``grants`` (and ``incoming``) the whole assignment of ``worker``'s current
        incarnation."""
        transaction = self.zk.transaction()
        data = Assignment(worker.incarnation, grants, incoming=incoming).encode()
        path = self.paths.assignment(worker.worker_id)
        if self.zk.exists(path):
            transaction.set_data(path, data)
        else:
            transaction.create(path, data)
        for bucket, epoch in grants.items():
            record = BucketRecord(
                BucketState.GRANTED, worker.worker_id, worker.incarnation, epoch
            ).encode()
            if self.zk.exists(self.paths.bucket(bucket)):
                transaction.set_data(self.paths.bucket(bucket), record)
            else:
                transaction.create(self.paths.bucket(bucket), record)
        results = transaction.commit()
        assert not any(isinstance(r, Exception) for r in results), results

    def release(self, bucket: int, epoch: int) -> Release | None:
        try:
            return Release.decode(self.zk.get(self.paths.release(bucket, epoch))[0])
        except NoNodeError:
            return None

    def wait_for_release(self, bucket: int, epoch: int, within: float = 60) -> Release:
        return wait_until(
            lambda: self.release(bucket, epoch), within, what=f"release of {bucket} at {epoch}"
        )

    def records(self, buckets: int) -> dict[int, BucketRecord]:
        """The bucket records written so far, by bucket."""
        found = {}
        for bucket in range(buckets):
            path = self.paths.bucket(bucket)
            data = self.zk.exists(path) and self.zk.get(path)[0]
            if data:
                found[bucket] = BucketRecord.decode(data)
        return found

    def resize_phase(self) -> ResizePhase | None:
        """The phase of the app's last resize (``hashq.resizing``); None: never resized."""
        try:
            return ResizeRecord.decode(self.zk.get(self.paths.resize)[0]).phase
        except NoNodeError:
            return None

    def all_granted(self, buckets: int, workers: set[str]) -> bool:
        """Every bucket granted, and every one of ``workers`` owning its share."""
        found = self.records(buckets)
        held = [sum(1 for r in found.values() if r.owner == w) for w in workers]
        return (
            len(found) == buckets
            and all(r.state is BucketState.GRANTED and r.owner in workers for r in found.values())
            and min(held) >= buckets // len(workers)
        )
