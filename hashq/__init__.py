"""hashq: per-key ordered, cross-key parallel job processing on RabbitMQ and ZooKeeper."""

from hashq.errors import (
    BatchPublishError,
    ConfigError,
    HashqError,
    InvalidMessage,
    MessageNacked,
    MessageUnroutable,
    Park,
    PublishError,
    PublishUnconfirmed,
    Reject,
    Retry,
    ServiceUnavailable,
    SettingsError,
    TopologyMismatch,
    Undecodable,
)
from hashq.message import Handler, Message
from hashq.provision import ensure_topology
from hashq.publisher import Outgoing, Publisher
from hashq.routing import App
from hashq.settings import Settings, WorkerSettings, load_settings
from hashq.sync_publisher import SyncPublisher
from hashq.topology import Topology
from hashq.worker.runtime import Worker, WorkerState

__version__ = "0.1.0"

__all__ = [
    "App",
    "BatchPublishError",
    "ConfigError",
    "Handler",
    "HashqError",
    "InvalidMessage",
    "Message",
    "MessageNacked",
    "MessageUnroutable",
    "Outgoing",
    "Park",
    "PublishError",
    "PublishUnconfirmed",
    "Publisher",
    "Reject",
    "Retry",
    "ServiceUnavailable",
    "Settings",
    "SettingsError",
    "SyncPublisher",
    "Topology",
    "TopologyMismatch",
    "Undecodable",
    "Worker",
    "WorkerSettings",
    "WorkerState",
    "ensure_topology",
    "load_settings",
]
