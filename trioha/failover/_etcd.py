"""etcd v3's requests and replies as plain values: what the control core asks and is told.

The control core (:mod:`trioha.failover._core`) never talks to etcd. It returns these requests
as parts of its actions and is fed the replies, so a test, the in-memory double
(:mod:`trioha.testing._etcd`), the model checker and the Trio layer that speaks to a real etcd
all see exactly the same values. The fields are those of etcd's v3 API as its JSON gateway
carries them (``/v3/kv/range``, ``/v3/kv/txn``, ``/v3/lease/grant``, ``/v3/lease/keepalive``,
``/v3/lease/revoke``, ``/v3/watch``), one to one: keys and values are bytes here and base64
there, and a missing integer field there is 0 here. Serialising them is all the Trio layer
adds.

Semantics the core relies on, as etcd documents them (docs/failover.md, "etcd"):

* every write (a put, a delete, or a transaction with at least one of them) makes one new
  *revision* of the whole store; a key remembers the revision that created it
  (``create_revision``) and the one that last changed it (``mod_revision``); a missing key
  compares as 0 on both, and as never equal on its value;
* a transaction applies its ``success`` operations if every compare holds, else its
  ``failure`` operations, atomically, and says which (``succeeded``);
* a key put with a lease is deleted when the lease expires or is revoked; a put naming a
  lease that does not exist fails the whole request (:class:`EtcdError`);
* a watch from revision *r* delivers, in revision order, every event at *r* or later.
"""

from __future__ import annotations

import enum
from typing import TypeAlias

import attrs

# --- compares ---------------------------------------------------------------------------------


class Target(enum.Enum):
    """``Compare.CompareTarget``: which property of the key a compare looks at."""

    VERSION = "VERSION"
    CREATE = "CREATE"
    MOD = "MOD"
    VALUE = "VALUE"
    LEASE = "LEASE"


class Cmp(enum.Enum):
    """``Compare.CompareResult``: how the key's property must relate to the operand."""

    EQUAL = "EQUAL"
    NOT_EQUAL = "NOT_EQUAL"
    GREATER = "GREATER"
    LESS = "LESS"


@attrs.frozen
class Compare:
    """One condition of a transaction: ``key``'s *target* must be *result* to *operand*.

    The operand is an int for every target but VALUE, whose operand is bytes.
    """

    key: bytes
    target: Target
    result: Cmp
    operand: int | bytes

    def __attrs_post_init__(self) -> None:
        wants_bytes = self.target is Target.VALUE
        if isinstance(self.operand, bytes) != wants_bytes:
            kind = "bytes" if wants_bytes else "an int"
            raise TypeError(f"a {self.target.value} compare takes {kind}, not {self.operand!r}")

    @classmethod
    def created_at(cls, key: bytes, revision: int) -> Compare:
        """``create_revision(key) == revision``; 0 means "the key does not exist"."""
        return cls(key, Target.CREATE, Cmp.EQUAL, revision)

    @classmethod
    def modified_at(cls, key: bytes, revision: int) -> Compare:
        """``mod_revision(key) == revision``: nobody changed the key since I read it."""
        return cls(key, Target.MOD, Cmp.EQUAL, revision)

    @classmethod
    def absent(cls, key: bytes) -> Compare:
        return cls.created_at(key, 0)


# --- operations -------------------------------------------------------------------------------


@attrs.frozen
class Put:
    """``RequestOp.request_put``: set *key* to *value*, bound to *lease* (0: none)."""

    key: bytes
    value: bytes
    lease: int = 0


@attrs.frozen
class DeleteRange:
    """``RequestOp.request_delete_range``: delete *key* (or ``[key, range_end)``)."""

    key: bytes
    range_end: bytes = b""


@attrs.frozen
class Range:
    """``RangeRequest``: read *key*, or every key in ``[key, range_end)``."""

    key: bytes
    range_end: bytes = b""

    @classmethod
    def prefix(cls, prefix: bytes) -> Range:
        """Every key that starts with *prefix* (etcd's ``--prefix``)."""
        return cls(prefix, prefix_end(prefix))

    def covers(self, key: bytes) -> bool:
        if not self.range_end:
            return key == self.key
        if self.range_end == b"\0":  # etcd: every key from ``key`` on
            return key >= self.key
        return self.key <= key < self.range_end


