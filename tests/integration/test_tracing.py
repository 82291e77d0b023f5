"""Tracing (``hashq.tracing``) from a real publish to a real handler execution: a publisher and a
worker against the real RabbitMQ and ZooKeeper, spans taken by OpenTelemetry's SDK with its
in-memory exporter. The worker runs in this process so that its spans land in the same exporter;
its buckets are granted through ZooKeeper by ``Grants``, as a coordinator would."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aio_pika
import pytest
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util._once import Once

from hashq import Reject, Retry
from hashq._io.amqp import connect_amqp
from hashq._io.logs import key_for_log
from hashq.message import Message
from hashq.placement import bucket_of
from hashq.publisher import Publisher
from hashq.settings import Settings, WorkerSettings
from hashq.sync_publisher import SyncPublisher
from hashq.topology import Topology
from hashq.tracing import SPAN_ATTRIBUTES
from hashq.worker.runtime import Worker
from tests.support.grants import Grants
from tools.polling import eventually

tracer = trace.get_tracer("tests.tracing")
KEYS = ("plain", "retry-once", "rejected", "not-json")


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    """The process's tracer provider, exporting into memory. OpenTelemetry lets a process set
    its provider once; after this module it is unset again, as OpenTelemetry's own test
    utilities do (``opentelemetry.test.globals_test.reset_trace_globals``), so that the tests
    after it run untraced, as they would alone."""
    found = trace.get_tracer_provider()
    provider = found if isinstance(found, TracerProvider) else TracerProvider()
    ours = provider is not found
    if ours:
        trace.set_tracer_provider(provider)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    yield memory
    memory.shutdown()
    if ours:
        trace._TRACER_PROVIDER_SET_ONCE = Once()
        trace._TRACER_PROVIDER = None
        trace._PROXY_TRACER_PROVIDER = trace.ProxyTracerProvider()


@pytest.fixture
async def traced_worker(
    initialized: Settings,
    grants: Grants,
    exporter: InMemorySpanExporter,
    request: pytest.FixtureRequest,
) -> AsyncIterator[WorkerSettings]:
    """A worker in this process running ``_handle`` (or the handler the test names), every
    bucket granted to it at epoch 3."""
    exporter.clear()
    given = {**initialized.model_dump(), "worker_id": "w-trace", "codec": "json"}
    settings = WorkerSettings(**given)
    handler = getattr(request, "param", _handle)
    stop = asyncio.Event()
    running = asyncio.ensure_future(Worker(settings, handler).run(stop))
    try:
        registration = await asyncio.to_thread(grants.wait_for_worker, "w-trace")
        grants.assign(registration, dict.fromkeys(range(settings.buckets), 3))
        yield settings
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)


async def _handle(message: Message) -> None:
    """Its own span, under the execution's; ``retry-once`` asks for one retry, ``rejected`` is
    dead-lettered."""
    with tracer.start_as_current_span("handler-work"):
        body = json.loads(message.body)
        if body.get("retry") and message.attempt == 1:
            raise Retry("once", after=0.1)
        if body.get("reject"):
            raise Reject("refused")


def _handle_in_thread(message: Message) -> None:
    """A plain function: the worker runs it in a thread of its pool."""
    with tracer.start_as_current_span("handler-work"):
        pass


def _spans(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def _executions(exporter: InMemorySpanExporter, exchange: str, count: int) -> list[ReadableSpan]:
    spans = _spans(exporter, f"process {exchange}")
    return spans if len(spans) >= count else []


async def test_a_trace_runs_from_the_publishing_request_to_each_execution(
    traced_worker: WorkerSettings, exporter: InMemorySpanExporter
) -> None:
    exchange = Topology.from_settings(traced_worker).exchange
    with tracer.start_as_current_span("request") as request:
        async with Publisher(traced_worker) as publisher:
            await publisher.publish("plain", b"{}")
            await publisher.publish("retry-once", json.dumps({"retry": True}))
            await publisher.publish("rejected", json.dumps({"reject": True}))
            await publisher.publish("not-json", b"{")  # undecodable: dead-lettered as it is
    runs = await eventually(lambda: _executions(exporter, exchange, 5), within=30)
    sends = _spans(exporter, f"send {exchange}")
    assert len(sends) == 4 and all(send.kind is SpanKind.PRODUCER for send in sends)
    trace_id = request.get_span_context().trace_id
    assert {run.context.trace_id for run in runs} == {trace_id}
    send_ids = {send.context.span_id for send in sends}
    for run in runs:
        assert run.kind is SpanKind.CONSUMER
        assert run.parent is not None and run.parent.span_id in send_ids
        assert [link.context.span_id for link in run.links] == [run.parent.span_id]
    by_key = _by_key(runs)
    plain = _only(by_key["plain"])
    assert plain["hashq.outcome"] == "done" and plain["hashq.epoch"] == 3
    assert plain["hashq.bucket"] == bucket_of("plain", traced_worker.buckets)
    assert plain["messaging.system"] == "rabbitmq"
    assert set(SPAN_ATTRIBUTES) <= set(plain)
    assert [(a["hashq.attempt"], a["hashq.outcome"]) for a in by_key["retry-once"]] == [
        (1, "retry"),
        (2, "done"),
    ]
    assert _only(by_key["rejected"])["hashq.outcome"] == "dead-lettered"
    assert _only(by_key["not-json"])["hashq.outcome"] == "dead-lettered"
    failed = [run for run in runs if run.status.status_code is StatusCode.ERROR]
    assert len(failed) == 3  # the retried attempt, the rejected one, the undecodable one
    assert all([event.name for event in run.events] == ["exception"] for run in failed)
    works = _spans(exporter, "handler-work")
    assert {work.parent.span_id for work in works if work.parent} == {
        run.context.span_id for run in runs if _key(run) != "not-json"
    }


@pytest.mark.parametrize("traced_worker", [_handle_in_thread], indirect=True)
async def test_a_plain_amqp_publisher_with_a_traceparent_is_traced_too(
    traced_worker: WorkerSettings, exporter: InMemorySpanExporter
) -> None:
    """What OpenTelemetry's own AMQP instrumentations do: the context in the message's headers
    by the global propagator (W3C traceparent). hashq's worker takes it as its parent, and a
    plain-function handler's own span, in its thread, nests under the execution's."""
    topology = Topology.from_settings(traced_worker)
    headers: dict[str, Any] = {}
    with tracer.start_as_current_span("other-client") as sent:
        propagate.inject(headers)
    connection = await connect_amqp(traced_worker, "test-plain")
    async with connection:
        channel = await connection.channel()
        exchange = await channel.get_exchange(topology.exchange)
        await exchange.publish(aio_pika.Message(b"{}", headers=headers), routing_key="k-plain")
    (run,) = await eventually(lambda: _executions(exporter, topology.exchange, 1), within=30)
    assert run.parent is not None
    assert run.parent.span_id == sent.get_span_context().span_id
    assert run.context.trace_id == sent.get_span_context().trace_id
    (work,) = await eventually(lambda: _spans(exporter, "handler-work"), within=5)
    assert work.parent is not None and work.parent.span_id == run.context.span_id


def _by_key(runs: list[ReadableSpan]) -> dict[str, list[dict[str, Any]]]:
    """Each key's executions' attributes, by attempt; keys are hashed in spans, as in logs."""
    found: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        found.setdefault(_key(run), []).append(dict(run.attributes or {}))
    return {key: sorted(rows, key=lambda a: a["hashq.attempt"]) for key, rows in found.items()}


def _key(run: ReadableSpan) -> str:
    names = {key_for_log(key, False): key for key in KEYS}
    return names[str((run.attributes or {})["hashq.key"])]


def _only(rows: list[dict[str, Any]]) -> dict[str, Any]:
    (row,) = rows
    return row


async def test_the_sync_publisher_carries_its_callers_trace_context(
    traced_worker: WorkerSettings, exporter: InMemorySpanExporter
) -> None:
    """``SyncPublisher`` publishes from its own thread's loop: the caller's context goes along
    (``run_coroutine_threadsafe`` schedules in a copy of the calling thread's context)."""
    exchange = Topology.from_settings(traced_worker).exchange

    def publish() -> None:
        with SyncPublisher(traced_worker) as publisher:
            publisher.publish("plain", b"{}")

    with tracer.start_as_current_span("request") as request:
        await asyncio.to_thread(publish)  # which runs it in a copy of this context
    (run,) = await eventually(lambda: _executions(exporter, exchange, 1), within=30)
    assert run.context.trace_id == request.get_span_context().trace_id
