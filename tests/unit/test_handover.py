"""The coordinator's handover step, simulated without servers: random joins, deaths, releases
and fences; the safety rules must hold at every step and the plan must be reached."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from hashq.records import Assignment, BucketRecord, BucketState, Registration
from hashq_coordinator.machine.handover import (
    Decision,
    View,
    assignments,
    committed_owners,
    step,
)
from hashq_coordinator.machine.planner import plan


def _registration(worker: str, life: int) -> Registration:
    return Registration(worker, f"{worker}-{life}", 1)


class Grants:
    """The safety rule, whatever states a bucket passes through: a bucket granted at epoch e to
    one incarnation is granted again (to anyone, at e + 1) only after that incarnation released
    epoch e or was fenced after that grant was made."""

    def __init__(self) -> None:
        self.last: dict[int, tuple[tuple[str, str], int, int]] = {}  # holder, epoch, fence count
        self.fences: dict[tuple[str, str], int] = {}  # fences completed per incarnation

    def fenced_now(self, done: set[tuple[str, str]]) -> None:
        for incarnation in done:
            self.fences[incarnation] = self.fences.get(incarnation, 0) + 1

    def check(
        self,
        records: dict[int, BucketRecord],
        changed: dict[int, BucketRecord],
        releases: set[tuple[int, int]],
        fenced: set[tuple[str, str]],
    ) -> None:
        for bucket, following in changed.items():
            before = records.get(bucket, BucketRecord())
            assert following.epoch >= before.epoch, "an epoch went backwards"
            if following.state is not BucketState.GRANTED or following.epoch == before.epoch:
                continue
            assert following.epoch == before.epoch + 1, "an epoch was skipped"
            if bucket in self.last:
                holder, epoch, fences_then = self.last[bucket]
                released = (bucket, epoch) in releases
                cut_off = self.fences.get(holder, 0) > fences_then
                assert released or cut_off, (
                    f"bucket {bucket} granted at {following.epoch} before {holder} released "
                    f"epoch {epoch} or was fenced"
                )
            holder = (str(following.owner), str(following.incarnation))
            self.last[bucket] = (holder, following.epoch, self.fences.get(holder, 0))


def _held(records: dict[int, BucketRecord], owner: Registration) -> set[tuple[int, int]]:
    return {
        (bucket, record.epoch)
        for bucket, record in records.items()
        if record.state is BucketState.GRANTED
        and (record.owner, record.incarnation) == (owner.worker_id, owner.incarnation)
    }


def _decide(
    buckets: int,
    records: dict[int, BucketRecord],
    live: dict[str, Registration],
    releases: set[tuple[int, int]],
    fenced: set[tuple[str, str]],
    now: float,
) -> Decision:
    """The leader's next step over what it knows, every fence taken as done with its returns."""
    view = View(
        buckets, records, live, frozenset(releases), frozenset(fenced), now, 5.0, fences_done=None
    )
    return step(view, plan(buckets, dict.fromkeys(live, 1), committed_owners(view)))


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(), buckets=st.integers(1, 40), workers=st.integers(1, 6))
def test_handovers_are_safe_and_converge(seed: int, buckets: int, workers: int) -> None:
    rng = random.Random(seed)
    names = [f"w{n}" for n in range(workers)]
    lives = dict.fromkeys(names, 0)
    live = {name: _registration(name, 0) for name in names if rng.random() < 0.8} or {
        names[0]: _registration(names[0], 0)
    }
    records: dict[int, BucketRecord] = {}
    releases: set[tuple[int, int]] = set()
    fenced: set[tuple[str, str]] = set()
    grants = Grants()
    now = 0.0
    for turn in range(60):
        now += 1.0
        if turn < 40 and rng.random() < 0.15:  # churn, then calm so that it converges
            name = rng.choice(names)
            if name in live and len(live) > 1:
                if rng.random() < 0.5:  # a clean stop: it releases everything, then goes
                    releases.update(_held(records, live[name]))
                del live[name]
            else:
                lives[name] += 1
                live[name] = _registration(name, lives[name])
        decision = _decide(buckets, records, live, releases, fenced, now)
        grants.check(records, decision.records, releases, fenced)
        records.update(decision.records)
        # A fenced worker that is granted a bucket again has reconnected to consume it: the
        # coordinator no longer counts it as fenced (its new connection is not cut off).
        fenced -= {
            (str(r.owner), str(r.incarnation))
            for r in decision.records.values()
            if r.state is BucketState.GRANTED
        }
        done = decision.fences if rng.random() < 0.7 else set()
        fenced |= done
        grants.fenced_now(done)
        # Cooperative owners release what they were asked to, most of the time.
        for bucket, record in records.items():
            if record.state is BucketState.REVOKING and rng.random() < 0.6:
                releases.add((bucket, record.epoch))
    for _ in range(20):  # calm: everything settles on the plan
        now += 10.0
        decision = _decide(buckets, records, live, releases, fenced, now)
        grants.check(records, decision.records, releases, fenced)
        records.update(decision.records)
        fenced |= decision.fences
        grants.fenced_now(decision.fences)
        for bucket, record in records.items():
            if record.state is BucketState.REVOKING:
                releases.add((bucket, record.epoch))
    owners = [records[b].owner for b in range(buckets)]
    assert all(records[b].state is BucketState.GRANTED for b in range(buckets))
    assert set(owners) <= set(live)
    counts = [owners.count(w) for w in live]
    assert max(counts) - min(counts) <= 1


