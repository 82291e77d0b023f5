"""Parked keys against real RabbitMQ and ZooKeeper, with real worker processes: a key whose
handler keeps failing steps aside in order while its bucket goes on, survives a kill -9 of its
owner, a handover and a RabbitMQ restart, and once released runs its parked messages, in order,
before its later ones."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from hashq.admin.parked import Parked, change_state, parked_keys
from hashq.parked import ParkedState
from hashq.publisher import Outgoing
from hashq.settings import Settings
from hashq.topology import Topology
from tests.support.grants import Grants
from tests.support.helpers import hashq
from tests.support.services import Endpoints
from tests.support.workers import (
    StartWorker,
    WorkerProcess,
    check,
    read_appended,
    wait_for_executions,
)
from tests.support.workload import publish
from tools.polling import eventually
from tools.queues import take_all

POISON = "poisoned-key"
PARKING = {
    "HASHQ_ON_FAILURE": "park",
    "HASHQ_MAX_ATTEMPTS": "2",
    "HASHQ_RETRY_BASE_DELAY": "0.05",
    "HASHQ_RETRY_MAX_DELAY": "0.1",
}


def _messages(key: str, seqs: range) -> list[Outgoing]:
    return [Outgoing(key, json.dumps({"seq": n}).encode()) for n in seqs]


def _neighbours(settings: Settings, key: str, count: int) -> list[str]:
    """``count`` keys of ``key``'s bucket."""
    topology = Topology.from_settings(settings)
    bucket = topology.bucket_of(key)
    found: list[str] = []
    n = 0
    while len(found) < count:
        n += 1
        if topology.bucket_of(f"cold-{n}") == bucket:
            found.append(f"cold-{n}")
    return found


def _start(
    start_worker: StartWorker,
    grants: Grants,
    settings: Settings,
    broken: Path,
    name: str = "w1",
    epoch: int = 1,
    env: dict[str, str] | None = None,
) -> WorkerProcess:
    """A worker running ``breakable`` that parks a key after two attempts, granted every bucket."""
    worker = start_worker(
        name,
        "tests.support.handlers:breakable",
        HASHQ_TEST_BROKEN=str(broken),
        **PARKING,
        **(env or {}),
    )
    registration = grants.wait_for_worker(name)
    grants.assign(registration, dict.fromkeys(range(settings.buckets), epoch))
    return worker


async def _parked_first(
    start_worker: StartWorker,
    grants: Grants,
    settings: Settings,
    tmp_path: Path,
    count: int,
    **env: str,
) -> tuple[Path, WorkerProcess]:
    """w1, granted every bucket, with ``POISON`` broken: ``count`` messages of it published and
    parked. The file that breaks it, and w1."""
    broken = tmp_path / "broken"
    await asyncio.to_thread(broken.write_text, POISON)
    worker = _start(start_worker, grants, settings, broken, env=env)
    await publish(settings, _messages(POISON, range(count)))
    await _parked(settings, count)
    return broken, worker


async def _parked(settings: Settings, messages: int, within: float = 60) -> Parked:
    async def found() -> Parked | None:
        shown = await parked_keys(settings)
        return shown[0] if shown and shown[0].messages == messages else None

    return await eventually(
        found, within, every=0.5, what=f"{POISON} parked with {messages} messages"
    )


def _ok_seqs(record: Path, key: str) -> list[int]:
    return [r["seq"] for r in read_appended(record) if r["key"] == key and r["outcome"] == "ok"]


async def _release_and_check(settings: Settings, broken: Path, record: Path, total: int) -> None:
    """Fix the handler, release the key: every message of it runs, in publish order."""
    await asyncio.to_thread(broken.write_text, "")
    await change_state(settings, POISON, ParkedState.RELEASING)
    report = await asyncio.to_thread(wait_for_executions, record, {POISON: total}, 60)
    assert (report.lost, report.reordered, report.overlaps) == ([], [], [])
    assert sorted(set(_ok_seqs(record, POISON))) == list(range(total))
    await eventually(
        lambda: parked_keys(settings), 30, every=0.5, until=lambda s: s == [], what="unparked"
    )


