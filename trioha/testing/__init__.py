"""Public helpers for testing code built on trioha: run trioha's own property-based tests
against your configuration (docs/testing.md).

Imported eagerly (they need nothing beyond trioha itself):

- :class:`ProtocolPair`, :class:`PairOptions`, :class:`Link`, :class:`SyncPut`: a master and a
  slave protocol pair with their commit logs, wired by byte queues and driven step by step.
- :class:`FaultyStream`, :func:`faulty_stream_pair`, :class:`Faults`, :class:`FaultyLink`,
  :class:`Breakage`: a Trio stream with short writes, odd reads, delays and a death.
- :class:`MemoryEtcd`, and its pure core :class:`EtcdState`, :func:`etcd_apply`,
  :func:`etcd_expire`: an in-memory, linearizable etcd (revisions, leases, transactions,
  watches) for the failover control core (docs/failover.md).

Imported on first use, because they need hypothesis:

- ``trioha.testing.strategies``: Hypothesis strategies for stored messages and for HA byte
  streams (cut anywhere, hostile frames and reports).
- :class:`ReplicationMachine`, :func:`replication_machine`, :func:`pair_options`,
  :func:`memory_log`: the stateful test of the protocol pair.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from trioha.testing._etcd import EtcdState, Lease, MemoryEtcd
from trioha.testing._etcd import apply as etcd_apply
from trioha.testing._etcd import expire as etcd_expire
from trioha.testing._faults import Breakage, Faults, FaultyLink, FaultyStream, faulty_stream_pair
from trioha.testing._pair import (
    Link,
    PairOptions,
    ProtocolPair,
    ReplicaLog,
    Side,
    SyncPut,
    log_bytes,
    pending_report_bytes,
)

if TYPE_CHECKING:
    from trioha.testing import strategies
    from trioha.testing._machine import (
        LogFactory,
        ReplicationMachine,
        memory_log,
        pair_options,
        replication_machine,
    )

__all__ = [
    "Breakage",
    "EtcdState",
    "Faults",
    "FaultyLink",
    "FaultyStream",
    "Lease",
    "Link",
    "LogFactory",
    "MemoryEtcd",
    "PairOptions",
    "ProtocolPair",
    "ReplicaLog",
    "ReplicationMachine",
    "Side",
    "SyncPut",
    "etcd_apply",
    "etcd_expire",
    "faulty_stream_pair",
    "log_bytes",
    "memory_log",
    "pair_options",
    "pending_report_bytes",
    "replication_machine",
    "strategies",
]

_LAZY = {
    "strategies": "trioha.testing.strategies",
    "LogFactory": "trioha.testing._machine",
    "ReplicationMachine": "trioha.testing._machine",
    "memory_log": "trioha.testing._machine",
    "pair_options": "trioha.testing._machine",
    "replication_machine": "trioha.testing._machine",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name == "strategies":
        return importlib.import_module(module)
    return getattr(importlib.import_module(module), name)
