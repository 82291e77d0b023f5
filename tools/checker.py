"""The one checker of what handlers executed, with the definitions of docs/guarantees.md. It
knows nothing of hashq: it sees executions (a key, its message's number ``seq`` from 0 in
publish order, a bucket, an epoch, when it started and ended), what the broker confirmed, what
was dead-lettered and what is still queued.

- lost: confirmed, never completed, not dead-lettered, not still queued (``unfinished``: what
  was still queued when the run stopped waiting for it);
- reordered: per key, the first execution of seq n starts after an execution of a higher seq
  has completed (a repeat of a seq already executed is a redelivery, not a reordering);
- overlaps: an execution starts while another of its key runs. Within one grant (same bucket and
  epoch) it is a bug; beside an older epoch's execution that started first it is a fenced zombie
  (what the fencing token is for), if that one is of its bucket, or of another bucket that has
  started a newer epoch since (a key a resize moved, whose old owner was cut off); beside a newer
  epoch's, or another bucket's current one (a key routed to two buckets), it is a stale
  overlap, a bug. A design without a fencing token
  records epoch None: each of its overlaps counts as one within a grant;
- stale starts: an execution starts at a lower epoch than one its bucket already started at. A
  fenced owner must start nothing more, whatever key it is;
- duplicates: executions beyond the first of a message (at-least-once: counted, not failed).

``Checker`` judges executions as they start and end, in time order: the simulation feeds it
on virtual time and stops at the first violation (``strict``); ``judge`` feeds it the records
of a run afterwards, and ``check`` the records of a test.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.executions import read_appended

Record = dict[str, Any]  # one execution as a handler recorded it
EXAMPLES_IN_JSON = 5


class Violation(Exception):
    """A guarantee broken (raised by a strict ``Checker``: the simulation stops there). The
    text begins with its kind ("reordered", "stale start", ...), then a colon."""


@dataclass(eq=False)
class Execution:
    key: str
    seq: int
    bucket: int
    epoch: int | None  # None: the design has no fencing token
    started: float
    worker: str = ""
    record: Record | None = None  # what the handler recorded, when judging records
    running: bool = True

    @property
    def grant(self) -> tuple[int, int | None]:
        return self.bucket, self.epoch

    def where(self) -> str:
        return (
            f"key {self.key} seq {self.seq} (bucket {self.bucket} epoch {self.epoch})"
            f" on {self.worker or '?'}"
        )


@dataclass
class Verdict:
    """What went wrong, each finding with the text that says where (see the module's words)."""

    confirmed: int = 0
    executions: int = 0
    completed: int = 0
    keys: int = 0
    dead_lettered: int = 0
    lost: list[tuple[str, int]] = field(default_factory=list)
    unfinished: list[tuple[str, int]] = field(default_factory=list)
    reordered: list[str] = field(default_factory=list)
    overlapping_same_epoch: list[str] = field(default_factory=list)
    overlapping_zombie: list[str] = field(default_factory=list)
    overlapping_stale: list[str] = field(default_factory=list)
    stale_starts: list[str] = field(default_factory=list)
    duplicates: list[Execution] = field(default_factory=list)

    @property
    def overlaps(self) -> list[str]:
        """Every overlap, fenced zombies' too: a test without faults expects none at all."""
        return [*self.overlapping_same_epoch, *self.overlapping_zombie, *self.overlapping_stale]

    @property
    def repeats(self) -> list[Record]:
        """The records of the duplicate executions."""
        return [d.record for d in self.duplicates if d.record is not None]

    @property
    def bugs(self) -> list[str]:
        """Every finding that breaks the guarantee: lost, reordered, overlapping within a grant
        or stale, stale starts (not fenced zombies, duplicates or what is still queued)."""
        lost = [f"lost: {key}#{seq}" for key, seq in self.lost]
        return [
            *lost,
            *(f"reordered: {text}" for text in self.reordered),
            *(f"overlap within an epoch: {text}" for text in self.overlapping_same_epoch),
            *(f"stale overlap: {text}" for text in self.overlapping_stale),
            *(f"stale start: {text}" for text in self.stale_starts),
        ]

    @property
    def clean(self) -> bool:
        return not self.bugs

    def to_json(self) -> dict[str, Any]:
        """Counts, and the first few examples of each kind of finding."""
        found = {
            "lost": [f"{key}#{seq}" for key, seq in self.lost],
            "reordered": self.reordered,
            "overlapping_same_epoch": self.overlapping_same_epoch,
            "overlapping_zombie": self.overlapping_zombie,
            "overlapping_stale": self.overlapping_stale,
            "stale_starts": self.stale_starts,
        }
        counts = {
            "confirmed": self.confirmed,
            "executions": self.executions,
            "completed": self.completed,
            "keys": self.keys,
            "unfinished": len(self.unfinished),
            "dead_lettered": self.dead_lettered,
            "duplicates": len(self.duplicates),
        }
        return {
            **counts,
            **{kind: len(texts) for kind, texts in found.items()},
            "examples": {k: v[:EXAMPLES_IN_JSON] for k, v in found.items() if v},
            "clean": self.clean,
        }


class Checker:
    """Judges executions as they start and end; each must be told in time order."""

    def __init__(self, strict: bool = False) -> None:
        self.verdict = Verdict()
        self._strict = strict
        self._running: dict[str, list[Execution]] = defaultdict(list)  # by key
        self._highest_done: dict[str, int] = {}  # by key: the highest seq completed
        self._started: set[tuple[str, int]] = set()
        self.completed: set[tuple[str, int]] = set()
        self._newest_start: dict[int, int] = {}  # bucket -> newest epoch started

    def newest_start(self, bucket: int) -> int:
        """The newest epoch anything of ``bucket`` started at (0: nothing yet)."""
        return self._newest_start.get(bucket, 0)

    def start(self, execution: Execution) -> Execution:
        self.verdict.executions += 1
        self._judge_order(execution)
        self._judge_epoch(execution)
        for other in self._running[execution.key]:
            self._judge_overlap(other, execution)
        self._running[execution.key].append(execution)
        return execution

    def end(self, execution: Execution, completed: bool = True, failed: bool = False) -> None:
        """``failed``: its handler raised. A failed execution is not the message's first (as
        ``judge`` leaves failed records out): the next one is judged for order as the first."""
        execution.running = False
        running = self._running[execution.key]
        running.remove(execution)
        if not running:
            del self._running[execution.key]
        message = (execution.key, execution.seq)
        if failed and message not in self.completed:
            self._started.discard(message)
        if completed:
            self.verdict.completed += 1
            self.completed.add((execution.key, execution.seq))
            highest = self._highest_done.get(execution.key, 0)
            self._highest_done[execution.key] = max(highest, execution.seq)

    def _judge_order(self, execution: Execution) -> None:
        message = (execution.key, execution.seq)
        if message in self._started:
            self.verdict.duplicates.append(execution)
            return
        self._started.add(message)
        highest = self._highest_done.get(execution.key, 0)
        if highest > execution.seq:
            text = f"{execution.where()} first started after seq {highest} completed"
            self._found("reordered", self.verdict.reordered, text)

    def _judge_epoch(self, execution: Execution) -> None:
        epoch, bucket = execution.epoch, execution.bucket
        if epoch is None:
            return
        newest = self._newest_start.get(bucket, 0)
        if epoch < newest:
            text = f"{execution.where()}, bucket already started at epoch {newest}"
            self._found("stale start", self.verdict.stale_starts, text)
        self._newest_start[bucket] = max(epoch, newest)

    def _judge_overlap(self, first: Execution, second: Execution) -> None:
        """``second`` starts while ``first``, of its key, runs."""
        where = second.where()
        if first.epoch is None or second.epoch is None or first.grant == second.grant:
            text = f"{where} while seq {first.seq} runs on {first.worker or '?'}"
            self._found("overlap within an epoch", self.verdict.overlapping_same_epoch, text)
        elif first.epoch < second.epoch and (
            first.bucket == second.bucket or self.newest_start(first.bucket) > first.epoch
        ):
            self.verdict.overlapping_zombie.append(f"{where} while epoch {first.epoch} runs")
        else:
            text = f"{where} while bucket {first.bucket} epoch {first.epoch} runs"
            self._found("stale overlap", self.verdict.overlapping_stale, text)

    def _found(self, kind: str, into: list[str], text: str) -> None:
        if self._strict:
            raise Violation(f"{kind}: {text}")
        into.append(text)


def judge(
    confirmed: list[Record],
    executions: list[Record],
    dead: set[tuple[str, int]],
    queued: set[tuple[str, int]] | None = None,
) -> Verdict:
    """The verdict on a run: ``confirmed`` (key, seq) as the publishers recorded them, the
    handlers' ``executions`` (those with an ``outcome`` other than "ok" failed and do not
    count), the messages found ``dead``-lettered and those still ``queued``."""
    checker = Checker()
    replay(checker, [run for run in executions if run.get("outcome", "ok") == "ok"])
    verdict = checker.verdict
    verdict.confirmed = len(confirmed)
    verdict.keys = len({row["key"] for row in confirmed})
    verdict.dead_lettered = len(dead)
    for row in confirmed:
        message = (row["key"], row["seq"])
        if message in checker.completed or message in dead:
            continue
        (verdict.unfinished if queued and message in queued else verdict.lost).append(message)
    verdict.completed = len(checker.completed)
    return verdict


def replay(checker: Checker, runs: list[Record]) -> None:
    """Tell ``checker`` of every run in time order: each start, after the end of every run that
    ended by then (a run that ends as another starts did not overlap it); on equal start times
    the lower epoch first."""
    ending: list[tuple[float, int, Execution]] = []  # heap of (end, tiebreak, execution)
    numbers = itertools.count()
    for run in sorted(runs, key=lambda r: (r["start"], r.get("epoch") or 0)):
        while ending and ending[0][0] <= run["start"]:
            checker.end(heapq.heappop(ending)[2])
        execution = checker.start(
            Execution(
                key=run["key"],
                seq=run["seq"],
                bucket=run.get("bucket", 0),
                epoch=run.get("epoch"),
                started=run["start"],
                worker=str(run.get("worker", "")),
                record=run,
            )
        )
        heapq.heappush(ending, (run["end"], next(numbers), execution))
    while ending:
        checker.end(heapq.heappop(ending)[2])


def check(path: Path, expected: dict[str, int]) -> Verdict:
    """The verdict on a test's records in ``path`` of the keys in ``expected`` (key -> how many
    messages it published, numbered 0..n-1 in publish order); other keys' records are not
    judged (a test may leave some keys out on purpose: poisoned ones, say)."""
    confirmed = [{"key": k, "seq": seq} for k, count in expected.items() for seq in range(count)]
    runs = [run for run in read_appended(path) if run["key"] in expected]
    return judge(confirmed, runs, set())
