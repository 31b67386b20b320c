"""trioha: Apache RocketMQ's master-slave HA replication on Trio, wire- and disk-compatible.

    async with trioha.open_broker(trioha.BrokerConfig(...)) as broker:
        result = await broker.put(topic="FooBar", body=b"...")
"""

from trioha._config import BrokerConfig, BrokerRole, FlushDiskType
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
from trioha._status import PutResult, PutStatus
from trioha.broker import Broker, BrokerStatistics, open_broker

__version__ = "0.1.0"

__all__ = [
    "Broker",
    "BrokerConfig",
    "BrokerRole",
    "BrokerStatistics",
    "ConfigError",
    "CorruptLogError",
    "FlushDiskType",
    "LocalProtocolError",
    "MessageTooLargeError",
    "OffsetMismatchError",
    "PipelineError",
    "ProtocolError",
    "PutResult",
    "PutStatus",
    "RemoteProtocolError",
    "RemotingError",
    "ReplicationError",
    "StorageError",
    "StoreLayoutError",
    "StoreLockedError",
    "TriohaError",
    "__version__",
    "open_broker",
]
