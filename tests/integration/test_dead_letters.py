"""``hashq dead-letters list|replay|purge`` against real dead letters: made by a real worker
whose handler fails, then listed, replayed and purged with the command itself."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hashq.publisher import Outgoing, Publisher
from hashq.settings import Settings
from hashq.topology import Topology
from tests.support.helpers import hashq, queue_depths
from tests.support.workers import WorkerProcess, start_coordinator, stop_cleanly
from tools.polling import eventually
from tools.queues import take_all

POISONED = ["bad-1", "bad-2", "bad-3"]


def dead_letters(
    settings: Settings, *argv: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    return hashq(settings, "dead-letters", *argv, stdin=stdin)


def listed(settings: Settings) -> list[dict[str, Any]]:
    done = dead_letters(settings, "list", "--json")
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


@pytest.fixture
async def dead_lettered(initialized: Settings, tmp_path: Path) -> Settings:
    """Three dead letters, made by a worker that then stopped."""
    coordinator = start_coordinator(initialized, "c1", tmp_path)
    worker = WorkerProcess(
        initialized,
        "w1",
        "tests.support.handlers:poison",
        tmp_path / "r.jsonl",
        tmp_path,
        {"HASHQ_MAX_ATTEMPTS": "1"},
    )
    dead = Topology.from_settings(initialized).dead_letter_queue
    try:
        async with Publisher(initialized) as publisher:
            await publisher.publish_many(
                Outgoing(
                    key,
                    json.dumps({"seq": 0, "poison": True}).encode(),
                    message_id=key,
                    job_type="poisoned",  # a replay must keep it (hashq.App routes by it)
                )
                for key in POISONED
            )
        await eventually(
            lambda: queue_depths(initialized),
            60,
            every=0.25,
            until=lambda depths: depths[dead] == len(POISONED),
            what="every poisoned message dead-lettered",
        )
    finally:
        stop_cleanly(worker, coordinator)
    return initialized


async def test_list_shows_why_and_leaves_every_dead_letter_in_its_place(
    dead_lettered: Settings,
) -> None:
    first = await asyncio.to_thread(listed, dead_lettered)
    assert sorted(row["key"] for row in first) == POISONED
    assert {row["reason"] for row in first} == {"handler-failed"}
    assert all("ValueError: poison message" in row["error"] for row in first)
    assert all(row["attempts"] == 1 and row["epoch"] == 1 for row in first)
    again = await asyncio.to_thread(listed, dead_lettered)
    assert [row["message_id"] for row in again] == [row["message_id"] for row in first]


async def test_replay_sends_only_the_chosen_one_to_its_key_and_keeps_the_rest(
    dead_lettered: Settings,
) -> None:
    before = [row["message_id"] for row in await asyncio.to_thread(listed, dead_lettered)]
    done = await asyncio.to_thread(dead_letters, dead_lettered, "replay", "--key", "bad-2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("replayed 1 of 3 dead letters")
    after = [row["message_id"] for row in await asyncio.to_thread(listed, dead_lettered)]
    assert after == [m for m in before if m != "bad-2"]  # the rest, in their order
    topology = Topology.from_settings(dead_lettered)
    (replayed,) = [m for q in topology.bucket_queues() for m in await take_all(dead_lettered, q)]
    assert replayed.message_id == "bad-2" and replayed.routing_key == "bad-2"
    assert replayed.headers["x-hashq-replayed"] == 1
    assert replayed.headers["x-hashq-type"] == "poisoned"
    ours = {"x-hashq-replayed", "x-hashq-type"}
    assert not [h for h in replayed.headers if h.startswith("x-hashq-") and h not in ours]
    assert json.loads(replayed.body) == {"seq": 0, "poison": True}


async def test_replay_without_a_choice_and_purge_without_yes_change_nothing(
    dead_lettered: Settings,
) -> None:
    refused = await asyncio.to_thread(dead_letters, dead_lettered, "replay")
    assert refused.returncode == 2
    assert "replay needs --id, --key, --reason or --all" in refused.stderr
    kept = await asyncio.to_thread(dead_letters, dead_lettered, "purge", stdin="no\n")
    assert kept.returncode == 1
    assert len(await asyncio.to_thread(listed, dead_lettered)) == 3
    purged = await asyncio.to_thread(dead_letters, dead_lettered, "purge", "--yes")
    assert purged.returncode == 0 and purged.stdout.startswith("deleted 3 dead letters")
    assert await asyncio.to_thread(listed, dead_lettered) == []
