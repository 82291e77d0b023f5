"""Growing the bucket count (``hashq.resizing``), without I/O: the resizer's next step from what
it read, the records and markers, and a lease passing a marker only once everything delivered
before it is finished (``LeaseCore.passable``)."""

from __future__ import annotations

import pytest

from hashq.parked import ParkedRecord
from hashq.placement import bucket_of
from hashq.resizing import (
    MARKER_HEADER,
    ResizePhase,
    ResizeRecord,
    Step,
    marker_of,
    next_step,
    parse_passed_name,
    passed_buckets,
    passed_name,
)
from hashq.worker.machine.lease import LeaseCore
from tests.support.machines import Job


def test_a_resize_goes_begin_switch_mark_commit_done() -> None:
    assert next_step(24, 16, None, frozenset()).step is Step.BEGIN
    switching = ResizeRecord(16, 24)
    assert next_step(24, 16, switching, frozenset()).step is Step.SWITCH
    barrier = ResizeRecord(16, 24, ResizePhase.BARRIER)
    marking = next_step(24, 16, barrier, frozenset({0, 5}))
    assert marking.step is Step.MARK
    assert marking.buckets == tuple(b for b in range(16) if b not in (0, 5))
    assert next_step(24, 16, barrier, frozenset(range(16))).step is Step.COMMIT
    done = ResizeRecord(16, 24, ResizePhase.DONE)
    assert next_step(24, 24, done, frozenset()).step is Step.DONE
    assert next_step(64, 24, done, frozenset()).step is Step.BEGIN  # the next resize


def test_a_resize_refuses_to_shrink_and_to_overtake_one_under_way() -> None:
    shrink = next_step(8, 16, None, frozenset())
    assert shrink.step is Step.REFUSE and "shrinking" in shrink.why
    other = next_step(64, 16, ResizeRecord(16, 24, ResizePhase.BARRIER), frozenset())
    assert other.step is Step.REFUSE
    assert "hashq resize --buckets 24" in other.why


def test_only_the_markers_of_this_resize_count() -> None:
    names = [passed_name(24, 3), passed_name(64, 4), passed_name(24, 7), "something-else"]
    assert passed_buckets(names, 24) == frozenset({3, 7})
    assert passed_buckets(names, 64) == frozenset({4})
    assert parse_passed_name(passed_name(24, 3)) == (24, 3)
    assert parse_passed_name("passed-x-1") is None


def test_records_and_markers_round_trip_and_refuse_garbage() -> None:
    record = ResizeRecord(16, 24, ResizePhase.BARRIER)
    assert ResizeRecord.decode(record.encode()) == record
    with pytest.raises(ValueError, match="resize"):
        ResizeRecord.decode(b'{"old": 16, "new": 24, "phase": "sideways"}')
    assert marker_of({MARKER_HEADER: 24}) == 24
    assert marker_of(None) == marker_of({}) == marker_of({MARKER_HEADER: "24"}) == 0


@pytest.mark.parametrize(("old", "new"), [(3, 8), (16, 24), (24, 64), (64, 65), (1, 7)])
def test_growing_the_ring_moves_a_key_only_to_a_new_bucket(old: int, new: int) -> None:
    """The property the barrier rests on (jump consistent hashing, ``hashq.placement``)."""
    for n in range(3_000):
        before, after = bucket_of(f"key-{n}", old), bucket_of(f"key-{n}", new)
        assert after == before or old <= after < new


# ----------------------------------------------------------------------------- a lease's marker

BUCKET = 3


def lease(parks: bool = False) -> LeaseCore[Job]:
    return LeaseCore(BUCKET, 5, "w1", parks=parks)


def test_a_marker_passes_once_everything_before_it_finished_in_any_order() -> None:
    core = lease()
    a1, b1 = core.deliver(1, Job("a", 1))[0], core.deliver(2, Job("b", 1))[0]
    core.deliver(3, Job("a", 2))  # behind a1, before the marker
    marker = Job("", 0, marker=24)
    assert core.deliver(4, marker) == []  # a marker runs no handler
    c1 = core.deliver(5, Job("c", 1))[0]  # after the marker: not waited for
    assert core.passable() == []
    for job in (c1, b1):
        core.started(job)
        core.finished(job)
    assert core.passable() == []
    core.started(a1)
    a2 = core.finished(a1)[0]
    assert core.passable() == []
    core.started(a2)
    core.finished(a2)
    assert core.passable() == [marker]
    assert core.passable() == []  # handed out once
    assert not core.idle
    core.finished(marker)
    assert core.idle


def test_a_marker_of_a_closed_lease_never_passes() -> None:
    core = lease()
    marker = Job("", 0, marker=24)
    core.deliver(1, marker)
    core.close()
    assert core.passable() == []


def _moving_and_staying_keys(old: int, new: int) -> tuple[str, str]:
    keys = [f"k{n}" for n in range(5_000) if bucket_of(f"k{n}", old) == BUCKET]
    moving = next(k for k in keys if bucket_of(k, new) != BUCKET)
    staying = next(k for k in keys if bucket_of(k, new) == BUCKET)
    return moving, staying


def test_a_marker_waits_while_a_key_parked_here_moves_to_a_new_bucket() -> None:
    moving, staying = _moving_and_staying_keys(8, 24)
    for key, passes in ((staying, True), (moving, False)):
        core = lease(parks=True)
        marker = Job("", 0, marker=24)
        core.deliver(1, marker)
        assert core.passable() == []  # its bucket's parked keys are not read yet
        core.parked.load([(ParkedRecord(key, BUCKET, epoch=5), 0)])
        assert core.passable() == ([marker] if passes else [])
