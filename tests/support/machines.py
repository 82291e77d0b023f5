"""Worker machines in a known state, for the tests that drive ``WorkerMachine`` by events, and
the job a ``LeaseCore`` holds in the tests that drive a lease by calls."""

from __future__ import annotations

from dataclasses import dataclass

from hashq.records import Assignment
from hashq.worker.machine import events as ev
from hashq.worker.machine.core import WorkerMachine


def registered_worker(withdraw_after: float = 30, prove_returns: bool = True) -> WorkerMachine:
    """Worker ``w1`` (concurrency 4), registered as incarnation ``i1`` on connection 1 at 0.1."""
    machine = WorkerMachine(
        "w1",
        4,
        drain_timeout=1,
        stop_within=5,
        withdraw_after=withdraw_after,
        prove_returns=prove_returns,
    )
    assert ev.BeginIncarnation() in machine.handle(ev.Tick(), 0.0)
    machine.handle(ev.Registered("i1", 1), 0.1)
    return machine


def granted_bucket_0(machine: WorkerMachine) -> ev.Subscribe:
    """The subscribe that the machine asks for when bucket 0 is granted at epoch 1 (at 0.2)."""
    (subscribe,) = machine.handle(ev.AssignmentRead(1, Assignment("i1", {0: 1})), 0.2)
    assert isinstance(subscribe, ev.Subscribe)
    return subscribe


@dataclass(eq=False)
class Job:
    """A delivery as ``LeaseCore`` sees it (``Keyed``): message ``n`` of ``key``; with
    ``marker``, a resize's marker (``hashq.resizing``)."""

    key: str
    n: int
    from_parking: bool = False
    marker: int = 0