def test_a_move_revokes_then_grants_at_the_next_epoch() -> None:
    a, b = _registration("a", 0), _registration("b", 0)
    records = {0: BucketRecord(BucketState.GRANTED, "a", a.incarnation, 4)}
    view = View(
        1, records, {"a": a, "b": b}, frozenset(), frozenset(), 100.0, 30.0, fences_done=None
    )
    revoking = step(view, {0: "b"}).records[0]
    assert (revoking.state, revoking.owner, revoking.target, revoking.epoch) == (
        BucketState.REVOKING,
        "a",
        "b",
        4,
    )
    written = assignments({0: revoking}, {"a": a, "b": b}, 1)
    assert (written["a"].grants, written["a"].incoming) == ({}, ())
    assert (written["b"].grants, written["b"].incoming) == ({}, (0,))  # gets its channel ready
    waiting = View(
        1, {0: revoking}, {"a": a, "b": b}, frozenset(), frozenset(), 110.0, 30.0, fences_done=None
    )
    assert step(waiting, {0: "b"}).records == {}
    released = View(
        1,
        {0: revoking},
        {"a": a, "b": b},
        frozenset({(0, 4)}),
        frozenset(),
        111.0,
        30.0,
        fences_done=None,
    )
    granted = step(released, {0: "b"}).records[0]
    assert (granted.state, granted.owner, granted.epoch) == (BucketState.GRANTED, "b", 5)


def test_an_owner_that_does_not_release_is_fenced_and_named() -> None:
    a, b = _registration("a", 0), _registration("b", 0)
    revoking = BucketRecord(BucketState.REVOKING, "a", a.incarnation, 4, target="b", since=100.0)
    late = View(
        1, {0: revoking}, {"a": a, "b": b}, frozenset(), frozenset(), 131.0, 30.0, fences_done=None
    )
    decision = step(late, {0: "b"})
    assert decision.records[0].state is BucketState.FENCING
    assert decision.fences == {("a", a.incarnation)}
    assert decision.stuck == {0: ("a", 30.0)}


def test_an_owner_that_released_before_it_went_is_not_fenced() -> None:
    """A clean stop releases every bucket, then deregisters: its buckets are granted at once at
    the next epoch, with no fence, which would cost the next owner another round. One that
    went without releasing is fenced."""
    a, b = _registration("a", 0), _registration("b", 0)
    granted = BucketRecord(BucketState.GRANTED, "a", a.incarnation, 4)

    def after_a_went(releases: frozenset[tuple[int, int]]) -> Decision:
        view = View(1, {0: granted}, {"b": b}, releases, frozenset(), 9.0, 30.0, fences_done=None)
        return step(view, {0: "b"})

    released = after_a_went(frozenset({(0, 4)}))
    record = released.records[0]
    assert (record.state, record.owner, record.epoch, released.fences) == (
        BucketState.GRANTED,
        "b",
        5,
        set(),
    )
    silent = after_a_went(frozenset({(0, 3)}))  # an earlier epoch's release counts for nothing
    assert silent.records[0].state is BucketState.FENCING
    assert silent.fences == {("a", a.incarnation)}


