"""The coordinator's fencing and election, each case a hole once found in it.

The election, readiness and liveness cases run real coordinators against the real ZooKeeper
and RabbitMQ; where only a timing can expose a hole, the management API's part of a fence is
replaced and the ``Fencer``'s bookkeeping around it is the real one.
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from kazoo.exceptions import ConnectionLoss

import hashq_coordinator.fencing.fencer as fencing
import hashq_coordinator.runtime as runtime
from hashq._io.management import Management
from hashq.errors import ServiceUnavailable
from hashq.records import (
    RETURN_GRACE_SECONDS,
    BucketRecord,
    BucketState,
    Registration,
    worker_connection_name,
)
from hashq.settings import Settings
from hashq.topology import Topology
from hashq_coordinator.fencing.cutoff import fence
from hashq_coordinator.fencing.fencer import Fencer
from hashq_coordinator.fencing.liveness import Liveness
from hashq_coordinator.machine.fencebook import FenceBook
from hashq_coordinator.machine.handover import View, step
from hashq_coordinator.metrics import CoordinatorMetrics
from hashq_coordinator.runtime import Coordinator, Role
from hashq_coordinator.settings import CoordinatorSettings
from hashq_coordinator.store import Store
from tests.support.grants import Grants
from tests.support.workers import WorkerProcess, wait_for_executions
from tests.support.workload import publish, workload
from tools.polling import eventually

INCARNATION = ("w1", "i1")


def _registration(number: int) -> Registration:
    return Registration("w1", "i1", 1, connection=worker_connection_name("w1", "i1", number))


def _coordinator_settings(settings: Settings, **changes: Any) -> CoordinatorSettings:
    return CoordinatorSettings(**{**settings.model_dump(), "management_lag": 0, **changes})


class StillConnected(Liveness):
    """The broker's word on every incarnation: it still holds a connection (a live worker), so
    each fence goes through the management API."""

    async def gone(self, worker_id: str, incarnation: str) -> bool:
        return False


def _fencer(settings: Settings, **changes: Any) -> Fencer:
    chosen = _coordinator_settings(settings, **changes)
    liveness = StillConnected(chosen, Topology.from_settings(chosen))
    return Fencer(chosen, "c1", CoordinatorMetrics(), _noop, liveness=liveness)


def _noop() -> None:
    return None


async def _fence(fencer: Fencer, calls: list[float]) -> None:
    fencer.start_fence(INCARNATION)
    await fencer.finished(INCARNATION)
    assert calls, "the fence did not run"


@pytest.fixture
def stub_fence(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The management API's part of a fence replaced: records when each fence listed."""
    calls: list[float] = []

    async def listed(*_: Any, **__: Any) -> int:
        calls.append(time.monotonic())
        return 1

    monkeypatch.setattr(fencing, "fence", listed)
    return calls


def test_a_fenced_bucket_is_granted_only_once_the_queues_had_time_to_take_back_its_messages() -> (
    None
):
    """A fence is done when no connection of the incarnation is left; the bucket queues may
    take back what those connections held only later (a queue led from a failed node, once it
    has a leader again: tests/e2e/test_cluster.py). So the next owner is granted
    ``RETURN_GRACE_SECONDS`` after the first fence that finished once the bucket was fencing;
    fences of the worker's newer connections (it lives on and reconnects) do not restart it."""
    stuck = BucketRecord(BucketState.FENCING, "w1", "i1", 3, target="w2", since=10.0)
    live = {"w2": _registration(1)}

    def granted(now: float, done: tuple[float, ...]) -> bool:
        fenced = frozenset({INCARNATION})
        view = View(
            1, {0: stuck}, live, frozenset(), fenced, now, 1, fences_done={INCARNATION: done}
        )
        record = step(view, {0: "w2"}).records.get(0)
        return record is not None and record.state is BucketState.GRANTED

    grace = RETURN_GRACE_SECONDS
    assert not granted(11.0 + grace - 0.01, (11.0,))
    assert granted(11.0 + grace, (11.0,))
    assert granted(11.0 + grace, (11.0, 13.0, 15.5))  # later fences of newer connections
    assert not granted(30.0, (9.0,))  # finished before the bucket began to move: not this one


async def test_a_fenced_worker_that_reconnected_is_fenced_again(
    settings: Settings, stub_fence: list[float]
) -> None:
    """A live worker, once fenced, reconnects under the same incarnation with a new connection.
    A later fence of that incarnation must close the new connection: the old fence does not
    cover it, so a bucket stuck in ``fencing`` is not granted before a second fence."""
    fencer = _fencer(settings)
    fencer.note({"w1": _registration(1)}, {INCARNATION})
    await _fence(fencer, stub_fence)
    assert INCARNATION in fencer.covered()

    fencer.note({"w1": _registration(2)}, {INCARNATION})  # reconnected, announced
    assert INCARNATION not in fencer.covered()
    stuck = BucketRecord(BucketState.FENCING, "w1", "i1", 3, target="w2")
    view = View(
        1,
        {0: stuck},
        {"w1": _registration(2)},
        frozenset(),
        fencer.covered(),
        0,
        1,
        fences_done=None,
    )
    decision = step(view, {0: "w2"})
    assert decision.fences == {INCARNATION} and 0 not in decision.records

    await _fence(fencer, stub_fence)
    assert len(stub_fence) == 2 and INCARNATION in fencer.covered()


