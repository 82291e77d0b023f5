"""Metrics and health endpoints, scraped over HTTP from real worker and coordinator processes
against the real servers: the counts must match what was published and what failed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest
from prometheus_client import CollectorRegistry

from hashq import __version__
from hashq._io.health import HealthServer
from hashq.parked import parked_name
from hashq.publisher import Outgoing, Publisher
from hashq.settings import Settings
from hashq.topology import Topology
from hashq.worker.starvation import STARVED_AFTER
from tests.support.grants import Grants
from tests.support.helpers import free_port, get, hashq, scrape, total
from tests.support.workers import (
    StartWorker,
    WorkerProcess,
    read_appended,
    start_coordinator,
    wait_for_executions,
)
from tests.support.workload import publish, workload
from tools.polling import eventually


@pytest.fixture
def processes(initialized: Settings, tmp_path: Path) -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for process in started:
        process.stop()


async def test_worker_and_coordinator_report_what_happened(
    initialized: Settings, tmp_path: Path, processes: list[WorkerProcess]
) -> None:
    coordinator_port, worker_port = free_port(), free_port()
    processes.append(
        start_coordinator(
            initialized, "c1", tmp_path, {"HASHQ_METRICS_PORT": str(coordinator_port)}
        )
    )
    record = tmp_path / "executions.jsonl"
    worker_env = {
        "HASHQ_METRICS_PORT": str(worker_port),
        "HASHQ_MAX_ATTEMPTS": "2",
        "HASHQ_RETRY_BASE_DELAY": "0.1",
    }
    processes.append(
        WorkerProcess(
            initialized, "w1", "tests.support.handlers:poison", record, tmp_path, worker_env
        )
    )
    await eventually(lambda: get(worker_port, "/readyz")[0] == 200)
    await eventually(lambda: total(scrape(worker_port), "hashq_grants_held") == initialized.buckets)

    good = [Outgoing(f"k{n % 40}", json.dumps({"seq": n // 40}).encode()) for n in range(400)]
    bad = [Outgoing("bad", json.dumps({"seq": 0, "poison": True}).encode())]
    async with Publisher(initialized) as publisher:
        await publisher.publish_many([*good, *bad])
    report = await asyncio.to_thread(
        wait_for_executions, record, {f"k{n}": 10 for n in range(40)}, 60
    )
    assert report.lost == []
    await eventually(lambda: total(scrape(worker_port), "hashq_messages_dead_lettered_total") == 1)

    worker = scrape(worker_port)
    assert total(worker, "hashq_messages_processed_total") == 401  # a dead letter is settled too
    assert total(worker, "hashq_messages_failed_total") == 2  # both attempts of the poison one
    assert total(worker, "hashq_messages_retried_total") == 1
    assert total(worker, "hashq_messages_dead_lettered_total", reason="handler-failed") == 1
    assert total(worker, "hashq_handler_seconds_count") == 402
    assert total(worker, "hashq_messages_in_flight") == 0
    assert total(worker, "hashq_zookeeper_connected") == 1
    assert total(worker, "hashq_worker_state", state="running") == 1
    assert get(worker_port, "/livez")[0] == 200
    for scraped, component in ((worker, "worker"), (scrape(coordinator_port), "coordinator")):
        assert total(scraped, "hashq_build_info", version=__version__, component=component) == 1
        assert total(scraped, "process_cpu_seconds_total") > 0
        assert total(scraped, "process_resident_memory_bytes") > 0
        assert total(scraped, "python_info") == 1

    await eventually(lambda: total(scrape(coordinator_port), "hashq_dead_letter_messages") == 1)
    leader = scrape(coordinator_port)
    assert total(leader, "hashq_coordinator_leader") == 1
    assert total(leader, "hashq_workers") == 1
    assert total(leader, "hashq_bucket_grants_total") == initialized.buckets
    assert total(leader, "hashq_bucket_queue_messages") == 0
    assert {labels for (name, labels) in leader if name == "hashq_bucket_queue_messages"} == {
        (("bucket", str(b)),) for b in range(initialized.buckets)
    }
    assert get(coordinator_port, "/readyz") == (200, "coordinator c1: leader\n")


async def test_readiness_answers_503_with_its_reason_and_unknown_paths_404() -> None:
    state = {"ready": False}
    server = await HealthServer.serve(
        CollectorRegistry(),
        lambda: (state["ready"], "granted buckets [3] not consumed yet"),
        "127.0.0.1",
        0,
    )
    try:
        assert await asyncio.to_thread(get, server.port, "/readyz") == (
            503,
            "granted buckets [3] not consumed yet\n",
        )
        state["ready"] = True
        assert (await asyncio.to_thread(get, server.port, "/readyz"))[0] == 200
        assert (await asyncio.to_thread(get, server.port, "/nope"))[0] == 404
    finally:
        await server.close()


async def _hold(message: aio_pika.abc.AbstractIncomingMessage) -> None:
    """Consume and never acknowledge."""


async def test_a_bucket_its_queue_does_not_feed_is_reported_until_it_is_fed(
    initialized: Settings, grants: Grants, start_worker: StartWorker, record: Path
) -> None:
    """A granted bucket consumed, holding nothing, that gets no delivery while its queue has
    messages ready (seen once in a chaos run, cause unknown): the worker says so in its
    readiness and in ``hashq_buckets_starved`` within about ``STARVED_AFTER`` seconds, and
    stops saying so once it is fed. Here another consumer holds the single-active-consumer
    queue first, which starves the owner the same way."""
    port = free_port()
    start_worker("w1", HASHQ_METRICS_PORT=str(port))
    (worker,) = grants.wait_for_workers(1)
    messages, expected = workload(keys=200, per_key=5)
    await publish(initialized, messages)
    connection = await aio_pika.connect(initialized.amqp_url)
    try:
        holder = await connection.channel()
        await holder.set_qos(prefetch_count=1)
        queue = await holder.get_queue(Topology.from_settings(initialized).bucket_queue(0))
        await queue.consume(_hold)  # holds one, never acknowledges
        grants.assign(worker, dict.fromkeys(range(initialized.buckets), 1))
        status, reason = await eventually(
            lambda: get(port, "/readyz"), STARVED_AFTER + 20, until=lambda r: "[0]" in r[1]
        )
        assert (status, reason) == (503, "worker w1: buckets [0] get nothing from full queues\n")
        assert total(scrape(port), "hashq_buckets_starved") == 1
        await holder.close()  # its message goes back: the owner's consumer is the active one
    finally:
        await connection.close()
    report = await asyncio.to_thread(wait_for_executions, record, expected, 60)
    assert (report.lost, report.reordered, report.overlaps) == ([], [], [])
    await eventually(lambda: get(port, "/readyz")[0] == 200, STARVED_AFTER / 2)  # fed again
    assert total(scrape(port), "hashq_buckets_starved") == 0


async def test_a_bucket_whose_parked_keys_cannot_be_read_starts_nothing_and_says_so(
    initialized: Settings, grants: Grants, start_worker: StartWorker, record: Path
) -> None:
    """Any key of a bucket may be parked until its records are read, so a bucket whose records
    do not read (one damaged by hand, here) starts nothing: that must show in readiness and in
    ``hashq_buckets_parking_unread`` at once, and the bucket must go on, losing nothing, once
    the record is mended."""
    port = free_port()
    damaged = f"{grants.paths.parked}/{parked_name(0, 'some-key')}"
    grants.zk.create(damaged, b"{not json", makepath=True)
    start_worker("w1", HASHQ_METRICS_PORT=str(port))
    (worker,) = grants.wait_for_workers(1)
    messages, expected = workload(keys=200, per_key=3)
    await publish(initialized, messages)
    grants.assign(worker, dict.fromkeys(range(initialized.buckets), 1))
    status, reason = await eventually(
        lambda: get(port, "/readyz"), 20, until=lambda r: "parked" in r[1]
    )
    assert (status, reason) == (503, "worker w1: buckets [0] cannot read their parked keys\n")
    assert total(scrape(port), "hashq_buckets_parking_unread") == 1
    listed = await asyncio.to_thread(hashq, initialized, "parked", "list")
    assert listed.returncode != 0 and f"{damaged}: unreadable parked record" in listed.stderr
    topology = Topology.from_settings(initialized)
    others = {key: n for key, n in expected.items() if topology.bucket_of(key) != 0}
    await asyncio.to_thread(wait_for_executions, record, others, 60)  # the other buckets flow
    assert not {r["key"] for r in read_appended(record)} - set(others)  # bucket 0 starts nothing

    grants.zk.delete(damaged)
    report = await asyncio.to_thread(wait_for_executions, record, expected, 60)
    assert (report.lost, report.reordered, report.overlaps) == ([], [], [])
    await eventually(lambda: get(port, "/readyz")[0] == 200, 10)
    assert total(scrape(port), "hashq_buckets_parking_unread") == 0
