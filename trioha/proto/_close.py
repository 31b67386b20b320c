"""Why an HA connection closed, in a few words: :class:`CloseKind`.

Each close is given its kind where it is decided: by the core's rules (a :class:`~trioha.
proto.Close` action carries it) or by the IO layer (the peer hung up, the transport broke,
the disk refused, the service stopped). The reason text stays for people (it names peers
and offsets); the kind is what code branches on, what the metrics count
(``closed_by_reason``, a label that must take few values) and what decides the log level:
the table below, one row per kind, for both sides.
"""

from __future__ import annotations

import enum
import logging


class CloseKind(enum.Enum):
    """A connection's close, by kind; the value is its metric category."""

    #: The peer hung up (a restart, a stop).
    PEER_CLOSED = "peer_closed"
    #: The transport failed under a read or a write (a reset, a network blip).
    BROKEN = "broken"
    #: Nothing read within the housekeeping interval.
    TIMEOUT = "timeout"
    #: The two logs are not one history: the slave is refused or stops until an operator
    #: cuts it back or re-seeds it (``Close.diverged_at``).
    DIVERGED = "diverged"
    #: What the slave needs next was deleted on the master (retention, RocketMQ #3388): only
    #: a re-seed helps (``Close.oldest``).
    DELETED = "deleted"
    #: The slave's disk refused a write or a flush (ENOSPC, EIO): replication pauses.
    DISK = "disk"
    #: A bug or a store that contradicts itself on this side.
    INTERNAL_ERROR = "internal_error"
    #: Still open when the service stopped (cancelled).
    SHUTDOWN = "shutdown"
    #: The peer broke the protocol, or asked for what cannot be served (a deleted offset,
    #: an untrusted ack, bytes that are no HA frame).
    PROTOCOL_ERROR = "protocol_error"
    #: The slave could not connect at all (no connection to close; counted with the rest).
    CONNECT_FAILED = "connect_failed"

    @property
    def category(self) -> str:
        """The metric label this close is counted under."""
        return self.value

    @property
    def level(self) -> int:
        """The log level of the line that reports the close: INFO for the closes of normal
        life (a restart, a network blip, a stop), WARNING for those that need an operator."""
        return _LEVELS[self]


_LEVELS = {
    CloseKind.PEER_CLOSED: logging.INFO,
    CloseKind.BROKEN: logging.INFO,
    CloseKind.TIMEOUT: logging.INFO,
    CloseKind.DIVERGED: logging.WARNING,
    CloseKind.DELETED: logging.WARNING,
    CloseKind.DISK: logging.WARNING,
    CloseKind.INTERNAL_ERROR: logging.WARNING,
    CloseKind.SHUTDOWN: logging.INFO,
    CloseKind.PROTOCOL_ERROR: logging.WARNING,
    CloseKind.CONNECT_FAILED: logging.WARNING,
}
