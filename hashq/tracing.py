"""OpenTelemetry tracing, optional: ``pip install 'hashq[otel]'`` (the API; the application sets
up its SDK and exporter, as with any instrumented library).

- A publish runs in a producer span, ``send hashq.<app>``, whose context goes into each
  message's headers through OpenTelemetry's configured propagator (by default W3C
  ``traceparent``/``tracestate``). A message published by another AMQP client with
  OpenTelemetry's own instrumentation carries the same headers, and is traced the same way.
- A worker runs each execution of a handler in a consumer span, ``process hashq.<app>``: the
  child of the context its message carries and linked to it, current while the handler runs
  (so the handler's own spans nest under it, in its thread too). Its attributes say which key
  (hashed unless ``HASHQ_LOG_KEYS=clear``), bucket, epoch and attempt, and how it ended
  (``hashq.outcome``: done, dropped, retry, dead-lettered, parked, moved, cut-off, not-begun,
  cancelled; docs/operations.md, "Tracing"); a failed attempt records its exception and an
  error status, so retries and dead letters show as spans of their own. A message dead-lettered
  or moved without running (undecodable, or of a parked key) gets a span too.

``HASHQ_TRACING``: ``auto`` (the default) traces when OpenTelemetry is installed, ``on`` refuses
to start without it, ``off`` never traces: then nothing of this runs per message. Either way no
span is made until the application sets a tracer provider (``Tracing.active``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from hashq.errors import ConfigError

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
except ImportError:  # the extra is not installed: nothing below is called
    trace = None  # type: ignore[assignment]
    Span = Any  # type: ignore[misc,assignment]
    SpanKind = Any  # type: ignore[misc,assignment]
    Link = Any  # type: ignore[misc,assignment]

from hashq._io.logs import key_for_log
from hashq.message import Message

__all__ = ["Execution", "Span", "Tracing", "current", "ended", "installed", "tracing_for"]

log = logging.getLogger(__name__)

INSTRUMENTATION = "hashq"
RECHECK_SECONDS = 1.0  # how soon a tracer provider set after start is seen
SYSTEM = "rabbitmq"
# hashq's own attributes of an execution's span (docs/operations.md, "Tracing").
SPAN_ATTRIBUTES = (
    "hashq.key",
    "hashq.bucket",
    "hashq.epoch",
    "hashq.attempt",
    "hashq.redelivered",
    "hashq.outcome",
)


def installed() -> bool:
    return trace is not None


def tracing_for(mode: str, exchange: str, *, keys_in_clear: bool = False) -> Tracing | None:
    """The tracing ``HASHQ_TRACING`` asks for, or None when it is off (or ``auto`` and
    OpenTelemetry is not installed)."""
    if mode == "off" or (mode == "auto" and not installed()):
        return None
    if not installed():
        raise ConfigError("HASHQ_TRACING=on needs OpenTelemetry: pip install 'hashq[otel]'")
    return Tracing(exchange, keys_in_clear)


class Tracing:
    """Spans of one app's publishes and executions (``exchange`` names the app). A failure of
    OpenTelemetry's own (a sampler, a span processor, a propagator of the application's)
    never changes what becomes of a message: it is logged, and the message goes on untraced.
    """

    def __init__(self, exchange: str, keys_in_clear: bool) -> None:
        from hashq import __version__

        # Asked of the global provider now; a proxy until the application sets one.
        self._tracer = trace.get_tracer(INSTRUMENTATION, __version__)
        self._exchange = exchange
        self._keys_in_clear = keys_in_clear
        self._provider_set = False
        self._asked_at = -RECHECK_SECONDS

    @property
    def active(self) -> bool:
        """Whether the application has set a tracer provider (an SDK). Until then no span
        would be recorded, and hashq makes none: 10 us a message, measured, for nothing. Asked
        again each second at most (asking OpenTelemetry takes 2 us), since it may be set later;
        once set, it stays (OpenTelemetry sets it once)."""
        if not self._provider_set:
            now = time.monotonic()
            if now - self._asked_at >= RECHECK_SECONDS:
                self._asked_at = now
                provider = trace.get_tracer_provider()
                self._provider_set = not isinstance(provider, trace.ProxyTracerProvider)
        return self._provider_set

    @contextlib.contextmanager
    def sending(self) -> Iterator[None]:
        """A producer span, current while a publish (or a batch) is sent and confirmed; an
        exception that ends the publish is recorded on it."""
        attributes = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.destination.name": self._exchange,
        }
        span = self._started(f"send {self._exchange}", SpanKind.PRODUCER, attributes)
        error: Exception | None = None
        try:
            with current(span):
                yield
        except Exception as exc:
            error = exc
            raise
        finally:
            ended(span, None, error)

    def inject(self, headers: MutableMapping[str, Any]) -> None:
        """The current trace context into a message's headers."""
        try:
            propagate.inject(headers)
        except Exception as exc:
            _failed(exc)

    @contextlib.contextmanager
    def executing(self, message: Message) -> Iterator[Execution]:
        """A consumer span for one execution of ``message``: the child of the context it
        carries, and linked to it. It ends once, when the block exits, with the outcome the
        block set (``cancelled`` if it set none: the block was left by an exception)."""
        execution = Execution(self._execution_span(message))
        try:
            yield execution
        finally:
            ended(execution.span, execution.outcome, execution.error)

    def _execution_span(self, message: Message) -> Span | None:
        if not self.active:
            return None
        try:
            carried = propagate.extract(_text_headers(message.headers))
            publish = trace.get_current_span(carried).get_span_context()
        except Exception as exc:
            _failed(exc)
            return None
        attributes: dict[str, str | int | bool] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.destination.name": self._exchange,
            "hashq.key": key_for_log(message.key, self._keys_in_clear),
            "hashq.bucket": message.bucket,
            "hashq.epoch": message.epoch,
            "hashq.attempt": message.attempt,
            "hashq.redelivered": message.redelivered,
        }
        if message.message_id is not None:
            attributes["messaging.message.id"] = message.message_id
        links = [Link(publish)] if publish.is_valid else None
        return self._started(
            f"process {self._exchange}", SpanKind.CONSUMER, attributes, carried, links
        )

    def _started(
        self,
        name: str,
        kind: SpanKind,
        attributes: Mapping[str, str | int | bool],
        parent: Any = None,
        links: list[Link] | None = None,
    ) -> Span | None:
        """A span begun now, or None while no provider is set or if OpenTelemetry failed."""
        if not self.active:
            return None
        try:
            return self._tracer.start_span(
                name, context=parent, kind=kind, links=links, attributes=attributes
            )
        except Exception as exc:
            _failed(exc)
            return None


