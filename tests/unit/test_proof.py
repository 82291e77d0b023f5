"""A bucket whose connection died under it is consumed again only once its queue says what that
connection held is back (``hashq.worker.machine.proof``; docs/protocol.md, "Consumed again after
a lost connection"). The simulator found the reordering this prevents (seed 644)."""

from __future__ import annotations

from hashq.records import QUEUE_ASK_SECONDS, RETURN_GRACE_SECONDS, Assignment
from hashq.worker.machine import events as ev
from hashq.worker.machine.core import WorkerMachine
from hashq.worker.machine.states import Phase
from tests.support.machines import granted_bucket_0, registered_worker

UP = 3.0  # when the second connection is up in ``_reconnected``


def _consuming(prove_returns: bool = True) -> tuple[WorkerMachine, int]:
    """Bucket 0 granted at epoch 1 and consumed on connection 1."""
    machine = registered_worker(prove_returns=prove_returns)
    subscribe = granted_bucket_0(machine)
    machine.handle(ev.Subscribed(subscribe.lease), 0.3)
    return machine, subscribe.lease


def _reconnected(
    prove_returns: bool = True, confirmed: bool = False
) -> tuple[WorkerMachine, list[ev.Action]]:
    """Connection 1 dies under bucket 0 (its channel's close unconfirmed unless ``confirmed``);
    connection 2 comes up at ``UP``, the grant unchanged: what the machine does then."""
    machine, lease = _consuming(prove_returns)
    actions = machine.handle(ev.LinkLost(1), 1.0)
    assert ev.CutOff(lease) in actions
    actions += machine.handle(ev.Closed(lease, confirmed=confirmed), 1.1)
    assert ev.Reconnect() in actions
    return machine, machine.handle(ev.LinkUp(2), UP)  # the runtime's number of the new one


def _proving() -> tuple[WorkerMachine, ev.AskQueue]:
    machine, actions = _reconnected()
    assert not [a for a in actions if isinstance(a, ev.Subscribe)]
    (ask,) = [a for a in actions if isinstance(a, ev.AskQueue)]
    assert machine.leases[ask.lease].phase is Phase.PROVING
    return machine, ask


def test_a_bucket_whose_connection_died_under_it_asks_its_queue_first() -> None:
    machine, ask = _proving()
    assert ask.bucket == 0
    assert machine.consuming() == {}


def test_it_waits_while_the_queue_counts_a_consumer() -> None:
    """A cancelled consumer still holding messages is counted: the new one would be active at
    once and get later messages of a key first."""
    machine, ask = _proving()
    assert machine.handle(ev.QueueAnswered(ask.lease, (40, 1)), UP + 0.01) == []
    again = machine.handle(ev.Tick(), UP + 0.01 + QUEUE_ASK_SECONDS)
    assert again == [ev.AskQueue(ask.lease, 0)]
    late = UP + RETURN_GRACE_SECONDS + 1  # even past the grace: a consumer is counted
    assert machine.handle(ev.QueueAnswered(ask.lease, (40, 1)), late) == []


def test_it_consumes_once_the_queue_has_ready_messages_and_no_consumer() -> None:
    machine, ask = _proving()
    actions = machine.handle(ev.QueueAnswered(ask.lease, (40, 0)), UP + 0.01)
    assert actions == [ev.Subscribe(ask.lease, 0, 1)]
    assert machine.leases[ask.lease].phase is Phase.SUBSCRIBING


def test_a_quiet_queue_is_consumed_only_the_return_grace_after_the_connection_came_up() -> None:
    """(0, 0) is also what a quorum queue without a leader answers; no answer says nothing."""
    machine, ask = _proving()
    for answer in ((0, 0), None):
        assert machine.handle(ev.QueueAnswered(ask.lease, answer), UP + 0.01) == []
        (ask,) = machine.handle(ev.Tick(), UP + 0.01 + QUEUE_ASK_SECONDS)  # type: ignore[assignment]
    done = UP + RETURN_GRACE_SECONDS
    assert machine.handle(ev.QueueAnswered(ask.lease, None), done) == [
        ev.Subscribe(ask.lease, 0, 1)
    ]


def test_revoked_while_proving_it_is_released_as_the_lost_lease_would_be() -> None:
    """Nothing was consumed on the proving lease; its release still waits the return grace
    after the newer connection came up, as the lost lease's would (``_may_release``)."""
    machine, ask = _proving()
    actions = machine.handle(ev.AssignmentRead(2, Assignment("i1", {})), UP + 0.5)
    assert not [a for a in actions if isinstance(a, ev.WriteRelease)]
    assert machine.leases[ask.lease].phase is Phase.CLOSED
    actions = machine.handle(ev.Tick(), UP + RETURN_GRACE_SECONDS)
    assert ev.WriteRelease(ask.lease, 0, 1, "i1") in actions


def test_a_proving_lease_cut_off_again_keeps_its_mark() -> None:
    """The connection dies again while the lease proves: the next lease proves too."""
    machine, ask = _proving()
    actions = machine.handle(ev.LinkLost(2), UP + 0.1)
    assert ask.lease not in machine.leases
    assert ev.Reconnect() in actions
    actions = machine.handle(ev.LinkUp(3), UP + 3)
    assert not [a for a in actions if isinstance(a, ev.Subscribe)]
    assert [a for a in actions if isinstance(a, ev.AskQueue)]


def test_a_confirmed_close_or_classic_queues_consume_again_at_once() -> None:
    for _, actions in (_reconnected(confirmed=True), _reconnected(prove_returns=False)):
        assert [a for a in actions if isinstance(a, ev.Subscribe)]
        assert not [a for a in actions if isinstance(a, ev.AskQueue)]


def test_a_new_incarnation_forgets_the_last_one_s_marks() -> None:
    """The marks name the last life's grants, which are void once it registers again."""
    machine, _ = _proving()
    machine.handle(ev.Registered("i2", 1), UP + 1)
    assert machine.unproven == {}


def test_a_proven_lease_is_consumed_and_later_released_as_one_of_the_current_connection() -> None:
    """Left with the dead connection's number, a later unconfirmed close on the current one
    would pass ``_may_release`` at once (a review found it)."""
    machine, ask = _proving()
    machine.handle(ev.QueueAnswered(ask.lease, (40, 0)), UP + 0.01)
    assert machine.leases[ask.lease].connection == machine.connection_number == 2


def test_an_answer_while_the_session_is_in_doubt_subscribes_nothing() -> None:
    """Only ``_reconcile`` subscribes what is granted, and only with the session CONNECTED."""
    machine, ask = _proving()
    machine.handle(ev.SessionChanged(ev.Session.SUSPENDED), UP + 0.01)
    actions = machine.handle(ev.QueueAnswered(ask.lease, (40, 0)), UP + 0.02)
    assert not [a for a in actions if isinstance(a, ev.Subscribe)]
    assert machine.leases[ask.lease].phase is Phase.PROVING
