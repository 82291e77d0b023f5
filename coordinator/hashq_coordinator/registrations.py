"""The leader's registrations between its looks: each worker's registration as last read, kept
until a watch on its node says it changed, so that a look at 1,000 unchanged workers costs one
listing of ``workers/`` instead of 1,000 reads. Pure bookkeeping, no I/O: ``Store`` (kazoo) and
the simulated coordinator drive it the same way.

A look, in order:
1. list the children of ``workers/``;
2. let every watch notification that arrived before that answer run (ZooKeeper sends a
   session the notification of a change before any answer that shows the change, and kazoo
   queues notifications in the order they arrive);
3. ``unread(names)``: what is kept (unchanged since read) and which names to read;
4. read those, each setting a watch that calls ``changed``;
5. ``remember`` what was read.

Why a stale entry cannot do harm: an entry is kept only while its watch, set by the read that
filled it, has not fired; watches do not outlive a connection (kazoo drops its watchers at
every disconnection and sends no SetWatches), so ``forget`` on every change of the
connection's state, or when a watcher is called with no path, makes the next look read
everything. And an expulsion deletes the registration only at the version read, so a
registration that changed unseen is refused, not deleted (``WorkerReturned``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hashq.records import Registration


@dataclass(frozen=True)
class Member:
    registration: Registration
    version: int = 0  # of its node: an expulsion's delete checks it


class Registrations:
    """Thread-safe: watches call ``changed`` and connection listeners ``forget`` from kazoo's
    threads while a look runs in another. One look at a time (the leader observes one at a
    time): a look's ``remember`` landing after a later look's would keep the older read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[str, Member] = {}
        self._changed: set[str] = set()  # named by a watch since their read
        self._generation = 0  # raised by ``forget``: reads begun before it are not kept

    def changed(self, name: str) -> None:
        """A watch fired on ``name``'s node (changed, deleted): read it again at the next look."""
        with self._lock:
            self._changed.add(name)

    def forget(self) -> None:
        """The connection's state changed (suspended, reconnected, session lost) or the lead was
        taken: a notification may have been lost, so the next look reads everything."""
        with self._lock:
            self._known.clear()
            self._changed.clear()
            self._generation += 1

    def unread(self, names: Iterable[str]) -> tuple[dict[str, Member], list[str], int]:
        """Of ``names`` (the children just listed, every earlier notification applied): those
        kept as they were read, those to read (new, or changed since their read), and the
        generation to ``remember`` the reads under. Names no longer listed are dropped."""
        with self._lock:
            listed = list(names)
            kept = {
                n: self._known[n] for n in listed if n in self._known and n not in self._changed
            }
            self._known, self._changed = dict(kept), set()
            return kept, [n for n in listed if n not in kept], self._generation

    def remember(self, generation: int, read: Mapping[str, Member]) -> None:
        """Keep what a look read, unless ``forget`` came since it began (its watches may be
        gone with the connection)."""
        with self._lock:
            if generation == self._generation:
                self._known.update(read)


def listed_in_order(names: Iterable[str], *found: Mapping[str, Member]) -> dict[str, Member]:
    """The members found, in the order of the listing (the machine's decisions are the same for
    the same look)."""
    return {n: m for n in names for part in found if (m := part.get(n)) is not None}
