"""trioha: Apache RocketMQ's master-slave HA replication on Trio, wire- and disk-compatible."""

from trioha._errors import (
    ConfigError,
    CorruptLogError,
    LocalProtocolError,
    MessageTooLargeError,
    OffsetMismatchError,
    PipelineError,
    ProtocolError,
    RemoteProtocolError,
    RemotingError,
    ReplicationError,
    StorageError,
    StoreLayoutError,
    StoreLockedError,
    TriohaError,
)

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "CorruptLogError",
    "LocalProtocolError",
    "MessageTooLargeError",
    "OffsetMismatchError",
    "PipelineError",
    "ProtocolError",
    "RemoteProtocolError",
    "RemotingError",
    "ReplicationError",
    "StorageError",
    "StoreLayoutError",
    "StoreLockedError",
    "TriohaError",
    "__version__",
]
