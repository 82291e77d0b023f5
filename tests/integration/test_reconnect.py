"""A worker that loses its AMQP connection or its ZooKeeper session, and comes back: each new
connection is announced before anything is consumed on it, so that a fence finds it, and a
ZooKeeper that flaps while the worker registers again does not end the worker."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from kazoo.exceptions import ConnectionLoss

from hashq._io.amqp import connect_amqp
from hashq._io.management import Management
from hashq.message import Message
from hashq.publisher import Outgoing
from hashq.records import RETURN_GRACE_SECONDS, Registration
from hashq.settings import Settings, WorkerSettings
from hashq.topology import Topology
from hashq.worker.machine.events import Session, SessionChanged
from hashq.worker.runtime import Worker, WorkerState
from hashq.worker.session import Membership
from hashq_coordinator.fencing.cutoff import fence
from tests.support.grants import Grants
from tests.support.helpers import close_connection_named, wait_for_connection
from tests.support.services import Endpoints
from tests.support.workers import StartWorker, check, read_appended, wait_for_executions
from tests.support.workload import publish, workload
from tools.broker_env import consumer_timeout_settings, restore_rabbit_env, set_rabbit_env
from tools.polling import eventually


def _announced_other_than(grants: Grants, connection: str) -> Callable[[], Registration | None]:
    def check() -> Registration | None:
        current = grants.workers().get("w1")
        return current if current is not None and current.connection != connection else None

    return check


async def test_a_reconnected_worker_announces_its_new_connection_and_a_fence_closes_it(
    initialized: Settings,
    grants: Grants,
    start_worker: StartWorker,
    record: Path,
    management: Management,
) -> None:
    """The fence of a reconnected worker used to look for the first connection's name (reused
    by every reconnect) and could miss the new one while the management API had not listed it.
    Now each connection has its own name, announced in the registration before it consumes."""
    start_worker("w1", HASHQ_TEST_DELAY_MS="5")
    (first,) = grants.wait_for_workers(1)
    grants.assign(first, dict.fromkeys(range(initialized.buckets), 1))
    await wait_for_connection(management, first.connection)
    messages, expected = workload(keys=100, per_key=20)
    await publish(initialized, messages)

    await close_connection_named(management, first.connection)
    second = await eventually(_announced_other_than(grants, first.connection))
    assert second.incarnation == first.incarnation
    assert (first.connection[-2:], second.connection[-2:]) == ("-1", "-2")
    await wait_for_connection(management, second.connection)

    assert await fence(management, "w1", first.incarnation) == 1  # the new connection
    third = await eventually(_announced_other_than(grants, second.connection))
    assert third.connection[-2:] == "-3"
    report = await asyncio.to_thread(wait_for_executions, record, expected, 120)
    assert (report.lost, report.reordered, report.overlaps) == ([], [], [])


async def test_a_bucket_whose_connection_died_resumes_once_its_queue_took_back(
    initialized: Settings,
    grants: Grants,
    start_worker: StartWorker,
    record: Path,
    management: Management,
) -> None:
    """With quorum bucket queues, a bucket whose connection died under it is consumed again only
    once its queue counts no consumer and has messages ready (docs/protocol.md, "Consumed again
    after a lost connection"). With a backlog that is as soon as the worker is back: well
    before the RETURN_GRACE_SECONDS that a quiet queue waits."""
    worker = start_worker("w1", HASHQ_TEST_DELAY_MS="20", HASHQ_CONCURRENCY="4")
    (first,) = grants.wait_for_workers(1)
    grants.assign(first, dict.fromkeys(range(initialized.buckets), 1))
    await wait_for_connection(management, first.connection)
    messages, expected = workload(keys=200, per_key=15)
    await publish(initialized, messages)
    await eventually(lambda: len(read_appended(record)) >= 200)
    closed = time.time()
    await close_connection_named(management, first.connection)
    assert len(read_appended(record)) < len(messages) / 2  # a backlog in every bucket
    report = await asyncio.to_thread(wait_for_executions, record, expected, 120)
    assert (report.lost, report.reordered, report.overlaps) == ([], [], [])
    resumed: dict[int, float] = {}
    for row in read_appended(record):
        if float(row["start"]) > closed + 0.05:  # nothing starts while the worker is cut off
            bucket = int(row["bucket"])
            resumed[bucket] = min(resumed.get(bucket, 1e18), float(row["start"]) - closed)
    print(f"resumed after the close: {sorted(round(s, 2) for s in resumed.values())}")
    assert len(resumed) == initialized.buckets
    assert max(resumed.values()) < RETURN_GRACE_SECONDS - 1
    assert "its queue took back what the lost connection held" in worker.output()


async def _nothing(message: Message) -> None:
    return None


async def test_a_zookeeper_blip_while_registering_again_does_not_end_the_worker(
    initialized: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session is lost, and the first attempt to register again meets a ConnectionLoss (a
    kazoo error, not a hashq one): the worker used to exit; it must try again."""
    settings = WorkerSettings(**{**initialized.model_dump(), "worker_id": "w-blip"})
    worker = Worker(settings, _nothing)
    stop = asyncio.Event()
    running = asyncio.ensure_future(worker._run(stop))
    try:
        await eventually(lambda: worker.state is WorkerState.WAITING)
        first_life = worker.machine.incarnation
        real_register = Membership.register
        attempts: list[str] = []

        async def flaky(membership: Membership, *args: Any) -> None:
            attempts.append(args[0])
            if len(attempts) == 1:
                raise ConnectionLoss()
            await real_register(membership, *args)

        monkeypatch.setattr(Membership, "register", flaky)
        worker.post(SessionChanged(Session.LOST))  # as kazoo says it: lost, then a new session
        worker.post(SessionChanged(Session.CONNECTED))
        await eventually(lambda: len(attempts) >= 2 and worker.state is WorkerState.WAITING)
        assert not running.done(), "the worker ended"
        assert worker.machine.incarnation not in ("", first_life)
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)


