"""The chaos checker. It knows nothing of hashq: it reads what the publishers say the broker
confirmed, what the handlers say they executed, and what the dead-letter queue holds, and
counts what went wrong.

- lost: confirmed, never completed, not dead-lettered, not still in a queue (``unfinished``:
  what a design had not processed when the run stopped waiting for it);
- reordered: per key, the first execution of seq n started after an execution of a higher seq
  had completed (a repeat of an already executed seq is a redelivery, not a reordering);
- overlapping: two executions of one key overlapping in time, each compared with every
  execution of the key still going when it starts. Split into those within one epoch (a bug),
  those where the older epoch's execution had started first and belonged to a fenced zombie,
  and those where the older epoch's execution started *after* the newer one (a stale start, a
  bug). A design without a fencing token records epoch None: nothing downstream can tell its
  two executions apart, so each of its overlaps counts as a same-epoch one;
- stale starts: an execution that starts at a lower epoch than one its bucket has already
  started at. A fenced owner must start nothing more, whatever key it is;
- duplicates: executions beyond the first of a message (at-least-once: counted, not failed).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hashq.admin.jobs_file import read_appended


@dataclass
class Verdict:
    confirmed: int = 0
    executions: int = 0
    completed: int = 0
    keys: int = 0
    lost: int = 0
    unfinished: int = 0
    dead_lettered: int = 0
    reordered: int = 0
    overlapping_same_epoch: int = 0
    overlapping_zombie: int = 0
    overlapping_stale: int = 0
    stale_starts: int = 0
    duplicates: int = 0
    examples: dict[str, list[str]] = field(default_factory=dict)

    def example(self, kind: str, text: str) -> None:
        self.examples.setdefault(kind, []).append(text)

    @property
    def clean(self) -> bool:
        bugs = (self.lost, self.reordered, self.overlapping_same_epoch, self.overlapping_stale)
        return not any(bugs) and self.stale_starts == 0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["examples"] = {k: v[:5] for k, v in self.examples.items()}
        data["clean"] = self.clean
        return data


def read_lines(paths: list[Path]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in paths:
        rows.extend(read_appended(path))
    return rows


def judge(
    confirmed: list[dict[str, Any]],
    executions: list[dict[str, Any]],
    dead: set[tuple[str, int]],
    queued: set[tuple[str, int]] | None = None,
) -> Verdict:
    verdict = Verdict(confirmed=len(confirmed), executions=len(executions))
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in executions:
        by_key[run["key"]].append(run)
    done = {(run["key"], run["seq"]) for run in executions}
    verdict.completed = len(done)
    verdict.keys = len({row["key"] for row in confirmed})
    verdict.dead_lettered = len(dead)
    for row in confirmed:
        message = (row["key"], row["seq"])
        if message in done or message in dead:
            continue
        if queued and message in queued:
            verdict.unfinished += 1
        else:
            verdict.lost += 1
            verdict.example("lost", f"{row['key']}#{row['seq']}")
    for key, runs in by_key.items():
        _judge_key(key, sorted(runs, key=lambda r: r["start"]), verdict)
    _judge_stale_starts(executions, verdict)
    return verdict


def _judge_stale_starts(executions: list[dict[str, Any]], verdict: Verdict) -> None:
    """Per bucket, in order of start: a start below the highest epoch started so far. On equal
    start times the lower epoch is taken to have started first."""
    newest: dict[int, int] = {}
    for run in sorted(executions, key=lambda r: (r["start"], r["epoch"] or 0)):
        epoch, bucket = run["epoch"], run["bucket"]
        if epoch is None:
            continue
        if epoch < newest.get(bucket, epoch):
            verdict.stale_starts += 1
            verdict.example(
                "stale_starts",
                f"bucket {bucket}: {run['key']}#{run['seq']} at epoch {epoch} after "
                f"epoch {newest[bucket]} began",
            )
        newest[bucket] = max(epoch, newest.get(bucket, epoch))


def _judge_key(key: str, runs: list[dict[str, Any]], verdict: Verdict) -> None:
    """``runs`` sorted by start time."""
    seen: set[int] = set()
    running: list[tuple[float, int]] = []  # heap of (end, seq) not yet known to be finished
    highest_finished = -1
    going: list[dict[str, Any]] = []  # runs that may still be going
    for run in runs:
        while running and running[0][0] <= run["start"]:
            highest_finished = max(highest_finished, heapq.heappop(running)[1])
        seq = run["seq"]
        if seq in seen:
            verdict.duplicates += 1
        elif highest_finished > seq:
            verdict.reordered += 1
            verdict.example("reordered", f"{key}: {seq} after {highest_finished}")
        seen.add(seq)
        heapq.heappush(running, (run["end"], seq))
        going = [other for other in going if other["end"] > run["start"]]
        for other in going:
            _overlap(key, other, run, verdict)
        going.append(run)


def _overlap(key: str, first: dict[str, Any], second: dict[str, Any], verdict: Verdict) -> None:
    """``first`` started no later than ``second``."""
    tokens = (first["epoch"], first["bucket"]), (second["epoch"], second["bucket"])
    if first["epoch"] is None or second["epoch"] is None or tokens[0] == tokens[1]:
        verdict.overlapping_same_epoch += 1
        verdict.example(
            "overlapping_same_epoch",
            f"{key}: {first['seq']} and {second['seq']} at epoch {first['epoch']}",
        )
        return
    kind = "overlapping_zombie" if first["epoch"] < second["epoch"] else "overlapping_stale"
    setattr(verdict, kind, getattr(verdict, kind) + 1)
    verdict.example(
        kind,
        f"{key}: {first['seq']}@epoch {first['epoch']} and {second['seq']}@epoch {second['epoch']}",
    )
