"""The chaos checker and the recovery times must be able to fail: synthetic histories with
known faults, no servers."""

from __future__ import annotations

from typing import Any

from tools.chaos.checker import judge
from tools.chaos.recovery import recoveries


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
    assert (verdict.lost, verdict.reordered, verdict.duplicates, verdict.keys) == (0, 0, 0, 2)


def test_missing_messages_are_lost_unless_dead_lettered_or_still_queued() -> None:
    verdict = judge(
        sent(("a", 0), ("a", 1), ("a", 2), ("a", 3)), [run("a", 0, 0, 1)], {("a", 1)}, {("a", 2)}
    )
    assert (verdict.lost, verdict.dead_lettered, verdict.unfinished) == (1, 1, 1)
    assert verdict.examples["lost"] == ["a#3"]
    assert not verdict.clean


def test_a_lower_seq_after_a_higher_one_completed_is_a_reordering() -> None:
    verdict = judge(sent(("a", 0), ("a", 1)), [run("a", 1, 0, 1), run("a", 0, 2, 3)], set())
    assert verdict.reordered == 1
    assert not verdict.clean


def test_a_repeat_of_a_message_in_flight_at_a_crash_is_a_duplicate_not_a_reordering() -> None:
    history = [
        run("a", 0, 0, 1),
        run("a", 1, 1, 2),
        run("a", 1, 3, 4, epoch=2),
        run("a", 2, 4, 5, epoch=2),
    ]
    verdict = judge(sent(("a", 0), ("a", 1), ("a", 2)), history, set())
    assert (verdict.reordered, verdict.duplicates) == (0, 1)
    assert verdict.clean


def test_overlaps_are_split_by_fencing_token() -> None:
    same_epoch = judge(sent(("a", 0), ("a", 1)), [run("a", 0, 0, 2), run("a", 1, 1, 3)], set())
    zombie = judge(sent(("a", 0), ("a", 1)), [run("a", 0, 0, 2), run("a", 1, 1, 3, epoch=2)], set())
    no_token = judge(
        sent(("a", 0), ("a", 1)),
        [run("a", 0, 0, 2, epoch=None, worker="x"), run("a", 1, 1, 3, epoch=None, worker="y")],
        set(),
    )
    assert (same_epoch.overlapping_same_epoch, same_epoch.overlapping_zombie) == (1, 0)
    assert (zombie.overlapping_same_epoch, zombie.overlapping_zombie) == (0, 1)
    assert (no_token.overlapping_same_epoch, no_token.overlapping_zombie) == (1, 0)
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
    assert (verdict.overlapping_zombie, verdict.overlapping_same_epoch) == (2, 1)
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
    assert (other_key.stale_starts, other_key.overlapping_zombie) == (1, 0)
    assert (same_key.stale_starts, same_key.overlapping_stale) == (1, 1)
    assert not other_key.clean and not same_key.clean
    assert other_key.examples["stale_starts"] == ["bucket 0: b#0 at epoch 1 after epoch 2 began"]


def test_two_live_owners_alternating_epochs_are_stale_starts() -> None:
    history = [
        run("a", 0, 0, 1, epoch=1, worker="w1"),
        run("a", 1, 1, 2, epoch=2, worker="w2"),
        run("a", 2, 2, 3, epoch=1, worker="w1"),
        run("a", 3, 3, 4, epoch=2, worker="w2"),
    ]
    verdict = judge(sent(*(("a", n) for n in range(4))), history, set())
    assert verdict.stale_starts == 1 and not verdict.clean


def test_a_zombie_run_begun_before_the_new_epoch_is_no_stale_start() -> None:
    history = [run("a", 0, 0, 5, epoch=1, worker="w1"), run("a", 0, 1, 2, epoch=2, worker="w2")]
    verdict = judge(sent(("a", 0)), history, set())
    assert (verdict.stale_starts, verdict.overlapping_zombie, verdict.duplicates) == (0, 1, 1)
    assert verdict.clean


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
