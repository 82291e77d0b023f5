"""Bodies as values (``hashq.payloads``): what a publisher sends for a value, and a handler that
declares the type of its body, run by the worker's own code through ``hashq.testing``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pydantic
import pytest
from pydantic import BaseModel

from hashq.errors import ConfigError, InvalidMessage
from hashq.message import Message
from hashq.payloads import encode
from hashq.publisher import Outgoing, prepare
from hashq.testing import run
from hashq.worker import cli as worker_cli
from tests.support.helpers import user_module


class Order(BaseModel):
    id: int
    item: str


@dataclass
class Refund:
    order: int


def test_a_value_is_sent_as_json_and_bytes_and_str_as_they_are() -> None:
    assert encode(b"\x00raw") == (b"\x00raw", None)
    assert encode("héllo") == ("héllo".encode(), None)
    assert encode({"a": [1, 2]}) == (b'{"a":[1,2]}', "application/json")
    assert encode(Order(id=1, item="tea")) == (b'{"id":1,"item":"tea"}', "application/json")
    _, _, properties = prepare(Outgoing("k", {"a": 1}))
    assert properties.content_type == "application/json"
    with pytest.raises(InvalidMessage, match="JSON-serialisable, not set"):
        encode({1, 2})


async def test_a_handler_receives_its_declared_type_and_an_invalid_body_is_dead_lettered() -> None:
    seen: list[Order] = []

    async def handle(msg: Message, order: Order) -> None:
        assert msg.data is order
        seen.append(order)

    messages = [
        Outgoing("user-1", Order(id=1, item="tea")),
        Outgoing("user-1", {"id": "not a number", "item": "cake"}),
        Outgoing("user-1", b"not json"),
        Outgoing("user-1", Order(id=2, item="jam")),
    ]
    result = await run(handle, messages)
    assert seen == [Order(id=1, item="tea"), Order(id=2, item="jam")]
    assert [dead.reason for dead in result.dead_letters] == ["invalid", "invalid"]
    first = str(result.dead_letters[0].headers["x-hashq-error"])
    assert first.startswith("not a valid Order: id: Input should be a valid integer")
    assert [execution.message.attempt for execution in result.executions] == [1, 1]


def test_a_plain_function_may_declare_a_dataclass_or_any_type_pydantic_validates() -> None:
    from hashq.testing import run_sync

    refunds: list[Refund] = []
    totals: list[list[int]] = []

    def refund(msg: Message, body: Refund) -> None:
        refunds.append(body)

    def total(msg: Message, numbers: list[int]) -> None:
        totals.append(numbers)

    run_sync(refund, [("k", json.dumps({"order": 7}))])
    run_sync(total, [("k", "[1, 2, 3]")])
    assert (refunds, totals) == ([Refund(order=7)], [[1, 2, 3]])


async def test_a_second_parameter_without_a_type_is_refused_before_any_message() -> None:
    async def handle(msg: Message, body) -> None:  # type: ignore[no-untyped-def]
        pass

    with pytest.raises(ConfigError, match="second parameter 'body' has no type"):
        await run(handle, [("k", b"x")])


def test_the_worker_command_accepts_a_typed_handler_and_refuses_an_untyped_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    user_module(
        tmp_path,
        monkeypatch,
        "typed_handlers",
        "from pydantic import BaseModel\n"
        "class Order(BaseModel):\n    id: int\n"
        "async def good(msg, order: Order): ...\n"
        "async def bad(msg, order): ...\n",
    )
    assert worker_cli.load_handler("typed_handlers:good") is not None
    with pytest.raises(ConfigError, match="has no type"):
        worker_cli.load_handler("typed_handlers:bad")


class _Positive(BaseModel):
    n: int

    @pydantic.field_validator("n")
    @classmethod
    def _check(cls, value: int) -> int:
        if value < 0:
            raise TypeError("negative")  # not a ValueError: pydantic lets it through
        return value


async def test_a_validator_that_raises_anything_is_an_invalid_body_not_a_stuck_key() -> None:
    seen: list[int] = []

    async def handle(msg: Message, body: _Positive) -> None:
        seen.append(body.n)

    result = await run(handle, [("k", '{"n": -1}'), ("k", '{"n": 2}')], within=5)
    assert seen == [2]
    assert [dead.reason for dead in result.dead_letters] == ["invalid"]
    assert "TypeError: negative" in str(result.dead_letters[0].headers["x-hashq-error"])


async def test_a_callable_object_a_str_body_and_a_wrapped_function_are_typed_handlers() -> None:
    got: list[object] = []

    class Handler:
        async def __call__(self, msg: Message, order: Order) -> None:
            got.append(order)

    def text(msg: Message, body: str) -> None:
        got.append(body)

    await run(Handler(), [Outgoing("k", Order(id=1, item="tea"))])
    await run(text, [Outgoing("k", "héllo, not JSON")])
    assert got == [Order(id=1, item="tea"), "héllo, not JSON"]


def test_an_annotation_that_does_not_resolve_is_one_line_at_start_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    user_module(
        tmp_path,
        monkeypatch,
        "checked_only",
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from somewhere import Order\n"
        "async def handle(msg, order: Order): ...\n",
    )
    with pytest.raises(ConfigError, match="'order' cannot be resolved: NameError"):
        worker_cli.load_handler("checked_only:handle")
