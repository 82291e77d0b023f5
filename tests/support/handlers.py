"""Handlers the worker tests run in real worker processes. Each execution is appended, one JSON
line, to the file named by HASHQ_TEST_RECORD (``tools.executions.append_record``: one os.write on
an O_APPEND descriptor, so lines from several processes never interleave and survive a kill -9)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time

from pydantic import BaseModel, field_validator

from hashq.errors import Reject, Retry
from hashq.message import Message
from hashq.routing import App
from tools.executions import append_record


def _record(msg: Message, start: float, outcome: str) -> None:
    append_record(
        "HASHQ_TEST_RECORD",
        {
            "key": msg.key,
            "seq": json.loads(msg.body)["seq"],
            "worker": os.environ.get("HASHQ_WORKER_ID", str(os.getpid())),
            "pid": os.getpid(),
            "bucket": msg.bucket,
            "epoch": msg.epoch,
            "attempt": msg.attempt,
            "redelivered": msg.redelivered,
            "start": start,
            "end": time.time(),
            "outcome": outcome,
        },
    )


async def record(msg: Message) -> None:
    """Sleep 0-4 ms (more if HASHQ_TEST_DELAY_MS says so), then record the execution."""
    start = time.time()
    ceiling = float(os.environ.get("HASHQ_TEST_DELAY_MS", "4")) / 1000
    await asyncio.sleep(random.uniform(0, ceiling))
    _record(msg, start, "ok")


async def poison(msg: Message) -> None:
    """Like ``record``, but a body with "poison": true always fails."""
    start = time.time()
    if json.loads(msg.body).get("poison"):
        _record(msg, start, "failed")
        raise ValueError(f"poison message {msg.key}/{json.loads(msg.body)['seq']}")
    await asyncio.sleep(random.uniform(0, 0.002))
    _record(msg, start, "ok")


async def breakable(msg: Message) -> None:
    """Like ``record``, but a key named in the file HASHQ_TEST_BROKEN (one per line) fails
    while the file names it: a fix is the file's change."""
    start = time.time()
    if msg.key in _broken_keys(os.environ.get("HASHQ_TEST_BROKEN", "")):
        _record(msg, start, "failed")
        raise ValueError(f"key {msg.key} is broken")
    await asyncio.sleep(random.uniform(0, 0.002))
    _record(msg, start, "ok")


def _broken_keys(path: str) -> list[str]:
    try:
        with open(path) as names:
            return names.read().split()
    except OSError:
        return []


def outcomes(msg: Message) -> None:
    """Like ``record`` (a plain function, in a thread), but a body's "retry_after" raises
    ``Retry(after=...)`` on the first attempt and its "reject" raises ``Reject``."""
    start = time.time()
    body = json.loads(msg.body)
    if "retry_after" in body and msg.attempt == 1:
        _record(msg, start, "failed")
        raise Retry("not yet", after=body["retry_after"])
    if body.get("reject"):
        _record(msg, start, "failed")
        raise Reject(f"hopeless {msg.key}/{body['seq']}")
    _record(msg, start, "ok")


class Numbered(BaseModel):
    seq: int
    note: str = ""


async def typed(msg: Message, body: Numbered) -> None:
    """Like ``record``, for a handler that declares its body's type."""
    assert msg.data is body
    _record(msg, time.time(), "ok")


class SlowToValidate(BaseModel):
    seq: int

    @field_validator("seq")
    @classmethod
    def _slowly(cls, value: int) -> int:
        time.sleep(float(os.environ.get("HASHQ_TEST_SLOW_SECONDS", "1")))
        return value


async def slow_to_validate(msg: Message, body: SlowToValidate) -> None:
    """Like ``record``, for a body whose validation takes HASHQ_TEST_SLOW_SECONDS."""
    _record(msg, time.time(), "ok")


app = App("t")  # the integration tests' app name (tests/conftest.py)


@app.handler("typed")
async def typed_job(msg: Message, body: Numbered) -> None:
    _record(msg, time.time(), "ok")


@app.handler("plain")
def plain_job(msg: Message) -> None:
    _record(msg, time.time(), "ok")


def record_sync(msg: Message) -> None:
    """A plain function, run in the worker's thread pool."""
    start = time.time()
    time.sleep(random.uniform(0, 0.004))
    _record(msg, start, "ok")


def slow_sync(msg: Message) -> None:
    """A plain function that takes HASHQ_TEST_SLOW_SECONDS on a first delivery whose body says
    "slow", and ignores the worker's request to stop (``msg.cancel_event``), as a thread may."""
    start = time.time()
    if json.loads(msg.body).get("slow") and not msg.redelivered:
        time.sleep(float(os.environ.get("HASHQ_TEST_SLOW_SECONDS", "3")))
    _record(msg, start, "ok")
