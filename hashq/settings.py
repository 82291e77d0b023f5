"""Settings: built once at the edge (CLI or caller) from ``HASHQ_`` variables and flags, then
passed down as data. Nothing in the core reads the environment.

Every field ``name`` is the variable ``HASHQ_NAME`` and the flag ``--name`` (underscores become
dashes). A bad value raises ``SettingsError`` with one line naming the setting; URLs with
credentials are never echoed.
"""

from __future__ import annotations

import difflib
import os
import re
import socket
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, overload
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from pydantic_settings import SettingsError as SourceError

from hashq.errors import SettingsError

MAX_BUCKETS = 4096
SECRETS_DIR_VARIABLE = "HASHQ_SECRETS_DIR"
SECRET_FIELDS = frozenset({"amqp_url", "management_url", "zk_auth"})
# Read by every command beside the settings (hashq._io.command).
COMMAND_VARIABLES = frozenset({"HASHQ_LOG_LEVEL", "HASHQ_LOG_FORMAT", SECRETS_DIR_VARIABLE})
# The project's own test tooling (tools/, tests/) reads these; they are no settings of hashq's.
TOOLING_PREFIXES = (
    "HASHQ_TEST_",
    "HASHQ_SERVICES_",
    "HASHQ_CHAOS_",
    "HASHQ_DEMO_",
    "HASHQ_BENCH_",
    "HASHQ_SIM_",
    "HASHQ_PLANNER_",
)
_APP_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_ZK_HOST_PATTERN = re.compile(r"^[A-Za-z0-9.\-\[\]:]+:\d{1,5}$")


class Settings(BaseSettings):
    """Where the services are and what the app's topology is."""

    model_config = SettingsConfigDict(env_prefix="HASHQ_", extra="forbid", frozen=True)
    section: ClassVar[str] = "services and app"  # the heading of its fields in --help

    amqp_url: str = Field(
        "amqp://guest:guest@127.0.0.1:5672/",
        description="RabbitMQ URL (amqp:// or amqps://); a cluster's nodes comma-separated",
    )
    zk_hosts: str = Field(
        "127.0.0.1:2181", description="ZooKeeper hosts, host:port[,host:port...][/chroot]"
    )
    app: str = Field(
        "default", description="namespace: exchange hashq.<app>, ZooKeeper /hashq/<app>"
    )
    buckets: int = Field(64, ge=1, le=MAX_BUCKETS, description="number of bucket queues")
    queue_type: Literal["quorum", "classic"] = Field("quorum", description="bucket queue type")
    delivery_limit: int = Field(
        20,
        ge=1,
        le=1000,
        description="quorum queues: times the broker may hand a message out (crashes, closed "
        "channels) before it dead-letters it; not the handler's retries (max_attempts)",
    )
    management_url: str = Field(
        "http://127.0.0.1:15672",
        description="RabbitMQ management API (amqp_url's credentials); several comma-separated",
    )
    tls_ca_file: Path | None = Field(
        None, description="CA certificates (PEM) that amqps:// and https:// servers must chain to"
    )
    tls_cert_file: Path | None = Field(
        None, description="client certificate (PEM) for amqps:// and https://"
    )
    tls_key_file: Path | None = Field(
        None, description="the client certificate's private key (PEM); unset: in the cert file"
    )
    connect_timeout: float = Field(10.0, gt=0, le=300, description="seconds to reach a service")
    confirm_timeout: float = Field(
        30.0, gt=0, le=3600, description="seconds to wait for a publisher confirm"
    )
    zk_session_timeout: float = Field(10.0, ge=1, le=60, description="ZooKeeper session seconds")
    zk_auth: str | None = Field(
        None, description="this process's ZooKeeper digest credentials, user:password"
    )
    zk_acl_coordinators: str | None = Field(
        None, description="coordinators' ZooKeeper digest id, user:digest (hashq zk-digest)"
    )
    zk_acl_workers: str | None = Field(
        None, description="workers' ZooKeeper digest id, user:digest (hashq zk-digest)"
    )
    event_loop: Literal["asyncio", "uvloop"] = Field(
        "asyncio", description="asyncio's own loop, or uvloop (pip install 'hashq[uvloop]')"
    )
    tracing: Literal["auto", "on", "off"] = Field(
        "auto",
        description="OpenTelemetry trace context and spans (pip install 'hashq[otel]'); "
        "auto: on when installed",
    )

    @field_validator("amqp_url")
    @classmethod
    def _check_amqp_url(cls, value: str) -> str:
        urls = split_urls(value)
        for url in urls:
            _check_url(url, ("amqp", "amqps"))
        if len({_vhost_of(url) for url in urls}) > 1:
            raise ValueError("every node's URL must name the same vhost")
        return ",".join(urls)

    @field_validator("management_url")
    @classmethod
    def _check_management_url(cls, value: str) -> str:
        urls = [url.rstrip("/") for url in split_urls(value)]
        for url in urls:
            _check_url(url, ("http", "https"))
        return ",".join(urls)

    @field_validator("tls_ca_file", "tls_cert_file", "tls_key_file")
    @classmethod
    def _check_readable_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"{str(value)!r} is not a readable file")
        return value

    @field_validator("zk_hosts")
    @classmethod
    def _check_zk_hosts(cls, value: str) -> str:
        hosts, _, chroot = value.partition("/")
        for host in hosts.split(","):
            if not _ZK_HOST_PATTERN.match(host.strip()):
                raise ValueError(f"{host.strip()!r} is not host:port")
        if chroot and not re.match(r"^[A-Za-z0-9_.\-/]+$", chroot):
            raise ValueError("the chroot may hold only letters, digits, '_', '.', '-', '/'")
        return value

    @field_validator("zk_auth", "zk_acl_coordinators", "zk_acl_workers")
    @classmethod
    def _check_user_colon(cls, value: str | None) -> str | None:
        if value is not None and (":" not in value or value.startswith(":")):
            raise ValueError("must be user:secret")  # never echo a credential
        return value

    @model_validator(mode="after")
    def _check_pairs(self) -> Settings:
        if (self.zk_acl_coordinators is None) != (self.zk_acl_workers is None):
            raise ValueError("zk_acl_coordinators and zk_acl_workers go together")
        if self.tls_key_file is not None and self.tls_cert_file is None:
            raise ValueError("tls_key_file needs tls_cert_file")
        return self

    @field_validator("app")
    @classmethod
    def _check_app(cls, value: str) -> str:
        if not _APP_PATTERN.match(value):
            raise ValueError(
                "must be 1-63 characters of a-z, 0-9, '_' or '-', starting with a letter or digit"
            )
        return value

    def environment(self) -> dict[str, str]:
        """The ``HASHQ_`` variables that give a child process these same settings."""
        return {
            variable_of(name): str(value)
            for name, value in self.model_dump().items()
            if value is not None
        }

    @property
    def amqp_urls(self) -> list[str]:
        """Every RabbitMQ node this process may connect to, in the order given."""
        return self.amqp_url.split(",")

    @property
    def management_urls(self) -> list[str]:
        return self.management_url.split(",")

    @property
    def amqp_url_redacted(self) -> str:
        return ",".join(redact_url(url) for url in self.amqp_urls)

    @property
    def management_credentials(self) -> tuple[str, str]:
        """The management API's user and password: its URL's, else the AMQP URL's."""
        for url in (self.management_urls[0], self.amqp_urls[0]):
            parts = urlsplit(url)
            if parts.username:
                return unquote(parts.username), unquote(parts.password or "")
        return "guest", "guest"

    @property
    def vhost(self) -> str:
        return _vhost_of(self.amqp_urls[0])


