"""The broker: a store, HA replication and RocketMQ's client side, run as one service.

:func:`open_broker` starts everything in one nursery. The modules here mirror the RocketMQ broker
classes they stand in for: the request processors (``_send``, ``_pull``, ``_offsets``,
``_clientmanage``, ``_query``, ``_admin``, ``_clientcalls`` behind the dispatching
``_processor``), the consume-queue builder (``_reput``), the config managers (``_metadata``),
settings changed at run time (``_liveconfig``), registration with name servers
(``_registration``) and a slave's metadata sync (``_slavesync``). ``docs/architecture.md`` maps
the rooms.
"""

from trioha.broker._broker import Broker, BrokerStatistics, open_broker
from trioha.broker._reput import CHECKPOINT_FILE, truncate_replica
from trioha.broker._types import new_message

__all__ = [
    "CHECKPOINT_FILE",
    "Broker",
    "BrokerStatistics",
    "new_message",
    "open_broker",
    "truncate_replica",
]
