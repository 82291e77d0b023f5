"""The invariants, checked as the simulation runs, with the definitions of docs/guarantees.md
(the chaos checker's, ``tools.chaos.checker``):

- per key in order: the first execution of seq n never starts after an execution of a higher
  seq of its key has completed (a repeat is a redelivery, not a reordering);
- never two at once within an epoch: an execution never starts while another of its key runs at
  the same epoch, nor at an older epoch than one running (a stale start beside a newer owner);
  an older epoch's execution that started first and still runs is a fenced zombie (counted);
- no stale starts: nothing of a bucket starts at an epoch older than one already started;
- epochs rise: every grant of a bucket is at a higher epoch than the one before;
- one consumer per bucket queue and epoch: the broker never has two consumers of one queue
  registered for the same epoch;
- a worker ends only when told to stop (``tools.sim.worker``).

And at the end, after every fault healed (``final``): nothing confirmed is lost, every queue is
empty, every live worker holds its share.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field

from tools.sim.world import Violation


@dataclass(eq=False)
class Execution:
    number: int
    worker: str
    key: str
    seq: int
    bucket: int
    epoch: int
    started: float
    running: bool = True


@dataclass
class Counts:
    executions: int = 0
    completed: int = 0
    redeliveries: int = 0
    zombie_overlaps: int = 0
    grants: int = 0
    faults: dict[str, int] = field(default_factory=lambda: defaultdict(int))


class Checker:
    def __init__(self) -> None:
        self.counts = Counts()
        self._numbers = itertools.count(1)
        self._running: dict[str, list[Execution]] = defaultdict(list)  # by key
        self._highest_done: dict[str, int] = {}
        self._started: set[tuple[str, int]] = set()
        self.completed: set[tuple[str, int]] = set()
        self._newest_start: dict[int, int] = {}  # bucket -> newest epoch started
        self._granted: dict[int, int] = {}  # bucket -> epoch of its latest grant

    def newest_start(self, bucket: int) -> int:
        """The newest epoch anything of ``bucket`` started at (0: nothing yet)."""
        return self._newest_start.get(bucket, 0)

    def start(
        self, worker: str, key: str, seq: int, bucket: int, epoch: int, now: float
    ) -> Execution:
        execution = Execution(next(self._numbers), worker, key, seq, bucket, epoch, now)
        self.counts.executions += 1
        where = f"key {key} seq {seq} (bucket {bucket} epoch {epoch}) on {worker}"
        if (key, seq) in self._started:
            self.counts.redeliveries += 1
        else:
            self._started.add((key, seq))
            highest = self._highest_done.get(key, 0)
            if highest > seq:
                raise Violation(f"reordered: {where} first started after seq {highest} completed")
        newest = self._newest_start.get(bucket, 0)
        if epoch < newest:
            raise Violation(f"stale start: {where}, bucket already started at epoch {newest}")
        self._newest_start[bucket] = epoch
        for other in self._running[key]:
            if other.epoch == epoch:
                raise Violation(
                    f"overlap within an epoch: {where} while seq {other.seq} runs on {other.worker}"
                )
            if other.epoch > epoch:
                raise Violation(f"stale overlap: {where} while epoch {other.epoch} runs")
            self.counts.zombie_overlaps += 1
        self._running[key].append(execution)
        return execution

    def end(self, execution: Execution, completed: bool) -> None:
        execution.running = False
        self._running[execution.key].remove(execution)
        if not self._running[execution.key]:
            del self._running[execution.key]
        if completed:
            self.counts.completed += 1
            self.completed.add((execution.key, execution.seq))
            key = execution.key
            self._highest_done[key] = max(self._highest_done.get(key, 0), execution.seq)

    def granted(self, bucket: int, epoch: int) -> None:
        before = self._granted.get(bucket, 0)
        if epoch <= before:
            raise Violation(
                f"epoch did not rise: bucket {bucket} granted at {epoch} after {before}"
            )
        self._granted[bucket] = epoch
        self.counts.grants += 1

    def consumer_added(self, queue: str, epochs: list[int]) -> None:
        """``epochs``: the epoch of every consumer of ``queue`` now registered."""
        if len(epochs) != len(set(epochs)):
            raise Violation(f"two consumers of {queue} at one epoch: {sorted(epochs)}")
