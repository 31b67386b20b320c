"""The Trio layer: sockets, tasks and time around the sans-IO core in :mod:`trioha.proto`."""

from trioha.net._client import HAClient, HAClientStatistics
from trioha.net._connection import HAConnection
from trioha.net._marks import MarkKeeper
from trioha.net._service import HAService, HAServiceStatistics, SlaveStatistics
from trioha.net._wakeup import Wakeup

__all__ = [
    "HAClient",
    "HAClientStatistics",
    "HAConnection",
    "HAService",
    "HAServiceStatistics",
    "MarkKeeper",
    "SlaveStatistics",
    "Wakeup",
]
