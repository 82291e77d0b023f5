"""A worker that loses its AMQP connection or its ZooKeeper session, and comes back: each new
connection is announced before anything is consumed on it, so that a fence finds it, and a
ZooKeeper that flaps while the worker registers again does not end the worker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kazoo.exceptions import ConnectionLoss

from coordinator.fence import fence
from hashq.management import Management
from hashq.membership import Membership, Session
from hashq.message import Message
from hashq.protocol import Registration
from hashq.settings import Settings, WorkerSettings
from hashq.worker import Worker, WorkerState
from tests.grants import Grants
from tests.helpers import close_connection_named, wait_for_connection
from tests.test_worker import publish, workload
from tests.workers import StartWorker, wait_for_executions


async def _eventually(condition: Callable[[], Any], within: float = 30) -> Any:
    deadline = time.monotonic() + within
    while not (found := condition()):
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)
    return found


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
    second = await _eventually(_announced_other_than(grants, first.connection))
    assert second.incarnation == first.incarnation
    assert (first.connection[-2:], second.connection[-2:]) == ("-1", "-2")
    await wait_for_connection(management, second.connection)

    assert await fence(management, "w1", first.incarnation) == 1  # the new connection
    third = await _eventually(_announced_other_than(grants, second.connection))
    assert third.connection[-2:] == "-3"
    report = await asyncio.to_thread(wait_for_executions, record, expected, 120)
    assert (report.missing, report.skipped_ahead, report.overlaps) == ([], [], [])


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
        await _eventually(lambda: worker.state is WorkerState.WAITING)
        first_life = worker._membership.incarnation
        real_register = Membership.register
        attempts: list[str] = []

        async def flaky(membership: Membership, *args: Any) -> None:
            attempts.append(args[0])
            if len(attempts) == 1:
                raise ConnectionLoss()
            await real_register(membership, *args)

        monkeypatch.setattr(Membership, "register", flaky)
        worker._membership.session = Session.LOST
        worker._wake.set()
        await _eventually(lambda: len(attempts) >= 2 and worker.state is WorkerState.WAITING)
        assert not running.done(), "the worker ended"
        assert worker._membership.incarnation not in ("", first_life)
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)
