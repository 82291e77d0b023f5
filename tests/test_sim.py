"""The deterministic simulation (``sim/``): a budget of seeds on every ``make test``, the seeds
that once found a bug, and the simulator's own promises (a seed replays exactly; a failing run
shrinks to fewer faults that still fail).

``HASHQ_SIM_SEEDS`` sets the budget (``make sim`` runs more; docs/guarantees.md reports a long
run)."""

from __future__ import annotations

import os

import pytest

import coordinator.handover as handover
from sim.cluster import Cluster, Scenario
from sim.run import outcomes, shrink, simulate

STEPS = 20000
BUDGET = int(os.environ.get("HASHQ_SIM_SEEDS", "240"))

# Seeds that found a bug, and what it was. Each failed before its fix and must pass now.
REGRESSIONS = {
    4: "a worker cut off from RabbitMQ, still registered, kept its grants: its buckets stalled",
    8: "the same, with thread handlers",
    57: "the same, with one message left behind",
}


def test_a_budget_of_seeds_keeps_every_invariant() -> None:
    failed = {
        outcome.seed: outcome.violation
        for outcome in outcomes(range(1, BUDGET + 1), STEPS, jobs=2)
        if outcome.violation
    }
    assert failed == {}


@pytest.mark.parametrize("seed", sorted(REGRESSIONS))
def test_a_seed_that_once_found_a_bug_passes(seed: int) -> None:
    outcome = simulate(seed, STEPS)
    assert outcome.violation == "", REGRESSIONS[seed]


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
    """With fencing taken out of the coordinator, a worker left cut off from ZooKeeper (but
    not from RabbitMQ) keeps its buckets' consumers: its keys never go on elsewhere."""
    original = handover._next

    def grant_without_fence(bucket, record, target, view, decision):  # type: ignore[no-untyped-def]
        following = original(bucket, record, target, view, decision)
        if following.state == handover.FENCING:
            return handover._grant(record, target, view)
        return following

    monkeypatch.setattr(handover, "_next", grant_without_fence)
    seed = 10  # a worker stays cut off from ZooKeeper at the end (Scenario.stranded)
    assert Scenario.draw(seed).stranded == "zk-partition"
    outcome = Cluster(Scenario.draw(seed)).run(STEPS)
    assert outcome.violation, "the simulation did not notice fencing was gone"
    faults, shrunk = shrink(seed, STEPS, outcome)
    assert shrunk.violation and len(faults) < len(outcome.applied)
