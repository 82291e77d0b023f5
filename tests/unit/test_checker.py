"""The one checker (``tools.checker``) must be able to fail: synthetic histories with known
faults, no servers. And the recovery times of a chaos run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tools.chaos.recovery import recoveries
from tools.checker import Checker, Execution, Violation, check, judge
from tools.executions import read_appended


def run(
    key: str,
    seq: int,
    start: float,
    end: float,
    epoch: int | None = 1,
    worker: str = "w1",
    bucket: int = 0,
) -> dict[str, Any]:
    return {
        "key": key,
        "seq": seq,
        "start": start,
        "end": end,
        "epoch": epoch,
        "worker": worker,
        "bucket": bucket,
    }


def sent(*messages: tuple[str, int]) -> list[dict[str, Any]]:
    return [{"key": key, "seq": seq} for key, seq in messages]


def test_a_clean_history_is_clean() -> None:
    verdict = judge(
        sent(("a", 0), ("a", 1), ("b", 0)),
        [run("a", 0, 0, 1), run("a", 1, 1, 2), run("b", 0, 0.5, 3)],
        set(),
    )
    assert verdict.clean
    assert (len(verdict.lost), len(verdict.reordered), len(verdict.duplicates), verdict.keys) == (
        0,
        0,
        0,
        2,
    )


def test_missing_messages_are_lost_unless_dead_lettered_or_still_queued() -> None:
    verdict = judge(
        sent(("a", 0), ("a", 1), ("a", 2), ("a", 3)), [run("a", 0, 0, 1)], {("a", 1)}, {("a", 2)}
    )
    assert (len(verdict.lost), verdict.dead_lettered, len(verdict.unfinished)) == (1, 1, 1)
    assert verdict.lost == [("a", 3)]
    assert not verdict.clean


def test_a_lower_seq_after_a_higher_one_completed_is_a_reordering() -> None:
    verdict = judge(sent(("a", 0), ("a", 1)), [run("a", 1, 0, 1), run("a", 0, 2, 3)], set())
    assert len(verdict.reordered) == 1
    assert not verdict.clean


def test_a_repeat_of_a_message_in_flight_at_a_crash_is_a_duplicate_not_a_reordering() -> None:
    history = [
        run("a", 0, 0, 1),
        run("a", 1, 1, 2),
        run("a", 1, 3, 4, epoch=2),
        run("a", 2, 4, 5, epoch=2),
    ]
    verdict = judge(sent(("a", 0), ("a", 1), ("a", 2)), history, set())
    assert (len(verdict.reordered), len(verdict.duplicates)) == (0, 1)
    assert verdict.clean


def test_overlaps_are_split_by_fencing_token() -> None:
    same_epoch = judge(sent(("a", 0), ("a", 1)), [run("a", 0, 0, 2), run("a", 1, 1, 3)], set())
    zombie = judge(sent(("a", 0), ("a", 1)), [run("a", 0, 0, 2), run("a", 1, 1, 3, epoch=2)], set())
    no_token = judge(
        sent(("a", 0), ("a", 1)),
        [run("a", 0, 0, 2, epoch=None, worker="x"), run("a", 1, 1, 3, epoch=None, worker="y")],
        set(),
    )
    assert (len(same_epoch.overlapping_same_epoch), len(same_epoch.overlapping_zombie)) == (1, 0)
    assert (len(zombie.overlapping_same_epoch), len(zombie.overlapping_zombie)) == (0, 1)
    assert (len(no_token.overlapping_same_epoch), len(no_token.overlapping_zombie)) == (1, 0)
    assert zombie.clean and not same_epoch.clean and not no_token.clean


def test_a_same_epoch_overlap_is_seen_while_an_older_epoch_run_is_still_going() -> None:
    """The first checker compared each run only with the one ending last so far (here the
    zombie), and called the pair a zombie overlap."""
    history = [
        run("a", 0, 0, 10, epoch=1, worker="zombie"),
        run("a", 1, 2, 4, epoch=2, worker="w2"),
        run("a", 2, 3, 5, epoch=2, worker="w2"),
    ]
    verdict = judge(sent(("a", 0), ("a", 1), ("a", 2)), history, set())
    assert (len(verdict.overlapping_zombie), len(verdict.overlapping_same_epoch)) == (2, 1)
    assert not verdict.clean


def test_an_older_epoch_starting_after_a_newer_one_began_is_a_stale_start() -> None:
    """A fenced owner starts nothing more: not the key the new owner runs, nor any other."""
    other_key = judge(
        sent(("a", 0), ("b", 0)),
        [run("a", 0, 0, 1, epoch=2, worker="w2"), run("b", 0, 2, 3, epoch=1, worker="w1")],
        set(),
    )
    same_key = judge(
        sent(("a", 0), ("a", 1)),
        [run("a", 1, 0, 2, epoch=2, worker="w2"), run("a", 0, 1, 3, epoch=1, worker="w1")],
        set(),
    )
    assert (len(other_key.stale_starts), len(other_key.overlapping_zombie)) == (1, 0)
    assert (len(same_key.stale_starts), len(same_key.overlapping_stale)) == (1, 1)
    assert not other_key.clean and not same_key.clean
    assert other_key.stale_starts == [
        "key b seq 0 (bucket 0 epoch 1) on w1, bucket already started at epoch 2"
    ]


def test_two_live_owners_alternating_epochs_are_stale_starts() -> None:
    history = [
        run("a", 0, 0, 1, epoch=1, worker="w1"),
        run("a", 1, 1, 2, epoch=2, worker="w2"),
        run("a", 2, 2, 3, epoch=1, worker="w1"),
        run("a", 3, 3, 4, epoch=2, worker="w2"),
    ]
    verdict = judge(sent(*(("a", n) for n in range(4))), history, set())
    assert len(verdict.stale_starts) == 1 and not verdict.clean


def test_a_zombie_run_begun_before_the_new_epoch_is_no_stale_start() -> None:
    history = [run("a", 0, 0, 5, epoch=1, worker="w1"), run("a", 0, 1, 2, epoch=2, worker="w2")]
    verdict = judge(sent(("a", 0)), history, set())
    assert (
        len(verdict.stale_starts),
        len(verdict.overlapping_zombie),
        len(verdict.duplicates),
    ) == (0, 1, 1)
    assert verdict.clean


def _write(path: Path, runs: list[tuple[str, int, float, float]]) -> None:
    lines = [
        json.dumps({"key": k, "seq": s, "start": a, "end": b, "outcome": "ok"})
        for k, s, a, b in runs
    ]
    path.write_text("\n".join(lines) + "\n")


def test_clean_history_passes(tmp_path: Path) -> None:
    _write(tmp_path / "r", [("a", 0, 0, 1), ("a", 1, 1, 2), ("b", 0, 0.5, 3)])
    report = check(tmp_path / "r", {"a": 2, "b": 1})
    assert (report.lost, report.reordered, report.overlaps, report.repeats) == ([], [], [], [])


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
    assert report.lost == [("a", 2)]
    assert report.reordered == [
        "key a seq 0 (bucket 0 epoch None) on ? first started after seq 1 completed"
    ]
    assert report.overlaps == ["key b seq 2 (bucket 0 epoch None) on ? while seq 1 runs on ?"]
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


def fault(kind: str, target: str, wall: float, until: float | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"fault": kind, "target": target, "wall": wall, "at": wall}
    if until is not None:
        entry["until"] = until
    return entry


def test_recovery_of_a_killed_workers_buckets_is_the_first_start_elsewhere() -> None:
    history = [
        run("a", 0, 99.0, 99.1, worker="w1", bucket=0),
        run("b", 0, 99.5, 99.6, worker="w1", bucket=1),
        run("c", 0, 99.5, 99.6, worker="w2", bucket=2),
        run("a", 1, 100.5, 100.6, worker="w1", bucket=0),  # the victim's in-hand work
        run("a", 2, 102.0, 102.1, worker="w2", bucket=0),
        run("b", 1, 103.0, 103.1, worker="w3", bucket=1),
    ]
    result = recoveries([fault("kill -9 worker", "w1", 100.0)], history)
    assert result["faults"][0]["buckets"] == 2
    assert result["faults"][0]["recovered_s"] == 3.0
    assert result["by_kind"]["kill -9 worker"]["unrecovered_buckets"] == 0


def test_a_bucket_nobody_takes_over_is_unrecovered() -> None:
    history = [run("a", 0, 99.0, 99.1, worker="w1", bucket=0)]
    result = recoveries([fault("SIGSTOP worker", "w1", 100.0)], history)
    assert result["by_kind"]["SIGSTOP worker"] == {
        "faults": 1,
        "median_s": None,
        "worst_s": None,
        "unrecovered_buckets": 1,
    }


def test_a_restart_counts_from_its_beginning_to_the_first_start_after_it_ended() -> None:
    history = [
        run("a", 0, 99.0, 99.1, bucket=0),
        run("a", 1, 101.0, 101.1, bucket=0),  # during the restart: does not count
        run("a", 2, 117.0, 117.1, bucket=0),
    ]
    result = recoveries([fault("restart rabbitmq", "", 100.0, until=116.0)], history)
    assert result["faults"][0]["recovered_s"] == 17.0


def test_a_new_worker_recovers_when_it_starts_working() -> None:
    history = [run("a", 0, 99.0, 99.1, worker="w1"), run("a", 1, 104.5, 104.6, worker="w9")]
    result = recoveries([fault("start worker", "w9", 100.0)], history)
    assert result["faults"][0]["recovered_s"] == 4.5


def test_the_simulations_strict_checker_stops_at_the_first_violation() -> None:
    """The simulation feeds executions as they start and end on virtual time; the first
    broken guarantee raises, its kind first, as ``tools.sim.run`` shrinks by it."""
    checker = Checker(strict=True)
    zombie = checker.start(Execution("a", 0, bucket=3, epoch=1, started=0.0, worker="w1"))
    checker.start(Execution("a", 0, bucket=3, epoch=2, started=1.0, worker="w2"))  # a zombie
    checker.end(zombie)
    assert len(checker.verdict.overlapping_zombie) == 1 and checker.newest_start(3) == 2
    with pytest.raises(Violation, match=r"^stale start: key b seq 0 \(bucket 3 epoch 1\)"):
        checker.start(Execution("b", 0, bucket=3, epoch=1, started=2.0, worker="w1"))


def test_a_key_running_in_two_buckets_at_once_is_a_stale_overlap_whatever_the_epochs() -> None:
    """Epochs of two buckets say nothing of each other: a key routed to two buckets is a bug,
    never a fenced zombie."""
    history = [run("a", 0, 0, 2, epoch=1, bucket=0), run("a", 1, 1, 3, epoch=2, bucket=5)]
    verdict = judge(sent(("a", 0), ("a", 1)), history, set())
    assert (len(verdict.overlapping_stale), verdict.overlapping_zombie) == (1, [])
    assert not verdict.clean and verdict.bugs[0].startswith("stale overlap: key a seq 1")


def test_a_test_judges_only_the_keys_it_expects(tmp_path: Path) -> None:
    _write(tmp_path / "r", [("a", 0, 0, 1), ("left-out", 1, 0, 1), ("left-out", 0, 2, 3)])
    report = check(tmp_path / "r", {"a": 1})
    assert (report.bugs, report.executions) == ([], 1)


def test_a_failed_attempt_is_no_execution(tmp_path: Path) -> None:
    """A handler that raised recorded outcome "failed": its message is not done by it."""
    lines = [
        {"key": "a", "seq": 0, "start": 0, "end": 1, "outcome": "failed"},
        {"key": "a", "seq": 1, "start": 2, "end": 3, "outcome": "ok"},
    ]
    (tmp_path / "r").write_text("".join(json.dumps(line) + "\n" for line in lines))
    report = check(tmp_path / "r", {"a": 2})
    assert (report.lost, report.executions, report.duplicates) == ([("a", 0)], 1, [])


def test_a_lasting_fault_says_how_soon_its_buckets_went_on_after_it_healed() -> None:
    history = [
        run("a", 0, 99.0, 99.1, worker="w1", bucket=0),
        run("a", 1, 112.5, 112.6, worker="w1", bucket=0),  # 2.5 s after the heal
    ]
    cut = fault("cut zookeeper worker", "w1", 100.0, until=110.0)
    (result,) = recoveries([cut], history)["faults"]
    assert (result["recovered_s"], result["after_heal_s"]) == (12.5, 2.5)


def test_the_longest_stall_of_each_bucket_names_the_fault_in_force() -> None:
    history = [
        run("a", 0, 90.0, 90.1, bucket=0),
        run("a", 1, 91.0, 91.1, bucket=0),
        run("a", 2, 105.0, 105.1, bucket=0),  # 14 s without a start, across the cut
        run("b", 0, 90.0, 90.1, bucket=1),
        run("b", 1, 92.0, 92.1, bucket=1),  # 2 s, before any fault
    ]
    faults = [fault("cut amqp worker", "w1", 95.0, until=104.0), fault("start worker", "w9", 200)]
    worst, other = recoveries(faults, history)["stalls"]
    assert (worst["bucket"], worst["seconds"], worst["causes"]) == (0, 14.0, ["cut amqp worker w1"])
    assert (other["bucket"], other["seconds"], other["causes"]) == (1, 2.0, [])


def test_a_moved_key_s_zombie_in_its_old_bucket_is_a_fenced_zombie_only_once_replaced() -> None:
    """A resize moved key a from bucket 1 to bucket 8. Its run in bucket 1 at epoch 6 overlaps
    its next run in bucket 8 at epoch 8: a fenced zombie if bucket 1 has started a newer epoch
    since (its owner was cut off), a stale overlap (the barrier broken) if not."""
    old = run("a", 0, 0, 10, epoch=6, worker="zombie", bucket=1)
    moved = run("a", 1, 5, 6, epoch=8, worker="w2", bucket=8)
    replaced = run("b", 0, 2, 3, epoch=7, worker="w2", bucket=1)
    fenced = judge(sent(("a", 0), ("a", 1), ("b", 0)), [old, replaced, moved], set())
    assert (len(fenced.overlapping_zombie), len(fenced.overlapping_stale)) == (1, 0)
    assert fenced.clean
    broken = judge(sent(("a", 0), ("a", 1)), [old, moved], set())
    assert (len(broken.overlapping_zombie), len(broken.overlapping_stale)) == (0, 1)
    assert not broken.clean
