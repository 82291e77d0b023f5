"""Crash detection from the broker's word (RabbitMQ's event exchange), with real servers and real
processes: a worker killed with -9 loses its buckets long before its ZooKeeper session could
expire; a worker whose connection is closed under it and that comes back keeps them."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hashq._io.amqp import connect_amqp, connect_named
from hashq._io.management import Management
from hashq.errors import WorkerReturned
from hashq.records import (
    BROKER_CONTACT_SECONDS,
    RETURN_GRACE_SECONDS,
    BucketRecord,
    BucketState,
    Paths,
    Registration,
    worker_connection_name,
    worker_connection_names,
)
from hashq.settings import Settings
from hashq_coordinator.crashes import RETRY_SECONDS, CrashFeed, FeedState
from hashq_coordinator.fencing.cutoff import close_connection
from hashq_coordinator.machine import events as cm
from hashq_coordinator.settings import CoordinatorSettings
from hashq_coordinator.store import Store
from tests.support.grants import Grants
from tests.support.helpers import open_zk
from tests.support.workers import (
    WorkerProcess,
    kill_and_time_failover,
    two_busy_workers,
    wait_for_executions,
)
from tools.polling import eventually

LONG_SESSION = 20.0  # the workers' ZooKeeper session: far longer than the failover may take
CRASH_GRACE = 0.5  # the coordinator's default


async def test_kill_9_moves_the_buckets_long_before_the_session_expires(
    initialized: Settings, cluster: Callable[..., WorkerProcess], record: Path, zk_view: Grants
) -> None:
    session = {"HASHQ_ZK_SESSION_TIMEOUT": f"{LONG_SESSION:g}"}
    doomed, expected = await two_busy_workers(
        initialized, cluster, record, zk_view, 300, 1_500, **session
    )
    slowest = await kill_and_time_failover(initialized, doomed, record, expected, zk_view)
    print(f"kill -9, {LONG_SESSION:g}s sessions: buckets resumed after at most {slowest:.2f}s")
    # The crash grace, which covers the bound on the dead worker's starts counted from the
    # broker's word of the close, once each bucket queue said it took everything back (quorum
    # queues); never the return grace (at least 5.5 s after the kill), nor the session.
    assert max(CRASH_GRACE, BROKER_CONTACT_SECONDS) <= slowest < RETURN_GRACE_SECONDS


async def test_a_worker_whose_connection_is_closed_and_comes_back_keeps_its_buckets(
    initialized: Settings, cluster: Callable[..., WorkerProcess], record: Path, zk_view: Grants
) -> None:
    """A RabbitMQ node going, a reset link: the broker closes a live worker's connection, the
    worker reconnects within the crash grace, and nothing moves (no epoch changes)."""
    _, expected = await two_busy_workers(initialized, cluster, record, zk_view, 200, 1_000)
    before = zk_view.records(initialized.buckets)
    w1 = zk_view.workers()["w1"]
    management = Management(initialized)

    def listed() -> str | None:
        for connection in management.connections():
            if connection.get("user_provided_name") == w1.connection:
                return str(connection["name"])
        return None

    name = await eventually(lambda: asyncio.to_thread(listed), within=15)
    await asyncio.to_thread(close_connection, management, name, "test: a reset")
    await eventually(lambda: zk_view.workers()["w1"].connection != w1.connection, within=10)
    await asyncio.sleep(3 * CRASH_GRACE)
    report = await asyncio.to_thread(wait_for_executions, record, expected, 120)
    assert (report.lost, report.reordered, report.overlaps) == ([], [], [])
    assert zk_view.workers()["w1"].incarnation == w1.incarnation  # not expelled
    assert zk_view.records(initialized.buckets) == before  # no bucket moved


def test_an_expulsion_of_a_worker_that_came_back_writes_nothing(initialized: Settings) -> None:
    """The commit that expels a crashed worker checks the version of its registration read
    before the broker was asked: a worker that announced a new connection since (so it lives)
    makes the whole commit fail, and the leader stays leader."""
    paths = Paths(initialized.app)
    zk = open_zk(initialized.zk_hosts)
    try:
        store = Store(zk, paths, initialized.buckets)
        _, leader_version = store.claim("c")
        node = paths.worker("w9")
        zk.create(node, Registration("w9", "i1", 1, connection="a-1").encode(), ephemeral=True)
        read = zk.get(node)[1].version
        zk.set(node, Registration("w9", "i1", 1, connection="a-2").encode())  # it came back
        grant = {0: BucketRecord(BucketState.FENCING, "w9", "i1", 3)}
        with pytest.raises(WorkerReturned):
            store.commit(leader_version, grant, [], {}, [], [], [], {"w9": read})
        assert zk.exists(node) and not zk.exists(paths.bucket(0))
        store.commit(leader_version, grant, [], {}, [], [], [], {"w9": read + 1})
        assert not zk.exists(node) and zk.exists(paths.bucket(0))
    finally:
        zk.stop()
        zk.close()


async def test_a_worker_whose_registration_is_deleted_under_it_starts_a_new_life(
    initialized: Settings, cluster: Callable[..., WorkerProcess], record: Path, zk_view: Grants
) -> None:
    """An expulsion the worker did not cause (the broker's word was wrong, say: a partitioned
    node dropped its queue): the watch on its own registration tells it at once, and it cuts
    everything off and registers a new incarnation instead of consuming at the old grants."""
    _, expected = await two_busy_workers(initialized, cluster, record, zk_view, 100, 500)
    old = zk_view.workers()["w1"]
    zk = open_zk(initialized.zk_hosts)
    try:
        zk.delete(Paths(initialized.app).worker("w1"))
    finally:
        zk.stop()
        zk.close()
    renewed = await eventually(
        lambda: (w := zk_view.workers().get("w1")) and w.incarnation != old.incarnation, within=10
    )
    assert renewed
    report = await asyncio.to_thread(wait_for_executions, record, expected, 120)
    assert (report.lost, report.reordered, report.overlaps) == ([], [], [])


async def test_the_crash_feed_says_once_when_it_cannot_listen(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """Listening in the plugin's vhost it hears a closed connection of a worker's name; pointed
    at a vhost it cannot use it says so once, at ERROR, and is not listening (the metric's 0)."""
    heard: list[cm.ConnectionClosed] = []
    good = CrashFeed(CoordinatorSettings(**_shared(settings)), heard.append)
    bad = CrashFeed(
        CoordinatorSettings(**_shared(settings), events_vhost="hashq-no-such-vhost"),
        heard.append,
    )
    tasks = [asyncio.ensure_future(feed.run()) for feed in (good, bad)]
    try:
        await eventually(lambda: good.listening, within=10)
        name = worker_connection_name("w7", "c0ffee00", 3)
        named = await connect_amqp(settings, name)
        await named.close()
        closed = cm.ConnectionClosed(("w7", "c0ffee00"), name)
        await eventually(lambda: closed in heard, within=5)
        await asyncio.sleep(2 * RETRY_SECONDS)  # retries meanwhile: still one line
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert not bad.listening and bad.state is FeedState.DISCONNECTED
    errors = [r for r in caplog.records if r.levelname == "ERROR" and "crash detection" in r.msg]
    assert len(errors) == 1, [r.getMessage() for r in errors]


async def test_a_failed_attempt_on_one_node_is_reported_closed_under_a_name_never_used_again(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node that refuses an attempt after the handshake began (here: a vhost it does not
    have) still reports a connection of that name closed. The worker's next attempt, on the
    next node, takes a new name: were it the same, the leader would count the live connection's
    broker contact from that report, the failed attempt's (a grant too early after a fence)."""
    heard: list[cm.ConnectionClosed] = []
    feed = CrashFeed(CoordinatorSettings(**_shared(settings)), heard.append)
    listening = asyncio.ensure_future(feed.run())
    refusing = settings.amqp_url.rsplit("/", 1)[0] + "/hashq-no-such-vhost"
    two_nodes = settings.model_copy(update={"amqp_url": f"{refusing},{settings.amqp_url}"})
    monkeypatch.setattr(random, "randrange", lambda n: 0)  # the refusing node is tried first
    try:
        await eventually(lambda: feed.listening, within=10)
        names = worker_connection_names("w7", "c0ffee01")
        connection, name = await connect_named(two_nodes, names)
        failed = cm.ConnectionClosed(("w7", "c0ffee01"), worker_connection_name("w7", "c0ffee01"))
        await eventually(lambda: failed in heard, within=5)
        assert name == worker_connection_name("w7", "c0ffee01", 2) and not connection.is_closed
        await connection.close()
        await eventually(lambda: cm.ConnectionClosed(("w7", "c0ffee01"), name) in heard, within=5)
    finally:
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)


def _shared(settings: Settings) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in Settings.model_fields}