Op: TypeAlias = Put | DeleteRange | Range


@attrs.frozen
class Txn:
    """``TxnRequest``: if every compare holds, apply *success*, else *failure*; atomically."""

    compare: tuple[Compare, ...]
    success: tuple[Op, ...]
    failure: tuple[Op, ...] = ()


@attrs.frozen
class LeaseGrant:
    """``LeaseGrantRequest``: a new lease living *ttl* seconds unless kept alive."""

    ttl: int


@attrs.frozen
class LeaseKeepAlive:
    """``LeaseKeepAliveRequest``: restart *lease*'s countdown from its full TTL."""

    lease: int


@attrs.frozen
class LeaseRevoke:
    """``LeaseRevokeRequest``: end *lease* now; every key bound to it is deleted."""

    lease: int


Request: TypeAlias = Txn | Range | LeaseGrant | LeaseKeepAlive | LeaseRevoke

# --- replies ----------------------------------------------------------------------------------


@attrs.frozen(order=True)
class KeyValue:
    """``mvccpb.KeyValue``. In a DELETE event only ``key`` and ``mod_revision`` (the revision
    of the delete) are set, as etcd sends them."""

    key: bytes
    value: bytes = b""
    create_revision: int = 0
    mod_revision: int = 0
    version: int = 0
    lease: int = 0


@attrs.frozen
class RangeResponse:
    """The keys a :class:`Range` found, in key order, as of *revision*."""

    revision: int
    kvs: tuple[KeyValue, ...] = ()


@attrs.frozen
class PutResponse:
    revision: int


@attrs.frozen
class DeleteRangeResponse:
    revision: int
    deleted: int = 0


OpResponse: TypeAlias = RangeResponse | PutResponse | DeleteRangeResponse


@attrs.frozen
class TxnResponse:
    """``TxnResponse``: which branch ran, and one reply per operation of that branch.

    *revision* is the store's revision after the transaction: for a successful transaction
    that wrote anything, the revision of its writes (the ``create_revision`` of a key it
    created).
    """

    revision: int
    succeeded: bool
    responses: tuple[OpResponse, ...] = ()


@attrs.frozen
class LeaseGrantResponse:
    revision: int
    lease: int
    ttl: int


@attrs.frozen
class LeaseKeepAliveResponse:
    """``LeaseKeepAliveResponse``: *ttl* is the lease's full TTL again, or 0 (or less) when
    the lease no longer exists (it expired or was revoked)."""

    revision: int
    lease: int
    ttl: int

    @property
    def alive(self) -> bool:
        return self.ttl > 0


@attrs.frozen
class LeaseRevokeResponse:
    revision: int


class ErrorCode(enum.Enum):
    """The etcd errors the core tells apart; anything else is ``OTHER``."""

    #: ``etcdserver: requested lease not found``: a put named a lease that is gone.
    LEASE_NOT_FOUND = "LEASE_NOT_FOUND"
    #: ``mvcc: required revision has been compacted``: a watch started too far back.
    COMPACTED = "COMPACTED"
    OTHER = "OTHER"


@attrs.frozen
class EtcdError:
    """etcd refused the request (it was not applied)."""

    code: ErrorCode
    message: str


Response: TypeAlias = (
    TxnResponse
    | RangeResponse
    | LeaseGrantResponse
    | LeaseKeepAliveResponse
    | LeaseRevokeResponse
    | EtcdError
)


class EventType(enum.Enum):
    PUT = "PUT"
    DELETE = "DELETE"


@attrs.frozen(order=True)
class WatchEvent:
    """``mvccpb.Event``: a key was put (``kv`` is its new state) or deleted."""

    type: EventType
    kv: KeyValue

    @property
    def revision(self) -> int:
        return self.kv.mod_revision


def prefix_end(prefix: bytes) -> bytes:
    """etcd's ``GetPrefixRangeEnd``: the smallest key greater than every key with *prefix*."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # every key
