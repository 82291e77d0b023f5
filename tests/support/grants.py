"""Writing grants into ZooKeeper the way the coordinator does (docs/protocol.md), so that the
worker can be tested against a real ZooKeeper without the coordinator."""

from __future__ import annotations

import time

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from hashq.records import Assignment, BucketRecord, BucketState, Paths, Registration, Release
from tests.support.helpers import open_zk


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
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            workers = self.workers()
            if len(workers) >= count:
                return sorted(workers.values(), key=lambda r: r.worker_id)
            time.sleep(0.1)
        raise AssertionError(f"{count} workers did not register within {within}s")

    def wait_for_worker(self, worker_id: str, within: float = 30) -> Registration:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            found = self.workers().get(worker_id)
            if found is not None:
                return found
            time.sleep(0.1)
        raise AssertionError(f"worker {worker_id} did not register within {within}s")

    def assign(self, worker: Registration, grants: dict[int, int]) -> None:
        """Make ``grants`` the whole assignment of ``worker``'s current incarnation."""
        transaction = self.zk.transaction()
        data = Assignment(worker.incarnation, grants).encode()
        path = self.paths.assignment(worker.worker_id)
        if self.zk.exists(path):
            transaction.set_data(path, data)
        else:
            transaction.create(path, data)
        for bucket, epoch in grants.items():
            record = BucketRecord(
                BucketState.GRANTED.value, worker.worker_id, worker.incarnation, epoch
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
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            found = self.release(bucket, epoch)
            if found is not None:
                return found
            time.sleep(0.05)
        raise AssertionError(f"bucket {bucket} epoch {epoch} not released within {within}s")
