"""Put statuses and results, with RocketMQ's names and response codes.

Mirrors ``org.apache.rocketmq.store.PutMessageStatus`` (docs/rocketmq-protocol.md §5.2, §5.3)
and the mapping in ``SendMessageProcessor.handlePutMessageResult``: four statuses mean the
message *is stored* on the master (the producer sees SEND_OK, FLUSH_DISK_TIMEOUT,
FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE); the rest are failures.
"""

from __future__ import annotations

import enum

import attrs

from trioha._errors import (
    MessageIllegalError,
    MessageTooLargeError,
    PropertiesTooLargeError,
    StorageError,
)


class PutStatus(enum.Enum):
    """RocketMQ's ``PutMessageStatus`` names (5.x spellings where they were renamed)."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGE_CACHE_BUSY = "OS_PAGE_CACHE_BUSY"
    IN_SYNC_REPLICAS_NOT_ENOUGH = "IN_SYNC_REPLICAS_NOT_ENOUGH"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"

    @property
    def is_stored(self) -> bool:
        """True when the message is in the master's commit log (the broker's ``sendOK``)."""
        return self in _STORED

    @property
    def response_code(self) -> int:
        """The remoting response code a send is answered with (docs/rocketmq-protocol.md §5.2)."""
        return _RESPONSE_CODES.get(self, 1)


_STORED = frozenset(
    {
        PutStatus.PUT_OK,
        PutStatus.FLUSH_DISK_TIMEOUT,
        PutStatus.FLUSH_SLAVE_TIMEOUT,
        PutStatus.SLAVE_NOT_AVAILABLE,
    }
)

# ResponseCode values: SUCCESS 0, SYSTEM_ERROR 1, FLUSH_DISK_TIMEOUT 10, SLAVE_NOT_AVAILABLE 11,
# FLUSH_SLAVE_TIMEOUT 12, MESSAGE_ILLEGAL 13, SERVICE_NOT_AVAILABLE 14.
_RESPONSE_CODES = {
    PutStatus.PUT_OK: 0,
    PutStatus.FLUSH_DISK_TIMEOUT: 10,
    PutStatus.SLAVE_NOT_AVAILABLE: 11,
    PutStatus.FLUSH_SLAVE_TIMEOUT: 12,
    PutStatus.MESSAGE_ILLEGAL: 13,
    PutStatus.PROPERTIES_SIZE_EXCEEDED: 13,
    PutStatus.SERVICE_NOT_AVAILABLE: 14,
}


@attrs.frozen(slots=False)  # made per send answered: cheaper without slots (NewMessage)
class PutResult:
    """What a put returns: the status and, when stored, where.

    ``offset`` is the physical offset of the (first) record, ``end_offset`` the end of the
    (last) one; both are -1 when nothing was stored.
    """

    status: PutStatus
    offset: int = -1
    end_offset: int = -1
    queue_offset: int = -1
    msg_id: str = ""

    @property
    def ok(self) -> bool:
        return self.status is PutStatus.PUT_OK


# Why the store refused a put, and the status the producer is told: the one table, searched
# along the exception's class hierarchy so the most specific refusal wins. A refusal that is the
# message's fault is MESSAGE_ILLEGAL or PROPERTIES_SIZE_EXCEEDED; any other storage failure
# means the broker could not write (CREATE_MAPPED_FILE_FAILED, as ``CommitLog.asyncPutMessage``
# answers when no segment can be had).
REFUSAL_STATUS: dict[type[Exception], PutStatus] = {
    PropertiesTooLargeError: PutStatus.PROPERTIES_SIZE_EXCEEDED,
    MessageTooLargeError: PutStatus.MESSAGE_ILLEGAL,
    MessageIllegalError: PutStatus.MESSAGE_ILLEGAL,
    StorageError: PutStatus.CREATE_MAPPED_FILE_FAILED,
    ValueError: PutStatus.MESSAGE_ILLEGAL,
}


def refusal_status(exc: Exception) -> PutStatus:
    """The :class:`PutStatus` for a put the store refused with *exc* (see ``REFUSAL_STATUS``)."""
    for cls in type(exc).__mro__:
        status = REFUSAL_STATUS.get(cls)
        if status is not None:
            return status
    return PutStatus.UNKNOWN_ERROR