class ServiceSettings(Settings):
    """What a long-running process (worker or coordinator) adds: its HTTP endpoints."""

    section: ClassVar[str] = "metrics and health"

    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="serve /metrics, /livez and /readyz here (unset: off)"
    )
    metrics_host: str = Field("0.0.0.0", description="the address the metrics port listens on")


class WorkerSettings(ServiceSettings):
    """A worker's settings: the shared ones plus how it processes messages."""

    section: ClassVar[str] = "worker"

    worker_id: str | None = Field(
        None, description="this worker's id (default host-pid-random); unique among live workers"
    )
    capacity: int = Field(1, ge=1, le=1000, description="relative share of buckets to receive")
    concurrency: int = Field(32, ge=1, le=10_000, description="handlers running at once")
    prefetch: int = Field(32, ge=1, le=10_000, description="unacknowledged messages per bucket")
    hot_key_share: float = Field(
        0.5,
        ge=0,
        le=1,
        description="a key holding more than this share of a bucket's prefetch window steps "
        "aside to its parking queue and comes back in order (0: never)",
    )
    threads: int = Field(
        8,
        ge=1,
        le=1000,
        description="threads for plain (non-async) handlers, run at most that many at once",
    )
    drain_timeout: float = Field(
        30.0, gt=0, le=3600, description="seconds a revoked bucket's handlers may take to finish"
    )
    withdraw_after: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="seconds without RabbitMQ before a worker gives its buckets up",
    )
    max_attempts: int = Field(
        5,
        ge=1,
        le=1000,
        description="times the handler is tried per message (raising retries it); not the "
        "broker's delivery_limit",
    )
    retry_base_delay: float = Field(0.2, gt=0, le=600, description="first retry delay, seconds")
    retry_max_delay: float = Field(30.0, gt=0, le=3600, description="longest retry delay, seconds")
    on_failure: Literal["dead-letter", "block", "park"] = Field(
        "dead-letter",
        description="after the last attempt: dead-letter, retry forever, or park the key",
    )
    codec: Literal["raw", "json"] = Field("raw", description="decode bodies into msg.data")
    log_keys: Literal["hashed", "clear"] = Field(
        "hashed", description="how the per-message DEBUG lines show keys"
    )

    @property
    def hot_after(self) -> int:
        """Messages of one key in hand from which it steps aside (0: never): at least 2, and
        never with a prefetch below 4 (a window that small has no room to protect)."""
        if self.hot_key_share <= 0 or self.prefetch < 4:
            return 0
        return max(2, int(self.hot_key_share * self.prefetch))

    @field_validator("worker_id")
    @classmethod
    def _check_worker_id(cls, value: str | None) -> str | None:
        return check_identifier(value)

    @model_validator(mode="after")
    def _check_retry_delays(self) -> WorkerSettings:
        if self.retry_base_delay > self.retry_max_delay:
            raise ValueError(
                f"retry_base_delay ({self.retry_base_delay:g} s) is longer than "
                f"retry_max_delay ({self.retry_max_delay:g} s)"
            )
        return self


