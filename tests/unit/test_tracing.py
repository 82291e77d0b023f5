"""``HASHQ_TRACING``'s modes, the headers a propagator reads, and a tracer that raises
(``hashq.tracing``); the spans themselves are tested against real servers in
tests/integration/test_tracing.py."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from hashq import tracing
from hashq.errors import ConfigError
from hashq.message import Message
from tests.unit.test_runner import _job, _Lease, _runners


def test_off_never_traces() -> None:
    assert tracing.tracing_for("off", "hashq.app") is None


def test_auto_traces_when_opentelemetry_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    assert tracing.tracing_for("auto", "hashq.app") is not None
    monkeypatch.setattr(tracing, "trace", None)
    assert tracing.tracing_for("auto", "hashq.app") is None


def test_on_without_opentelemetry_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "trace", None)
    with pytest.raises(ConfigError, match=r"pip install 'hashq\[otel\]'"):
        tracing.tracing_for("on", "hashq.app")


def test_header_values_that_arrive_as_bytes_are_read_as_text() -> None:
    headers = {"traceparent": b"00-ab-cd-01", "x-count": 3, "tracestate": "a=b"}
    assert tracing._text_headers(headers) == {"traceparent": "00-ab-cd-01", "tracestate": "a=b"}


class _Broken:
    """A tracer (or span) of the application's that raises wherever it is called."""

    def __getattr__(self, name: str) -> Any:
        def broken(*args: object, **kwargs: object) -> Any:
            if self.spans and name == "start_span":
                return _Broken(spans=False)
            raise RuntimeError(f"{name} is broken")

        return broken

    def __init__(self, spans: bool) -> None:
        self.spans = spans


@pytest.mark.parametrize("where", ["starting a span", "ending a span"])
async def test_a_tracer_that_raises_changes_nothing_of_what_becomes_of_a_message(
    where: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="hashq.tracing")  # WARNING once a process, then DEBUG
    traced = tracing.Tracing("hashq.app", keys_in_clear=False)
    traced._provider_set = True  # as if the application had set a provider
    traced._tracer = _Broken(spans=where == "ending a span")  # type: ignore[assignment]
    ran: list[str] = []

    async def handler(message: Message) -> None:
        ran.append(message.key)

    runners = _runners(handler, concurrency=1, threads=1, tracing=traced)
    runners.start()
    lease = _Lease()
    runners.dispatch(_job(lease, 1))
    runners.dispatch(_job(lease, 2))
    await asyncio.sleep(0.1)
    assert ran == ["k1", "k2"] and lease.running == [] and runners.processed == 2
    assert "tracing failed, the message goes on untraced" in caplog.text
    await runners.close()
