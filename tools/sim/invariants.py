"""The invariants, checked as the simulation runs. Those of executions are the one checker's
(``tools.checker``, the definitions of docs/guarantees.md), fed on virtual time and strict: the
first violation ends the run. The simulation adds what only it can see:

- epochs rise: every grant of a bucket is at a higher epoch than the one before;
- one consumer per bucket queue and epoch: the broker never has two consumers of one queue
  registered for the same epoch;
- a worker's connection name means one connection: the leader takes the broker's word that a
  name closed as about the connection announced under it (``FenceBook.heard_closed``);
- a worker ends only when told to stop (``tools.sim.worker``).

And at the end, after every fault healed (``final``): nothing confirmed is lost, every queue is
empty, every live worker holds its share.
"""

from __future__ import annotations

from hashq.records import parse_worker_connection_name
from tools.checker import Checker, Execution, Violation

__all__ = ["Execution", "Invariants"]


class Invariants:
    def __init__(self) -> None:
        self.checker = Checker(strict=True)  # the one checker, fed on virtual time
        self.grants = 0
        self._granted: dict[int, int] = {}  # bucket -> epoch of its latest grant
        self._worker_connections: set[str] = set()  # every worker connection name opened

    @property
    def completed(self) -> set[tuple[str, int]]:
        """Every message (key, seq) an execution of which completed."""
        return self.checker.completed

    def newest_start(self, bucket: int) -> int:
        return self.checker.newest_start(bucket)

    def start(
        self, worker: str, key: str, seq: int, bucket: int, epoch: int, now: float
    ) -> Execution:
        return self.checker.start(Execution(key, seq, bucket, epoch, now, worker))

    def end(self, execution: Execution, completed: bool, failed: bool = False) -> None:
        self.checker.end(execution, completed, failed)

    def granted(self, bucket: int, epoch: int) -> None:
        before = self._granted.get(bucket, 0)
        if epoch <= before:
            raise Violation(
                f"epoch did not rise: bucket {bucket} granted at {epoch} after {before}"
            )
        self._granted[bucket] = epoch
        self.grants += 1

    def connection_opened(self, name: str) -> None:
        if parse_worker_connection_name(name) is None:
            return
        if name in self._worker_connections:
            raise Violation(f"two connections named {name}")
        self._worker_connections.add(name)

    def consumer_added(self, queue: str, epochs: list[int]) -> None:
        """``epochs``: the epoch of every consumer of ``queue`` now registered."""
        if len(epochs) != len(set(epochs)):
            raise Violation(f"two consumers of {queue} at one epoch: {sorted(epochs)}")
