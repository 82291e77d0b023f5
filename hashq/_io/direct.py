"""A bucket channel's deliveries handed to the worker at once, without a task each.

aiormq runs every consumer callback in a task of its own (``Channel._on_deliver_frame``): a
task, a future-store entry and two done-callbacks per message, about 5 us, a tenth of what a
plain consumer spends on a message here. A bucket lease's callback (``BucketLease.deliver``)
never waits: it puts the delivery in its lane and returns, so it can run in the channel's
reader itself. Its order is then the channel's, which the lease's machine restores anyway.

This replaces the channel's ``_on_deliver_frame`` (aiormq 6 and 7 look it up on the channel
each time a ``basic.deliver`` arrives) with one that reads the message as aiormq does and
calls the callback. What it relies on is checked first, names and signatures; if it is not
there (another aiormq), the channel stays as it is and the callback runs in aiormq's tasks,
slower but the same, and the worker says so once. ``tests/unit/test_direct.py`` fails if
aiormq's reader stops calling the method, or reads a delivery otherwise. A bucket channel has
one consumer, the lease's: every delivery to a consumer of the channel goes to the callback.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import aiormq.abc
from aiormq.abc import DeliveredMessage
from pamqp import commands as spec
from pamqp.header import ContentHeader

log = logging.getLogger(__name__)

# What is called, with the parameters it is called with.
_NEEDED = {"_on_deliver_frame": ["frame"], "_get_frame": [], "_read_content": ["frame", "header"]}
_said: list[bool] = []  # whether the slower path was reported (once a process)


def supported(channel: object) -> bool:
    """Whether ``channel`` has what ``deliver_directly`` relies on, as it relies on it."""
    if not isinstance(getattr(channel, "consumers", None), dict):
        return False
    for name, parameters in _NEEDED.items():
        method = getattr(channel, name, None)
        try:
            if method is None or list(inspect.signature(method).parameters) != parameters:
                return False
        except (TypeError, ValueError):  # no signature to read
            return False
    return True


def deliver_directly(
    channel: aiormq.abc.AbstractChannel, callback: Callable[[DeliveredMessage], None]
) -> bool:
    """Call ``callback`` in ``channel``'s reader for each delivery to one of its consumers;
    False (and the channel unchanged) if this aiormq has not what it takes."""
    if not supported(channel):
        if not _said:
            _said.append(True)
            log.info("aiormq's channel reader is not as expected: deliveries go through its tasks")
        return False
    underlay: Any = channel  # its protected members, checked above

    async def on_deliver_frame(frame: spec.Basic.Deliver) -> None:
        header = await underlay._get_frame()
        if not isinstance(header, ContentHeader):
            raise ValueError(f"Unexpected frame {header!r} instead of ContentHeader", header)
        message = await underlay._read_content(frame, header)
        if frame.consumer_tag not in underlay.consumers:
            return  # cancelled: the message goes back when the channel closes, as in aiormq
        try:
            callback(message)
        except Exception:  # as aiormq's task would: said, and the channel goes on
            log.exception("a delivery's callback failed")

    underlay._on_deliver_frame = on_deliver_frame
    return True
