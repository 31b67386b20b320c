"""trioha: Apache RocketMQ's master-slave HA replication on Trio, wire- and disk-compatible.

    async with trioha.open_broker(trioha.BrokerConfig(...)) as broker:
        result = await broker.put(trioha.NewMessage("FooBar", b"..."))

Importing :mod:`trioha` (or any of its sans-IO parts: :mod:`trioha.proto`, :mod:`trioha.store`,
:mod:`trioha.pipeline`) loads neither Trio nor the broker: the public names below are resolved on
first use, so a Spark executor, the model checker or an embedder of the core pays only for what
it touches. ``tests/test_imports.py`` keeps it that way.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# First: importing trioha._build chooses the build before any compilable module loads.
from trioha._build import BuildInfo, build_info
from trioha._errors import (
    BodyTooLargeError,
    ConfigError,
    CorruptLogError,
    DamagedLogError,
    LocalProtocolError,
    LostAcknowledgedError,
    MessageIllegalError,
    MessageTooLargeError,
    NotAMessageBoundaryError,
    OffsetMismatchError,
    PipelineError,
    PropertiesTooLargeError,
    ProtocolError,
    RemoteProtocolError,
    RemotingError,
    RequestError,
    StorageError,
    StoreLayoutError,
    StoreLockedError,
    TopicTooLongError,
    TriohaError,
)
from trioha._status import PutResult, PutStatus

if TYPE_CHECKING:
    from trioha._config import BrokerConfig, BrokerRole
    from trioha.broker import Broker, BrokerStatistics, open_broker, producer_properties
    from trioha.store import FlushDiskType, NewMessage

__version__ = "0.1.0"

# Names whose modules import Trio or read configuration: loaded when first asked for.
_LAZY = {
    "BrokerConfig": "trioha._config",
    "BrokerRole": "trioha._config",
    "FlushDiskType": "trioha.store",
    "Broker": "trioha.broker",
    "BrokerStatistics": "trioha.broker",
    "open_broker": "trioha.broker",
    "producer_properties": "trioha.broker",
    "NewMessage": "trioha.store",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trioha' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "BodyTooLargeError",
    "Broker",
    "BrokerConfig",
    "BrokerRole",
    "BrokerStatistics",
    "BuildInfo",
    "ConfigError",
    "CorruptLogError",
    "DamagedLogError",
    "FlushDiskType",
    "LocalProtocolError",
    "LostAcknowledgedError",
    "MessageIllegalError",
    "MessageTooLargeError",
    "NewMessage",
    "NotAMessageBoundaryError",
    "OffsetMismatchError",
    "PipelineError",
    "PropertiesTooLargeError",
    "ProtocolError",
    "PutResult",
    "PutStatus",
    "RemoteProtocolError",
    "RemotingError",
    "RequestError",
    "StorageError",
    "StoreLayoutError",
    "StoreLockedError",
    "TopicTooLongError",
    "TriohaError",
    "__version__",
    "build_info",
    "open_broker",
    "producer_properties",
]
