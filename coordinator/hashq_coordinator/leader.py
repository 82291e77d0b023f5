"""What the leader asks of ZooKeeper: each of the machine's ZooKeeper actions carried out
through the ``Store``, its outcome returned as the event the machine expects. Failures are
outcomes too (``ObserveFailed``, ``ClaimFailed``, ``Deposed``), never exceptions: the machine
decides what follows."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from hashq.errors import Deposed, WorkerReturned
from hashq_coordinator.machine import events as cm
from hashq_coordinator.machine.fencebook import Incarnation
from hashq_coordinator.store import Store

# Whether the broker says a worker incarnation has no connection left.
Gone = Callable[[str, str], Awaitable[bool]]
QUESTION_SECONDS = 2.0  # how long the leader waits for the broker's word on a suspect


async def claim(store: Store, me: str) -> cm.Event:
    """Raise the leader epoch, tie the lead to this session, read every record and assignment."""
    try:
        leadership, version = await asyncio.to_thread(store.claim, me)
        records = await asyncio.to_thread(store.records)
        written = await asyncio.to_thread(store.assignments)
    except Exception as exc:
        return cm.ClaimFailed(repr(exc))
    return cm.Elected(leadership.epoch, version, records, written)


async def observe(store: Store, ask_gone: tuple[Incarnation, ...], gone: Gone) -> cm.Event:
    """The registrations (with their versions) and the releases; then, only after them, the
    broker's word on each suspect, so that a worker that takes its liveness queue again after
    the question has to write its registration after the version read here."""
    try:
        members = await asyncio.to_thread(store.workers)
        releases = await asyncio.to_thread(store.releases)
    except Exception as exc:
        return cm.ObserveFailed(repr(exc))
    workers = {worker: member.registration for worker, member in members.items()}
    versions = {worker: member.version for worker, member in members.items()}
    answers = await asyncio.gather(*(_asked(gone, incarnation) for incarnation in ask_gone))
    said = frozenset(i for i, answer in zip(ask_gone, answers, strict=True) if answer)
    return cm.Observed(workers, releases, versions, said)


async def _asked(gone: Gone, incarnation: Incarnation) -> bool:
    """The broker's word, or False (it lives) if it does not answer within
    ``QUESTION_SECONDS``: the leader's loop waits for this."""
    try:
        return await asyncio.wait_for(gone(*incarnation), QUESTION_SECONDS)
    except Exception:
        return False


async def commit(store: Store, decision: cm.Commit) -> cm.Event:
    """One transaction, checked against the leader node's version."""
    try:
        await asyncio.to_thread(
            store.commit,
            decision.version,
            decision.records,
            decision.known_records,
            decision.assignments,
            decision.known_assignments,
            decision.removed,
            decision.consumed,
            decision.expelled,
        )
    except WorkerReturned as exc:
        return cm.ExpelRefused(str(exc))
    except Deposed as exc:
        return cm.Deposed(str(exc))
    return cm.Committed()
