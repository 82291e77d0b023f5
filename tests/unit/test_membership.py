"""The worker's session bookkeeping (``WorkerMachine``), with ZooKeeper's answers arriving at
the worst moment: only a timing exposes these holes."""

from __future__ import annotations

from hashq.records import Assignment
from hashq.worker.machine import events as ev
from hashq.worker.machine.core import WorkerMachine
from hashq.worker.machine.states import WorkerState
from tests.support.machines import registered_worker


def _registered() -> WorkerMachine:
    return registered_worker(withdraw_after=5)


def test_a_session_check_answered_before_a_second_pause_does_not_resume_the_worker() -> None:
    """The worker asks ZooKeeper whether its session lives; ZooKeeper says yes; before the
    answer is applied the process is paused again, long enough for the session to expire. The
    watchdog notices the second pause. The old answer must not make the worker resume."""
    machine = _registered()
    actions = machine.handle(ev.PauseSeen(3.0), 1.0)  # the first pause
    assert ev.PauseRunners() in actions
    (asked,) = [a for a in actions if isinstance(a, ev.ConfirmSession)]
    machine.handle(ev.PauseSeen(3.0), 2.0)  # a second pause while the answer was on its way
    actions = machine.handle(ev.SessionConfirmed(asked.asked, ev.Session.CONNECTED), 2.1)
    assert machine.session is ev.Session.SUSPENDED
    assert ev.ResumeRunners() not in actions
    (again,) = [a for a in actions if isinstance(a, ev.ConfirmSession)]  # asked again at once

    actions = machine.handle(ev.SessionConfirmed(again.asked, ev.Session.CONNECTED), 3.1)
    assert _session(machine) is ev.Session.CONNECTED  # (a call: mypy narrowed the attribute)
    assert ev.ResumeRunners() in actions


def test_an_older_assignment_read_late_is_not_taken() -> None:
    machine = _registered()
    machine.handle(ev.AssignmentRead(10, Assignment("i1", {0: 2})), 1.0)
    machine.handle(ev.AssignmentRead(7, Assignment("i1", {0: 1, 1: 1})), 1.1)
    assert machine.grants() == {0: 2}


def test_a_bucket_is_released_only_once_its_handlers_returned() -> None:
    """Revoked while a handler thread runs on: drained, closed, held; released only after."""
    machine = _registered()
    (subscribe,) = machine.handle(ev.AssignmentRead(1, Assignment("i1", {0: 1})), 1.0)
    assert isinstance(subscribe, ev.Subscribe)
    machine.handle(ev.Subscribed(subscribe.lease), 1.1)
    assert machine.state is WorkerState.RUNNING
    (drain,) = machine.handle(ev.AssignmentRead(2, Assignment("i1", {})), 2.0)
    assert isinstance(drain, ev.Drain)
    assert machine.handle(ev.Closed(drain.lease, running=1), 3.0) == []
    (release,) = machine.handle(ev.Settled(drain.lease), 9.0)
    assert release == ev.WriteRelease(drain.lease, 0, 1, "i1")


def test_a_worker_without_rabbitmq_withdraws_then_registers_again_on_its_own_timer() -> None:
    """Withdrawn after ``withdraw_after`` without a connection; then it must begin again by
    itself (the simulation found it waiting for an unrelated event, seed 16)."""
    machine = _registered()
    machine.handle(ev.LinkLost(1), 1.0)  # reconnecting
    machine.handle(ev.LinkFailed("refused"), 1.2)
    suspended = machine.handle(ev.SessionChanged(ev.Session.SUSPENDED), 1.5)  # ZooKeeper too
    later = machine.handle(ev.Tick(), 2.5)
    (asked,) = [a for a in suspended + later if isinstance(a, ev.ConfirmSession)]
    machine.handle(ev.SessionChanged(ev.Session.CONNECTED), 6.9)  # the client reconnected
    actions = machine.handle(ev.SessionConfirmed(asked.asked, ev.Session.CONNECTED), 7.0)
    assert ev.Withdraw() in actions  # RabbitMQ is still out of reach, for 6 s now
    assert machine.state is WorkerState.WITHDRAWN
    assert machine.wake_at is not None
    assert ev.BeginIncarnation() in machine.handle(ev.Tick(), machine.wake_at)


def _session(machine: WorkerMachine) -> ev.Session:
    return machine.session
