"""A live worker whose AMQP connection closed takes a new one within the coordinator's crash
grace (0.5 s), whatever other retry is pending: reconnects keep their own time
(``hashq.worker.machine.states.reconnect_delay``; docs/protocol.md, crash detection)."""

from __future__ import annotations

import itertools

from hashq.worker.machine import events as ev
from hashq.worker.machine.core import WorkerMachine
from tests.support.machines import granted_bucket_0, registered_worker


def _subscribe_failed_at(when: float) -> WorkerMachine:
    """Bucket 0 granted on connection 1; its subscribe failed at ``when`` (a retry in 1 s)."""
    machine = registered_worker()
    subscribe = granted_bucket_0(machine)
    machine.handle(ev.Subscribed(subscribe.lease, ok=False, error="x"), when)
    return machine


def test_a_lost_connection_is_replaced_at_once_while_a_subscribe_waits_to_retry() -> None:
    machine = _subscribe_failed_at(1.0)
    assert ev.Reconnect() in machine.handle(ev.LinkLost(1), 1.1)


def test_failed_reconnects_retry_from_50_ms_doubling_whatever_else_waits() -> None:
    machine = _subscribe_failed_at(1.0)
    machine.handle(ev.LinkLost(1), 1.1)
    now, asked = 1.1, [1.1]
    for _ in range(3):
        machine.handle(ev.LinkFailed("RESOURCE_LOCKED"), now)
        assert machine.wake_at is not None
        now = machine.wake_at
        assert ev.Reconnect() in machine.handle(ev.Tick(), now)
        asked.append(now)
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(asked)]
    assert gaps == [0.05, 0.1, 0.2]  # the third attempt comes 0.35 s after the loss
