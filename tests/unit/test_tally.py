"""Reading a run's records as they grow: only what was added since the last look is read, a
line counts once its newline is there, and an execution read before its confirmation still
counts as done."""

from __future__ import annotations

import json
from pathlib import Path

from tools.chaos.tally import Tally
from tools.executions import Growing


def _line(key: str, seq: int) -> str:
    return json.dumps({"key": key, "seq": seq}) + "\n"


def _append(path: Path, text: str) -> None:
    with path.open("a") as file:
        file.write(text)


def test_a_growing_file_gives_each_record_once_and_a_half_line_once_it_is_whole(
    tmp_path: Path,
) -> None:
    path = tmp_path / "record"
    growing, counting = Growing(path), Growing(path)
    assert growing.records() == [] and counting.count() == 0  # not there yet
    whole = _line("a", 1)
    _append(path, _line("a", 0) + whole[:7])  # a writer in the middle of its line
    assert [r["seq"] for r in growing.records()] == [0]
    assert counting.count() == 1
    _append(path, whole[7:] + _line("a", 2))
    assert [r["seq"] for r in growing.records()] == [1, 2]
    assert growing.records() == []
    assert counting.count() == 3


def test_the_tally_leaves_out_what_ran_before_its_confirmation_was_written(
    tmp_path: Path,
) -> None:
    confirmed, record = tmp_path / "confirmed", tmp_path / "record"
    tally = Tally([confirmed], record)
    _append(record, _line("k", 0))  # the handler ran before the publisher wrote the confirm
    tally.look()
    _append(confirmed, _line("k", 0) + _line("k", 1))
    tally.look()
    assert (tally.sent, tally.executions, tally.left) == (2, 1, {("k", 1)})
    _append(record, _line("k", 1) + _line("k", 1))  # and a duplicate
    tally.look()
    assert (tally.executions, tally.left) == (3, set())


def test_a_line_torn_by_a_killed_writer_gives_the_record_appended_to_it_across_looks(
    tmp_path: Path,
) -> None:
    path = tmp_path / "record"
    growing = Growing(path)
    _append(path, _line("a", 0) + _line("a", 1)[:9])  # killed -9 in the middle of seq 1
    assert [r["seq"] for r in growing.records()] == [0]
    _append(path, _line("a", 2))  # the next writer appends to the torn part
    assert [r["seq"] for r in growing.records()] == [2]
