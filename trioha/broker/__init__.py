"""The broker: a store, HA replication and RocketMQ's client side, run as one service.

:func:`open_broker` starts everything in one nursery. The modules here mirror the RocketMQ broker
classes they stand in for: the request processors (``_send``, ``_pull``, ``_offsets``,
``_clientmanage``, ``_query``, ``_admin``, ``_clientcalls`` behind the dispatching
``_processor``), the consume-queue builder (``_reput``), the config managers (``_metadata``),
settings changed at run time (``_liveconfig``), registration with name servers
(``_registration``), a slave's metadata sync (``_slavesync``) and automatic failover's replica
manager (``_failover``: the control core of ``trioha.failover`` against etcd).
``docs/architecture.md`` maps the rooms.
"""

from trioha.broker._broker import Broker, BrokerStatistics, open_broker
from trioha.broker._clientside import free_port_pair
from trioha.broker._failover import (
    FailoverStatistics,
    HandoverOutcome,
    ReplicaManager,
    describe_group,
    hand_over,
    read_group,
)
from trioha.broker._reput import CHECKPOINT_FILE, truncate_replica
from trioha.broker._types import producer_properties

__all__ = [
    "CHECKPOINT_FILE",
    "Broker",
    "BrokerStatistics",
    "FailoverStatistics",
    "HandoverOutcome",
    "ReplicaManager",
    "describe_group",
    "free_port_pair",
    "hand_over",
    "open_broker",
    "producer_properties",
    "read_group",
    "truncate_replica",
]
