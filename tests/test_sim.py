"""The deterministic simulation (``sim/``): a budget of seeds on every ``make test``, the bugs
it found (each fixed, and each still found by its seed when the fix is taken out), and the
simulator's own promises (a seed replays exactly; a failing run shrinks to fewer faults that
still fail).

``HASHQ_SIM_SEEDS`` sets the budget (``make sim`` runs more; docs/guarantees.md reports a long
run)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace

import pytest

import coordinator.handover as handover
from coordinator import machine as cm
from coordinator.fencebook import FenceBook
from hashq.machines.events import Session, SessionConfirmed
from hashq.machines.states import Lease
from hashq.machines.worker import WorkerMachine
from hashq.protocol import BucketRecord
from sim.cluster import Cluster, Scenario
from sim.coordinator import SimCoordinator
from sim.mutations import MUTATIONS, ROOT
from sim.run import outcomes, shrink, simulate

STEPS = 20000
BUDGET = int(os.environ.get("HASHQ_SIM_SEEDS", "240"))


def _no_withdraw(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(WorkerMachine, "_withdrawing", lambda self, now: False)


def _release_on_any_close(monkeypatch: pytest.MonkeyPatch) -> None:
    def may_release(self: WorkerMachine, lease: Lease, now: float) -> bool:
        return self.session is Session.CONNECTED and now >= lease.retry_at

    monkeypatch.setattr(WorkerMachine, "_may_release", may_release)


def _any_connection_is_up(monkeypatch: pytest.MonkeyPatch) -> None:
    def link_to(self: WorkerMachine, connection: int, now: float) -> bool:
        self._connection, self.link_up, self._link_lost_at = connection, True, None
        return True

    monkeypatch.setattr(WorkerMachine, "_link_to", link_to)


def _lock_released_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The old resignation: one attempt to delete the lock node, then campaign again."""
    resign, do = cm.CoordinatorMachine._resign, SimCoordinator._do

    def without_give_back(self: cm.CoordinatorMachine, why: str) -> list[cm.Action]:
        return [a for a in resign(self, why) if not isinstance(a, cm.GiveBack)]

    def resign_once(self: SimCoordinator, action: cm.Action) -> None:
        do(self, action)
        if isinstance(action, cm.Resign):
            node, self._lock_node = self._lock_node, ""
            if node:
                self._call(lambda zk, _: zk.delete(node), lambda _: None)
            self.later(1.0, self._retry_campaign)

    monkeypatch.setattr(cm.CoordinatorMachine, "_resign", without_give_back)
    monkeypatch.setattr(SimCoordinator, "_do", resign_once)


def _sightings_trusted_after_a_blind_spot(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither a new term nor a long gap between looks makes the sightings of vanished
    incarnations start again."""
    monkeypatch.setattr(FenceBook, "_unseen", lambda self, vanished, now: None)


def _fenced_within_the_drain_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    def drain_and_grace(self: handover.View, record: BucketRecord) -> float:
        registration = self.workers.get(str(record.owner))
        if registration is None or registration.drain_timeout <= 0:
            return self.revoke_timeout
        return registration.drain_timeout + self.fence_grace

    monkeypatch.setattr(handover.View, "revoke_timeout_of", drain_and_grace)


def _every_verdict_believed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A session check's answer taken even if a pause came after it was asked."""
    take = WorkerMachine._take_verdict

    def as_if_current(self: WorkerMachine, event: SessionConfirmed, now: float) -> None:
        take(self, replace(event, asked=self._doubts), now)

    monkeypatch.setattr(WorkerMachine, "_take_verdict", as_if_current)


# Bugs the simulation found (and finding 8 of the review before it, which it finds since the
# confirm-freeze fault waits for the buckets to move): a seed that shows each with its fix out.
FOUND: dict[str, tuple[int, Callable[[pytest.MonkeyPatch], None]]] = {
    "an owner cut off ZooKeeper was fenced before it could notice": (
        1097,
        _fenced_within_the_drain_timeout,
    ),
    "a worker cut off from RabbitMQ kept its grants": (6, _no_withdraw),
    "a revoked bucket released before the broker dropped its channel": (509, _release_on_any_close),
    "a connection that died while announced was taken as up": (105, _any_connection_is_up),
    "a deposed leader's lock node blocked every election": (6, _lock_released_once),
    "a session check answered before a second pause was believed after it": (
        12,
        _every_verdict_believed,
    ),
    "a leader trusted sightings from before a blind spot (its election)": (
        420,
        _sightings_trusted_after_a_blind_spot,
    ),
}


@pytest.mark.parametrize("bug", sorted(FOUND))
def test_a_bug_the_simulation_found_stays_fixed_and_its_seed_still_finds_it(
    bug: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed, take_fix_out = FOUND[bug]
    assert simulate(seed, STEPS).violation == ""
    take_fix_out(monkeypatch)
    assert simulate(seed, STEPS).violation, f"seed {seed} no longer shows: {bug}"


def test_a_budget_of_seeds_keeps_every_invariant() -> None:
    failed = {
        outcome.seed: outcome.violation
        for outcome in outcomes(range(1, BUDGET + 1), STEPS, jobs=2)
        if outcome.violation
    }
    assert failed == {}


def test_every_mutation_of_the_campaign_still_applies() -> None:
    """``make mutations`` takes each rule out by an exact edit: one that no longer matches the
    code would report an error instead of a figure."""
    stale = [m.name for m in MUTATIONS if (ROOT / m.path).read_text().count(m.old) != 1]
    assert stale == []


def test_a_seed_replays_exactly() -> None:
    first, second = simulate(3, 5000), simulate(3, 5000)
    assert (first.steps, first.confirmed, first.executions) == (
        second.steps,
        second.confirmed,
        second.executions,
    )
    assert first.trace == second.trace


def test_a_failing_run_shrinks_to_fewer_faults_that_still_fail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With fencing taken out of the coordinator, a worker cut off from ZooKeeper but not from
    RabbitMQ keeps its buckets' consumers: its keys do not go on elsewhere."""
    original = handover._next

    def grant_without_fence(bucket, record, target, view, decision):  # type: ignore[no-untyped-def]
        following = original(bucket, record, target, view, decision)
        if following.state == handover.FENCING:
            return handover._grant(record, target, view)
        return following

    monkeypatch.setattr(handover, "_next", grant_without_fence)
    seed = 1  # one of the seeds that notices (docs/guarantees.md, "Mutations")
    outcome = Cluster(Scenario.draw(seed)).run(STEPS)
    assert outcome.violation, "the simulation did not notice fencing was gone"
    faults, shrunk = shrink(seed, STEPS, outcome)
    assert shrunk.violation and len(faults) < len(outcome.applied)
