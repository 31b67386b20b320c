"""One exception tree for all of trioha.

Every message says what was wrong and where (an offset, a file, a peer address), so that an
operator reading one log line knows what to look at. The shape follows h11: a protocol error
is either ours (``LocalProtocolError``) or the peer's (``RemoteProtocolError``), decided at
the one place bytes come in.
"""

from __future__ import annotations


class TriohaError(Exception):
    """Base of every error trioha raises on purpose."""


class ConfigError(TriohaError):
    """A setting, flag or configuration file is wrong; the message names the key and why."""


# --- replication protocol -------------------------------------------------------------


class ProtocolError(TriohaError):
    """The HA or remoting protocol was broken; the connection concerned must be closed."""


class LocalProtocolError(ProtocolError):
    """We were asked to do something the protocol does not allow (a bug on our side)."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol does not allow (garbage, a hostile size, ...)."""


# --- storage ---------------------------------------------------------------------------


class StorageError(TriohaError):
    """The commit log or the store directory cannot be used as asked."""


class CorruptLogError(StorageError):
    """Stored bytes are not a valid RocketMQ record where one was expected."""


class StoreLayoutError(StorageError):
    """The store directory is not laid out as RocketMQ lays it out (wrong file size, gap, ...)."""


class StoreLockedError(StorageError):
    """Another process holds the store's ``lock`` file."""


class OffsetMismatchError(StorageError):
    """Replicated bytes were offered somewhere other than exactly the end of the log."""


class NotAMessageBoundaryError(StorageError):
    """A commit log cut was asked for inside a record; ``before``/``after`` are the nearest
    boundaries (``after`` is None when no readable record follows ``before``)."""

    def __init__(self, message: str, *, offset: int, before: int, after: int | None) -> None:
        super().__init__(message)
        self.offset = offset
        self.before = before
        self.after = after


class DamagedLogError(StorageError):
    """Recovery cut bytes that had been flushed: damage, not a lost tail; a master refuses
    to start on such a log unless the operator accepts it explicitly."""


class LostAcknowledgedError(StorageError):
    """A master recovered below messages it had answered PUT_OK, which a slave may still
    hold; it refuses to start as master unless the operator accepts the loss explicitly."""


class MessageTooLargeError(StorageError):
    """A message does not fit a segment or exceeds a RocketMQ limit (MESSAGE_ILLEGAL)."""


class BodyTooLargeError(MessageTooLargeError):
    """A body is longer than ``maxMessageSize`` (MESSAGE_ILLEGAL)."""


class PropertiesTooLargeError(MessageTooLargeError):
    """Encoded properties exceed the record's 32767-byte field (PROPERTIES_SIZE_EXCEEDED)."""


class TopicTooLongError(MessageTooLargeError):
    """A topic is longer than its record version allows (MESSAGE_ILLEGAL)."""


class MessageIllegalError(StorageError, ValueError):
    """A message field cannot be stored as RocketMQ stores it: a number outside its Java type,
    an unknown record version (MESSAGE_ILLEGAL). A ``ValueError`` too, as bad arguments are."""


# --- automatic failover (the coordinator, etcd) ----------------------------------------


class CoordinatorError(TriohaError):
    """The failover coordinator (etcd) cannot be used as the broker group needs it."""


class CoordinatorDataError(CoordinatorError, ValueError):
    """A key the broker group keeps in etcd holds a value that is not what trioha writes there
    (hand-edited, or written by something else); the message names the key and the fault."""


class EtcdUnavailableError(CoordinatorError):
    """No etcd endpoint answered the request in time (nothing listening, connection lost, too
    slow); the request was **not** applied, so it may be sent again. The message names every
    endpoint and what it did."""


class EtcdNoQuorumError(EtcdUnavailableError):
    """etcd answered, but without a leader: fewer than a majority of its members are up and
    reach each other. Nothing was applied; nothing can be until the majority is back."""


class EtcdOutcomeUnknownError(CoordinatorError):
    """A request that writes was sent and no answer came (timeout, connection lost, etcd's own
    ``request timed out``): it may or may not have been applied, and is never sent again
    blindly. Read the keys to learn which."""


class EtcdEndpointError(CoordinatorError, ConfigError):
    """Something answers at an etcd endpoint that is not etcd's v3 JSON gateway (another HTTP
    server, a wrong port, an etcd too old for ``/v3/``): a configuration fault."""


class EtcdAuthError(CoordinatorError, ConfigError):
    """etcd refused trioha's credentials, or asked for some it was not given, or the user may
    not use the keys: a configuration fault that retrying cannot cure."""


class EtcdCompactedError(CoordinatorError):
    """A watch asked for history etcd has compacted away: read the keys again, then watch from
    that read's revision + 1. *compact_revision* is the oldest revision etcd still has."""

    def __init__(self, message: str, *, compact_revision: int) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision


class HandoverRefusedError(CoordinatorError):
    """A handover of the master role (``failover-elect``) was refused or did not happen: the
    message names why (the target is unknown or not in the SyncStateSet, the group has no
    master, the master refused, the target did not catch up in time). Nothing changed, or, if
    another broker became master meanwhile, the message says which."""


# --- other subsystems ------------------------------------------------------------------


class PipelineError(TriohaError):
    """The Spark pipeline cannot run (pyspark or Java missing, bad input directory, ...)."""


class RequestError(TriohaError, ValueError):
    """A remoting request that cannot be served as sent: a missing or malformed header field, a
    body that does not decode. It is answered with an error naming the fault, and the
    connection stays open (RocketMQ's ``RemotingCommandException``)."""


class RemotingError(TriohaError):
    """A RocketMQ remoting request failed; carries RocketMQ's response code and remark."""

    def __init__(self, message: str, *, code: int = 1) -> None:
        super().__init__(message)
        self.code = code
