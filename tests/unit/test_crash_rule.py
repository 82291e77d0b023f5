"""The crash rule of the coordinator's machine, without I/O: a worker whose AMQP connection
closed (the broker's event) and that holds none once the crash grace has passed is expelled;
one that came back, or whose question the broker could not answer, is left alone. And the
observation that a watch or a suspect asks for while one is under way is not left to the next
tick."""

from __future__ import annotations

from hashq.records import (
    BROKER_CONTACT_SECONDS,
    BucketState,
    Registration,
    parse_worker_connection_name,
)
from hashq_coordinator.crashes import events_url
from hashq_coordinator.machine import events as cm
from hashq_coordinator.machine.core import CoordinatorMachine

GRACE = 0.5
W1, W2 = ("w1", "i1"), ("w2", "i2")


def _workers(*incarnations: tuple[str, str]) -> dict[str, Registration]:
    return {
        w: Registration(
            w,
            i,
            capacity=1,
            connection=f"hashq-worker-{w}-{i}-1",
            contact_seconds=BROKER_CONTACT_SECONDS,
        )
        for w, i in incarnations
    }


def closed(incarnation: tuple[str, str], number: int = 1) -> cm.ConnectionClosed:
    """The broker's word that connection ``number`` of ``incarnation`` closed (the first is the
    one ``_workers`` announces)."""
    return cm.ConnectionClosed(
        incarnation, f"hashq-worker-{incarnation[0]}-{incarnation[1]}-{number}"
    )


def _leading() -> CoordinatorMachine:
    """A leader that granted four buckets to w1 and w2 and committed them."""
    machine = CoordinatorMachine(
        "c", 4, settle=0.0, drain_timeout=5, fence_grace=1, crash_grace=GRACE
    )
    machine.handle(cm.LockAcquired(), 0.0)
    assert machine.handle(cm.Elected(1, 0, {}, {}), 0.0) == [cm.Observe(())]
    commit = machine.handle(cm.Observed(_workers(W1, W2), {}, {"w1": 0, "w2": 0}), 0.1)
    assert isinstance(commit[0], cm.Commit)
    machine.handle(cm.Committed(), 0.2)
    return machine


def _owned_by(machine: CoordinatorMachine, worker: str) -> list[int]:
    return sorted(b for b, r in machine.records.items() if r.owner == worker)


def test_a_closed_connection_is_asked_about_once_the_grace_has_passed() -> None:
    machine = _leading()
    assert machine.handle(closed(W1), 1.0) == [cm.Wake(GRACE)]
    assert machine.handle(closed(W1), 1.1) == [cm.Wake(GRACE)]  # from the newest
    assert machine.handle(cm.Tick(), 1.5) == [cm.Observe(())]  # within its grace: not asked
    machine.handle(cm.Observed(_workers(W1, W2), {}, {"w1": 0, "w2": 0}), 1.55)
    assert machine.handle(cm.Tick(), 1.6) == [cm.Observe((W1,))]


def test_a_watch_that_fires_during_an_observation_is_observed_as_soon_as_it_is_done() -> None:
    """A release written while the leader observes used to wait for the next tick (0.5 s),
    which was most of a planned handover's pause (docs/benchmarks.md)."""
    machine = _leading()
    assert machine.handle(cm.Tick(), 1.0) == [cm.Observe(())]
    assert machine.handle(cm.Tick(), 1.01) == []  # the release's watch: busy
    again = machine.handle(cm.Observed(_workers(W1, W2), {}, {"w1": 0, "w2": 0}), 1.02)
    assert again == [cm.Observe(())]  # nothing to commit: at once
    joined = _workers(W1, W2, ("w3", "i3"))  # w3 joined: buckets are revoked for it
    commit = machine.handle(cm.Observed(joined, {}, {"w1": 0, "w2": 0, "w3": 0}), 1.03)
    assert isinstance(commit[0], cm.Commit)
    assert machine.handle(cm.Tick(), 1.04) == []  # busy committing
    assert machine.handle(cm.Committed(), 1.05) == [cm.Observe(())]


