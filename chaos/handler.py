"""The handler the chaos workers run: a short, variable amount of work, then one JSON line per
execution appended (os.write on an O_APPEND descriptor: atomic, survives kill -9) to the file
named by HASHQ_CHAOS_RECORD."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time

from hashq.message import Message

_fd: int | None = None


async def record(msg: Message) -> None:
    started = time.time()
    await asyncio.sleep(random.uniform(0.0005, 0.004))
    entry = {
        "key": msg.key,
        "seq": json.loads(msg.body)["seq"],
        "id": msg.message_id,
        "worker": os.environ.get("HASHQ_WORKER_ID", str(os.getpid())),
        "bucket": msg.bucket,
        "epoch": msg.epoch,
        "redelivered": msg.redelivered,
        "start": started,
        "end": time.time(),
    }
    global _fd
    if _fd is None:
        _fd = os.open(
            os.environ["HASHQ_CHAOS_RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
        )
    os.write(_fd, (json.dumps(entry) + "\n").encode())