async def test_a_fence_waits_until_the_newest_connection_can_be_listed(
    settings: Settings, stub_fence: list[float]
) -> None:
    """The API lists a new connection only after a lag. A new leader has seen nothing yet, and
    a reconnected worker's connection is new: either way the fence lists only once the lag has
    passed since the connection was first known."""
    lag = 0.6
    fencer = _fencer(settings, management_lag=lag)
    began = time.monotonic()
    fencer.start_fence(INCARNATION)  # a new leader: never saw this incarnation
    await asyncio.sleep(0.3)
    fencer.note({"w1": _registration(2)}, {INCARNATION})  # announced meanwhile
    await fencer.finished(INCARNATION)
    assert stub_fence[0] - began >= 0.3 + lag - 0.05
    assert INCARNATION in fencer.covered()


def test_a_leader_elected_again_waits_the_full_lag_for_what_it_saw_in_an_earlier_term() -> None:
    """Leading, then not, then leading again: a worker may have announced a connection and
    lost its session meanwhile, unseen here, so the sighting of the earlier term must not let
    a fence list at once (the simulation found it, seed 197: the fence missed a young
    connection and its buckets stalled behind the stranded worker's consumer)."""
    book = FenceBook()
    book.note({"w1": _registration(1)}, {INCARNATION}, now=0.0, asked=0.0)
    book.note({"w1": _registration(1)}, {INCARNATION}, now=10.0, asked=9.95)
    book.new_term()  # however soon after the last look of the earlier term
    book.note({}, {INCARNATION}, now=10.5, asked=10.45)  # the first look of the new term
    assert book.listable_in(INCARNATION, now=10.5, lag=6.0) == 6.0
    assert book.sighting(INCARNATION, now=10.5).liveness  # still asks the broker first


def test_a_worker_that_vanished_while_the_leader_could_not_look_is_fenced_afresh() -> None:
    """The leader keeps its lead through a ZooKeeper outage shorter than its session; a worker
    with a shorter session announces a connection and loses its session meanwhile. The old
    sighting, and a fence that covered it, must not stand for the connection it never saw."""
    for gap, afresh in ((0.5, False), (3.0, True)):
        book = FenceBook()
        book.note({"w1": _registration(1)}, {INCARNATION}, now=0.0, asked=0.0)
        book.note({"w1": _registration(1)}, {INCARNATION}, now=10.0, asked=9.95)
        book.done(INCARNATION, book.sighting(INCARNATION, 10.0), now=10.0)
        book.note({}, {INCARNATION}, now=10.0 + gap, asked=9.95 + gap)  # w1 is gone
        assert (INCARNATION not in book.covered()) is afresh
        assert book.listable_in(INCARNATION, now=10.0 + gap, lag=6.0) == (6.0 if afresh else 0.0)


