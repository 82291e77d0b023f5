"""The parked keys of one lease (``ParkedKeys``, through ``LeaseCore``), without I/O: each rule
of docs/protocol.md, "Parked keys", as the machine keeps it."""

from __future__ import annotations

from hashq.parked import ParkedRecord, ParkedState, bucket_of_parked_name, parked_name
from hashq.worker.machine import parking as pk
from hashq.worker.machine.lease import LeaseCore
from hashq.worker.machine.parking import Fate, Outcome, ParkPhase, RecordOp
from tests.support.machines import Job

EPOCH = 5


def lease(found: list[tuple[ParkedRecord, int]] | None = None) -> LeaseCore[Job]:
    core: LeaseCore[Job] = LeaseCore(3, EPOCH, "w1", parks=True)
    if found is not None:
        core.parked.load(found)
    return core


def actions(core: LeaseCore[Job], kind: type) -> list[object]:
    return [a for a in core.take() if isinstance(a, kind)]


def parked_key(core: LeaseCore[Job], key: str = "k") -> Job:
    """Park ``key``: its first message fails for good, and the record's create is confirmed.
    Returns that message, which is then dispatched to move."""
    first = core.deliver(1, Job(key, 1))[0]
    core.started(first, core.fate(first))
    core.park(first, "handler failed", 0.0)
    core.parked.record_result(key, RecordOp.CREATE, Outcome.DONE, version=0)
    return first


def test_nothing_of_the_bucket_goes_on_before_its_parked_keys_are_read() -> None:
    core = lease()
    assert core.deliver(1, Job("a", 1)) == []
    core.parked.load([])
    dispatched = [a.job for a in actions(core, pk.Dispatch)]  # type: ignore[attr-defined]
    assert [job.n for job in dispatched] == [1]


def test_a_key_moves_only_once_its_record_is_written() -> None:
    core = lease([])
    first = core.deliver(1, Job("k", 1))[0]
    core.started(first, core.fate(first))
    core.park(first, "handler failed", 0.0)
    assert core.parked.phase("k") is ParkPhase.CLAIMING
    [write] = actions(core, pk.WriteRecord)
    assert write.op is RecordOp.CREATE  # type: ignore[attr-defined]
    assert core.fate(first) is Fate.WAIT
    core.parked.record_result("k", RecordOp.CREATE, Outcome.DONE, version=0)
    assert core.parked.phase("k") is ParkPhase.PARKED
    assert core.fate(first) is Fate.MOVE


def test_a_parked_key_moves_its_messages_one_at_a_time_and_others_run() -> None:
    core = lease([])
    parked_key(core)
    core.take()
    assert core.deliver(2, Job("k", 2)) == []  # behind the failed one, which moves first
    [other] = core.deliver(3, Job("other", 1))
    assert core.fate(other) is Fate.RUN


def test_a_found_record_is_claimed_at_the_lease_s_epoch_before_anything_of_the_key_goes_on() -> (
    None
):
    record = ParkedRecord("k", 3, ParkedState.PARKED, EPOCH - 2)
    core = lease([(record, 7)])
    [claim] = actions(core, pk.WriteRecord)
    assert (claim.op, claim.version, claim.record.epoch) == (RecordOp.SET, 7, EPOCH)  # type: ignore[attr-defined]
    assert core.deliver(1, Job("k", 1)) == []
    core.parked.record_result("k", RecordOp.SET, Outcome.DONE, version=8)
    assert core.parked.phase("k") is ParkPhase.PARKED


def test_a_record_claimed_at_a_higher_epoch_loses_the_key_here() -> None:
    core = lease([(ParkedRecord("k", 3, ParkedState.PARKED, EPOCH - 1), 1)])
    core.take()
    core.parked.record_result("k", RecordOp.SET, Outcome.CHANGED)
    [read] = actions(core, pk.WriteRecord)
    assert read.op is RecordOp.READ  # type: ignore[attr-defined]
    newer = ParkedRecord("k", 3, ParkedState.PARKED, EPOCH + 1)
    core.parked.record_result("k", RecordOp.READ, Outcome.DONE, newer, 2)
    assert core.parked.phase("k") is ParkPhase.LOST
    assert actions(core, pk.WriteRecord) == []


