"""The Trio layer: sockets, tasks and time around the sans-IO core in :mod:`trioha.proto`."""

from trioha.net._client import DIVERGED_FILE, Divergence, HAClient, HAClientStatistics
from trioha.net._connection import HAConnection
from trioha.net._divergence import former_master_divergence, open_master_history
from trioha.net._marks import MarkKeeper
from trioha.net._service import HAService, HAServiceStatistics, SlaveStatistics
from trioha.net._waiters import OffsetWaiters
from trioha.net._wakeup import Wakeup

__all__ = [
    "DIVERGED_FILE",
    "Divergence",
    "HAClient",
    "HAClientStatistics",
    "HAConnection",
    "HAService",
    "HAServiceStatistics",
    "MarkKeeper",
    "OffsetWaiters",
    "SlaveStatistics",
    "Wakeup",
    "former_master_divergence",
    "open_master_history",
]
