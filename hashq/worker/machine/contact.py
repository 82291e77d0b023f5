"""Whether a worker has heard from the broker on a connection recently enough to start a message
delivered on it: a lease on the connection, renewed by the worker's own round trips. Pure: the
caller gives the clock.

A worker starts a delivered message only within ``BROKER_CONTACT_SECONDS`` after it *sent* a
request on the message's connection that the broker answered. Once the broker has closed the
connection (the worker's link failed, a fence closed it, the broker reset it), no request sent
afterwards is answered, so from ``BROKER_CONTACT_SECONDS`` after that close on the worker starts
nothing more of it, by its own clock and whatever it knows or hears: frozen and resumed, cut off
ZooKeeper, or not yet aware that the connection is gone. That bound is what lets the leader hand
a fenced owner's bucket on that long after the fence once the bucket's queue shows it took back
everything (``hashq_coordinator.machine.handover.View.returned``), rather than after
``RETURN_GRACE_SECONDS``. The cost: a broker slower than ``BROKER_CONTACT_SECONDS`` minus
``RENEW_SECONDS`` to answer holds new starts until it answers.
"""

from __future__ import annotations

import math

from hashq.records import BROKER_CONTACT_SECONDS

RENEW_SECONDS = BROKER_CONTACT_SECONDS / 4  # how often a worker asks the broker something


class BrokerContact:
    """The lease on one connection."""

    def __init__(self) -> None:
        self._sent_at = -math.inf  # when the newest request the broker answered was sent

    def answered(self, sent_at: float) -> None:
        """A request sent at ``sent_at`` (the caller's monotonic clock) was answered."""
        self._sent_at = max(self._sent_at, sent_at)

    def fresh(self, now: float) -> bool:
        """Whether a delivered message of the connection may start at ``now``."""
        return now - self._sent_at < BROKER_CONTACT_SECONDS

    def lapsed(self, now: float) -> float:
        """How long, at ``now``, the contact has not been fresh since it last was: 0 while
        fresh, and before anything was answered (starting, not lapsed)."""
        if self._sent_at == -math.inf:
            return 0.0
        return max(0.0, now - self._sent_at - BROKER_CONTACT_SECONDS)
