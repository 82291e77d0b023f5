"""Handlers by job type: ``hashq.App``, and the ``Route`` each message takes through a worker.

::

    app = hashq.App("orders")

    @app.handler("order.placed")
    async def placed(msg: hashq.Message, order: Order) -> None: ...

    @app.handler("order.cancelled", max_attempts=1)
    def cancelled(msg: hashq.Message) -> None: ...

Run it as ``hashq-worker module:app`` (``HASHQ_APP`` must be the app's name); publish with
``publisher.publish(key, body, job_type="order.placed")``, which sends the type in the header
``x-hashq-type``. One key's jobs keep one order, whatever their types: types choose the
function, not the queue or the lane. A job of a type no handler is registered for (or without a
type, unless ``@app.handler(None)`` takes those) is dead-lettered with reason
``unknown-type``. An app with any plain-function handler runs at most ``HASHQ_THREADS``
handlers at once, as a worker of one plain function does (``hashq.worker.runners``).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from hashq.errors import ConfigError, Undecodable
from hashq.message import Handler, MessageHandler, is_async
from hashq.payloads import Payload, declared_payload, with_payload
from hashq.worker.retry import OnFailure, RetryPolicy

TYPE_HEADER = "x-hashq-type"
H = TypeVar("H", bound=Callable[..., Any])


class UnknownType(Undecodable):
    """Raised when a job's type has no handler in the app."""

    reason = "unknown-type"


@dataclass(frozen=True)
class Route:
    """One handler as the runners call it: with one message, on the loop or in a thread, its
    body decoded into the type it declares, retried by its own policy or the worker's."""

    call: MessageHandler
    is_async: bool
    payload: Payload | None
    policy: RetryPolicy | None = None

    @classmethod
    def of(cls, handler: Handler, policy: RetryPolicy | None = None) -> Route:
        payload = declared_payload(handler)
        call = with_payload(handler) if payload else cast(MessageHandler, handler)
        return cls(call, is_async(handler), payload, policy)


def check_handler(name: str, handler: object) -> None:
    """``ConfigError`` unless ``handler`` can be called with a message (and, if it has a
    second parameter, that parameter has a type for the body)."""
    if not callable(handler):
        kind = type(handler).__name__
        raise ConfigError(f"handler {name!r} is not callable (an object of type {kind})")
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):  # a callable without one (some built-ins): nothing to check
        return
    if declared_payload(handler) is not None:  # or ConfigError: a second parameter, no type
        return
    try:
        signature.bind(object())
    except TypeError:
        raise ConfigError(
            f"handler {name!r} cannot be called with one message: its signature is {signature}"
        ) from None


class App:
    """An app's handlers by job type."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._handlers: dict[str | None, tuple[Handler, dict[str, Any]]] = {}

    def handler(
        self,
        job_type: str | None,
        *,
        max_attempts: int | None = None,
        retry_base_delay: float | None = None,
        retry_max_delay: float | None = None,
        on_failure: str | None = None,
    ) -> Callable[[H], H]:
        """Register the decorated function for ``job_type`` (None: jobs without a type), with
        retry settings of its own where given (the worker's ``HASHQ_MAX_ATTEMPTS``,
        ``HASHQ_RETRY_BASE_DELAY``, ``HASHQ_RETRY_MAX_DELAY``, ``HASHQ_ON_FAILURE`` otherwise)."""
        if job_type is not None and not isinstance(job_type, str):
            raise ConfigError(
                f"app {self.name!r}: a job type is a str or None, not {type(job_type).__name__}"
                " (write @app.handler('type'), with the parentheses)"
            )
        overrides = _policy_overrides(
            f"app {self.name!r} job type {job_type!r}",
            max_attempts=max_attempts,
            base_delay=retry_base_delay,
            max_delay=retry_max_delay,
            on_failure=on_failure,
        )

        def register(function: H) -> H:
            if job_type in self._handlers:
                raise ConfigError(f"app {self.name!r}: job type {job_type!r} has two handlers")
            check_handler(f"{self.name}:{job_type}", function)
            self._handlers[job_type] = (function, overrides)
            return function

        return register

    def mapped(self, change: Callable[[Handler], Handler]) -> App:
        """The same app with every handler replaced by ``change(handler)`` (hashq.testing
        records calls this way)."""
        copy = App(self.name)
        copy._handlers = {kind: (change(h), o) for kind, (h, o) in self._handlers.items()}
        return copy

    def check_runs_as(self, app: str) -> None:
        """``ConfigError`` unless a worker of app ``app`` can run this one."""
        if self.name != app:
            raise ConfigError(
                f"the handlers are app {self.name!r}'s, the settings app {app!r}'s: "
                f"set HASHQ_APP={self.name}"
            )
        if not self._handlers:
            raise ConfigError(f"app {self.name!r} has no handlers: register one with @app.handler")

    def router(self, policy: RetryPolicy) -> Router:
        routes = {}
        for job_type, (handler, overrides) in self._handlers.items():
            own = dataclasses.replace(policy, **overrides) if overrides else None
            routes[job_type] = Route.of(handler, own)
        return Router(routes, self.name)


class Router:
    """Which route a job takes: by its type for an app, the one handler otherwise."""

    def __init__(self, routes: dict[str | None, Route], app: str | None = None) -> None:
        self._routes = routes
        self._app = app  # None: one handler for every job, whatever its type

    @classmethod
    def of(cls, handler: Handler | App, policy: RetryPolicy) -> Router:
        if isinstance(handler, App):
            return handler.router(policy)
        return cls({None: Route.of(handler)})

    @property
    def all_async(self) -> bool:
        return all(route.is_async for route in self._routes.values())

    def route(self, headers: dict[str, Any]) -> Route:
        if self._app is None:
            return self._routes[None]
        job_type = headers.get(TYPE_HEADER)
        if isinstance(job_type, bytes | bytearray):  # a client that sends it as a byte array
            job_type = bytes(job_type).decode("utf-8", "replace")
        found = self._routes.get(None if job_type is None else str(job_type))
        if found is None:
            known = ", ".join(sorted(repr(kind) for kind in self._routes if kind is not None))
            raise UnknownType(
                f"app {self._app!r} has no handler for job type {job_type!r} (it has {known})"
            )
        return found


def _policy_overrides(where: str, **given: Any) -> dict[str, Any]:
    """A handler's own retry settings, checked as the worker's are (``WorkerSettings``)."""
    overrides = {name: value for name, value in given.items() if value is not None}
    try:
        if "on_failure" in overrides:
            overrides["on_failure"] = OnFailure(overrides["on_failure"])
        attempts = overrides.get("max_attempts", 1)
        base = overrides.get("base_delay", 0.2)
        ceiling = overrides.get("max_delay", max(base, 30.0))
        if not (isinstance(attempts, int) and 1 <= attempts <= 1000):
            raise ValueError(f"max_attempts {attempts!r} is not from 1 to 1000")
        if not 0 < base <= ceiling <= 3600:
            raise ValueError(f"retry delays {base!r} and {ceiling!r}: 0 < base <= max <= 3600")
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return overrides
