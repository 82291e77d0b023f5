"""A small client for the RabbitMQ management HTTP API (standard library only).

Used to read what AMQP cannot tell (bindings, connections, queue depths); the coordinator's
fence also closes connections through it (``hashq_coordinator.fencing.cutoff``). Calls are
blocking; run them with ``asyncio.to_thread`` from async code.
"""

from __future__ import annotations

import base64
import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from hashq._io.tls import tls_context
from hashq.errors import ServiceUnavailable
from hashq.settings import Settings, redact_url

FIRST_CONNECTION = "/api/connections?page=1&page_size=1&columns=name"  # the least a listing can be
# The tag that lets a user list and close every connection (others close their own only).
CLOSES_EVERY_CONNECTION = "administrator"


class _Unreachable(ServiceUnavailable):
    """A node's management API did not answer, or answered that it cannot serve now (the next
    node is asked; when none answers, ``ServiceUnavailable`` names them all)."""


def without_credentials(url: str) -> str:
    """``url`` without ``user:password@``: the credentials travel in the Authorization header
    (``Settings.management_credentials``); left in the URL they would be taken for the host."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=netloc))


def _decoded(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:  # a proxy's error page, or a reply cut short
        raise _Unreachable(f"not JSON: {raw[:60]!r}") from None


class Management:
    """Calls to ``settings.management_urls`` with the settings' credentials.

    With several URLs (one per cluster node) a call that cannot reach a node goes on to the
    next, and the one that answered is asked first next time.
    """

    def __init__(self, settings: Settings, timeout: float | None = None) -> None:
        self._bases = [without_credentials(url) for url in settings.management_urls]
        self._context = tls_context(settings)
        user, password = settings.management_credentials
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self._auth = f"Basic {token}"
        self._timeout = timeout or settings.connect_timeout
        self.vhost = settings.vhost

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        *,
        missing_ok: bool = False,
    ) -> Any:
        """The decoded JSON answer to ``method path`` (``None`` when empty, or when the thing is
        not found and ``missing_ok``)."""
        data = None if body is None else json.dumps(body).encode()
        failures: list[str] = []
        for base in list(self._bases):
            req = urllib.request.Request(base + path, data=data, method=method)
            req.add_header("Authorization", self._auth)
            req.add_header("Content-Type", "application/json")
            for name, value in (headers or {}).items():
                req.add_header(name, value)
            try:
                return _decoded(self._send(req, method, path, missing_ok))
            except _Unreachable as exc:
                failures.append(f"{redact_url(base)}: {exc}")
                self._bases.append(self._bases.pop(0))  # ask the next node first from now on
        raise ServiceUnavailable(f"management API cannot be reached at {'; '.join(failures)}")

    def _send(self, req: urllib.request.Request, method: str, path: str, missing_ok: bool) -> bytes:
        try:
            with urllib.request.urlopen(req, timeout=self._timeout, context=self._context) as reply:
                raw: bytes = reply.read()
                return raw
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and missing_ok:
                return b""
            if exc.code >= 500:  # a node that is starting or stopping: another may answer
                raise _Unreachable(f"HTTP {exc.code} {exc.reason}") from None
            raise ServiceUnavailable(
                f"management API {method} {path}: HTTP {exc.code} {exc.reason}"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            raise _Unreachable(str(getattr(exc, "reason", exc))) from None
        except http.client.HTTPException as exc:  # e.g. IncompleteRead: a reply cut short
            raise _Unreachable(f"{type(exc).__name__}: {exc}") from None

    def _vhost_path(self, kind: str, name: str = "") -> str:
        path = f"/api/{kind}/{quote(self.vhost, safe='')}"
        return f"{path}/{quote(name, safe='')}" if name else path

    def bindings_from(self, exchange: str) -> list[dict[str, Any]]:
        """Bindings whose source is ``exchange`` (none if it does not exist)."""
        result: list[dict[str, Any]] | None = self.request(
            "GET", self._vhost_path("exchanges", exchange) + "/bindings/source", missing_ok=True
        )
        return result or []

    def queue_depths(self) -> dict[str, int]:
        """Queue name -> messages (ready and unacknowledged) of every queue in the vhost."""
        listed: list[dict[str, Any]] = self.request(
            "GET", self._vhost_path("queues") + "?columns=name,messages"
        )
        return {str(q["name"]): int(q.get("messages") or 0) for q in listed}

    def connections(self, columns: Sequence[str] = ()) -> list[dict[str, Any]]:
        """Every connection the broker has, each with only ``columns`` if any are named: at
        10,000 connections every column is 1.5 s of the broker's time, a few columns a fraction
        of it (docs/benchmarks.md)."""
        query = f"?columns={','.join(columns)}" if columns else ""
        result: list[dict[str, Any]] = self.request("GET", "/api/connections" + query)
        return result

    def can_list_connections(self) -> None:
        """Raises unless the API lists connections. A fleet's coordinators all ask every few
        seconds, and a listing costs the broker time in proportion to its connections (230 ms
        at 10,000, even for a page of one), so a user tagged administrator, which may list and
        close every connection, is only asked who it is."""
        me = self.request("GET", "/api/whoami") or {}
        tags = me.get("tags") or []
        if isinstance(tags, str):  # "a,b" before RabbitMQ 3.9
            tags = tags.split(",")
        if CLOSES_EVERY_CONNECTION not in tags:
            self.request("GET", FIRST_CONNECTION)
