"""Change the local test broker's settings at run time, and put them back: how the tests and the
chaos run make RabbitMQ's ``consumer_timeout`` fire without a config file of their own.

RabbitMQ 3.10 reads ``consumer_timeout`` (and the channel tick that checks it) when a channel
opens, so a change holds for the channels opened after it; a broker restart forgets it.
``evaluate`` runs one Erlang expression in the broker (``tools/services.sh rabbit-eval``)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from tools import SERVICES_SCRIPT

Evaluate = Callable[[str], str]


def rabbit_eval(expression: str) -> str:
    """Evaluate ``expression`` in the local broker; its printed result."""
    done = subprocess.run(
        ["bash", str(SERVICES_SCRIPT), "rabbit-eval", expression],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def consumer_timeout_settings(milliseconds: int) -> dict[str, int]:
    """The settings that make ``consumer_timeout`` fire after ``milliseconds``, checked five
    times as often (a channel cannot open without a tick interval)."""
    return {"consumer_timeout": milliseconds, "channel_tick_interval": max(100, milliseconds // 5)}


def set_rabbit_env(evaluate: Evaluate, values: dict[str, int]) -> dict[str, str]:
    """Set ``values`` in the broker's application environment; the values they replace, as
    Erlang terms ("" for one that was not set), for ``restore_rabbit_env``."""
    before = {name: read_rabbit_env(evaluate, name) for name in values}
    for name, value in values.items():
        evaluate(f"application:set_env(rabbit, {name}, {value}).")
    return before


def restore_rabbit_env(evaluate: Evaluate, before: dict[str, str]) -> None:
    for name, term in before.items():
        change = f"set_env(rabbit, {name}, {term})" if term else f"unset_env(rabbit, {name})"
        evaluate(f"application:{change}.")


def read_rabbit_env(evaluate: Evaluate, name: str) -> str:
    """The broker's value of ``name`` as an Erlang term, or "" when it is not set."""
    found = evaluate(f"application:get_env(rabbit, {name}).").strip()
    return found[len("{ok,") : -1] if found.startswith("{ok,") else ""
