"""Parked keys as plain data: the record each parked key has in ZooKeeper, where it lives, and
the name of the queue its messages wait in. ``docs/protocol.md`` ("Parked keys") describes the
rules; ``hashq.worker.machine.parking`` carries them out.

Under ``/hashq/<app>/parked``, one persistent node per parked key, ``<NNNN>-<digest>``: the
key's bucket, then a digest of the key (a key may hold any character; a node name may not). Its
messages wait, in their order, in the durable queue ``hashq.<app>.parked.<digest>``.

Who writes a record:

- the owner of the key's bucket creates it, before it moves any message of the key away;
- the owner of the key's bucket at each new epoch claims it (writes its epoch into it, with the
  version it read) before it moves or runs anything of the key: a write of an earlier owner,
  made with the version it read, then fails;
- the operator (``hashq parked release`` / ``drop``) changes its state, with the version read;
- the owner deletes it, with its version, once the parking queue proved empty and was deleted.
"""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import asdict, dataclass, replace

from hashq.records import record_fields

PARKED_DIGEST_CHARS = 32


class ParkedState(enum.Enum):
    """What the operator wants of a parked key (the record's ``state``)."""

    PARKED = "parked"
    """Its messages move to its parking queue as they come; nothing of it runs."""
    RELEASING = "releasing"
    """Its parked messages run, in order; then the key flows again."""
    DROPPING = "dropping"
    """Its parked messages go to the dead-letter exchange; then the key flows again."""


KEY_HEADER = "x-hashq-key"  # a parked message's key (its routing key is its queue's name)


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:PARKED_DIGEST_CHARS]


def parked_name(bucket: int, key: str) -> str:
    """The record's node name: its bucket first, so that an owner lists its buckets' keys."""
    return f"{bucket:04d}-{key_digest(key)}"


def bucket_of_parked_name(name: str) -> int | None:
    head, _, digest = name.partition("-")
    if not head.isdigit() or len(digest) != PARKED_DIGEST_CHARS:
        return None
    return int(head)


def parking_queue(app: str, key: str) -> str:
    return f"hashq.{app}.parked.{key_digest(key)}"


@dataclass(frozen=True)
class ParkedRecord:
    """One parked key. ``epoch`` is the epoch of the bucket owner that last claimed it: an owner
    that reads a record claimed at a higher epoch has lost the key and writes it no more."""

    key: str
    bucket: int
    state: ParkedState = ParkedState.PARKED
    epoch: int = 0
    reason: str = ""
    since: float = 0.0  # wall clock of the first park (seconds since the epoch)
    worker: str = ""  # the worker that parked it

    def encode(self) -> bytes:
        fields = asdict(self)
        fields["state"] = self.state.value
        return json.dumps(fields, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> ParkedRecord:
        fields = record_fields(data, "parked", cls)
        try:
            state = ParkedState(fields.pop("state", ParkedState.PARKED.value))
        except ValueError:
            raise ValueError("unreadable parked record: unknown state") from None
        return cls(state=state, **fields)

    @classmethod
    def read(cls, path: str, data: bytes) -> ParkedRecord:
        """``decode``, whose ``ValueError`` names the node at ``path``: a damaged record stops
        its bucket, so whoever reads it says which one."""
        try:
            return cls.decode(data)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None

    def claimed(self, epoch: int) -> ParkedRecord:
        return replace(self, epoch=epoch)

    def to(self, state: ParkedState) -> ParkedRecord:
        return replace(self, state=state)
