"""Granting a fenced bucket before the return grace, without I/O: the bucket queue's word that
it took back everything (a quorum queue's passive declare), and the worker's bound on starts
after the broker last answered it, which the early grant waits out."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

import pytest

from hashq.records import (
    BROKER_CONTACT_SECONDS,
    RETURN_GRACE_SECONDS,
    BucketRecord,
    BucketState,
    queue_holds_nothing,
)
from hashq.worker.contact import ContactKeeper
from hashq.worker.machine.contact import BrokerContact
from hashq_coordinator.machine import events as cm
from hashq_coordinator.machine.core import CoordinatorMachine
from hashq_coordinator.machine.handover import View
from tests.unit.test_crash_rule import W1, W2, _leading, _owned_by, _workers, closed
from tests.unit.test_runner import _Blocking, _job, _Lease, _runners

FENCING = BucketRecord(BucketState.FENCING, "a", "1", 3, since=10.0)


def _view(
    now: float,
    emptied: frozenset[int] = frozenset(),
    closed_at: float | None = None,
    contact: float | None = BROKER_CONTACT_SECONDS,
) -> View:
    return View(
        1,
        {0: FENCING},
        {},
        frozenset(),
        frozenset({("a", "1")}),
        now,
        30.0,
        fences_done={("a", "1"): (11.0,)},
        emptied=emptied,
        closed_at={} if closed_at is None else {("a", "1"): closed_at},
        contact_bounds={} if contact is None else {("a", "1"): contact},
    )


def test_only_an_answer_with_ready_messages_and_no_consumer_proves_the_returns() -> None:
    assert queue_holds_nothing(ready=5, consumers=0)
    assert not queue_holds_nothing(ready=5, consumers=1)  # a consumer, perhaps cancelled, holds
    assert not queue_holds_nothing(
        ready=0, consumers=0
    )  # also what a queue that cannot answer says


def test_a_proven_bucket_is_granted_once_the_owner_can_start_nothing_more() -> None:
    done = 11.0
    assert not _view(done + BROKER_CONTACT_SECONDS - 0.01, frozenset({0})).returned(0, FENCING)
    assert _view(done + BROKER_CONTACT_SECONDS, frozenset({0})).returned(0, FENCING)
    assert not _view(done + RETURN_GRACE_SECONDS - 0.01).returned(0, FENCING)  # no word: the grace
    assert _view(done + RETURN_GRACE_SECONDS).returned(0, FENCING)


def test_an_owner_that_declared_no_contact_bound_waits_the_return_grace() -> None:
    """An older worker (no ``contact_seconds`` in its registration) may have a longer bound,
    or none: its proven bucket is granted only after the return grace; one that declared a
    longer bound is waited for that long."""
    done, proven = 11.0, frozenset({0})
    assert not _view(done + 1.0, proven, contact=None).returned(0, FENCING)
    assert not _view(done + RETURN_GRACE_SECONDS - 0.01, proven, contact=None).returned(0, FENCING)
    assert _view(done + RETURN_GRACE_SECONDS, proven, contact=None).returned(0, FENCING)
    assert not _view(done + 0.99, proven, contact=1.0).returned(0, FENCING)
    assert _view(done + 1.0, proven, contact=1.0).returned(0, FENCING)


def test_the_leader_keeps_the_bound_each_registration_declared() -> None:
    machine = _leading()
    older = {"w3": replace(_workers(("w3", "i3"))["w3"], contact_seconds=0.0)}
    machine.handle(cm.Tick(), 0.9)
    machine.handle(cm.Observed({**_workers(W1, W2), **older}, {}, {"w1": 0, "w2": 0}), 0.95)
    assert machine.book.contact_bounds() == {W1: BROKER_CONTACT_SECONDS, W2: BROKER_CONTACT_SECONDS}


def test_the_bound_runs_from_the_broker_s_word_that_the_fenced_connection_closed() -> None:
    """A crash: the broker said the owner's connection closed (9.0) before the expulsion's
    fence finished (11.0), so the bound has lapsed by then; heard only after the fence, the
    fence counts."""
    proven = frozenset({0})
    assert _view(11.0, proven, closed_at=9.0).returned(0, FENCING)
    assert not _view(11.0 + BROKER_CONTACT_SECONDS - 0.01, proven, closed_at=11.5).returned(
        0, FENCING
    )
    assert _view(11.0 + BROKER_CONTACT_SECONDS, proven, closed_at=11.5).returned(0, FENCING)
    assert not _view(11.0, closed_at=9.0).returned(0, FENCING)  # no word from the queue


def test_only_the_close_of_the_connection_the_fence_covered_starts_the_bound() -> None:
    """(After an observation shortly before, as the leader's ticks make: one more than a
    session apart takes the expelled worker's connection as unseen, which no word covers.)"""
    announced, other = _leading(), _leading()
    for machine in (announced, other):
        machine.handle(cm.Tick(), 0.9)
        machine.handle(cm.Observed(_workers(W1, W2), {}, {"w1": 0, "w2": 0}), 0.95)
    _expelled_and_fenced(announced, number=1)
    _expelled_and_fenced(other, number=2)
    for machine in (announced, other):
        machine.handle(cm.FenceDone(W1, machine.book.sighting(W1, 1.8)), 1.8)
    assert announced.book.closed_at() == {W1: 1.0}
    assert other.book.closed_at() == {}


def _expelled_and_fenced(machine: CoordinatorMachine, number: int = 2) -> list[int]:
    """w1 expelled after the broker said its connection ``number`` closed (by default not the
    one it announced, so its fence, not that word, starts its contact bound)."""
    held = _owned_by(machine, "w1")
    machine.handle(closed(W1, number), 1.0)
    machine.handle(cm.Tick(), 1.5)
    machine.handle(cm.Observed(_workers(W1, W2), {}, {"w1": 7, "w2": 0}, frozenset({W1})), 1.6)
    machine.handle(cm.Committed(), 1.7)
    return held


def test_the_leader_asks_the_queues_of_fenced_buckets_only_after_the_fence() -> None:
    machine = _leading()
    machine.ask_returns = True
    held = _expelled_and_fenced(machine)
    assert machine.handle(cm.Tick(), 1.75) == [cm.Observe((), ())]  # not fenced yet: not asked
    machine.handle(cm.Observed(_workers(W2), {}, {"w2": 0}), 1.76)
    (observe,) = machine.handle(cm.FenceDone(W1, machine.book.sighting(W1, 1.8)), 1.8)
    assert observe == cm.Observe((), tuple(held))
    waiting = machine.handle(cm.Observed(_workers(W2), {}, {"w2": 0}, emptied=frozenset(held)), 1.9)
    (wake,) = waiting  # asked again once the bound has passed
    assert isinstance(wake, cm.Wake) and wake.after == pytest.approx(
        1.8 + BROKER_CONTACT_SECONDS - 1.9
    )
    assert all(machine.records[b].state is BucketState.FENCING for b in held)  # within 1 s
    later = 1.81 + BROKER_CONTACT_SECONDS
    (again,) = machine.handle(cm.Tick(), later)
    assert again == cm.Observe((), tuple(held))
    (commit,) = machine.handle(
        cm.Observed(_workers(W2), {}, {"w2": 0}, emptied=frozenset(held)),
        later,
    )
    assert isinstance(commit, cm.Commit)
    assert all(commit.records[b].owner == "w2" for b in held)


def test_a_leader_of_classic_queues_never_asks_them() -> None:
    machine = _leading()  # ask_returns is off by default
    held = _expelled_and_fenced(machine)
    (observe,) = machine.handle(cm.FenceDone(W1, machine.book.sighting(W1, 1.8)), 1.8)
    assert observe == cm.Observe((), ())
    assert held


def test_a_contact_is_fresh_only_within_the_bound_after_an_answered_request_was_sent() -> None:
    contact = BrokerContact()
    assert not contact.fresh(0.0)  # nothing answered yet
    contact.answered(10.0)
    contact.answered(9.0)  # an older request answered late changes nothing
    assert contact.fresh(10.0 + BROKER_CONTACT_SECONDS - 0.01)
    assert not contact.fresh(10.0 + BROKER_CONTACT_SECONDS)


class _Contact:
    """A broker contact that is fresh once ``answered`` is set."""

    def __init__(self) -> None:
        self.answered = asyncio.Event()

    def heard(self) -> bool:
        return self.answered.is_set()

    async def heard_again(self) -> None:
        await self.answered.wait()


async def test_runners_start_nothing_while_the_broker_has_not_answered_lately() -> None:
    contact = _Contact()
    handler, lease = _Blocking(), _Lease()
    runners = _runners(handler, concurrency=2, threads=2, contact=contact)
    runners.start()
    runners.dispatch(_job(lease, 1))
    await asyncio.sleep(0.3)
    assert handler.began == [], "a job started though the broker had not answered lately"
    contact.answered.set()
    await asyncio.sleep(0.3)
    assert handler.began == ["m1"]
    handler.release.set()
    await runners.close()


def test_a_contact_counts_how_long_it_has_lapsed_once_it_was_answered() -> None:
    contact = BrokerContact()
    assert contact.lapsed(100.0) == 0.0  # starting: nothing answered yet, nothing lapsed
    contact.answered(10.0)
    assert contact.lapsed(10.0 + BROKER_CONTACT_SECONDS - 0.01) == 0.0
    assert contact.lapsed(12.0) == pytest.approx(2.0 - BROKER_CONTACT_SECONDS)


def test_a_keeper_says_once_that_its_contact_lapsed_and_counts_every_lapse(
    caplog: pytest.LogCaptureFixture,
) -> None:
    keeper, contact = ContactKeeper(), BrokerContact()
    with caplog.at_level(logging.WARNING, "hashq.worker.contact"):
        keeper._answered(contact, 0.0, 0.1)  # in time: nothing lapsed
        keeper._answered(contact, 0.2, 0.9)  # fresh until 0.5: held 0.4 s, and still (to 0.7)
        keeper._answered(contact, 1.0, 1.6)  # held on to 1.6: from 0.5 on, 1.1 s in all
    assert keeper.round_trip_seconds == pytest.approx(0.6)
    assert keeper.lapsed_seconds() == pytest.approx(1.1)
    [said] = caplog.records
    assert "answered this worker 0.70s after it asked" in said.getMessage()


def test_an_answer_that_leaves_the_contact_lapsed_is_not_counted_twice() -> None:
    keeper, contact = ContactKeeper(), BrokerContact()
    keeper._answered(contact, 0.0, 0.1)
    keeper._answered(contact, 0.2, 3.0)  # sent before a stop: lapsed from 0.5, and still
    keeper._answered(contact, 3.0, 3.1)  # the next answer ends it
    assert keeper.lapsed_seconds() == pytest.approx(2.6)


async def test_a_lapse_cut_short_by_the_connections_end_is_counted_and_never_taken_back() -> None:
    """``hashq_broker_contact_lapsed_seconds`` is a counter: a lapse under way when the
    connection ends (the keeper stopped) stays counted, and the count never falls."""
    keeper, contact = ContactKeeper(), BrokerContact()
    contact.answered(time.monotonic() - 2.0)  # sent 2 s ago: lapsed for 1.5 s
    keeper._contact = contact

    async def open_until_stopped(connection: object, contact: BrokerContact) -> None:
        await asyncio.Event().wait()

    keeper._keep_while_open = open_until_stopped  # type: ignore[method-assign]
    task = keeper._task = asyncio.ensure_future(keeper._keep(None, contact))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    during = keeper.lapsed_seconds()
    keeper.stop()
    await asyncio.wait({task})
    after = keeper.lapsed_seconds()
    assert 2.0 - BROKER_CONTACT_SECONDS - 0.1 < during <= after < 2.0
