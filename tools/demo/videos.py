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
from tools.executions import append_record


async def transcode(msg: hashq.Message) -> None:
    job = msg.data if msg.data is not None else json.loads(msg.body)
    started = time.time()
    await asyncio.sleep(random.uniform(0.002, 0.010))  # the "transcoding"
    append_record(
        "HASHQ_DEMO_RECORD",
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
        },
    )
