"""The leader's fence bookkeeping, without I/O: which connection each worker incarnation
announced and since when this leader knows it, and which connection each finished fence
covered.

A fence covers the connection that was the incarnation's newest when it was done. A worker that
was fenced and lived on reconnects with a new, announced connection, which that fence does not
cover: the next bucket of it that needs a fence gets a new one (``covered``). The management API
lists a connection only after up to a lag, so a fence that lists connections must wait until
the newest announced one has been known for that long (``listable_in``). Times are the leader's
own clock (monotonic, or the simulator's); no other machine's clock is read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from hashq.records import Registration

Incarnation = tuple[str, str]  # (worker id, incarnation)

LIVENESS_SINCE_VERSION = 2  # workers of this protocol version on hold a liveness queue
# The shortest session a worker may have (HASHQ_ZK_SESSION_TIMEOUT >= 1): between observations
# closer than this, no worker can announce a connection and then lose its session.
MIN_SESSION_SECONDS = 1.0
UNSEEN = "?"  # a connection this leader may have missed: no real name equals it


@dataclass(frozen=True)
class Sighting:
    """The connection an incarnation's registration announced, and when this coordinator first
    saw that announcement."""

    connection: str
    since: float
    liveness: bool = False  # the worker holds a liveness queue (protocol 2)
    contact: float = 0.0  # its registration's ``contact_seconds`` (0: not declared)


class FenceBook:
    def __init__(self) -> None:
        self._sightings: dict[Incarnation, Sighting] = {}  # newest connection of each
        self._fenced: dict[Incarnation, str] = {}  # the newest connection a fence covered
        self._fenced_at: dict[Incarnation, list[float]] = {}  # when its fences finished
        self._live: set[Incarnation] = set()  # live at the last observation
        # incarnation -> connection -> when the broker's word that it closed was first heard
        self._closed: dict[Incarnation, dict[str, float]] = {}
        self._seen_until = -math.inf  # when the last observation was asked

    def note(
        self, workers: Mapping[str, Registration], keep: set[Incarnation], now: float, asked: float
    ) -> None:
        """Record each live incarnation's newest announced connection, first seen ``now`` if it
        is new; forget incarnations not in ``keep`` (neither live nor named by a bucket).
        ``asked``: when this observation was asked (what it read is at least that recent)."""
        live = {(worker, registration.incarnation) for worker, registration in workers.items()}
        if now - self._seen_until >= MIN_SESSION_SECONDS:
            self._unseen(self._live - live, now)
        for worker, registration in workers.items():
            incarnation = (worker, registration.incarnation)
            announced = registration.connection
            if self._sightings.get(incarnation, Sighting("", 0)).connection != announced:
                liveness = registration.version >= LIVENESS_SINCE_VERSION
                contact = registration.contact_seconds
                self._sightings[incarnation] = Sighting(announced, now, liveness, contact)
        self._live, self._seen_until = live, asked
        self._sightings = {k: v for k, v in self._sightings.items() if k in keep}
        self._fenced = {k: v for k, v in self._fenced.items() if k in keep}
        self._fenced_at = {k: v for k, v in self._fenced_at.items() if k in keep}
        self._closed = {k: v for k, v in self._closed.items() if k in keep}

    def _unseen(self, vanished: set[Incarnation], now: float) -> None:
        """Incarnations that vanished while this leader did not look for as long as a session
        can last: each may have announced a connection and then lost its session, unseen. Its
        sighting restarts ``now`` as unknown, so its fence waits the full lag and no earlier
        fence covers it."""
        for incarnation in vanished:
            before = self._sightings.get(incarnation, Sighting("", now))
            self._sightings[incarnation] = replace(before, connection=UNSEEN, since=now)

    def new_term(self) -> None:
        """Elected: while another coordinator led, any incarnation known here may have
        announced a connection and vanished unseen (the first observation of the term treats
        those that vanished so). Finished fences stay: each closed what it covered."""
        self._live, self._seen_until = set(self._sightings), -math.inf

    def sighting(self, incarnation: Incarnation, now: float) -> Sighting:
        """The incarnation's newest announced connection; one never seen (a new leader
        continuing an old fence) counts as seen ``now``, so its fence waits the full lag."""
        if incarnation not in self._sightings:
            self._sightings[incarnation] = Sighting("", now)
        return self._sightings[incarnation]

    def listable_in(self, incarnation: Incarnation, now: float, lag: float) -> float:
        """Seconds until the newest announced connection has been known for ``lag``: only then
        does its absence from the management API's list prove that it is closed."""
        return max(0.0, self.sighting(incarnation, now).since + lag - now)

    def done(self, incarnation: Incarnation, covered: Sighting, now: float) -> None:
        """A fence finished ``now``; it covered ``covered`` (the sighting it waited for)."""
        self._fenced[incarnation] = covered.connection
        self._fenced_at.setdefault(incarnation, []).append(now)

    def heard_closed(self, incarnation: Incarnation, connection: str, now: float) -> None:
        """The broker said (its event exchange) that ``connection`` closed: heard ``now``,
        which is after it closed."""
        self._closed.setdefault(incarnation, {}).setdefault(connection, now)

    def closed_at(self) -> dict[Incarnation, float]:
        """When the connection that each incarnation's newest fence covered was heard closed.
        Every older connection of it stopped asking the broker anything before that one was
        opened, so from then on no connection of it that could hold a bucket is answered."""
        return {
            incarnation: self._closed[incarnation][connection]
            for incarnation, connection in self._fenced.items()
            if connection in self._closed.get(incarnation, {})
        }

    def contact_bounds(self) -> dict[Incarnation, float]:
        """The contact bound each incarnation's registration declared, for those that did: a
        fenced owner without one (an older worker, or one this leader never saw) waits
        ``RETURN_GRACE_SECONDS``."""
        return {k: s.contact for k, s in self._sightings.items() if s.contact > 0}

    def covered(self) -> frozenset[Incarnation]:
        """Incarnations fenced since their newest connection was announced."""
        return frozenset(
            incarnation
            for incarnation, connection in self._fenced.items()
            if self._sightings.get(incarnation, Sighting("", 0)).connection == connection
        )

    def fences_done(self) -> dict[Incarnation, tuple[float, ...]]:
        """When each incarnation's fences finished (this leader's clock), oldest first."""
        return {incarnation: tuple(times) for incarnation, times in self._fenced_at.items()}