async def test_a_handler_thread_that_outlives_its_channel_never_runs_beside_its_redelivery(
    initialized: Settings,
    grants: Grants,
    start_worker: StartWorker,
    record: Path,
    management: Management,
) -> None:
    """A plain-function handler runs longer than the drain timeout, and the worker's connection
    is closed under it: the message goes back to the queue. The worker used to wait for the
    thread only up to the drain timeout and then subscribe again at the same epoch, so the
    redelivered copy ran beside the thread still running the first. The bucket must wait."""
    start_worker(
        "w1",
        "tests.support.handlers:slow_sync",
        HASHQ_DRAIN_TIMEOUT="1",
        HASHQ_TEST_SLOW_SECONDS="4",
    )
    (registration,) = grants.wait_for_workers(1)
    grants.assign(registration, dict.fromkeys(range(initialized.buckets), 1))
    await wait_for_connection(management, registration.connection)
    slow = Outgoing("slow-key", json.dumps({"seq": 0, "slow": True}).encode())
    after = [Outgoing("slow-key", json.dumps({"seq": n}).encode()) for n in range(1, 4)]
    await publish(initialized, [slow, *after])
    await asyncio.sleep(0.5)  # the thread is in its 4 s sleep
    await close_connection_named(management, registration.connection)
    await asyncio.to_thread(wait_for_executions, record, {"slow-key": 4}, 60)
    # Both executions of seq 0 are recorded once the thread has returned; then judge.
    runs = await eventually(lambda: _runs_of_first(record, 2), within=30)
    assert all(r["epoch"] == 1 for r in runs), runs  # the same grant: a redelivery
    report = check(record, {"slow-key": 4})
    assert (report.lost, report.reordered, report.overlaps) == ([], [], [])


def _runs_of_first(record: Path, count: int) -> list[dict[str, Any]]:
    runs = [r for r in read_appended(record) if r["seq"] == 0]
    return runs if len(runs) >= count else []


async def _send_to_queue(settings: Settings, queue: str, seq: int) -> None:
    connection = await connect_amqp(settings, "test-direct")
    async with connection:
        channel = await connection.channel()
        body = json.dumps({"seq": seq}).encode()
        await channel.default_exchange.publish(aio_pika.Message(body), routing_key=queue)


async def test_a_consumer_the_broker_cancels_is_subscribed_again(
    initialized: Settings, grants: Grants, start_worker: StartWorker, record: Path
) -> None:
    """The broker cancels a consumer (``basic.cancel``) when its queue is deleted. aiormq drops
    the frame; the lease used to look healthy while it consumed nothing, for good."""
    topology = Topology.from_settings(initialized)
    queue = topology.bucket_queue(0)
    start_worker("w1")
    (registration,) = grants.wait_for_workers(1)
    grants.assign(registration, {0: 1})
    await _send_to_queue(initialized, queue, 0)
    await asyncio.to_thread(wait_for_executions, record, {queue: 1}, 30)

    connection = await connect_amqp(initialized, "test-recreate")
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete(queue)
        # RabbitMQ 3.10 cancels the consumers of a deleted quorum queue a moment later; a queue
        # declared again at once can keep the old consumer from ever hearing of it.
        await asyncio.sleep(2)
        await channel.declare_queue(queue, durable=True, arguments=topology.bucket_arguments())
    await _send_to_queue(initialized, queue, 1)
    report = await asyncio.to_thread(wait_for_executions, record, {queue: 2}, 30)
    assert report.lost == []


@pytest.fixture
def short_consumer_timeout(endpoints: Endpoints) -> Iterator[None]:
    """RabbitMQ's consumer_timeout at 1 s (checked every 0.2 s) for the channels opened during
    the test; the broker's own values are put back after it."""
    if endpoints.rabbit_eval is None:
        pytest.skip(f"the broker from {endpoints.source} cannot be reconfigured by the tests")
    before = set_rabbit_env(endpoints.rabbit_eval, consumer_timeout_settings(1000))
    yield
    restore_rabbit_env(endpoints.rabbit_eval, before)


async def test_a_channel_closed_for_consumer_timeout_is_said_and_loses_nothing(
    initialized: Settings,
    grants: Grants,
    start_worker: StartWorker,
    record: Path,
    short_consumer_timeout: None,
) -> None:
    """A handler holds its message past the broker's consumer_timeout: RabbitMQ closes the
    bucket's channel and hands back what it held. The worker used to call that a lost channel
    and say nothing of why; it must name consumer_timeout in one ERROR line, wait for the
    handler, and go on in order."""
    worker = start_worker("w1", "tests.support.handlers:slow_sync", HASHQ_TEST_SLOW_SECONDS="3")
    (registration,) = grants.wait_for_workers(1)
    grants.assign(registration, dict.fromkeys(range(initialized.buckets), 1))
    slow = Outgoing("slow-key", json.dumps({"seq": 0, "slow": True}).encode())
    after = [Outgoing("slow-key", json.dumps({"seq": n}).encode()) for n in range(1, 4)]
    await publish(initialized, [slow, *after])
    await asyncio.to_thread(wait_for_executions, record, {"slow-key": 4}, 60)
    await eventually(lambda: _runs_of_first(record, 2), within=30)
    report = check(record, {"slow-key": 4})
    assert (report.lost, report.reordered, report.overlaps) == ([], [], [])
    said = [line for line in worker.output().splitlines() if "consumer_timeout" in line]
    assert len(said) == 1 and " ERROR " in said[0], said