async def test_a_fence_goes_on_after_any_failure_of_the_management_api(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A reply cut short (IncompleteRead) or one that is not JSON used to end the fence task,
    leaving its bucket in ``fencing`` for good."""

    class Flaky:
        def __init__(self) -> None:
            self.failures: list[Exception] = [
                http.client.IncompleteRead(b"[{"),
                ValueError("Expecting value"),
            ]
            self.closed: list[str] = []

        def connections(self, columns: Sequence[str] = ()) -> list[dict[str, Any]]:
            assert set(columns) >= {"name", "user_provided_name"}
            if self.failures:
                raise self.failures.pop(0)
            return [{"name": "c", "user_provided_name": worker_connection_name("w1", "i1", 3)}]

        def request(self, method: str, path: str, **_: Any) -> None:
            assert (method, path.rpartition("/")[0]) == ("DELETE", "/api/connections")
            self.closed.append(path.rpartition("/")[2])

    flaky = Flaky()
    told: list[str | None] = []
    closed = await asyncio.wait_for(fence(flaky, "w1", "i1", told.append), 10)  # type: ignore[arg-type]
    assert (closed, flaky.closed) == (1, ["c"])
    assert told[-1] is None and len(told) == 3


@pytest.fixture
async def running() -> AsyncIterator[Callable[[Coordinator], None]]:
    """Runs coordinators in this process; each is stopped at the end."""
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    yield lambda coordinator: tasks.append(asyncio.ensure_future(coordinator._run(stop)))
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)


async def test_a_failed_claim_gives_the_lock_back_and_the_coordinator_leads(
    initialized: Settings,
    running: Callable[[Coordinator], None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ZooKeeper blips after the lock was taken: reading the records fails once. The held lock
    used to be abandoned, and the next lock node queued behind it for ever: nobody could lead."""
    real_records = Store.records
    failures = [ConnectionLoss()]

    def records(store: Store) -> dict[int, BucketRecord]:
        if failures:
            raise failures.pop()
        return real_records(store)

    monkeypatch.setattr(Store, "records", records)
    coordinator = Coordinator(_coordinator_settings(initialized))
    running(coordinator)
    await eventually(lambda: not failures)
    await eventually(lambda: coordinator.role is Role.LEADER)


async def test_a_coordinator_that_cannot_fence_says_so_once(
    initialized: Settings,
    running: Callable[[Coordinator], None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without a working management API no dead worker's buckets can move: the coordinator
    says so at start, in one line, and in its readiness and metrics."""
    nowhere = _coordinator_settings(initialized, management_url="http://127.0.0.1:9")
    coordinator = Coordinator(nowhere)
    with caplog.at_level(logging.ERROR, logger="hashq_coordinator.fencing.fencer"):
        running(coordinator)
        await eventually(lambda: coordinator.role is Role.LEADER)
        ready, why = coordinator.readiness()  # said at start, before any fence is needed
        assert not ready and "cannot fence" in why
        assert coordinator.metrics.registry.get_sample_value("hashq_coordinator_can_fence") == 0
        await asyncio.sleep(runtime.MANAGEMENT_SECONDS + 1)  # a second probe says nothing more
    assert not coordinator.readiness()[0]
    said = [r for r in caplog.records if "cannot fence" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]


async def test_without_the_management_api_a_killed_workers_buckets_still_move(
    initialized: Settings,
    cluster: Callable[..., WorkerProcess],
    record: Path,
    zk_view: Grants,
) -> None:
    """With no management API, the buckets of a worker killed with kill -9 used to stay where
    they were for good. The broker itself says that the worker's connection is gone (its
    liveness queue went with it), so they move."""
    nowhere = {"HASHQ_MANAGEMENT_URL": "http://127.0.0.1:9"}
    cluster("c1", **nowhere)
    doomed = cluster("w1")
    cluster("w2")
    await eventually(lambda: zk_view.all_granted(initialized.buckets, {"w1", "w2"}))
    messages, expected = workload(keys=100, per_key=10)
    await publish(initialized, messages)
    doomed.kill()
    report = await asyncio.to_thread(wait_for_executions, record, expected, 60)
    assert (report.lost, report.reordered, report.overlaps) == ([], [], [])
    await eventually(lambda: zk_view.all_granted(initialized.buckets, {"w2"}), within=30)


@pytest.mark.parametrize(
    ("tags", "can"),
    [("administrator", True), ("monitoring", True), ("management", True), ("", False)],
)
async def test_whether_a_coordinator_can_list_connections_depends_on_its_users_tags(
    initialized: Settings, tags: str, can: bool
) -> None:
    """A user tagged administrator is only asked who it is; one tagged monitoring or
    management is asked for a page of the listing as well (which shows the latter its own
    connections only: docs/operations.md says which user a coordinator needs); one the
    management API does not let in cannot fence."""
    admin = Management(initialized)
    user = f"hashq-test-{tags or 'untagged'}"
    path = f"/api/users/{user}"
    await asyncio.to_thread(admin.request, "PUT", path, {"password": "pw", "tags": tags})
    try:
        url = initialized.management_urls[0].replace("://", f"://{user}:pw@", 1)
        management = Management(_coordinator_settings(initialized, management_url=url))
        if can:
            await asyncio.to_thread(management.can_list_connections)
        else:
            with pytest.raises(ServiceUnavailable, match="401"):
                await asyncio.to_thread(management.can_list_connections)
    finally:
        await asyncio.to_thread(admin.request, "DELETE", path)


async def test_a_probe_that_passes_does_not_hide_a_fence_that_fails(settings: Settings) -> None:
    """The probe asks an administrator only who it is, so it may pass while the listing a fence
    needs fails: the coordinator says it cannot fence until that fence gets through."""
    fencer = _fencer(settings)
    await fencer.probe()
    assert fencer.cannot_fence is None
    fencer.trouble("the listing timed out")  # as a fence under way says at each failed try
    await fencer.probe()
    assert fencer.cannot_fence == "the listing timed out"
    fencer.trouble(None)  # that fence got through
    assert fencer.cannot_fence is None


async def test_a_broker_that_leaves_the_clients_name_out_is_asked_for_its_properties() -> None:
    """Some brokers leave ``user_provided_name`` out of the listing (rabbitmq-server#5816): a
    fence that found nobody named would close nothing and count as done. A listing in which no
    connection has the name is asked again with the client's properties."""
    named = worker_connection_name("w1", "i1", 2)

    class Unnamed:
        def __init__(self) -> None:
            self.asked: list[tuple[str, ...]] = []
            self.closed: list[str] = []

        def connections(self, columns: Sequence[str] = ()) -> list[dict[str, Any]]:
            self.asked.append(tuple(columns))
            if "client_properties" not in columns:
                return [{"name": "c"}, {"name": "d"}]
            return [{"name": "c", "client_properties": {"connection_name": named}}, {"name": "d"}]

        def request(self, method: str, path: str, **_: Any) -> None:
            self.closed.append(path.rpartition("/")[2])

    broker = Unnamed()
    closed = await asyncio.wait_for(fence(broker, "w1", "i1"), 10)  # type: ignore[arg-type]
    assert (closed, broker.closed, len(broker.asked)) == (1, ["c"], 2)
