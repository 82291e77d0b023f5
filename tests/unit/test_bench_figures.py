"""The benchmark's figures from synthetic consumer records: they must be able to show a bad
handover, a slow failover and a throughput drop."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tools.bench import figures
from tools.bench.probe import published_at, stamp


def line(
    worker: str, t0: float, buckets: dict[int, list[float]], latency: list[float] | None = None
) -> dict[str, Any]:
    return {
        "worker": worker,
        "t0": t0,
        "t1": t0 + 0.1,
        "buckets": {str(b): entry for b, entry in buckets.items()},
        "latency": latency or [],
    }


HISTORY = [
    line("w1", 10.0, {0: [5, 10.0, 10.09], 1: [5, 10.0, 10.09]}, [0.001, 0.002]),
    line("w1", 10.1, {0: [5, 10.1, 10.15], 1: [5, 10.1, 10.19]}, [0.003]),
    line("w2", 10.4, {0: [4, 10.45, 10.49]}, [0.050]),  # bucket 0 moved to w2
    line("w1", 10.4, {1: [5, 10.4, 10.49]}),
]


def test_consumed_and_last_start() -> None:
    assert figures.consumed(HISTORY) == 29
    assert figures.last_start(HISTORY) == pytest.approx(10.49)


def test_the_handover_gap_runs_from_the_old_owners_last_start_to_the_new_owners_first() -> None:
    moved = figures.held(HISTORY, "w2", 10.3, 11.0)
    assert moved == {0}
    assert figures.handover_gaps(HISTORY, moved, "w1", "w2") == [pytest.approx(0.30)]


def test_the_handover_pause_counts_from_the_first_message_s_publish_if_it_came_later() -> None:
    """The new owner's first message was published at 10.40, 0.25 s after the old owner's last
    start: it waited 0.05 s, not the 0.30 s gap; published before that last start, it waited
    from then. Records without the publish time count from the last start."""
    later = [*HISTORY[:2], line("w2", 10.4, {0: [4, 10.45, 10.49, 10.40]})]
    earlier = [*HISTORY[:2], line("w2", 10.4, {0: [4, 10.45, 10.49, 10.10]})]
    assert figures.handover_pauses(later, [0], "w1", "w2") == [pytest.approx(0.05)]
    assert figures.handover_pauses(earlier, [0], "w1", "w2") == [pytest.approx(0.30)]
    assert figures.handover_pauses(HISTORY, [0], "w1", "w2") == [pytest.approx(0.30)]


def test_recovery_counts_only_other_workers() -> None:
    assert figures.recovery_times(HISTORY, [0], 10.2, "w1") == [pytest.approx(0.25)]
    assert figures.recovery_times(HISTORY, [0], 10.2, "w2") == []


def test_rate_of_chosen_buckets_over_whole_intervals() -> None:
    assert figures.rate(HISTORY, {1}, 10.0, 10.2) == pytest.approx(50.0)
    assert figures.rate(HISTORY, {0}, 10.0, 10.2) == pytest.approx(50.0)
    assert figures.rate(HISTORY, {0}, 10.2, 10.5) == pytest.approx(4 / 0.3)


def test_latency_percentiles_in_milliseconds() -> None:
    result = figures.latency_ms(HISTORY, 0, 100)
    assert (result["p50_ms"], result["p99_ms"], result["samples"]) == (2.0, 50.0, 4)


def test_a_body_carries_its_publish_time() -> None:
    body = stamp(100)
    assert len(body) == 100
    assert abs(published_at(body) - time.time()) < 5
