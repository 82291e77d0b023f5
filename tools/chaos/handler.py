"""The work every chaos consumer does, hashq's or a baseline's: a short, variable pause, then
one JSON line per execution appended to the file named by HASHQ_CHAOS_RECORD (see
``tools.executions.append_record``: atomic, survives kill -9)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time

from hashq.message import Message
from tools.executions import append_record


async def execute(
    key: str, body: bytes, message_id: str | None, bucket: int, epoch: int | None, again: bool
) -> None:
    """Do the work of one message and record it. ``epoch`` None: the design has no token."""
    started = time.time()
    await asyncio.sleep(random.uniform(0.0005, 0.004))
    append_record(
        "HASHQ_CHAOS_RECORD",
        {
            "key": key,
            "seq": json.loads(body)["seq"],
            "id": message_id,
            "worker": os.environ.get("HASHQ_WORKER_ID", str(os.getpid())),
            "bucket": bucket,
            "epoch": epoch,
            "redelivered": again,
            "start": started,
            "end": time.time(),
        },
    )


async def record(msg: Message) -> None:
    """The handler hashq's chaos workers run."""
    await execute(msg.key, msg.body, msg.message_id, msg.bucket, msg.epoch, msg.redelivered)
