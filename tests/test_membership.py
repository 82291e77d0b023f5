"""The worker's session bookkeeping, with ZooKeeper's answers replaced: only a timing exposes
these holes, so the answers are made to arrive at the worst moment."""

from __future__ import annotations

import asyncio
import threading

import pytest

from hashq.membership import Membership, Session
from hashq.settings import Settings


async def test_a_session_check_answered_before_a_second_pause_does_not_resume_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker asks ZooKeeper whether its session lives; ZooKeeper says yes; before the
    answer is applied the process is paused again, long enough for the session to expire. The
    watchdog notices the second pause. The old answer must not make the worker resume."""
    membership = Membership(Settings(), "w1", 1, asyncio.Event())  # no server is asked
    membership.suspect()  # the first pause
    answered = threading.Event()
    release = threading.Event()

    def probe() -> Session:
        answered.set()
        release.wait(5)
        return Session.CONNECTED  # true when ZooKeeper said it, stale when it is applied

    monkeypatch.setattr(membership, "_probe", probe)
    checking = asyncio.ensure_future(membership.confirm())
    await asyncio.to_thread(answered.wait, 5)
    membership.suspect()  # the watchdog: a second pause while the answer was on its way
    release.set()
    await checking
    assert membership.session is Session.SUSPENDED

    monkeypatch.setattr(membership, "_probe", lambda: Session.CONNECTED)
    await membership.confirm()  # asked again after the pause: believed
    assert _session(membership) is Session.CONNECTED


def _session(membership: Membership) -> Session:
    return membership.session
