"""The leader asks a bucket queue by its name whatever the count it started with: after a resize,
a new bucket's fenced owner is let go on its queue's word, as an old bucket's is."""

from __future__ import annotations

from typing import Any

import pytest

from hashq.settings import Settings
from hashq.topology import Topology
from hashq_coordinator.fencing import liveness


async def test_a_new_bucket_s_queue_is_asked_by_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    async def declare_passive(connection: Any, name: str) -> tuple[int, int]:
        asked.append(name)
        return 3, 0  # ready messages, no consumer: nothing held

    checker = liveness.Liveness(Settings(app="t"), Topology("t", 8, "quorum", 20))
    monkeypatch.setattr(liveness, "declare_passive", declare_passive)
    monkeypatch.setattr(checker, "_connect", lambda: _connected())
    assert await checker.holds_nothing(12)
    assert asked == ["hashq.t.b0012"]


async def _connected() -> None:
    return None
