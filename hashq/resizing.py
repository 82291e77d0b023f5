"""Growing an app's bucket count online, as data and one decision without I/O: the record of a
resize in ZooKeeper, the marker a resize puts into every old bucket, and ``next_step``, which
says what the resizer does next from what it read. ``hashq resize`` carries the steps out with
kazoo and aio-pika (``hashq.admin.resize``), the simulator with its models; ``docs/protocol.md``
("Resizing") gives the reasons.

The ring routes a key by jump consistent hashing over the ring's bindings in index order
(``hashq.placement``): growing it from N to M bindings moves a key either nowhere or to one of
the new buckets N..M-1, never between old ones. So order holds if no new bucket starts before
every old one has finished what it received before the switch. The steps:

1. ``Begin``: write the record ``/hashq/<app>/resize`` (``SWITCHING``, N to M).
2. ``Switch``: declare the new bucket queues; then, with the entry exchange unbound from the
   ring (a publish meanwhile is returned to its mandatory publisher, never routed by a ring of
   some size in between), bind the ring to the new queues in index order and bind the entry
   exchange again: the routing goes from N to M in one step. Then the record says ``BARRIER``.
3. ``Mark``: publish a marker (header ``MARKER_HEADER``: M) straight into each old bucket queue
   whose marker has not passed. The owner of an old bucket finishes everything delivered
   before its marker, then creates ``resize/<passed_name(M, bucket)>`` and acknowledges it.
4. ``Commit``: once every old bucket passed, one transaction: the topology record says M, the
   resize record ``DONE``, the passed nodes go. Only then does the leader grant the new
   buckets, so none of them starts before the barrier.

Every step may be repeated: a resizer that died is run again and goes on from the record.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass

from hashq.records import record_fields

MARKER_HEADER = "x-hashq-resize"  # on a resize's marker: the bucket count it grows to
# Between declaring the new bucket queues and switching the routing: a process that checked,
# just before they were declared, that no bucket queue lies beyond its count, and is about to
# bind the entry exchange to a ring of that count, has done so by then unless it was paused
# that long between two frames (docs/protocol.md, "Resizing": the one race left open).
SWITCH_SETTLE_SECONDS = 5.0


class ResizePhase(enum.Enum):
    """Where a resize is, as its record says."""

    SWITCHING = "switching"
    """Begun: the new bucket queues may exist, and the routing may already be the new one
    (whoever rebuilds the ring now builds it with the new count once those queues exist).
    Nothing of a new bucket is granted."""
    BARRIER = "barrier"
    """The routing is the new one; markers go into the old buckets, and each old bucket's
    owner says when it passed its marker. Nothing of a new bucket is granted."""
    DONE = "done"
    """The topology record has the new count; the leader grants the new buckets."""


@dataclass(frozen=True)
class ResizeRecord:
    """The node ``/hashq/<app>/resize``: the last resize of the app, from ``old`` buckets to
    ``new``."""

    old: int
    new: int
    phase: ResizePhase = ResizePhase.SWITCHING

    def encode(self) -> bytes:
        return json.dumps({"old": self.old, "new": self.new, "phase": self.phase.value}).encode()

    @classmethod
    def decode(cls, data: bytes) -> ResizeRecord:
        fields = record_fields(data, "resize", cls)
        try:
            return cls(int(fields["old"]), int(fields["new"]), ResizePhase(fields["phase"]))
        except (KeyError, ValueError, TypeError):
            raise ValueError("unreadable resize record") from None

    @property
    def under_way(self) -> bool:
        return self.phase is not ResizePhase.DONE

    def old_buckets(self) -> range:
        return range(self.old)


def marker_of(headers: Mapping[str, object] | None) -> int:
    """The bucket count a delivery's headers name if it is a resize's marker; else 0."""
    if not headers:
        return 0
    value = headers.get(MARKER_HEADER)
    return value if isinstance(value, int) and value > 0 else 0


def passed_name(new: int, bucket: int) -> str:
    """The node an old bucket's owner creates under the resize record once it passed the
    marker of the resize to ``new`` buckets: named by that count, so that the marker of an
    earlier resize (a copy left in a queue) never counts for a later one."""
    return f"passed-{new:04d}-{bucket:04d}"


def parse_passed_name(name: str) -> tuple[int, int] | None:
    """(new, bucket) of a passed node's name; None for any other name."""
    head, _, rest = name.partition("-")
    new, _, bucket = rest.partition("-")
    if head != "passed" or not (new.isdigit() and bucket.isdigit()):
        return None
    return int(new), int(bucket)


def passed_buckets(names: list[str], new: int) -> frozenset[int]:
    """The old buckets whose marker of the resize to ``new`` has passed, from the children of
    the resize record."""
    buckets = set()
    for name in names:
        parsed = parse_passed_name(name)
        if parsed is not None and parsed[0] == new:
            buckets.add(parsed[1])
    return frozenset(buckets)


# ----------------------------------------------------------------------------- the decision


class Step(enum.Enum):
    """What the resizer does next (``next_step``)."""

    REFUSE = "refuse"  # nothing to do, or not this: ``Decision.why`` says why
    BEGIN = "begin"  # write the record, SWITCHING (created, or over a DONE one, by version)
    SWITCH = "switch"  # the new queues, then the routing in one step; then BARRIER
    MARK = "mark"  # a marker into each old bucket in ``Decision.buckets``, then wait
    COMMIT = "commit"  # the topology record says the new count; the record DONE
    DONE = "done"  # the app has the count asked for


@dataclass(frozen=True)
class Decision:
    step: Step
    why: str = ""
    buckets: tuple[int, ...] = ()  # MARK: the old buckets whose marker has not passed


def next_step(
    wanted: int, current: int, record: ResizeRecord | None, passed: frozenset[int]
) -> Decision:
    """What a resizer asked to grow the app to ``wanted`` buckets does next, given the topology
    record's count ``current``, the resize record, and the old buckets whose marker passed."""
    if record is not None and record.under_way:
        if record.new != wanted:
            return Decision(
                Step.REFUSE,
                f"a resize from {record.old} to {record.new} buckets is under way; finish it "
                f"first (hashq resize --buckets {record.new})",
            )
        if record.phase is ResizePhase.SWITCHING:
            return Decision(Step.SWITCH)
        waiting = tuple(b for b in record.old_buckets() if b not in passed)
        return Decision(Step.MARK, buckets=waiting) if waiting else Decision(Step.COMMIT)
    if wanted == current:
        return Decision(Step.DONE)
    if wanted < current:
        return Decision(
            Step.REFUSE,
            f"the app has {current} buckets; shrinking to {wanted} is not supported (it would "
            "move keys between old buckets)",
        )
    return Decision(Step.BEGIN)
