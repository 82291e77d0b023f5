"""hashq on a three-node RabbitMQ cluster and a three-node ZooKeeper ensemble, all on loopback:
one RabbitMQ node and the ZooKeeper leader are killed with SIGKILL under load. Nothing confirmed
may be lost, each key stays in order and never runs twice at once, and every bucket goes on
being processed."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError

from hashq._io.amqp import close_quietly, connect_amqp
from hashq._io.management import Management
from hashq._io.zk import close_zk, connect_zk
from hashq.errors import BatchPublishError
from hashq.provision import ensure_topology
from hashq.publisher import Outgoing, Publisher
from hashq.records import BucketRecord, BucketState, Leadership, Paths, worker_connection_name
from hashq.settings import Settings
from hashq_coordinator.fencing.cutoff import fence
from tests.support.cluster import LocalCluster, cluster_possible
from tests.support.helpers import wait_for_connection
from tests.support.workers import Verdict, WorkerProcess, check, start_coordinator
from tools import ROOT
from tools.executions import read_appended
from tools.launcher import child_environment
from tools.polling import eventually

pytestmark = pytest.mark.skipif(
    not cluster_possible(), reason="needs the Debian rabbitmq-server and zookeeper packages"
)

LOAD_SECONDS = 40.0
KILL_RABBIT_AT = 8.0
KILL_ZOOKEEPER_AT = 14.0
PAUSE_LIMIT = 10.0  # seconds


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    # One fixed folder: a run that died without stopping its servers is cleaned up by the next.
    nodes = LocalCluster(ROOT / ".services" / "cluster")
    try:
        nodes.up()
        yield nodes
    finally:
        nodes.down()


@pytest.fixture
def settings(cluster: LocalCluster) -> Settings:
    return Settings(
        amqp_url=",".join(cluster.amqp_urls),
        management_url=",".join(cluster.management_urls),
        zk_hosts=cluster.zk_hosts,
        app="t",
        buckets=8,
        queue_type="quorum",
        zk_session_timeout=8,
        connect_timeout=5,
    )


def _start_load(
    settings: Settings, confirmed: Path, logs: Path, rate: int = 600
) -> subprocess.Popen[bytes]:
    """The chaos publisher: a key's next message only after its previous one was confirmed."""
    arguments = ["--exchange", f"hashq.{settings.app}", "--prefix", "c", "--keys", "200"]
    arguments += ["--rate", str(rate), "--seconds", str(LOAD_SECONDS)]
    arguments += ["--confirmed", str(confirmed)]
    with (logs / "publisher.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "tools.chaos.publish", *arguments],
            env=child_environment(settings),
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _expected(confirmed: Path) -> dict[str, int]:
    """Key -> number of confirmed messages (a key's confirmed seqs are 0..n-1)."""
    return dict(Counter(line["key"] for line in read_appended(confirmed)))


def _busiest_node(settings: Settings, cluster: LocalCluster) -> int:
    """The node with the publisher's connection, else the most hashq connections: killing it
    makes the publisher and the most workers reconnect elsewhere."""
    connections = Management(settings).connections()
    for connection in connections:
        if str(connection.get("user_provided_name", "")).startswith("hashq-publisher-"):
            return cluster.rabbit_index(connection["node"])
    nodes = Counter(str(c["node"]) for c in connections)
    return cluster.rabbit_index(nodes.most_common(1)[0][0])


async def test_killing_a_rabbitmq_node_and_the_zookeeper_leader_under_load(
    cluster: LocalCluster, settings: Settings, tmp_path: Path
) -> None:
    record, confirmed = tmp_path / "executions.jsonl", tmp_path / "confirmed.jsonl"
    await ensure_topology(settings)
    processes = [start_coordinator(settings, name, tmp_path) for name in ("c1", "c2")]
    processes += [
        WorkerProcess(settings, name, "tests.support.handlers:record", record, tmp_path)
        for name in ("w1", "w2")
    ]
    load = _start_load(settings, confirmed, tmp_path)
    began = time.monotonic()
    zk = await asyncio.to_thread(connect_zk, settings, "coordinator")
    try:
        await _sleep_until(began + KILL_RABBIT_AT)
        before = _records(zk, settings)
        killed_rabbit = _busiest_node(settings, cluster)
        rabbit_killed_at = time.time()
        cluster.kill_rabbit(killed_rabbit)
        await _sleep_until(began + KILL_ZOOKEEPER_AT)
        killed_zookeeper = cluster.wait_zk_leader()
        zookeeper_killed_at = time.time()
        cluster.kill_zk(killed_zookeeper)
        await asyncio.to_thread(load.wait, LOAD_SECONDS + 30)
        assert load.returncode == 0, (tmp_path / "publisher.log").read_text()[-2000:]
        # Both come back and rejoin (start_rabbit waits until every node lists it running).
        cluster.start_rabbit(killed_rabbit)
        cluster.start_zk(killed_zookeeper)

        expected = _expected(confirmed)
        report = await _wait_for_all(record, expected, within=120)
        assert report.lost == [], report.lost[:10]
        assert report.reordered == []
        assert report.overlaps == []
        _assert_every_bucket_resumed(record, settings.buckets, zookeeper_killed_at)
        _assert_publishing_went_on(confirmed, rabbit_killed_at, zookeeper_killed_at)
        _assert_no_bucket_moved_twice(before, await eventually(lambda: _records(zk, settings)))
    finally:
        _clean_up(zk, load, processes, cluster, tmp_path)


def _assert_no_bucket_moved_twice(before: list[BucketRecord], after: list[BucketRecord]) -> None:
    """A RabbitMQ node killed sends no connection.closed for what it held, and the workers
    that were on it reconnect elsewhere within the crash grace: no storm of moves (a bucket may
    move once, should a worker's session not survive the ZooKeeper leader's death)."""
    assert before, "the records were not read before the kills"
    rises = [b.epoch - a.epoch for a, b in zip(before, after, strict=True)]
    print(f"epochs risen per bucket over the kills: {rises}")
    assert max(rises) <= 1, rises


def _assert_every_bucket_resumed(record: Path, buckets: int, after: float) -> None:
    """Every bucket was processed after the kills, and none paused longer than ``PAUSE_LIMIT``
    (a generous bound: here the longest pause was about 1 s)."""
    starts: dict[int, list[float]] = defaultdict(list)
    for run in read_appended(record):
        starts[run["bucket"]].append(run["start"])
    assert {bucket for bucket, times in starts.items() if max(times) > after} == set(range(buckets))
    pauses = {bucket: _longest_pause(times) for bucket, times in starts.items()}
    print(f"longest pause of each bucket, s: {pauses}")
    assert max(pauses.values()) < PAUSE_LIMIT, pauses


def _assert_publishing_went_on(confirmed: Path, *kills: float) -> None:
    """Confirms went on through the surviving nodes: after each kill, and without a pause as
    long as the confirm timeout (a send stuck on the dead connection would cause one)."""
    times = [line["at"] for line in read_appended(confirmed)]
    for killed_at in kills:
        assert any(at > killed_at + 3 for at in times), "no publish confirmed after a kill"
    print(f"longest pause between confirms: {_longest_pause(times):.2f} s")
    assert _longest_pause(times) < PAUSE_LIMIT


def _longest_pause(times: list[float]) -> float:
    ordered = sorted(times)
    return max((b - a for a, b in pairwise(ordered)), default=0.0)


async def _wait_for_all(record: Path, expected: dict[str, int], within: float) -> Verdict:
    return await eventually(
        lambda: check(record, expected), within, every=0.5, until=lambda v: not v.lost, or_last=True
    )


async def _sleep_until(moment: float) -> None:
    await asyncio.sleep(max(0.0, moment - time.monotonic()))


async def test_fencing_closes_a_connection_through_another_nodes_management_api(
    cluster: LocalCluster, settings: Settings
) -> None:
    """The coordinator's fence reaches a worker's connection on any node, through whichever
    node's API answers."""
    name = worker_connection_name("w-fenced", "incarnation1")
    on_first = settings.model_copy(update={"amqp_url": cluster.amqp_urls[0]})
    connection = await connect_amqp(on_first, name)
    closed = asyncio.Event()
    connection.close_callbacks.add(lambda *_: closed.set())
    try:
        third = Management(
            settings.model_copy(update={"management_url": cluster.management_urls[-1]})
        )
        await wait_for_connection(third, name)
        assert await fence(third, "w-fenced", "incarnation1") == 1
        await asyncio.wait_for(closed.wait(), timeout=10)
    finally:
        await close_quietly(connection)


async def test_a_publisher_whose_node_died_with_the_queue_leaders_publishes_again(
    cluster: LocalCluster, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The publisher reconnects at once to a surviving node, before the queues have new
    leaders. RabbitMQ 3.10 nacks every publish on a channel opened then, for as long as it
    lives: the publisher must move to a fresh channel, not go on being refused."""
    doomed = 0
    on_doomed = settings.model_copy(update={"amqp_url": cluster.amqp_urls[doomed], "app": "lead"})
    await ensure_topology(on_doomed)  # the declaring node leads the bucket queues
    monkeypatch.setattr(random, "randrange", lambda n: 0)  # connect to the doomed node first
    two_nodes = on_doomed.model_copy(
        update={"amqp_url": f"{cluster.amqp_urls[doomed]},{cluster.amqp_urls[1]}"}
    )
    batch = [Outgoing(f"k{n}", b"{}") for n in range(100)]
    async with Publisher(two_nodes) as publisher:
        await publisher.publish_many(batch)
        cluster.kill_rabbit(doomed)
        killed_at = time.monotonic()
        try:
            while True:
                try:
                    await publisher.publish_many(batch)
                    break
                except BatchPublishError:
                    assert time.monotonic() - killed_at < PAUSE_LIMIT, "still refused"
                    await asyncio.sleep(0.05)
            print(f"confirmed again {time.monotonic() - killed_at:.1f} s after the kill")
        finally:
            cluster.start_rabbit(doomed)


async def test_a_rabbitmq_node_killed_during_a_handover(
    cluster: LocalCluster, settings: Settings, tmp_path: Path
) -> None:
    """w2 joins while w1 holds every bucket; as soon as a bucket is being revoked from w1 (it
    drains: its handlers take up to 0.4 s), the RabbitMQ node of w1's connection is killed. The
    drain is cut short: what w1 held goes back to the queues, w1 connects to another node, and
    the handover ends by a release or a fence. Nothing lost, in order, never two at once, and
    both workers end up with buckets."""
    settings = settings.model_copy(update={"app": "handover"})  # none of another test's nodes
    record, confirmed = tmp_path / "executions.jsonl", tmp_path / "confirmed.jsonl"
    await ensure_topology(settings)
    slow = {"HASHQ_TEST_DELAY_MS": "400", "HASHQ_DRAIN_TIMEOUT": "10"}
    processes = [start_coordinator(settings, name, tmp_path) for name in ("c1", "c2")]
    processes.append(WorkerProcess(settings, "w1", HANDLER, record, tmp_path, slow))
    load = _start_load(settings, confirmed, tmp_path, rate=150)
    zk = connect_zk(settings, "coordinator")
    try:
        await eventually(lambda: _owners(zk, settings) == {"w1"}, within=30)
        node = await eventually(  # node 0 is an answer too, though not a true one
            lambda: _node_of(settings, cluster, "hashq-worker-w1-"),
            15,
            until=lambda index: index is not None,
            what="w1's connection in the management API",
        )
        processes.append(WorkerProcess(settings, "w2", HANDLER, record, tmp_path, slow))
        await eventually(lambda: _revoking_from(zk, settings, "w1"), within=30, every=0.02)
        killed_at = time.time()
        cluster.kill_rabbit(node)
        await eventually(lambda: _owners(zk, settings) == {"w1", "w2"}, within=60)
        await asyncio.to_thread(load.wait, LOAD_SECONDS + 30)
        cluster.start_rabbit(node)
        await _judge(record, confirmed, settings.buckets, killed_at)
    finally:
        _clean_up(zk, load, processes, cluster, tmp_path)


async def test_a_rabbitmq_node_shut_down_cleanly_moves_no_bucket(
    cluster: LocalCluster, settings: Settings, tmp_path: Path
) -> None:
    """A node shut down cleanly closes its connections, and the broker announces each close:
    the leader suspects the worker that was on it, and asks after the crash grace whether it
    holds its liveness queue again. It has reconnected to another node by then, so it is not
    expelled, and no bucket moves (expelling it anyway moved every bucket). The coordinators
    use the other two nodes: the leader must hear the closes (its own connection to the node
    would go too)."""
    settings = settings.model_copy(update={"app": "clean"})  # none of another test's nodes
    record, confirmed = tmp_path / "executions.jsonl", tmp_path / "confirmed.jsonl"
    await ensure_topology(settings)
    processes = [WorkerProcess(settings, w, HANDLER, record, tmp_path) for w in ("w1", "w2")]
    load = _start_load(settings, confirmed, tmp_path)
    zk = connect_zk(settings, "coordinator")
    try:
        node = await eventually(
            lambda: _node_of(settings, cluster, "hashq-worker-w1-"),
            15,
            until=lambda index: index is not None,
            what="w1's connection in the management API",
        )
        elsewhere = _without_node(settings, cluster, node)
        processes += [start_coordinator(elsewhere, name, tmp_path) for name in ("c1", "c2")]
        before = await eventually(  # settled: each worker owns its share, nothing moving
            lambda: _records(zk, settings),
            within=30,
            until=lambda records: (
                {r.owner for r in records} == {"w1", "w2"}
                and all(r.state is BucketState.GRANTED for r in records)
            ),
        )
        stopped_at = time.time()
        await asyncio.to_thread(cluster.stop_rabbit, node)
        await asyncio.to_thread(load.wait, LOAD_SECONDS + 30)
        after = _records(zk, settings)
        await asyncio.to_thread(cluster.start_rabbit, node)
        await _judge(record, confirmed, settings.buckets, stopped_at)
        assert [b.epoch for b in after] == [b.epoch for b in before]
        heard = (tmp_path / "c1.log").read_text() + (tmp_path / "c2.log").read_text()
        assert "RabbitMQ says hashq-worker-w1-" in heard  # the closes were heard, and forgiven
    finally:
        _clean_up(zk, load, processes, cluster, tmp_path)


async def test_the_zookeeper_leader_killed_while_a_coordinator_campaigns(
    cluster: LocalCluster, settings: Settings, tmp_path: Path
) -> None:
    """The leading coordinator is killed; the moment its election node goes (its session
    expired) and the other coordinator takes the lock, the ZooKeeper leader is killed too. The
    campaign must end with exactly one leader at a higher leader epoch, which goes on deciding
    (a worker that joins afterwards gets buckets), and the workers lose nothing meanwhile."""
    settings = settings.model_copy(update={"app": "campaign"})  # none of another test's nodes
    record, confirmed = tmp_path / "executions.jsonl", tmp_path / "confirmed.jsonl"
    await ensure_topology(settings)
    coordinators = {name: start_coordinator(settings, name, tmp_path) for name in ("c1", "c2")}
    workers = [WorkerProcess(settings, n, HANDLER, record, tmp_path) for n in ("w1", "w2")]
    load = _start_load(settings, confirmed, tmp_path, rate=300)
    zk = connect_zk(settings, "coordinator")
    paths = Paths(settings.app)
    try:
        first = await eventually(lambda: _leadership(zk, paths), within=30)
        await eventually(lambda: len(zk.get_children(paths.election)) == 2, within=30)
        # The lock is held by the lowest sequence number: the leader's node.
        holder = min(zk.get_children(paths.election), key=lambda name: name[-10:])
        coordinators[first.leader].kill()
        await eventually(lambda: holder not in zk.get_children(paths.election), 60, every=0.02)
        zookeeper = cluster.wait_zk_leader()
        killed_at = time.time()
        cluster.kill_zk(zookeeper)
        (standby,) = set(coordinators) - {first.leader}
        after = await eventually(
            lambda: _leadership(zk, paths, newer_than=first), within=60, every=0.2
        )
        assert after.leader == standby and after.epoch > first.epoch, (first, after)
        workers.append(WorkerProcess(settings, "w3", HANDLER, record, tmp_path))
        await eventually(lambda: "w3" in _owners(zk, settings), within=60)
        await asyncio.to_thread(load.wait, LOAD_SECONDS + 30)
        cluster.start_zk(zookeeper)
        await _judge(record, confirmed, settings.buckets, killed_at)
    finally:
        _clean_up(zk, load, [*coordinators.values(), *workers], cluster, tmp_path)


HANDLER = "tests.support.handlers:record"


def _records(zk: KazooClient, settings: Settings) -> list[BucketRecord]:
    """Every bucket's record; none while ZooKeeper does not answer."""
    paths = Paths(settings.app)
    try:
        return [BucketRecord.decode(zk.get(paths.bucket(b))[0]) for b in range(settings.buckets)]
    except (NoNodeError, KazooException):
        return []


def _owners(zk: KazooClient, settings: Settings) -> set[str]:
    """The workers that own a bucket now (granted or moving away)."""
    return {record.owner for record in _records(zk, settings) if record.owner}


def _revoking_from(zk: KazooClient, settings: Settings, worker: str) -> bool:
    return any(
        record.state is BucketState.REVOKING and record.owner == worker
        for record in _records(zk, settings)
    )


def _leadership(
    zk: KazooClient, paths: Paths, newer_than: Leadership | None = None
) -> Leadership | None:
    """The leader record, once there is one (newer than ``newer_than``); None until then, and
    while ZooKeeper does not answer."""
    try:
        found = Leadership.decode(zk.get(paths.leader)[0])
    except (NoNodeError, KazooException):
        return None
    return found if newer_than is None or found.epoch > newer_than.epoch else None


def _node_of(settings: Settings, cluster: LocalCluster, prefix: str) -> int | None:
    """The RabbitMQ node of a connection whose name starts with ``prefix``, once the
    management API lists one."""
    for connection in Management(settings).connections():
        if str(connection.get("user_provided_name", "")).startswith(prefix):
            return cluster.rabbit_index(connection["node"])
    return None


def _without_node(settings: Settings, cluster: LocalCluster, node: int) -> Settings:
    others = [i for i in range(cluster.size) if i != node]
    return settings.model_copy(
        update={
            "amqp_url": ",".join(cluster.amqp_urls[i] for i in others),
            "management_url": ",".join(cluster.management_urls[i] for i in others),
        }
    )


async def _judge(record: Path, confirmed: Path, buckets: int, killed_at: float) -> None:
    """Nothing lost, in order, never two at once, and every bucket went on after the kill."""
    report = await _wait_for_all(record, _expected(confirmed), within=120)
    assert (report.lost, report.reordered, report.overlaps) == ([], [], []), report
    _assert_every_bucket_resumed(record, buckets, killed_at)


def _clean_up(
    zk: KazooClient,
    load: subprocess.Popen[bytes],
    processes: list[WorkerProcess],
    cluster: LocalCluster,
    tmp_path: Path,
) -> None:
    close_zk(zk)
    if load.poll() is None:
        load.kill()
    for process in processes:
        process.stop()
    cluster.keep_logs(tmp_path / "servers")