def test_a_suspect_that_closed_again_while_asked_is_asked_again() -> None:
    machine = _leading()
    machine.handle(closed(W1), 1.0)
    assert machine.handle(cm.Tick(), 1.5) == [cm.Observe((W1,))]
    machine.handle(closed(W1, 2), 1.55)  # its new connection closed too
    machine.handle(cm.Observed(_workers(W1, W2), {}, {"w1": 1, "w2": 0}), 1.6)  # it lived
    assert machine.handle(cm.Tick(), 2.1) == [cm.Observe((W1,))]


def test_a_worker_with_no_connection_left_is_expelled_and_its_buckets_fenced() -> None:
    machine = _leading()
    held = _owned_by(machine, "w1")
    machine.handle(closed(W1), 1.0)
    assert machine.handle(cm.Tick(), 1.5) == [cm.Observe((W1,))]
    actions = machine.handle(
        cm.Observed(_workers(W1, W2), {}, {"w1": 7, "w2": 0}, frozenset({W1})), 1.6
    )
    (commit,) = actions
    assert isinstance(commit, cm.Commit)
    assert commit.expelled == {"w1": 7}  # checked against the version read before the question
    assert "w1" in commit.removed
    assert sorted(commit.records) == held
    assert all(commit.records[b].state is BucketState.FENCING for b in held)
    fences = machine.handle(cm.Committed(), 1.7)
    assert cm.Fence(W1) in fences
    assert machine.expelled == 1 and ("w1", "i1") not in machine.members


def test_a_worker_that_came_back_within_the_grace_keeps_its_buckets() -> None:
    machine = _leading()
    held = _owned_by(machine, "w1")
    machine.handle(closed(W1), 1.0)
    machine.handle(cm.Tick(), 1.5)
    # The broker says a connection of it lives (or could not be asked): nothing moves.
    assert machine.handle(cm.Observed(_workers(W1, W2), {}, {"w1": 8, "w2": 0}), 1.6) == []
    assert _owned_by(machine, "w1") == held and machine.suspects == {}
    assert machine.handle(cm.Tick(), 2.5) == [cm.Observe(())]  # the suspicion is settled


def test_a_new_incarnation_of_the_same_worker_is_not_expelled_for_the_old_one() -> None:
    machine = _leading()
    machine.handle(closed(W1), 1.0)
    machine.handle(cm.Tick(), 1.5)
    actions = machine.handle(
        cm.Observed(_workers(("w1", "i9"), W2), {}, {"w1": 0, "w2": 0}, frozenset({W1})), 1.6
    )
    assert all(not a.expelled for a in actions if isinstance(a, cm.Commit))


def test_unknown_connections_and_followers_raise_no_suspicion() -> None:
    machine = _leading()
    assert machine.handle(closed(("w3", "i3")), 1.0) == []
    follower = CoordinatorMachine("d", 4, settle=0, drain_timeout=5, fence_grace=1)
    assert follower.handle(closed(W1), 1.0) == []
    assert machine.suspects == {} and follower.suspects == {}


def test_a_refused_expulsion_writes_nothing_and_the_leader_reads_again() -> None:
    machine = _leading()
    before = dict(machine.records)
    machine.handle(closed(W1), 1.0)
    machine.handle(cm.Tick(), 1.5)
    machine.handle(cm.Observed(_workers(W1, W2), {}, {"w1": 7, "w2": 0}, frozenset({W1})), 1.6)
    # Asked again at once: it will be found alive (or, if it died again, expelled then).
    assert machine.handle(cm.ExpelRefused("w1 changed"), 1.7) == [cm.Observe((W1,))]
    assert machine.role is cm.Role.LEADER and machine.records == before and machine.expelled == 0


def test_a_worker_connection_name_says_whose_it_is() -> None:
    assert parse_worker_connection_name("hashq-worker-host-12-ab-1a2b3c4d-3") == (
        "host-12-ab",
        "1a2b3c4d",
    )
    for other in ("hashq-worker-w1-i1", "hashq-coordinator-h-1-abc", "hashq-events-h-1-abc", ""):
        assert parse_worker_connection_name(other) is None


def test_the_event_exchange_is_reached_in_its_own_vhost() -> None:
    assert events_url("amqp://u:p@h:5672/app", "/") == "amqp://u:p@h:5672/%2F"
    assert events_url("amqps://h/x?heartbeat=5", "ev") == "amqps://h/ev?heartbeat=5"