def release(core: LeaseCore[Job]) -> None:
    record = ParkedRecord("k", 3, ParkedState.RELEASING, EPOCH)
    core.parked.seen("k", record, 5)


def test_a_released_key_flows_again_only_once_its_queue_proved_empty_twice() -> None:
    core = lease([])
    parked_key(core)
    core.take()
    release(core)
    assert actions(core, pk.ConsumeParked)
    core.parked.consuming("k")
    assert actions(core, pk.AskParked)
    core.parked.answered("k", 0, 0)  # no leader: proves nothing
    assert core.parked.phase("k") is ParkPhase.RELEASING
    core.take()
    core.parked.answered("k", 0, 2)  # a dead owner's consumer still counts: it may hold some
    assert core.parked.phase("k") is ParkPhase.RELEASING
    core.take()
    core.parked.answered("k", 0, 1)
    assert core.parked.phase("k") is ParkPhase.EMPTYING  # moves stop, then ask again
    core.parked.answered("k", 0, 1)
    assert core.parked.phase("k") is ParkPhase.UNPARKING
    taken = core.take()
    assert any(isinstance(a, pk.StopParked) for a in taken)  # the empty queue stays
    [delete] = [a for a in taken if isinstance(a, pk.WriteRecord)]
    assert (delete.op, delete.version) == (RecordOp.DELETE, 5)
    core.parked.record_result("k", RecordOp.DELETE, Outcome.DONE)
    assert core.parked.phase("k") is None


def test_a_key_stops_moving_and_waits_for_its_last_move_before_it_is_unparked() -> None:
    core = lease([])
    first = parked_key(core)
    core.started(first, core.fate(first))  # the failed message moves now
    release(core)
    core.parked.consuming("k")
    assert actions(core, pk.AskParked)
    core.parked.answered("k", 0, 1)
    assert core.parked.phase("k") is ParkPhase.EMPTYING  # proved empty once: moves stop
    assert actions(core, pk.AskParked) == []  # not while a message moves
    core.finished(first)
    assert actions(core, pk.AskParked)
    core.parked.answered("k", 0, 1)
    assert core.parked.phase("k") is ParkPhase.UNPARKING


def test_parked_messages_run_in_their_order_one_at_a_time() -> None:
    core = lease([])
    parked_key(core)
    release(core)
    core.parked.consuming("k")
    core.take()
    first, second = Job("k", 1, True), Job("k", 2, True)
    core.parked.delivered("k", 2, second)
    assert actions(core, pk.Dispatch) == []  # tag 1 first
    core.parked.delivered("k", 1, first)
    [dispatch] = actions(core, pk.Dispatch)
    assert dispatch.job is first  # type: ignore[attr-defined]
    assert core.fate(first) is Fate.RUN and core.fate(second) is Fate.GONE
    core.started(first, Fate.RUN)
    core.finished(first)
    [dispatch] = actions(core, pk.Dispatch)
    assert dispatch.job is second  # type: ignore[attr-defined]


def running_released(core: LeaseCore[Job]) -> Job:
    """Park ``k``, release it, and start its first parked message: returned."""
    parked_key(core)
    release(core)
    core.parked.consuming("k")
    core.take()
    job = Job("k", 1, True)
    core.parked.delivered("k", 1, job)
    core.take()
    core.started(job, core.fate(job))
    return job


