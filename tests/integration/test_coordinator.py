"""hashq-coordinator with real workers, RabbitMQ and ZooKeeper: processes started, stopped and
killed for real."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from hashq.errors import Deposed
from hashq.publisher import Outgoing
from hashq.records import (
    PROTOCOL_VERSION,
    RETURN_GRACE_SECONDS,
    Assignment,
    BucketRecord,
    BucketState,
    Leadership,
    Paths,
    Registration,
)
from hashq.settings import Settings
from hashq_coordinator.store import Store
from tests.support.grants import Grants
from tests.support.helpers import hashq, open_zk
from tests.support.services import Endpoints
from tests.support.workers import (
    SESSION,
    WorkerProcess,
    kill_and_time_failover,
    read_appended,
    two_busy_workers,
    wait_for_executions,
)
from tests.support.workload import publish, workload
from tools.polling import eventually


class Auditor:
    """Polls the assignments and bucket records every 20 ms, in a thread, and remembers any
    moment a bucket was in two assignments or an epoch went backwards."""

    def __init__(self, settings: Settings) -> None:
        self.zk: KazooClient = open_zk(settings.zk_hosts)
        self.paths = Paths(settings.app)
        self.buckets = settings.buckets
        self.double: list[str] = []
        self.backwards: list[str] = []
        self.looks = 0  # complete looks: a run that never managed one proves nothing
        self._epochs: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._look()
            time.sleep(0.02)

    def _look(self) -> None:
        holders: dict[int, str] = {}
        try:
            for worker in self.zk.get_children(self.paths.assignments):
                data = self.zk.get(self.paths.assignment(worker))[0]
                for bucket in Assignment.decode(data).grants:
                    if bucket in holders:
                        self.double.append(f"bucket {bucket}: {holders[bucket]} and {worker}")
                    holders[bucket] = worker
            for bucket in range(self.buckets):
                if self.zk.exists(self.paths.bucket(bucket)):
                    epoch = BucketRecord.decode(self.zk.get(self.paths.bucket(bucket))[0]).epoch
                    if epoch < self._epochs.get(bucket, 0):
                        self.backwards.append(f"bucket {bucket}: {self._epochs[bucket]} -> {epoch}")
                    self._epochs[bucket] = epoch
        except NoNodeError:  # an assignment removed between listing and reading it
            return
        self.looks += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.zk.stop()
        self.zk.close()


async def test_a_worker_joining_under_load(
    initialized: Settings, cluster: Callable[..., WorkerProcess], record: Path, zk_view: Grants
) -> None:
    cluster("c1")
    cluster("w1", HASHQ_TEST_DELAY_MS="6")
    cluster("w2", HASHQ_TEST_DELAY_MS="6")
    await eventually(lambda: zk_view.all_granted(initialized.buckets, {"w1", "w2"}))
    messages, expected = workload(keys=400, per_key=30)
    await publish(initialized, messages)
    await eventually(lambda: len(read_appended(record)) > 2_000)

    before = zk_view.records(initialized.buckets)
    joined_at = time.time()
    cluster("w3", HASHQ_TEST_DELAY_MS="6")
    await eventually(lambda: zk_view.all_granted(initialized.buckets, {"w1", "w2", "w3"}))
    after = zk_view.records(initialized.buckets)

    report = await asyncio.to_thread(wait_for_executions, record, expected, 120)
    assert (report.lost, report.reordered, report.overlaps, report.repeats) == (
        [],
        [],
        [],
        [],
    )
    moved = {b for b in after if after[b].owner != before[b].owner}
    assert len([b for b in after.values() if b.owner == "w3"]) in (2, 3)
    assert all(after[b].epoch == before[b].epoch + 1 for b in moved)
    unmoved = set(after) - moved
    assert all(after[b].epoch == before[b].epoch for b in unmoved), "an unmoved bucket was paused"
    # Unmoved buckets kept flowing through the handover: no pause longer than 0.5 s.
    for bucket in unmoved:
        starts = sorted(
            float(r["start"])
            for r in read_appended(record)
            if r["bucket"] == bucket and joined_at - 1 < float(r["start"]) < joined_at + 3
        )
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        assert starts and max(gaps, default=0) < 0.5, (bucket, max(gaps, default=0))


async def test_kill_9_worker_resumes_elsewhere_within_session_and_return_grace_plus_2s(
    initialized: Settings, cluster: Callable[..., WorkerProcess], record: Path, zk_view: Grants
) -> None:
    doomed, expected = await two_busy_workers(initialized, cluster, record, zk_view, 400, 2_000)
    slowest = await kill_and_time_failover(initialized, doomed, record, expected, zk_view)
    print(f"kill -9: buckets resumed after at most {slowest:.2f}s (session {SESSION}s)")
    # A grant after a fence waits for the bucket queue's word that the returns are in, or
    # RETURN_GRACE_SECONDS without it (docs/protocol.md, "Returns take time"); with the
    # broker answering, the word usually comes first, so only the upper bound is fixed.
    assert 0 < slowest < float(SESSION) + RETURN_GRACE_SECONDS + 2


async def test_zombie_is_fenced_and_processes_nothing_more(
    initialized: Settings, cluster: Callable[..., WorkerProcess], record: Path, zk_view: Grants
) -> None:
    zombie, expected = await two_busy_workers(initialized, cluster, record, zk_view, 300, 1_500)

    held = {b: r.epoch for b, r in zk_view.records(initialized.buckets).items() if r.owner == "w1"}
    stopped_at = zombie.stop_process()
    # Its buckets granted elsewhere at a higher epoch: only after its connection was cut off.
    await eventually(lambda: _all_moved(zk_view, held, "w1", initialized.buckets), within=30)
    zombie.signal(signal.SIGCONT)

    report = await asyncio.to_thread(wait_for_executions, record, expected, 120)
    assert report.bugs == []  # nothing lost or reordered, no overlap but a fenced zombie's
    # A handler the zombie had begun before it froze finishes when it thaws, perhaps beside its
    # message's redelivery elsewhere: a lower epoch, which the fencing token covers. No other
    # overlap is allowed.
    assert _overlaps_but_the_frozen(read_appended(record), "w1", stopped_at) == []
    moved_on = [
        r
        for r in read_appended(record)
        if r["worker"] == "w2" and r["epoch"] > held.get(r["bucket"], 99)
    ]
    assert moved_on, "w1's buckets never moved: it had finished before it was stopped"
    # After it comes back it registers afresh and may be granted buckets again, at new epochs;
    # under its old grants it must start nothing.
    late = [
        r
        for r in read_appended(record)
        if r["worker"] == "w1" and r["start"] > stopped_at and held.get(r["bucket"]) == r["epoch"]
    ]
    assert late == [], "the fenced worker went on processing its old buckets"


def _overlaps_but_the_frozen(
    runs: list[dict[str, Any]], frozen: str, stopped_at: float
) -> list[tuple[str, int, int]]:
    """Pairs of runs of one key that overlap in time, except where one of them is a run of the
    ``frozen`` worker begun before it was stopped, at a lower epoch than the other."""
    by_key: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        if run["outcome"] == "ok":
            by_key.setdefault(run["key"], []).append(run)

    def excused(zombie: dict[str, Any], other: dict[str, Any]) -> bool:
        began_frozen = zombie["worker"] == frozen and zombie["start"] < stopped_at
        return began_frozen and bool(zombie["epoch"] < other["epoch"])

    found = []
    for key, key_runs in by_key.items():
        for first, second in itertools.combinations(key_runs, 2):
            overlap = first["start"] < second["end"] and second["start"] < first["end"]
            if overlap and not (excused(first, second) or excused(second, first)):
                found.append((key, first["seq"], second["seq"]))
    return found


async def test_leader_killed_mid_handover_a_standby_finishes_it(
    initialized: Settings, cluster: Callable[..., WorkerProcess], record: Path, zk_view: Grants
) -> None:
    leader = cluster("c1")
    await eventually(lambda: _leader(zk_view) == "c1", within=30)
    cluster("c2")  # the standby
    slow = {"HASHQ_TEST_DELAY_MS": "1500"}  # drains take seconds: the handover is slow
    cluster("w1", **slow)
    cluster("w2", **slow)
    await eventually(lambda: zk_view.all_granted(initialized.buckets, {"w1", "w2"}))
    messages, expected = workload(keys=60, per_key=10)
    await publish(initialized, messages)
    await asyncio.sleep(1.0)

    auditor = Auditor(initialized)
    try:
        cluster("w3", **slow)
        await eventually(
            lambda: any(
                r.state is BucketState.REVOKING
                for r in zk_view.records(initialized.buckets).values()
            ),
            within=30,
        )
        leader.kill()
        after_kill = zk_view.records(initialized.buckets)
        await eventually(lambda: _leader(zk_view) == "c2", within=30)
        await eventually(
            lambda: zk_view.all_granted(initialized.buckets, {"w1", "w2", "w3"}), within=60
        )
        report = await asyncio.to_thread(wait_for_executions, record, expected, 120)
    finally:
        auditor.close()
    # Buckets still revoking once the leader was dead can only have been granted by the standby.
    left_half_done = {b: r for b, r in after_kill.items() if r.state is BucketState.REVOKING}
    assert left_half_done, "every handover ended before the kill: nothing was tested"
    final = zk_view.records(initialized.buckets)
    for bucket, moving in left_half_done.items():
        assert final[bucket].state is BucketState.GRANTED and final[bucket].epoch > moving.epoch, (
            bucket
        )
    assert auditor.looks > 10, "the auditor never read the state"
    assert auditor.double == [], "a bucket was granted to two workers at once"
    assert auditor.backwards == [], "an epoch went backwards"
    assert (report.lost, report.reordered, report.overlaps) == ([], [], [])


def _all_moved(view: Grants, held: dict[int, int], old_owner: str, buckets: int) -> bool:
    now = view.records(buckets)
    return all(
        now[b].state is BucketState.GRANTED and now[b].owner != old_owner and now[b].epoch > epoch
        for b, epoch in held.items()
    )


def _leader(view: Grants) -> str:
    try:
        return Leadership.decode(view.zk.get(view.paths.leader)[0]).leader
    except NoNodeError:  # nobody has led yet
        return ""


def test_a_coordinator_whose_session_expired_cannot_write(initialized: Settings) -> None:
    first = open_zk(initialized.zk_hosts)
    store = Store(first, Paths(initialized.app), initialized.buckets)
    _, version = store.claim("old")
    record = {0: BucketRecord(BucketState.UNASSIGNED, None, None, 7)}
    store.commit(version, record, [], {}, [], [], [])  # while it leads, it may write

    # A newer leader raises the leader epoch: the old one's writes are refused.
    second = open_zk(initialized.zk_hosts)
    Store(second, Paths(initialized.app), initialized.buckets).claim("new")
    with pytest.raises(Deposed):
        store.commit(
            version, {0: BucketRecord(BucketState.UNASSIGNED, None, None, 8)}, [0], {}, [], [], []
        )

    # Expire the old leader's session (a second client on the same session closes it).
    _, version = store.claim("old")
    session_id, password = first.client_id
    twin = KazooClient(hosts=initialized.zk_hosts, client_id=(session_id, password))
    twin.start(timeout=15)
    twin.stop()
    twin.close()
    time.sleep(0.5)
    with pytest.raises(Deposed):
        store.commit(
            version, {0: BucketRecord(BucketState.UNASSIGNED, None, None, 9)}, [0], {}, [], [], []
        )
    data = second.get(Paths(initialized.app).bucket(0))[0]
    assert BucketRecord.decode(data).epoch == 7
    for client in (first, second):
        client.stop()
        client.close()


async def test_status_shows_leader_workers_and_owners(
    initialized: Settings, cluster: Callable[..., WorkerProcess], zk_view: Grants
) -> None:
    cluster("c1")
    cluster("w1")
    cluster("w2")
    await eventually(lambda: zk_view.all_granted(initialized.buckets, {"w1", "w2"}))
    done = hashq(initialized, "status", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["leader"]["leader"] == "c1"
    assert sorted(report["workers"]) == ["w1", "w2"]
    assert sorted(len(w["buckets"]) for w in report["workers"].values()) == [4, 4]
    assert report["handover_in_progress"] is False
    assert {b["state"] for b in report["buckets"]} == {"granted"}
    assert all(b["epoch"] >= 1 and b["owner"] in ("w1", "w2") for b in report["buckets"])
    assert all(b["consumers"] == 1 for b in report["buckets"])
    table = hashq(initialized, "status").stdout
    assert "leader: c1" in table and "handover in progress: no" in table


async def test_a_worker_that_does_not_release_in_its_drain_timeout_is_fenced_and_named(
    initialized: Settings, cluster: Callable[..., WorkerProcess], record: Path, zk_view: Grants
) -> None:
    """The coordinator gives a revoked worker the drain timeout the worker registered plus the
    grace, but at least the session timeout it registered, not the coordinator's own 60 s. One
    frozen before it could drain is fenced within that (its session, 4 s, runs out first: a
    worker cut off never starts a message after the fence), and its buckets go on elsewhere."""
    coordinator = cluster("c1", HASHQ_DRAIN_TIMEOUT="60", HASHQ_FENCE_GRACE="0.5")
    quick = {"HASHQ_DRAIN_TIMEOUT": "1", "HASHQ_ZK_SESSION_TIMEOUT": "4"}
    frozen = cluster("w1", **quick)
    await eventually(lambda: zk_view.all_granted(initialized.buckets, {"w1"}))
    messages, expected = workload(keys=40, per_key=5)
    await publish(initialized, messages)
    cluster("w2", **quick)
    frozen.stop_process()  # before it sees the revoke: it neither drains nor releases
    try:
        await eventually(lambda: "fenced worker w1" in coordinator.output(), within=30)
        assert "within 60s" not in coordinator.output()
    finally:
        frozen.signal(signal.SIGCONT)
    report = await asyncio.to_thread(wait_for_executions, record, expected, 60)
    assert report.bugs == []  # nothing lost or reordered, no overlap but a fenced zombie's


async def test_processing_goes_on_after_a_zookeeper_restart(
    initialized: Settings,
    endpoints: Endpoints,
    cluster: Callable[..., WorkerProcess],
    record: Path,
    zk_view: Grants,
) -> None:
    if endpoints.stop is None or endpoints.start is None:
        pytest.skip(f"servers from {endpoints.source} cannot be restarted by the tests")
    cluster("c1")
    cluster("w1")
    cluster("w2")
    await eventually(lambda: zk_view.all_granted(initialized.buckets, {"w1", "w2"}))
    first, expected_first = workload(keys=100, per_key=5, seed=1)
    await publish(initialized, first)
    await asyncio.to_thread(wait_for_executions, record, expected_first, 60)

    # Down for several seconds: longer than any bounded reconnect policy would wait.
    await asyncio.to_thread(endpoints.stop, "zookeeper")
    await asyncio.sleep(6)
    await asyncio.to_thread(endpoints.start, "zookeeper")
    await asyncio.sleep(3 * float(SESSION))
    second = [
        Outgoing(m.key, json.dumps({"seq": 5 + json.loads(m.body)["seq"]}).encode())
        for m in workload(keys=100, per_key=5, seed=2)[0]
    ]
    await publish(initialized, second)
    expected = dict.fromkeys(expected_first, 10)
    report = await asyncio.to_thread(wait_for_executions, record, expected, 90)
    assert (report.lost, report.reordered, report.overlaps) == ([], [], [])


async def test_a_worker_of_a_newer_protocol_gets_no_bucket(
    initialized: Settings, cluster: Callable[..., WorkerProcess], zk_view: Grants
) -> None:
    future = Registration("w9", "i9", capacity=1, version=PROTOCOL_VERSION + 1)
    zk_view.zk.create(zk_view.paths.worker("w9"), future.encode(), ephemeral=True, makepath=True)
    coordinator = cluster("c1")
    cluster("w1")
    await eventually(lambda: zk_view.all_granted(initialized.buckets, {"w1"}))
    await asyncio.sleep(2)  # several more leader steps
    assert {r.owner for r in zk_view.records(initialized.buckets).values()} == {"w1"}
    assert f"worker w9 speaks protocol version {PROTOCOL_VERSION + 1}" in coordinator.output()
