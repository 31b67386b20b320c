"""The HA timings both ends share, and the one place their defaults are written.

RocketMQ configures them in milliseconds (``MessageStoreConfig.haSendHeartbeatInterval``,
``haHousekeepingInterval``, ``slaveTimeout``); the sans-IO core works in seconds of whatever
clock the caller feeds it. ``trioha._config.BrokerConfig`` takes its defaults from here, and
:class:`Timing` is what the master side (:class:`~trioha.proto.MasterConnection`) and the slave
side (:class:`~trioha.proto.SlaveConnection`) are both given.
"""

from __future__ import annotations

import attrs

#: ``haSendHeartbeatInterval``: an idle side sends a heartbeat after this much write silence.
HEARTBEAT_INTERVAL_MS = 5000
#: ``haHousekeepingInterval``: a side that read nothing for this long closes the connection.
HOUSEKEEPING_INTERVAL_MS = 20000
#: ``slaveTimeout`` (5.x): how long a sync put waits for its acks before FLUSH_SLAVE_TIMEOUT.
SLAVE_TIMEOUT_MS = 3000


@attrs.frozen
class Timing:
    """Heartbeat and housekeeping intervals in seconds (RocketMQ's are in milliseconds)."""

    heartbeat: float = HEARTBEAT_INTERVAL_MS / 1000
    housekeeping: float = HOUSEKEEPING_INTERVAL_MS / 1000

    @classmethod
    def from_millis(cls, heartbeat_ms: int, housekeeping_ms: int) -> Timing:
        return cls(heartbeat_ms / 1000, housekeeping_ms / 1000)
