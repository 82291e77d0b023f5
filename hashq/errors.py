"""One exception tree for hashq, grouped by what the caller can do about each error.

- ``ConfigError``: fix a setting, an argument or the deployment, then run again.
- ``ServiceUnavailable``: RabbitMQ or ZooKeeper cannot be reached now; retry later.
- ``PublishError``: one or more messages were not confirmed; decide per message
  (retry, which may duplicate, or give up).
- ``Undecodable``: one delivered message cannot be handled as it is; it is dead-lettered and
  its key goes on.
- ``HandlerOutcome`` (``Retry``, ``Reject``): raised by a handler, not by hashq, to have its
  message tried again after a given delay, or dead-lettered now.
- ``Superseded``: this process's standing in ZooKeeper ended (its session expired, another
  leader took over); what it held is no longer its own, and it begins again.

Every message is one line and never contains a secret.
"""

from __future__ import annotations

from dataclasses import dataclass


class HashqError(Exception):
    """Root of every error hashq raises on purpose."""


# ---------------------------------------------------------------- fix and run again
class ConfigError(HashqError):
    """Raised when a setting, an argument or the deployment is wrong; nothing was changed."""


class SettingsError(ConfigError):
    """Raised when a ``HASHQ_`` setting or its command-line flag has a bad value."""


class TopologyMismatch(ConfigError):
    """Raised when RabbitMQ or ZooKeeper holds a topology that differs from the settings.

    The existing topology is left untouched: bindings of a consistent-hash exchange must never
    change once created, because that remaps keys to other buckets.
    """


class InvalidMessage(ConfigError, ValueError):
    """Raised when a message cannot be published as given (empty or overlong key, bad body)."""


# ---------------------------------------------------------------- retry later
class ServiceUnavailable(HashqError):
    """Raised when RabbitMQ, its management API or ZooKeeper cannot be reached or went away."""


# ---------------------------------------------------------------- decide per message
class PublishError(HashqError):
    """Raised when a message was not confirmed by the broker.

    ``key`` and ``message_id`` name the message affected.
    """

    def __init__(self, reason: str, *, key: str, message_id: str) -> None:
        super().__init__(f"{reason} (key={key!r}, message_id={message_id})")
        self.reason = reason
        self.key = key
        self.message_id = message_id


class MessageNacked(PublishError):
    """Raised when the broker refused the message (a negative publisher confirm).

    The broker holds no copy; publishing again is safe.
    """


class MessageUnroutable(PublishError):
    """Raised when the exchange routed the message to no queue and the broker returned it.

    The broker holds no copy. It means the bucket bindings are missing: see ``hashq init``.
    """


class PublishUnconfirmed(PublishError):
    """Raised when the connection or channel closed, or the confirm timed out, before the broker
    answered.

    The message may or may not be queued: publishing again is safe for order only if the
    handler tolerates the duplicate (delivery is at-least-once anyway).
    """


# ---------------------------------------------------------------- one message, not the system
class Undecodable(HashqError):
    """Raised when a delivered body does not decode with the worker's codec."""

    reason = "undecodable"  # its dead letter's x-hashq-reason


# ---------------------------------------------------------------- begin again
class HandlerOutcome(HashqError):
    """Raised by a handler, not by hashq: what the worker is to do with the message instead of
    acknowledging it. Not a failure of the handler's, whose exceptions are retried by the
    worker's policy."""


class Retry(HandlerOutcome):
    """Raise in a handler to try its message again: after ``after`` seconds, or the worker's
    backoff if not given. Its key waits meanwhile (the message stays held, so keep ``after``
    below the broker's ``consumer_timeout``); other keys go on. It spends an attempt, so after
    ``HASHQ_MAX_ATTEMPTS`` the message is dead-lettered, unless ``HASHQ_ON_FAILURE`` is
    ``block``."""

    def __init__(self, reason: str = "", *, after: float | None = None) -> None:
        if after is not None and not 0 <= after <= 86_400:
            raise ValueError(f"Retry(after={after!r}): seconds from 0 to 86,400")
        super().__init__(reason or "retry asked for by the handler")
        self.after = after


class Reject(HandlerOutcome):
    """Raise in a handler to dead-letter its message now, with ``reason``, whatever attempts
    are left: a message no retry can mend. Its key goes on with the next message."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)


class Park(HandlerOutcome):
    """Raise in a handler to park its key now, with ``reason``, whatever attempts are left: this
    message and every later one of its key wait, in their order, in the key's parking queue
    (``hashq parked list``), while the other keys go on; ``hashq parked release`` runs them in
    order, then the key flows again (docs/operations.md, "Parked keys")."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)


class Superseded(HashqError):
    """Raised when what this process held in ZooKeeper is no longer its own."""


class RegistrationGone(Superseded):
    """Raised when a worker's registration is no longer its incarnation's (the session
    expired, or another process registered the worker id)."""


class Deposed(Superseded):
    """Raised when a write of a coordinator was refused because another leads now, or its
    session ended: it must stop acting as leader."""


class WorkerReturned(Superseded):
    """Raised when a coordinator's commit was refused, nothing of it written, because a worker
    it took as crashed changed its registration since it was read (it came back)."""


@dataclass(frozen=True)
class Failure:
    """One message of a batch that was not confirmed."""

    index: int
    error: PublishError


class BatchPublishError(PublishError):
    """Raised by ``publish_many`` when some messages of the batch were not confirmed.

    ``failures`` lists exactly those, by their index in the batch; every other message of the
    batch was confirmed, and ``confirmed`` holds their message ids in batch order.
    """

    def __init__(self, failures: list[Failure], confirmed: list[str]) -> None:
        first = failures[0].error
        reason = (
            f"{len(failures)} of {len(failures) + len(confirmed)} messages not confirmed; "
            f"first: {first.reason}"
        )
        super().__init__(reason, key=first.key, message_id=first.message_id)
        self.failures = failures
        self.confirmed = confirmed
