"""Per-key lanes: the pure core of in-order, cross-key parallel processing.

Deliveries of a bucket arrive in queue order. ``InOrder`` puts them back in that order if
callbacks run out of order (the broker numbers deliveries on a channel 1, 2, 3, ...). ``Lanes``
then lets at most one item per key be active: an item becomes ready when its key is idle, and
the next item of that key only when the previous one is done. A key has state only while it
has an item in hand, so memory is bounded by the prefetch window, however many keys pass.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class InOrder(Generic[T]):
    """Releases items in the order of their sequence numbers 1, 2, 3, ..., holding early ones."""

    def __init__(self, first: int = 1) -> None:
        self._next = first
        self._early: dict[int, T] = {}

    def push(self, number: int, item: T) -> list[T]:
        """Items now in order, starting with ``item`` if it was the next one."""
        if number < self._next or number in self._early:
            raise ValueError(f"sequence number {number} seen twice")
        self._early[number] = item
        released = []
        while self._next in self._early:
            released.append(self._early.pop(self._next))
            self._next += 1
        return released

    def __len__(self) -> int:
        return len(self._early)


class Lanes(Generic[T]):
    """FIFO lanes by key: at most one active item per key."""

    def __init__(self) -> None:
        # A key is present while it has an active item; its deque holds the items behind it.
        self._behind: dict[str, deque[T]] = {}

    def add(self, key: str, item: T) -> bool:
        """Queue ``item``; True if it is ready at once (its key was idle), and is now active."""
        behind = self._behind.get(key)
        if behind is None:
            self._behind[key] = deque()
            return True
        behind.append(item)
        return False

    def done(self, key: str) -> T | None:
        """The active item of ``key`` finished: its next item, now active, or None (key idle)."""
        behind = self._behind[key]
        if behind:
            return behind.popleft()
        del self._behind[key]
        return None

    def clear(self) -> None:
        self._behind.clear()

    def in_hand(self, key: str) -> int:
        """Items of ``key`` held: its active one and those behind it."""
        behind = self._behind.get(key)
        return 0 if behind is None else 1 + len(behind)

    def in_hand_by_key(self) -> dict[str, int]:
        """``in_hand`` of every key that has items in hand."""
        return {key: 1 + len(behind) for key, behind in self._behind.items()}

    @property
    def active_keys(self) -> int:
        return len(self._behind)

    @property
    def waiting(self) -> int:
        """Items queued behind their key's active one."""
        return sum(len(behind) for behind in self._behind.values())