@dataclass
class Execution:
    """One execution's span (None: untraced), and what became of the execution."""

    span: Span | None
    outcome: str = "cancelled"
    error: BaseException | None = None

    def ended(self, outcome: str, error: BaseException | None = None) -> None:
        self.outcome, self.error = outcome, error


def current(span: Span | None) -> contextlib.AbstractContextManager[object]:
    """``span`` current while the block runs (a handler's own spans nest under it). What the
    block raises is not recorded here: ``ended`` records it once."""
    if span is None:
        return contextlib.nullcontext()
    return trace.use_span(
        span, end_on_exit=False, record_exception=False, set_status_on_exception=False
    )


def ended(span: Span | None, outcome: str | None, error: BaseException | None = None) -> None:
    """End ``span``: with its outcome (``hashq.outcome``), and its error if it failed."""
    if span is None:
        return
    try:
        if outcome is not None:
            span.set_attribute("hashq.outcome", outcome)
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, _describe(error)))
        span.end()
    except Exception as exc:
        _failed(exc)


def _describe(error: BaseException) -> str:
    try:
        return f"{type(error).__name__}: {error}"[:200]
    except Exception:  # an exception whose str() raises
        return type(error).__name__


def _failed(exc: Exception) -> None:
    """OpenTelemetry raised: said once at WARNING, then at DEBUG; hashq goes on untraced."""
    global _warned
    level = logging.DEBUG if _warned else logging.WARNING
    log.log(level, "tracing failed, the message goes on untraced: %s: %s", type(exc).__name__, exc)
    _warned = True


_warned = False


def _text_headers(headers: dict[str, Any]) -> dict[str, str]:
    """The headers a propagator can read: text values (AMQP may carry them as bytes)."""
    text = {}
    for name, value in headers.items():
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if isinstance(value, str):
            text[name] = value
    return text