def test_an_owner_is_given_at_least_its_session_before_it_is_fenced() -> None:
    """Cut off ZooKeeper, an owner never hears of the revoke and starts what it holds until its
    client notices, within its session: a fence after only its drain timeout (1 s) plus the
    grace could let it start a message after the next owner did (simulation seed 531)."""
    owner = Registration("a", "a1", 1, drain_timeout=1.0, session_timeout=6.0)
    record = BucketRecord(BucketState.REVOKING, "a", "a1", 1, target="b", since=0.0)

    def revoke_timeout_for(registration: Registration) -> float:
        workers = {"a": registration}
        return View(
            1, {0: record}, workers, frozenset(), frozenset(), 0.0, 30.0, 1.0, fences_done=None
        ).revoke_timeout_of(record)

    assert revoke_timeout_for(owner) == 6.0
    unknown = Registration("a", "a1", 1, drain_timeout=1.0)  # an older worker says no session
    assert revoke_timeout_for(unknown) == 2.0


def test_before_membership_settles_only_orphans_move() -> None:
    a, b = _registration("a", 0), _registration("b", 0)
    records = {
        0: BucketRecord(BucketState.GRANTED, "a", a.incarnation, 1),
        1: BucketRecord(BucketState.GRANTED, "a", a.incarnation, 1),
        2: BucketRecord(BucketState.UNASSIGNED, None, None, 3),
    }
    view = View(3, records, {"a": a, "b": b}, frozenset(), frozenset(), 1.0, 30.0, fences_done=None)
    decision = step(view, {0: "a", 1: "b", 2: "b"}, settled=False)
    assert set(decision.records) == {2}
    assert (decision.records[2].owner, decision.records[2].epoch) == ("b", 4)
    settled = step(view, {0: "a", 1: "b", 2: "b"}, settled=True)
    assert settled.records[1].state is BucketState.REVOKING


def test_only_a_live_target_hears_of_a_bucket_on_its_way_and_only_until_the_grant() -> None:
    a, b = _registration("a", 0), _registration("b", 0)
    fencing = BucketRecord(BucketState.FENCING, "a", a.incarnation, 4, target="b", since=1.0)
    granted = BucketRecord(BucketState.GRANTED, "b", b.incarnation, 5)
    assert assignments({0: fencing, 1: granted}, {"a": a, "b": b}, 1)["b"].incoming == (0,)
    assert assignments({0: fencing}, {"a": a}, 1)["a"].incoming == ()
    assert assignments({1: granted}, {"a": a, "b": b}, 1)["b"].incoming == ()


def test_an_assignment_without_incoming_buckets_reads_as_before_the_field() -> None:
    """Older readers ignore unknown fields, and an assignment with nothing incoming is
    written exactly as before (no new write while nothing moves)."""
    plain = Assignment("i1", {3: 7}, 2)
    assert b"incoming" not in plain.encode()
    assert Assignment.decode(plain.encode()) == plain
    moving = Assignment("i1", {3: 7}, 2, (5, 1))
    assert Assignment.decode(moving.encode()) == Assignment("i1", {3: 7}, 2, (1, 5))


def test_a_bucket_granted_for_the_first_time_starts_above_every_epoch() -> None:
    """A resize's new bucket: the keys that move to it keep a rising epoch (their old bucket's
    zombie carries a lower one), so ``msg.epoch`` stays a fencing token per key."""
    a = _registration("a", 0)
    records = {
        0: BucketRecord(BucketState.GRANTED, "a", a.incarnation, 7),
        1: BucketRecord(BucketState.GRANTED, "a", a.incarnation, 3),
    }
    view = View(3, records, {"a": a}, frozenset(), frozenset(), 100.0, 30.0, fences_done=None)
    granted = step(view, {0: "a", 1: "a", 2: "a"}).records
    assert list(granted) == [2]
    assert (granted[2].state, granted[2].epoch) == (BucketState.GRANTED, 8)
    fresh = View(2, {}, {"a": a}, frozenset(), frozenset(), 100.0, 30.0, fences_done=None)
    assert {r.epoch for r in step(fresh, {0: "a", 1: "a"}).records.values()} == {1}
