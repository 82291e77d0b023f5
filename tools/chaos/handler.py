"""The work every chaos consumer does, hashq's or a baseline's: a short, variable pause (or the
``hold`` seconds its message asks for, ``tools.chaos.publish``), then one JSON line per
execution appended to the file named by HASHQ_CHAOS_RECORD (see
``tools.executions.append_record``: atomic, survives kill -9).

hashq's chaos workers run ``record`` (a coroutine, cancelled when its bucket is cut off) or
``record_in_thread`` (a plain function in a thread, which nothing can stop: the zombie that
outlives its drain timeout and its channel). Either fails, recorded as failed, for a key the run
has poisoned (``tools.chaos.poison``)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from typing import Any

from hashq.message import Message
from tools.chaos.clock import true_offset
from tools.chaos.poison import Poisoned, PoisonFile
from tools.executions import append_record

_TRUE_OFFSET = true_offset()
_POISON = PoisonFile()


def _now() -> float:
    """The true time, even in a process whose wall clock a fault stepped (tools.chaos.clock)."""
    return _TRUE_OFFSET + time.monotonic()


async def execute(
    key: str, body: bytes, message_id: str | None, bucket: int, epoch: int | None, again: bool
) -> None:
    """Do the work of one message and record it. ``epoch`` None: the design has no token."""
    started = _now()
    await asyncio.sleep(_pause(body))
    append_record(
        "HASHQ_CHAOS_RECORD", _execution(key, body, message_id, bucket, epoch, again, started)
    )


async def record(msg: Message) -> None:
    """The handler hashq's chaos workers run."""
    first_line = _now()
    _fail_if_poisoned(msg, first_line)
    await asyncio.sleep(_pause(msg.body))
    append_record("HASHQ_CHAOS_RECORD", _hashq_execution(msg, first_line))


def record_in_thread(msg: Message) -> None:
    """The same work as ``record``, as a plain function: hashq runs it in a thread."""
    first_line = _now()
    _fail_if_poisoned(msg, first_line)
    time.sleep(_pause(msg.body))
    append_record("HASHQ_CHAOS_RECORD", {**_hashq_execution(msg, first_line), "thread": True})


def _fail_if_poisoned(msg: Message, first_line: float) -> None:
    """A poison key's message fails (``tools.chaos.poison``), recorded as failed."""
    try:
        _POISON.check(msg.key)
    except Poisoned:
        failed = {**_hashq_execution(msg, first_line), "outcome": "failed"}
        append_record("HASHQ_CHAOS_RECORD", failed)
        raise


def _hashq_execution(msg: Message, first_line: float) -> dict[str, Any]:
    """An execution as hashq started it: at ``Message.started_at``, the clock read just before
    the worker's last look that the bucket was its own. A pause between that look and the
    handler's first line (kept as ``first_line``) is a fenced zombie's, not a stale start: the
    checker judges when the worker decided, as it judges a pause anywhere later in the handler."""
    started = _TRUE_OFFSET + msg.started_at if msg.started_at else first_line
    execution = _execution(
        msg.key, msg.body, msg.message_id, msg.bucket, msg.epoch, msg.redelivered, started
    )
    return {**execution, "first_line": first_line}


def _pause(body: bytes) -> float:
    hold = json.loads(body).get("hold")
    return float(hold) if hold else random.uniform(0.0005, 0.004)


def _execution(
    key: str,
    body: bytes,
    message_id: str | None,
    bucket: int,
    epoch: int | None,
    again: bool,
    started: float,
) -> dict[str, Any]:
    now = _now()
    stepped = round(time.time() - now)  # what this process's own clock says, against the truth
    return {
        **({"clock_off": stepped} if stepped else {}),
        "key": key,
        "seq": json.loads(body)["seq"],
        "id": message_id,
        "worker": os.environ.get("HASHQ_WORKER_ID", str(os.getpid())),
        "bucket": bucket,
        "epoch": epoch,
        "redelivered": again,
        "start": started,
        "end": now,
    }
