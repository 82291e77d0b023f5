"""The leader's look at the registrations against the real ZooKeeper: a registration is read
once and again only when its watch says it changed, and what another client wrote before a
look is what the look sees, with no wait (``Store.workers``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest
from kazoo.client import KazooClient
from kazoo.protocol.states import Callback

from hashq.records import Paths, Registration
from hashq.settings import Settings
from hashq_coordinator.store import WATCHES_RUN_SECONDS, Store
from tests.support.helpers import open_zk

ROUNDS = 20  # each change seen by the very next look, every round


class Reads:
    """Counts the registration reads a store asks for (the server is the real one)."""

    def __init__(self, zk: KazooClient, workers: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        real = zk.get_async

        def counted(path: str, watch: Any = None) -> Any:
            if path.startswith(f"{workers}/"):
                self.paths.append(path)
            return real(path, watch=watch)

        monkeypatch.setattr(zk, "get_async", counted)

    def taken(self) -> int:
        count, self.paths = len(self.paths), []
        return count


class Scene(NamedTuple):
    """A store on the leader's client; w1 and w2 registered by another client, not looked at."""

    leader: KazooClient
    workers: KazooClient
    paths: Paths
    store: Store
    reads: Reads


@pytest.fixture
def scene(initialized: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[Scene]:
    leader, workers = open_zk(initialized.zk_hosts), open_zk(initialized.zk_hosts)
    paths = Paths(initialized.app)
    for name in ("w1", "w2"):
        workers.create(paths.worker(name), _registration(name, f"{name}-0"), ephemeral=True)
    store = Store(leader, paths, initialized.buckets)
    yield Scene(leader, workers, paths, store, Reads(leader, paths.workers, monkeypatch))
    for client in (leader, workers):
        client.stop()
        client.close()


def _registration(worker: str, incarnation: str) -> bytes:
    return Registration(worker, incarnation, capacity=1).encode()


def _busy(zk: KazooClient, seconds: float) -> None:
    """Keep kazoo's callback thread, which runs every notification, busy for ``seconds``."""
    zk.handler.dispatch_callback(Callback("watch", time.sleep, (seconds,)))


def _seen(store: Store) -> dict[str, tuple[str, int]]:
    return {n: (m.registration.incarnation, m.version) for n, m in store.workers().items()}


def test_a_look_reads_only_what_changed_and_sees_every_change_at_once(
    scene: Scene,
) -> None:
    leader, workers, paths, store, reads = scene
    assert _seen(store) == {"w1": ("w1-0", 0), "w2": ("w2-0", 0)}
    assert reads.taken() == 2
    assert _seen(store) == {"w1": ("w1-0", 0), "w2": ("w2-0", 0)}
    assert reads.taken() == 0, "an unchanged registration was read again"

    for round_ in range(1, ROUNDS + 1):
        _busy(leader, 0.02)  # the coordinator's own watches run on this thread too
        workers.set(paths.worker("w1"), _registration("w1", f"w1-{round_}"))
        assert _seen(store) == {"w1": (f"w1-{round_}", round_), "w2": ("w2-0", 0)}
        assert reads.taken() == 1

    workers.delete(paths.worker("w2"))
    workers.create(paths.worker("w3"), _registration("w3", "w3-0"), ephemeral=True)
    assert _seen(store) == {"w1": (f"w1-{ROUNDS}", ROUNDS), "w3": ("w3-0", 0)}
    assert reads.taken() == 1  # w3; w2's deletion is in the listing

    workers.create(paths.worker("w2"), _registration("w2", "w2-1"), ephemeral=True)
    assert _seen(store)["w2"] == ("w2-1", 0)  # back, under a new incarnation
    assert reads.taken() == 1


def test_a_new_connection_or_lead_reads_every_registration_again(
    scene: Scene,
) -> None:
    """Watches do not outlive a connection (kazoo drops them), nor a session."""
    leader, workers, paths, store, reads = scene
    store.workers()
    assert reads.taken() == 2
    leader.stop()
    leader.start(timeout=15)
    workers.set(paths.worker("w1"), _registration("w1", "w1-1"))
    assert _seen(store) == {"w1": ("w1-1", 1), "w2": ("w2-0", 0)}
    assert reads.taken() == 2
    store.claim("me")
    store.workers()
    assert reads.taken() == 2


def test_a_look_that_cannot_wait_for_the_watches_reads_every_registration(
    scene: Scene, caplog: pytest.LogCaptureFixture
) -> None:
    leader, workers, paths, store, reads = scene
    store.workers()
    reads.taken()
    _busy(leader, WATCHES_RUN_SECONDS + 0.5)
    workers.set(paths.worker("w1"), _registration("w1", "w1-1"))
    with caplog.at_level(logging.INFO, logger="hashq_coordinator.store"):
        assert _seen(store) == {"w1": ("w1-1", 1), "w2": ("w2-0", 0)}
        assert reads.taken() == 2
        said = [(r.levelno, r.getMessage()) for r in caplog.records]
        assert [level for level, _ in said] == [logging.WARNING], said
        time.sleep(1)  # the busy callback ends
        assert _seen(store) == {"w1": ("w1-1", 1), "w2": ("w2-0", 0)}
        assert _seen(store) == {"w1": ("w1-1", 1), "w2": ("w2-0", 0)}
        assert reads.taken() == 1  # w1 once more: its notice ran late; then known
        said = [(r.levelno, r.getMessage()) for r in caplog.records]
        assert [level for level, _ in said] == [logging.WARNING, logging.INFO], said
