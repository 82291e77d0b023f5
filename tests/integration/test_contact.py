"""A worker starts nothing it was delivered once the broker has not answered it for
``BROKER_CONTACT_SECONDS`` (``hashq.worker.contact``), against a real broker stopped with SIGSTOP
under load: its connection stays open and its prefetched messages are at hand, yet it starts
none of them until the broker answers again, nothing is lost or reordered, and it counts the
time it held its starts (``hashq_broker_contact_lapsed_seconds``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hashq.records import BROKER_CONTACT_SECONDS
from hashq.settings import Settings
from tests.support.grants import Grants
from tests.support.helpers import free_port, scrape, total
from tests.support.services import Endpoints
from tests.support.workers import WorkerProcess, read_appended, wait_for_executions
from tests.support.workload import publish, workload
from tools.polling import eventually

STOPPED_SECONDS = 3.0
MARGIN = 0.3  # a start decided just before the bound, recorded a little after it


async def test_a_worker_starts_nothing_once_the_broker_stops_answering(
    initialized: Settings,
    cluster: Callable[..., WorkerProcess],
    record: Path,
    zk_view: Grants,
    endpoints: Endpoints,
) -> None:
    if endpoints.pause is None or endpoints.resume is None:
        pytest.skip("needs the local broker, to stop it")
    cluster("c1")
    # 4 handlers of 0-50 ms at once: what it holds (32 per bucket) lasts several seconds.
    port = free_port()
    cluster("w1", HASHQ_TEST_DELAY_MS="50", HASHQ_CONCURRENCY="4", HASHQ_METRICS_PORT=str(port))
    await eventually(lambda: zk_view.all_granted(initialized.buckets, {"w1"}))
    messages, expected = workload(keys=200, per_key=10)
    await publish(initialized, messages)
    await eventually(lambda: len(read_appended(record)) > 50)
    endpoints.pause("rabbitmq")
    stopped = time.time()
    try:
        await asyncio.sleep(STOPPED_SECONDS)
    finally:
        resumed = time.time()  # before: the broker answers as soon as it runs again
        endpoints.resume("rabbitmq")
    report = await asyncio.to_thread(wait_for_executions, record, expected, 120)
    assert (report.lost, report.reordered, report.overlaps) == ([], [], [])
    starts = sorted(e["start"] for e in read_appended(record))
    bound = stopped + BROKER_CONTACT_SECONDS + MARGIN
    went_on = [s for s in starts if stopped < s < bound]
    late = [round(s - stopped, 2) for s in starts if bound < s < resumed]
    print(f"broker stopped: {len(went_on)} starts within the bound, then {len(late)}")
    assert went_on, "it held nothing to start: the test shows nothing"
    assert late == [], f"started {len(late)} messages after the broker stopped answering"
    # It says how long it held its starts, and how late the broker's answer came.
    lapsed = total(scrape(port), "hashq_broker_contact_lapsed_seconds_total")
    after = [round(s - resumed, 2) for s in starts if s > resumed][:3]
    print(f"starts held {lapsed:.2f}s in all; first starts after resume {after}")
    assert STOPPED_SECONDS - BROKER_CONTACT_SECONDS - 1 < lapsed < time.time() - stopped, lapsed
    await eventually(lambda: total(scrape(port), "hashq_broker_round_trip_seconds") < 0.5)
