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

from hashq._io.amqp import close_quietly, connect_amqp
from hashq._io.management import Management
from hashq.errors import BatchPublishError
from hashq.provision import ensure_topology
from hashq.publisher import Outgoing, Publisher
from hashq.records import worker_connection_name
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


def _start_load(settings: Settings, confirmed: Path, logs: Path) -> subprocess.Popen[bytes]:
    """The chaos publisher: a key's next message only after its previous one was confirmed."""
    arguments = ["--exchange", f"hashq.{settings.app}", "--prefix", "c", "--keys", "200"]
    arguments += ["--rate", "600", "--seconds", str(LOAD_SECONDS), "--confirmed", str(confirmed)]
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
    try:
        await _sleep_until(began + KILL_RABBIT_AT)
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
    finally:
        if load.poll() is None:
            load.kill()
        for process in processes:
            process.stop()
        cluster.keep_logs(tmp_path / "servers")


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
