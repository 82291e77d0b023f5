"""An example handler: per-user video uploads. Each user's uploads must be processed in the
order they were made (a later edit depends on an earlier upload); different users in parallel.

    hashq-worker examples.videos:transcode

A message's body is ``{"seq": n, "video": "user-0001/clip-n.mp4"}`` (``examples.publish_uploads``).
The handler checks each user's order as it goes, which only holds within one worker's life: the
real check, across workers and failures, is ``make run``'s (``tools/demo``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random

import hashq

log = logging.getLogger("examples.videos")

EVERY = 500  # one line per this many uploads
_last_seq: dict[str, int] = {}
_done = 0


async def transcode(msg: hashq.Message) -> None:
    global _done
    upload = json.loads(msg.body)
    await asyncio.sleep(random.uniform(0.002, 0.010))  # the "transcoding"
    before = _last_seq.get(msg.key, -1)
    if upload["seq"] < before:  # an earlier upload after a later one: never expected
        log.error("%s: upload %d after %d", msg.key, upload["seq"], before)
    _last_seq[msg.key] = upload["seq"]
    _done += 1
    if _done % EVERY == 0:
        log.info(
            "%d uploads transcoded; last %s (bucket %d, epoch %d)",
            _done,
            upload["video"],
            msg.bucket,
            msg.epoch,
        )