async def test_a_poisoned_key_steps_aside_while_its_bucket_flows_and_is_released_in_order(
    initialized: Settings, grants: Grants, start_worker: StartWorker, record: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    broken.write_text(POISON)
    _start(start_worker, grants, initialized, broken)
    cold = _neighbours(initialized, POISON, 1000)
    await publish(initialized, _messages(POISON, range(5)))
    await publish(initialized, [m for key in cold for m in _messages(key, range(2))])
    await publish(initialized, _messages(POISON, range(5, 10)))

    report = await asyncio.to_thread(wait_for_executions, record, dict.fromkeys(cold, 2), 90)
    assert (report.lost, report.reordered, report.overlaps) == ([], [], [])
    parked = await _parked(initialized, 10)
    assert parked.record.state is ParkedState.PARKED and "broken" in parked.record.reason
    assert _ok_seqs(record, POISON) == []

    await publish(initialized, _messages(POISON, range(10, 15)))  # parked behind the others
    await _parked(initialized, 15)
    await _release_and_check(initialized, broken, record, 15)
    await publish(initialized, _messages(POISON, range(15, 20)))  # flows again
    report = await asyncio.to_thread(wait_for_executions, record, {POISON: 20}, 30)
    assert (report.lost, report.reordered) == ([], [])


async def test_a_parked_key_outlives_its_owner_s_kill_9_and_a_new_owner(
    initialized: Settings, grants: Grants, start_worker: StartWorker, record: Path, tmp_path: Path
) -> None:
    broken, first = await _parked_first(start_worker, grants, initialized, tmp_path, 6)
    first.kill()
    _start(start_worker, grants, initialized, broken, "w2", epoch=2)
    await publish(initialized, _messages(POISON, range(6, 10)))  # the new owner parks them
    await _parked(initialized, 10)
    assert _ok_seqs(record, POISON) == []
    await _release_and_check(initialized, broken, record, 10)
    assert {r["worker"] for r in read_appended(record) if r["outcome"] == "ok"} == {"w2"}


async def test_a_parked_key_is_handed_over_with_its_bucket_and_released_by_the_next_owner(
    initialized: Settings, grants: Grants, start_worker: StartWorker, record: Path, tmp_path: Path
) -> None:
    broken, _ = await _parked_first(start_worker, grants, initialized, tmp_path, 6)
    start_worker("w2", "tests.support.handlers:breakable", HASHQ_TEST_BROKEN=str(broken), **PARKING)
    second = grants.wait_for_worker("w2")
    grants.assign(grants.wait_for_worker("w1"), {})  # revoked: w1 drains and releases
    for bucket in range(initialized.buckets):
        await asyncio.to_thread(grants.wait_for_release, bucket, 1)
    # Waiting in the bucket queue as w2 takes the bucket: it must read that the key is parked
    # before it starts any of them.
    await publish(initialized, _messages(POISON, range(6, 10)))
    grants.assign(second, dict.fromkeys(range(initialized.buckets), 2))
    await _parked(initialized, 10)
    assert _ok_seqs(record, POISON) == []
    await _release_and_check(initialized, broken, record, 10)
    ran = {
        r["worker"] for r in read_appended(record) if r["key"] == POISON and r["outcome"] == "ok"
    }
    assert ran == {"w2"}


async def test_a_parked_key_survives_a_rabbitmq_restart(
    initialized: Settings,
    grants: Grants,
    start_worker: StartWorker,
    record: Path,
    tmp_path: Path,
    endpoints: Endpoints,
) -> None:
    # No coordinator grants again here: the worker must not withdraw however long RabbitMQ
    # takes to come back (over 30 s on a busy machine).
    broken, _ = await _parked_first(
        start_worker, grants, initialized, tmp_path, 5, HASHQ_WITHDRAW_AFTER="600"
    )
    assert endpoints.restart is not None
    await asyncio.to_thread(endpoints.restart, "rabbitmq")
    await publish(initialized, _messages(POISON, range(5, 8)))
    await _parked(initialized, 8, within=180)  # reconnected, and the return grace waited
    await _release_and_check(initialized, broken, record, 8)
    assert check(record, {POISON: 8}).lost == []


async def test_the_parked_command_lists_shows_and_drops_a_key_whose_next_messages_then_run(
    initialized: Settings, grants: Grants, start_worker: StartWorker, record: Path, tmp_path: Path
) -> None:
    broken, _ = await _parked_first(start_worker, grants, initialized, tmp_path, 4)

    listed = await asyncio.to_thread(hashq, initialized, "parked", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert (row["key"], row["state"], row["messages"]) == (POISON, "parked", 4)
    assert "key poisoned-key is broken" in row["reason"] and row["since"]
    shown = await asyncio.to_thread(hashq, initialized, "parked", "show", POISON)
    assert shown.returncode == 0 and POISON in shown.stdout and "parked" in shown.stdout
    absent = await asyncio.to_thread(hashq, initialized, "parked", "release", "no-such-key")
    assert absent.returncode != 0 and "is not parked" in absent.stderr

    await asyncio.to_thread(broken.write_text, "")
    dropped = await asyncio.to_thread(hashq, initialized, "parked", "drop", POISON, "--yes")
    assert dropped.returncode == 0, dropped.stderr
    await eventually(
        lambda: parked_keys(initialized), 60, every=0.5, until=lambda s: s == [], what="dropped"
    )
    dead = await take_all(initialized, "hashq.t.dead")
    assert sorted(json.loads(d.body)["seq"] for d in dead) == [0, 1, 2, 3]
    assert {d.headers["x-hashq-reason"] for d in dead} == {"dropped"}
    await publish(initialized, _messages(POISON, range(4, 6)))
    await eventually(lambda: _ok_seqs(record, POISON) == [4, 5], 30, what="the key flowing")