def default_worker_id() -> str:
    """The id of a worker whose ``worker_id`` is not set: host-pid-random."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"


def check_identifier(value: str | None) -> str | None:
    """A worker or coordinator id: it becomes part of ZooKeeper paths and connection names."""
    if value is not None and not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$", value):
        raise ValueError("must be 1-100 characters of letters, digits, '_', '.', '-'")
    return value


def variable_of(name: str) -> str:
    """The environment variable of setting ``name``."""
    return f"HASHQ_{name.upper()}"


def unknown_variables(environ: Mapping[str, str], kinds: Iterable[type[Settings]]) -> list[str]:
    """One line for each ``HASHQ_`` variable in ``environ`` that is no setting of any of
    ``kinds`` (give every command's, so that an environment shared by workers and coordinators
    draws no warning), with the closest known name if one is close."""
    known = set(COMMAND_VARIABLES)
    for kind in kinds:
        known.update(variable_of(name) for name in kind.model_fields)
    lines = []
    for variable in sorted(environ):
        if not variable.startswith("HASHQ_") or variable in known:
            continue
        if variable.startswith(TOOLING_PREFIXES):
            continue
        close = difflib.get_close_matches(variable, known, n=1, cutoff=0.8)
        hint = f"; did you mean {close[0]}?" if close else ""
        lines.append(f"{variable} is set but is no hashq setting, so it is ignored{hint}")
    return lines


def split_urls(value: str) -> list[str]:
    """The URLs of a comma-separated list (a cluster's nodes), without blanks."""
    urls = [url.strip() for url in value.split(",") if url.strip()]
    if not urls:
        raise ValueError("names no URL")
    return urls


def _check_url(url: str, schemes: tuple[str, ...]) -> None:
    parts = urlsplit(url)
    if parts.scheme not in schemes:
        raise ValueError(f"must start with {' or '.join(s + '://' for s in schemes)}")
    _check_host_port(parts.hostname, url)


def _vhost_of(url: str) -> str:
    path = urlsplit(url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


def _check_host_port(hostname: str | None, url: str) -> None:
    if not hostname:
        raise ValueError("has no host")
    try:
        urlsplit(url).port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        raise ValueError("has a bad port") from exc


def redact_url(url: str) -> str:
    """The URL with its password replaced by ``***``, safe for logs and errors."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = quote(unquote(parts.username or ""), safe="")
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


S = TypeVar("S", bound=Settings)


@overload
def load_settings(**overrides: Any) -> Settings: ...
@overload
def load_settings(kind: type[S], /, **overrides: Any) -> S: ...
def load_settings(kind: type[Settings] = Settings, /, **overrides: Any) -> Settings:
    """Settings of class ``kind`` from ``HASHQ_`` variables, with ``overrides`` (flags) winning;
    ``None`` values are ignored. A setting may also come from a file named after its variable
    in the folder ``HASHQ_SECRETS_DIR`` (a mounted secret); a variable wins over a file.
    Raises ``SettingsError`` with one line for the first bad one."""
    given = {name: value for name, value in overrides.items() if value is not None}
    secrets = os.environ.get(SECRETS_DIR_VARIABLE)
    if secrets and not Path(secrets).is_dir():
        raise SettingsError(f"{SECRETS_DIR_VARIABLE}: {secrets!r} is not a directory")
    try:
        return kind(_secrets_dir=secrets or None, **given)
    except ValidationError as exc:
        raise SettingsError(_describe(exc)) from None
    except SourceError as exc:  # a secret's file this user may not read (a mount's mode)
        cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
        raise SettingsError(f"{SECRETS_DIR_VARIABLE}: cannot read a secret: {cause}") from None


def _describe(exc: ValidationError) -> str:
    error = exc.errors()[0]
    message = str(error["msg"]).removeprefix("Value error, ")
    if not error["loc"]:  # a rule across settings: its input is all of them, secrets too
        return f"settings: {message}"
    name = str(error["loc"][0])
    if error["type"] == "extra_forbidden":
        return f"unknown setting {name!r}"
    shown = "" if name in SECRET_FIELDS else f" (got {error.get('input')!r})"
    flag = "--" + name.replace("_", "-")
    return f"setting {name} ({variable_of(name)} / {flag}): {message}{shown}"
