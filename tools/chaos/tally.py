"""What a chaos run has confirmed and executed so far, read while it goes on: the publishers'
confirmed files and the handlers' record, each read only as far as it grew since the last
look (``tools.executions.Growing``), so that watching costs the harness, whose proxies carry
every link of the run, a few milliseconds a look however long the run."""

from __future__ import annotations

from pathlib import Path

from tools.executions import Growing

Message = tuple[str, int]  # a key and its seq


class Tally:
    """Confirmed messages, executed ones, and those confirmed and not yet executed."""

    def __init__(self, confirmed: list[Path], record: Path) -> None:
        self._confirmed = [Growing(path) for path in confirmed]
        self._record = Growing(record)
        self.sent = 0
        self.executions = 0
        self._executed: set[Message] = set()
        self.left: set[Message] = set()  # confirmed, not executed

    def look(self) -> None:
        """Read what the files gained. An execution may be read before its confirmation (the
        publisher writes it after the broker's confirm, the handler may run first)."""
        sent = [(r["key"], r["seq"]) for growing in self._confirmed for r in growing.records()]
        runs = [(r["key"], r["seq"]) for r in self._record.records()]
        self.sent += len(sent)
        self.executions += len(runs)
        self._executed.update(runs)
        self.left.update(message for message in sent if message not in self._executed)
        self.left.difference_update(runs)
