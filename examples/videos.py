"""An example handler: per-user video processing. Each user's uploads must be processed in the
order they were made (a later edit depends on an earlier upload); different users in parallel.

Each execution is appended as one JSON line to the file named by HASHQ_DEMO_RECORD, so that the
demo can check afterwards that no user's uploads ran out of order or at the same time.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time

import hashq

_record_fd: int | None = None


async def transcode(msg: hashq.Message) -> None:
    job = msg.data if msg.data is not None else json.loads(msg.body)
    started = time.time()
    await asyncio.sleep(random.uniform(0.002, 0.010))  # the "transcoding"
    _record(
        {
            "key": msg.key,
            "seq": job["seq"],
            "video": job["video"],
            "worker": os.environ.get("HASHQ_WORKER_ID", str(os.getpid())),
            "bucket": msg.bucket,
            "epoch": msg.epoch,
            "redelivered": msg.redelivered,
            "start": started,
            "end": time.time(),
            "outcome": "ok",
        }
    )


def _record(entry: dict[str, object]) -> None:
    global _record_fd
    path = os.environ.get("HASHQ_DEMO_RECORD")
    if path is None:
        return
    if _record_fd is None:
        _record_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_record_fd, (json.dumps(entry) + "\n").encode())
