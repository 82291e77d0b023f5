"""ZooKeeper ACLs against a real ZooKeeper: coordinators and workers log in with their own
digest credentials; the system runs, and a worker's credentials cannot grant it a bucket."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import make_digest_acl_credential

from hashq.provision import ensure_topology
from hashq.records import Assignment, BucketRecord, Paths
from hashq.settings import Settings
from tests.support.workers import WorkerProcess, start_coordinator, stop_cleanly
from tools.polling import eventually

COORDINATOR = ("hashq-coordinator", "coordinator-secret")
WORKER = ("hashq-worker", "worker-secret")


def as_role(settings: Settings, role: tuple[str, str]) -> Settings:
    return settings.model_copy(
        update={
            "zk_auth": ":".join(role),
            "zk_acl_coordinators": make_digest_acl_credential(*COORDINATOR),
            "zk_acl_workers": make_digest_acl_credential(*WORKER),
        }
    )


@pytest.fixture
def worker_zk(settings: Settings) -> Iterator[KazooClient]:
    """A client logged in with the workers' credentials, as a rogue worker would be."""
    client = KazooClient(hosts=settings.zk_hosts, auth_data=[("digest", ":".join(WORKER))])
    client.start(timeout=15)
    yield client
    client.stop()
    client.close()


def granted_to(zk: KazooClient, paths: Paths, buckets: int, worker: str) -> bool:
    if not zk.exists(paths.assignment(worker)):
        return False
    records = [zk.get(paths.bucket(b))[0] for b in range(buckets) if zk.exists(paths.bucket(b))]
    owners = {BucketRecord.decode(data).owner for data in records}
    return len(records) == buckets and owners == {worker}


async def test_a_worker_cannot_grant_itself_a_bucket(
    settings: Settings, tmp_path: Path, worker_zk: KazooClient
) -> None:
    await ensure_topology(as_role(settings, COORDINATOR))  # hashq init, as an admin would
    paths = Paths(settings.app)
    coordinator = start_coordinator(
        settings, "c1", tmp_path, as_role(settings, COORDINATOR).environment()
    )
    worker = WorkerProcess(
        settings,
        "w1",
        "tests.support.handlers:record",
        tmp_path / "r.jsonl",
        tmp_path,
        as_role(settings, WORKER).environment(),
    )
    try:
        await eventually(
            lambda: asyncio.to_thread(granted_to, worker_zk, paths, settings.buckets, "w1"),
            60,
            every=0.25,
            what="the worker's buckets granted under ACLs",
        )
        forged = Assignment("forged", {0: 99}).encode()
        with pytest.raises(NoAuthError):
            worker_zk.set(paths.assignment("w1"), forged)
        with pytest.raises(NoAuthError):
            worker_zk.set(paths.bucket(0), BucketRecord().encode())
        with pytest.raises(NoAuthError):
            worker_zk.create(paths.assignment("w2"), forged)
        with pytest.raises(NoAuthError):
            worker_zk.delete(paths.leader)
        anonymous = KazooClient(hosts=settings.zk_hosts)
        anonymous.start(timeout=15)
        try:
            with pytest.raises(NoAuthError):
                anonymous.get(paths.assignment("w1"))
        finally:
            anonymous.stop()
            anonymous.close()
    finally:
        stop_cleanly(worker, coordinator)  # releasing and deregistering need the shared rights
        _remove_as_coordinator(settings)  # the anonymous clean-up of the test root may not
    assert "NoAuth" not in worker.output() + coordinator.output()


def _remove_as_coordinator(settings: Settings) -> None:
    client = KazooClient(hosts=settings.zk_hosts, auth_data=[("digest", ":".join(COORDINATOR))])
    client.start(timeout=15)
    try:
        client.delete("/hashq", recursive=True)
    finally:
        client.stop()
        client.close()
