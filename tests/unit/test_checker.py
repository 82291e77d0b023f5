"""The test checker itself must be able to fail: synthetic records with known faults."""

from __future__ import annotations

import json
from pathlib import Path

from hashq.admin.jobs_file import read_appended
from tests.support.workers import check


def _write(path: Path, runs: list[tuple[str, int, float, float]]) -> None:
    lines = [
        json.dumps({"key": k, "seq": s, "start": a, "end": b, "outcome": "ok"})
        for k, s, a, b in runs
    ]
    path.write_text("\n".join(lines) + "\n")


def test_clean_history_passes(tmp_path: Path) -> None:
    _write(tmp_path / "r", [("a", 0, 0, 1), ("a", 1, 1, 2), ("b", 0, 0.5, 3)])
    report = check(tmp_path / "r", {"a": 2, "b": 1})
    assert (report.missing, report.skipped_ahead, report.overlaps, report.repeats) == (
        [],
        [],
        [],
        [],
    )


def test_each_fault_is_reported(tmp_path: Path) -> None:
    _write(
        tmp_path / "r",
        [
            ("a", 1, 0, 1),  # before 0: reordered
            ("a", 0, 2, 3),
            ("b", 0, 0, 5),
            ("b", 1, 6, 7),
            ("b", 2, 6.5, 8),  # overlaps 1
            ("b", 2, 9, 10),  # repeat
        ],
    )
    report = check(tmp_path / "r", {"a": 3, "b": 3})
    assert report.missing == [("a", 2)]
    assert report.skipped_ahead == ["a: 1 before 0"]
    assert report.overlaps == ["b: 1 and 2"]
    assert [(r["key"], r["seq"]) for r in report.repeats] == [("b", 2)]


def test_records_torn_by_a_concurrent_or_killed_writer_are_read_as_far_as_complete(
    tmp_path: Path,
) -> None:
    whole = [json.dumps({"key": "a", "seq": n, "outcome": "ok"}) for n in range(3)]
    path = tmp_path / "r"
    # a kill -9 mid-write left half of seq 1, the next record was appended to it, and a
    # writer is still in the middle of its line at the end
    path.write_text(f"{whole[0]}\n{whole[1][:9]}{whole[2]}\n{whole[1][:5]}")
    assert [r["seq"] for r in read_appended(path)] == [0, 2]
    assert read_appended(tmp_path / "absent") == []
