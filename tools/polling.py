"""The one polling helper of the tests and the tools: ask again until the answer is yes, or
time is up. ``wait_until`` blocks (a thread, a script); ``eventually`` awaits, and its probe may
be a coroutine function."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast, overload

T = TypeVar("T")


def wait_until(
    probe: Callable[[], T | None],
    within: float,
    *,
    every: float = 0.05,
    until: Callable[[T], object] = bool,
    what: str = "condition",
    or_last: bool = False,
) -> T:
    """Call ``probe`` every ``every`` seconds until its answer is true (or satisfies ``until``),
    and return that answer. After ``within`` seconds: ``TimeoutError`` naming ``what``, or, with
    ``or_last``, the last answer (for a caller that reports what it saw)."""
    deadline = time.monotonic() + within
    while not _done(answer := probe(), until):
        if time.monotonic() >= deadline:
            return _late(answer, within, what, or_last)
        time.sleep(every)
    return cast(T, answer)


@overload
async def eventually(
    probe: Callable[[], Awaitable[T | None]],
    within: float = ...,
    *,
    every: float = ...,
    until: Callable[[T], object] = ...,
    what: str = ...,
    or_last: bool = ...,
) -> T: ...


@overload
async def eventually(
    probe: Callable[[], T | None],
    within: float = ...,
    *,
    every: float = ...,
    until: Callable[[T], object] = ...,
    what: str = ...,
    or_last: bool = ...,
) -> T: ...


async def eventually(
    probe: Callable[[], Any],
    within: float = 60,
    *,
    every: float = 0.05,
    until: Callable[[Any], object] = bool,
    what: str = "condition",
    or_last: bool = False,
) -> Any:
    """``wait_until`` for a coroutine: ``probe`` may be a plain or a coroutine function."""
    deadline = time.monotonic() + within
    while not _done(answer := await _ask(probe), until):
        if time.monotonic() >= deadline:
            return _late(answer, within, what, or_last)
        await asyncio.sleep(every)
    return answer


async def _ask(probe: Callable[[], Any]) -> Any:
    answer = probe()
    if inspect.isawaitable(answer):
        return await answer
    return answer


def _done(answer: T | None, until: Callable[[T], object]) -> bool:
    return answer is not None and bool(until(answer))


def _late(answer: T | None, within: float, what: str, or_last: bool) -> T:
    if or_last:
        return cast(T, answer)
    raise TimeoutError(f"{what} not reached within {within:g}s")
