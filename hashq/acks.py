"""Batched acknowledgements: which delivery tags of a channel to acknowledge, and how. Pure:
the bucket lease sends what ``AckWindow.take`` says."""

from __future__ import annotations


class AckWindow:
    """Which delivery tags to acknowledge, and how: one ``multiple`` ack for the longest prefix
    of completed tags (tags of one channel are 1, 2, 3, ...; messages complete out of order),
    and single acks for tags that stay complete beyond a gap across two batches (a key held up
    by retries must not hold up the acknowledgements, and so the prefetch window, of the rest).
    """

    def __init__(self, batch: int) -> None:
        self._batch = batch
        self._acked = 0  # every tag up to here is acknowledged
        self._contiguous = 0  # every tag up to here is complete
        self._ahead: set[int] = set()  # complete, beyond the first gap
        self._single: set[int] = set()  # of those, acknowledged one by one
        self._waited: set[int] = set()  # ahead, unacknowledged, at the last take

    def complete(self, tag: int) -> bool:
        """Mark ``tag`` complete; True when a batch is due."""
        self._ahead.add(tag)
        while self._contiguous + 1 in self._ahead:
            self._contiguous += 1
            self._ahead.discard(self._contiguous)
        return self._contiguous - self._acked >= self._batch or len(self._ahead) >= self._batch

    def take(self) -> tuple[int, list[int]]:
        """The tag to acknowledge ``multiple`` up to (0: none), and tags to acknowledge singly.

        The multiple tag is never one acknowledged before: the broker would close the channel.
        """
        upto = self._contiguous
        while upto > self._acked and upto in self._single:
            upto -= 1
        prefix = upto if upto > self._acked else 0
        self._single = {tag for tag in self._single if tag > self._contiguous}
        self._acked = self._contiguous
        stragglers = sorted((self._waited & self._ahead) - self._single)
        self._single.update(stragglers)
        self._waited = self._ahead - self._single
        return prefix, stragglers

    @property
    def pending(self) -> bool:
        return self._contiguous > self._acked or bool(self._ahead - self._single)
