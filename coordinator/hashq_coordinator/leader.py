"""What the leader asks of ZooKeeper: each of the machine's ZooKeeper actions carried out
through the ``Store``, its outcome returned as the event the machine expects. Failures are
outcomes too (``ObserveFailed``, ``ClaimFailed``, ``Deposed``), never exceptions: the machine
decides what follows."""

from __future__ import annotations

import asyncio

from hashq.errors import Deposed
from hashq_coordinator.machine import events as cm
from hashq_coordinator.store import Store


async def claim(store: Store, me: str) -> cm.Event:
    """Raise the leader epoch, tie the lead to this session, read every record and assignment."""
    try:
        leadership, version = await asyncio.to_thread(store.claim, me)
        records = await asyncio.to_thread(store.records)
        written = await asyncio.to_thread(store.assignments)
    except Exception as exc:
        return cm.ClaimFailed(repr(exc))
    return cm.Elected(leadership.epoch, version, records, written)


async def observe(store: Store) -> cm.Event:
    """The registrations and the releases."""
    try:
        members = await asyncio.to_thread(store.workers)
        releases = await asyncio.to_thread(store.releases)
    except Exception as exc:
        return cm.ObserveFailed(repr(exc))
    workers = {worker: member.registration for worker, member in members.items()}
    return cm.Observed(workers, releases)


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
        )
    except Deposed as exc:
        return cm.Deposed(str(exc))
    return cm.Committed()
