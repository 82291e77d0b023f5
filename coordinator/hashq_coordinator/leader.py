"""What the leader asks of ZooKeeper: each of the machine's ZooKeeper actions carried out
through the ``Store``, its outcome returned as the event the machine expects. Failures are
outcomes too (``ObserveFailed``, ``ClaimFailed``, ``Deposed``), never exceptions: the machine
decides what follows."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from hashq.errors import Deposed, WorkerReturned
from hashq_coordinator.machine import events as cm
from hashq_coordinator.store import Store

# Whether the broker says a worker incarnation has no connection left.
Gone = Callable[[str, str], Awaitable[bool]]
# Whether a bucket queue says no consumer holds any of its messages.
Held = Callable[[int], Awaitable[bool]]
QUESTION_SECONDS = 2.0  # how long the leader waits for the broker's word on a suspect
# ... and on a bucket queue: asked at every observation while buckets wait, so briefly (a queue
# that does not answer in time is asked again at the next).
HELD_SECONDS = 0.5
T = TypeVar("T")


async def claim(store: Store, me: str) -> cm.Event:
    """Raise the leader epoch, tie the lead to this session, read every record and assignment."""
    try:
        leadership, version = await asyncio.to_thread(store.claim, me)
        await asyncio.to_thread(store.bucket_count)  # so that every record is read
        records = await asyncio.to_thread(store.records)
        written = await asyncio.to_thread(store.assignments)
    except Exception as exc:
        return cm.ClaimFailed(repr(exc))
    return cm.Elected(leadership.epoch, version, records, written)


async def observe(store: Store, asked: cm.Observe, gone: Gone, holds_nothing: Held) -> cm.Event:
    """The registrations (with their versions) and the releases; then, only after them, the
    broker's word on each suspect, so that a worker that takes its liveness queue again after
    the question has to write its registration after the version read here, and on each bucket
    queue asked about (after the fence the machine waits on, which finished before it asked)."""
    try:
        buckets = await asyncio.to_thread(store.bucket_count)
        members = await asyncio.to_thread(store.workers)
        releases = await asyncio.to_thread(store.releases)
    except Exception as exc:
        return cm.ObserveFailed(repr(exc))
    workers = {worker: member.registration for worker, member in members.items()}
    versions = {worker: member.version for worker, member in members.items()}
    gone_ones, emptied = await asyncio.gather(
        _yes(asked.ask_gone, lambda incarnation: gone(*incarnation), QUESTION_SECONDS),
        _yes(asked.ask_held, holds_nothing, HELD_SECONDS),
    )
    return cm.Observed(workers, releases, versions, gone_ones, emptied, buckets)


async def _yes(
    about: tuple[T, ...], question: Callable[[T], Awaitable[bool]], within: float
) -> frozenset[T]:
    """Those of ``about`` the broker says yes about, all asked at once; no answer within
    ``within`` counts as no (it lives; the queue may still hold something): the leader's loop
    waits for this."""
    answers = await asyncio.gather(*(_asked(question(one), within) for one in about))
    return frozenset(one for one, yes in zip(about, answers, strict=True) if yes)


async def _asked(question: Awaitable[bool], within: float) -> bool:
    try:
        return await asyncio.wait_for(question, within)
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
