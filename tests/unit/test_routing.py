"""``hashq.App``: handlers by job type, run by the worker's own runners through
``hashq.testing``. One key's jobs keep one order whatever their types; an unknown type is a dead
letter; each handler may have retry settings of its own."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from pydantic import BaseModel

import hashq
from hashq.errors import ConfigError
from hashq.message import Message
from hashq.publisher import Outgoing
from hashq.settings import WorkerSettings
from hashq.testing import run
from hashq.worker import cli as worker_cli
from tests.support.helpers import user_module


class Placed(BaseModel):
    n: int


def _orders(seen: list[tuple[str, str, int]]) -> hashq.App:
    app = hashq.App("orders")

    @app.handler("order.placed")
    async def placed(msg: Message, order: Placed) -> None:
        await asyncio.sleep(0.001)
        seen.append((msg.key, "placed", order.n))

    @app.handler("order.paid", max_attempts=2)
    def paid(msg: Message) -> None:  # a plain function, in a thread
        if msg.body == b"fail":
            raise ValueError("card declined")
        seen.append((msg.key, "paid", int(msg.body)))

    return app


async def test_one_key_keeps_one_order_across_its_job_types() -> None:
    seen: list[tuple[str, str, int]] = []
    messages = []
    for n in range(30):
        for key in ("user-1", "user-2", "user-3"):
            if n % 2:
                messages.append(Outgoing(key, str(n), job_type="order.paid"))
            else:
                messages.append(Outgoing(key, Placed(n=n), job_type="order.placed"))
    result = await run(_orders(seen), messages, WorkerSettings(app="orders", threads=1))
    for key in ("user-1", "user-2", "user-3"):
        ran = [(kind, n) for k, kind, n in seen if k == key]
        assert ran == [("paid" if n % 2 else "placed", n) for n in range(30)]
    assert result.dead_letters == []
    assert result.most_at_once == 1  # a plain handler in the app: no more than its threads


async def test_an_unknown_or_missing_type_is_a_dead_letter_and_its_key_goes_on() -> None:
    seen: list[tuple[str, str, int]] = []
    messages = [
        Outgoing("user-1", Placed(n=0), job_type="order.placed"),
        Outgoing("user-1", b"x", job_type="order.shipped"),
        Outgoing("user-1", b"no type at all"),
        Outgoing("user-1", "3", job_type="order.paid"),
    ]
    result = await run(_orders(seen), messages, WorkerSettings(app="orders"))
    assert seen == [("user-1", "placed", 0), ("user-1", "paid", 3)]
    assert [dead.reason for dead in result.dead_letters] == ["unknown-type", "unknown-type"]
    first = str(result.dead_letters[0].headers["x-hashq-error"])
    assert first == (
        "app 'orders' has no handler for job type 'order.shipped' "
        "(it has 'order.paid', 'order.placed')"
    )


async def test_a_handler_s_own_retry_settings_beat_the_worker_s() -> None:
    seen: list[tuple[str, str, int]] = []
    settings = WorkerSettings(app="orders", max_attempts=5)
    result = await run(_orders(seen), [Outgoing("k", "fail", job_type="order.paid")], settings)
    assert [e.message.attempt for e in result.executions] == [1, 2]  # its own max_attempts=2
    (dead,) = result.dead_letters
    assert dead.reason == "handler-failed"


async def test_jobs_without_a_type_may_have_a_handler_of_their_own() -> None:
    app = hashq.App("orders")
    untyped: list[bytes] = []

    @app.handler(None)
    async def anything(msg: Message) -> None:
        untyped.append(msg.body)

    result = await run(app, [("k", b"a"), Outgoing("k", b"b", job_type="other")])
    assert untyped == [b"a"]
    assert [dead.reason for dead in result.dead_letters] == ["unknown-type"]


def test_registering_a_type_twice_or_a_handler_that_cannot_take_a_message_is_refused() -> None:
    app = hashq.App("orders")

    @app.handler("a")
    async def first(msg: Message) -> None: ...

    with pytest.raises(ConfigError, match="job type 'a' has two handlers"):

        @app.handler("a")
        async def second(msg: Message) -> None: ...

    with pytest.raises(ConfigError, match="second parameter 'body' has no type"):

        @app.handler("b")
        async def untyped(msg: Message, body) -> None: ...  # type: ignore[no-untyped-def]


def test_a_worker_runs_an_app_only_under_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = "import hashq\napp = hashq.App('orders')\n@app.handler('x')\nasync def x(msg): ...\n"
    user_module(tmp_path, monkeypatch, "orders_app", text)
    loaded = worker_cli.load_handler("orders_app:app")
    assert isinstance(loaded, hashq.App)
    with pytest.raises(ConfigError, match="set HASHQ_APP=orders"):
        hashq.Worker(WorkerSettings(app="default"), loaded)


async def test_retries_of_one_type_do_not_hold_up_other_keys() -> None:
    seen: list[tuple[str, str, int]] = []
    began = time.monotonic()
    messages = [Outgoing("slow", "fail", job_type="order.paid")]
    messages += [Outgoing(f"k{n}", str(n), job_type="order.paid") for n in range(20)]
    await run(_orders(seen), messages, WorkerSettings(app="orders"), wait_for_retries=True)
    assert {key for key, _, _ in seen} == {f"k{n}" for n in range(20)}
    assert time.monotonic() - began < 5


def test_mistakes_in_an_app_are_one_line_before_any_message() -> None:
    app = hashq.App("orders")
    with pytest.raises(ConfigError, match="with the parentheses"):

        @app.handler  # type: ignore[arg-type]
        async def forgot(msg: Message) -> None: ...

    with pytest.raises(ConfigError, match="max_attempts 0 is not from 1 to 1000"):
        app.handler("a", max_attempts=0)
    with pytest.raises(ConfigError, match="0 < base <= max"):
        app.handler("a", retry_base_delay=5, retry_max_delay=1)
    with pytest.raises(ConfigError, match="'sometimes' is not a valid OnFailure"):
        app.handler("a", on_failure="sometimes")
    with pytest.raises(ConfigError, match="has no handlers"):
        hashq.Worker(WorkerSettings(app="orders"), app)


async def test_a_type_sent_as_a_byte_array_is_routed_as_its_text() -> None:
    seen: list[tuple[str, str, int]] = []
    headers = {"x-hashq-type": b"order.paid"}  # as a client sending a byte array would
    await run(_orders(seen), [Outgoing("k", "7", headers=headers)], WorkerSettings(app="orders"))
    assert seen == [("k", "paid", 7)]
