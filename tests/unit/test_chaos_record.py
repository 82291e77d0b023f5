"""What hashq's chaos handlers record: the start is when the worker let the execution begin
(``Message.started_at``, on the harness's true clock), the handler's first line kept beside it,
so the checker judges the worker's decision and the report can show how late a first line came."""

from __future__ import annotations

import json
import time

from hashq.message import Message
from tools.chaos import handler


def test_a_record_starts_when_the_worker_let_it_begin_and_keeps_the_first_line() -> None:
    message = Message("k", json.dumps({"seq": 3}).encode(), {}, "m", 2, 7, False, 1)
    message.started_at = time.monotonic() - 1.0  # the process was stopped for a second between
    first_line = handler._now()
    record = handler._hashq_execution(message, first_line)
    assert record["start"] == handler._TRUE_OFFSET + message.started_at
    assert record["first_line"] == first_line
    assert first_line - record["start"] >= 1.0
    assert (record["key"], record["seq"], record["bucket"], record["epoch"]) == ("k", 3, 2, 7)


def test_without_a_start_from_the_worker_the_first_line_is_the_start() -> None:
    message = Message("k", json.dumps({"seq": 0}).encode(), {}, "m", 0, 1, False, 1)
    record = handler._hashq_execution(message, 123.0)
    assert record["start"] == record["first_line"] == 123.0
