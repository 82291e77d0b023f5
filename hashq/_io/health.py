"""The HTTP endpoints of a worker or a coordinator, served on the event loop itself:

- ``/metrics``: Prometheus text format;
- ``/livez``: 200 while the event loop answers (a stuck loop does not answer, and the probe's
  timeout says so);
- ``/readyz``: 200 when the process does its job (a worker: registered and consuming every
  bucket granted to it; a coordinator: connected to ZooKeeper), else 503 with the reason.

A few lines of HTTP/1.1 on ``asyncio.start_server`` rather than a web framework: three fixed
paths, GET only, one response per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Gauge,
    generate_latest,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from hashq.errors import ConfigError
from hashq.settings import ServiceSettings

log = logging.getLogger(__name__)

Readiness = Callable[[], tuple[bool, str]]
REQUEST_SECONDS = 5.0
MAX_HEADER_LINES = 100


def describe_process(registry: CollectorRegistry, component: str) -> None:
    """What every hashq process serves besides its own counts: prometheus-client's process,
    platform and garbage-collector metrics (``process_cpu_seconds_total``,
    ``process_resident_memory_bytes``, ``python_info``, ...), and ``hashq_build_info``, which
    says which version runs where (1, labelled by version and component)."""
    from hashq import __version__

    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    info = Gauge(
        "hashq_build_info",
        "1, labelled by the hashq version and the component (worker or coordinator)",
        ["version", "component"],
        registry=registry,
    )
    info.labels(__version__, component).set(1)


class HealthServer:
    """Serves ``registry`` and ``ready`` until closed; made listening by ``serve``."""

    def __init__(self, registry: CollectorRegistry, ready: Readiness) -> None:
        self._registry = registry
        self._ready = ready

    @classmethod
    async def serve(
        cls, registry: CollectorRegistry, ready: Readiness, host: str, port: int
    ) -> Listening:
        """Listen on ``host``:``port`` (0: a port the system chooses)."""
        handler = cls(registry, ready)
        try:
            server = await asyncio.start_server(handler._serve, host, port)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}"
            ) from None
        listening = Listening(server)
        log.info("metrics and health on http://%s:%d/metrics", host, listening.port)
        return listening

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            method, path = await asyncio.wait_for(_read_request(reader), REQUEST_SECONDS)
            status, content_type, body = self._answer(method, path)
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, ValueError) as exc:
            log.debug("health endpoint: %r", exc)
        finally:
            writer.close()

    def _answer(self, method: str, path: str) -> tuple[str, str, bytes]:
        if method != "GET":
            return "405 Method Not Allowed", "text/plain", b"GET only\n"
        route = path.split("?", 1)[0]
        if route == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(self._registry)
        if route == "/livez":
            return "200 OK", "text/plain", b"alive\n"
        if route == "/readyz":
            ready, reason = self._ready()
            status = "200 OK" if ready else "503 Service Unavailable"
            return status, "text/plain", f"{reason}\n".encode()
        return "404 Not Found", "text/plain", b"try /metrics, /livez or /readyz\n"


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str]:
    """The method and path of one request; its headers are read and ignored."""
    parts = (await reader.readline()).decode("latin-1").split()
    if len(parts) < 2:
        raise ValueError("not an HTTP request")
    for _ in range(MAX_HEADER_LINES):
        if (await reader.readline()).strip() == b"":
            break
    return parts[0], parts[1]


class Listening:
    """A started ``HealthServer``."""

    def __init__(self, server: asyncio.Server) -> None:
        self._server = server

    @property
    def port(self) -> int:
        """The port listened on (the one chosen by the system when asked for 0)."""
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)


@contextlib.asynccontextmanager
async def health_endpoints(
    settings: ServiceSettings, registry: CollectorRegistry, ready: Readiness
) -> AsyncIterator[Listening | None]:
    """The endpoints, served while the block runs, if ``settings.metrics_port`` asks for them."""
    server = None
    if settings.metrics_port is not None:
        port, host = settings.metrics_port, settings.metrics_host
        server = await HealthServer.serve(registry, ready, host, port)
    try:
        yield server
    finally:
        if server is not None:
            await server.close()