def test_a_parking_channel_lost_under_a_running_handler_is_consumed_again_once_it_stopped() -> None:
    core = lease([])
    job = running_released(core)
    core.parked.parking_lost("k")  # a consumer_timeout, say: the message went back
    [cut] = core.take()
    assert isinstance(cut, pk.CutOff) and cut.job is job
    core.dropped(job)  # its handler stopped: now its redelivery may run
    assert actions(core, pk.ConsumeParked)


def test_a_released_message_that_fails_for_good_parks_its_key_again() -> None:
    core = lease([])
    job = running_released(core)
    core.park(job, "handler failed", 0.0)
    assert core.parked.phase("k") is ParkPhase.PARKED
    taken = core.take()
    assert any(isinstance(a, pk.StopParked) for a in taken)
    assert any(isinstance(a, pk.WriteRecord) and a.op is RecordOp.SET for a in taken)
    assert not any(isinstance(a, pk.CutOff) for a in taken)  # it returned: nothing to wait for


def test_a_dropped_key_dead_letters_what_is_parked_and_moves_nothing_more() -> None:
    core = lease([])
    parked_key(core)
    core.take()
    core.parked.seen("k", ParkedRecord("k", 3, ParkedState.DROPPING, EPOCH), 5)
    assert core.parked.phase("k") is ParkPhase.EMPTYING
    core.parked.consuming("k")
    job = Job("k", 1, True)
    core.parked.delivered("k", 1, job)
    assert core.fate(job) is Fate.DEAD_LETTER


def test_a_draining_lease_moves_again_what_an_emptying_key_held_back() -> None:
    core = lease([])
    parked_key(core)
    core.take()
    core.parked.seen("k", ParkedRecord("k", 3, ParkedState.DROPPING, EPOCH), 5)
    core.drain()
    assert core.parked.phase("k") is ParkPhase.RELEASING


def test_a_parked_record_s_name_holds_its_bucket() -> None:
    name = parked_name(12, "user/42 ü")
    assert bucket_of_parked_name(name) == 12
    assert bucket_of_parked_name("0012-short") is None
    record = ParkedRecord("user/42 ü", 12, ParkedState.RELEASING, 3, "why", 1.5, "w1")
    assert ParkedRecord.decode(record.encode()) == record


def test_a_key_holding_its_share_of_a_full_window_steps_aside_released_at_once() -> None:
    core: LeaseCore[Job] = LeaseCore(3, EPOCH, "w1", parks=True, hot_after=2, window=4)
    core.parked.load([])
    hot = [Job("h", n) for n in range(1, 4)]
    [first] = core.deliver(1, hot[0])
    core.deliver(2, hot[1])
    core.deliver(3, hot[2])
    [cold] = core.deliver(4, Job("c", 1))
    core.started(first, core.fate(first))
    assert core.finished(first) == []  # its next one waits while the key steps aside
    [create] = actions(core, pk.WriteRecord)
    assert (create.op, create.record.state, create.why) == (  # type: ignore[attr-defined]
        RecordOp.CREATE,
        ParkedState.RELEASING,
        "hot",
    )
    core.parked.record_result("h", RecordOp.CREATE, Outcome.DONE, version=0)
    taken = core.take()
    assert any(isinstance(a, pk.ConsumeParked) for a in taken)
    [moving] = [a.job for a in taken if isinstance(a, pk.Dispatch)]
    assert moving is hot[1] and core.fate(moving) is Fate.MOVE
    assert core.fate(cold) is Fate.RUN


def test_a_key_ahead_in_a_window_with_room_does_not_step_aside() -> None:
    core: LeaseCore[Job] = LeaseCore(3, EPOCH, "w1", parks=True, hot_after=2, window=8)
    core.parked.load([])
    jobs = [Job("h", n) for n in range(1, 4)]
    [first] = core.deliver(1, jobs[0])
    core.deliver(2, jobs[1])
    core.deliver(3, jobs[2])
    core.started(first, core.fate(first))
    assert core.finished(first) == [jobs[1]]
    assert actions(core, pk.WriteRecord) == []
