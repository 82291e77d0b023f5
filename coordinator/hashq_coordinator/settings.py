"""The coordinator's settings: the shared ``HASHQ_`` ones plus its own."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator

from hashq.settings import ServiceSettings, check_identifier


class CoordinatorSettings(ServiceSettings):
    """A coordinator's settings: the shared ones plus how it moves buckets."""

    section: ClassVar[str] = "coordinator"

    coordinator_id: str | None = Field(
        None, description="this coordinator's id in the election (default host-pid-random)"
    )
    settle: float = Field(
        1.0, ge=0, le=600, description="seconds membership must be still before buckets move"
    )
    drain_timeout: float = Field(
        30.0, gt=0, le=3600, description="seconds a revoked worker may take before it is fenced"
    )
    fence_grace: float = Field(
        5.0, ge=0, le=600, description="extra seconds beyond the drain timeout before fencing"
    )
    management_lag: float = Field(
        6.0, ge=0, le=120, description="seconds a new connection may take to show in the API"
    )
    crash_grace: float = Field(
        0.5,
        ge=0,
        le=60,
        description="seconds a worker whose AMQP connection closed has to come back before it "
        "is taken as crashed and its buckets move",
    )
    early_grant: bool = Field(
        True,
        description="grant a fenced bucket once its quorum queue says it took back what the "
        "old owner held (and the owner's 1 s bound on starts passed), rather than after the "
        "5 s return grace; off: always wait the grace (RabbitMQ clusters that expect node "
        "splits, where a member behind could answer)",
    )
    events_vhost: str = Field(
        "/",
        description="the vhost of RabbitMQ's event exchange (rabbitmq_event_exchange), where "
        "crashes are heard; empty: do not listen (crashes then wait for session expiry)",
    )

    @field_validator("coordinator_id")
    @classmethod
    def _check_id(cls, value: str | None) -> str | None:
        return check_identifier(value)
