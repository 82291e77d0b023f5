"""Bodies as values: what a publisher encodes and what a typed handler receives.

A publisher sends bytes as they are, a str as its UTF-8 bytes, and any other value as JSON
(a pydantic model by its own JSON, anything else by ``json.dumps``), with content type
``application/json``. A handler that takes a second parameter with a type, such as
``async def handle(msg: hashq.Message, order: Order)``, receives the body decoded from JSON and
validated as that type (a pydantic model, a dataclass, ``list[int]``: whatever pydantic's
``TypeAdapter`` validates); ``msg.data`` holds the same value. A body that is not valid is
dead-lettered with reason ``invalid`` and pydantic's account of why, without calling the
handler, and its key goes on.
"""

from __future__ import annotations

import inspect
import json
import typing
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from hashq.errors import ConfigError, InvalidMessage, Undecodable
from hashq.message import MessageHandler, is_async

JSON = "application/json"


class InvalidPayload(Undecodable):
    """Raised when a body does not validate as the type its handler declares."""

    reason = "invalid"


def encode(body: object) -> tuple[bytes, str | None]:
    """The bytes to send for ``body``, and their content type (None for bytes and str)."""
    if isinstance(body, bytes):
        return body, None
    if isinstance(body, str):
        return body.encode(), None
    if isinstance(body, BaseModel):
        return body.model_dump_json().encode(), JSON
    try:
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode(), JSON
    except (TypeError, ValueError) as exc:
        kind = type(body).__name__
        raise InvalidMessage(
            f"the body must be bytes, str or JSON-serialisable, not {kind}: {exc}"
        ) from None


class Payload:
    """The type a handler declares for its body, and how to decode a body into it."""

    def __init__(self, kind: Any, parameter: str = "body") -> None:
        self.kind = kind
        try:
            self._adapter: TypeAdapter[Any] = TypeAdapter(kind)
        except Exception as exc:  # pydantic cannot validate that type
            raise ConfigError(
                f"the handler's parameter {parameter!r} has a type pydantic cannot validate "
                f"({kind!r}): {type(exc).__name__}"
            ) from None

    def decode(self, body: bytes) -> Any:
        """The body as the declared type: str and bytes as they were sent (``encode``)."""
        if self.kind is bytes:
            return body
        if self.kind is str:
            try:
                return body.decode()
            except UnicodeDecodeError as exc:
                raise InvalidPayload(f"not a valid str: not UTF-8 ({exc.reason})") from None
        try:
            return self._adapter.validate_json(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "body"
            raise InvalidPayload(
                f"not a valid {getattr(self.kind, '__name__', self.kind)}: {where}: "
                f"{first['msg']} ({exc.error_count()} errors)"
            ) from None
        except Exception as exc:  # a validator of the user's that raised something else
            name = getattr(self.kind, "__name__", self.kind)
            raise InvalidPayload(f"not a valid {name}: {type(exc).__name__}: {exc}") from None


def declared_payload(handler: object) -> Payload | None:
    """The type of a handler's second parameter, if it has one; ``ConfigError`` if it has a
    second parameter without a type (the worker would not know what to give it)."""
    try:
        parameters = list(inspect.signature(handler).parameters.values())  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in parameters if p.kind in positional and p.default is p.empty]
    if len(required) != 2:
        return None
    target = inspect.unwrap(handler)  # type: ignore[arg-type]  # a wrapper's original
    routine = inspect.isfunction(target) or inspect.ismethod(target)
    name = required[1].name
    try:
        hints = typing.get_type_hints(target if routine else type(target).__call__)
    except Exception as exc:  # an annotation that does not resolve (TYPE_CHECKING, local)
        raise ConfigError(
            f"the type of the handler's parameter {name!r} cannot be resolved: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    kind = hints.get(name)
    if kind is None:
        raise ConfigError(
            f"the handler's second parameter {name!r} has no type: give it the "
            "type its body should be decoded into (a pydantic model, say)"
        )
    return Payload(kind, name)


def with_payload(handler: Any) -> MessageHandler:
    """``handler(msg, payload)`` as a handler of one message, async if it is."""
    if is_async(handler):

        async def typed(msg: Any) -> None:
            await handler(msg, msg.data)

        return typed

    def typed_in_thread(msg: Any) -> None:
        handler(msg, msg.data)

    return typed_in_thread
