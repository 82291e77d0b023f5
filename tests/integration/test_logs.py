"""JSON logs from real worker and coordinator processes: every line one object, carrying the
process's id, and bucket lines their bucket and epoch as fields."""

from __future__ import annotations

import json
from pathlib import Path

from hashq._io.logs import key_for_log
from hashq.publisher import Outgoing, Publisher
from hashq.settings import Settings
from tests.support.helpers import hashq
from tests.support.workers import WorkerProcess, start_coordinator, stop_cleanly
from tools.polling import eventually


def json_lines(process: WorkerProcess) -> list[dict[str, object]]:
    return [json.loads(line) for line in process.output().splitlines() if line.strip()]


async def test_json_lines_carry_the_process_and_the_bucket(
    initialized: Settings, tmp_path: Path
) -> None:
    env = {"HASHQ_LOG_FORMAT": "json"}
    coordinator = start_coordinator(initialized, "c1", tmp_path, env)
    worker = WorkerProcess(
        initialized,
        "w1",
        "tests.support.handlers:record",
        tmp_path / "r.jsonl",
        tmp_path,
        {**env, "HASHQ_LOG_LEVEL": "DEBUG"},
    )
    try:
        consuming = await eventually(
            lambda: [e for e in json_lines(worker) if "consuming" in str(e["message"])],
            60,
            every=0.25,
            until=lambda consuming: len(consuming) == initialized.buckets,
            what="every bucket consumed",
        )
        async with Publisher(initialized) as publisher:
            await publisher.publish_many(
                [Outgoing("customer-4711", json.dumps({"seq": n}).encode()) for n in range(3)]
            )
        await eventually(
            lambda: (
                sum(
                    "customer" in str(e["message"]) or "of key #" in str(e["message"])
                    for e in json_lines(worker)
                )
                >= 3
            ),
            30,
            every=0.25,
            what="three messages of the key logged",
        )
    finally:
        stop_cleanly(worker, coordinator)
    lines = json_lines(worker)
    assert all(line["worker"] == "w1" and line["level"] for line in lines)
    assert {(line["bucket"], line["epoch"]) for line in consuming} == {
        (b, 1) for b in range(initialized.buckets)
    }
    assert any("revoked" in str(line["message"]) and "bucket" in line for line in lines)
    assert all(line["coordinator"] == "c1" for line in json_lines(coordinator))
    hashed = key_for_log("customer-4711", clear=False)
    done = [line for line in lines if f"of key {hashed} done" in str(line["message"])]
    assert len(done) == 3 and all(line["level"] == "DEBUG" for line in done)
    assert "customer-4711" not in worker.output()


def test_a_bad_log_format_is_one_line_and_status_2(settings: Settings) -> None:
    done = hashq(settings, "status", HASHQ_LOG_FORMAT="yaml")
    assert done.returncode == 2
    assert done.stderr.strip() == "setting log_format: 'yaml' is not one of text, json"
