"""An in-memory, linearizable etcd: revisions, leases on an abstract clock, transactions, watches.

Two layers:

* :class:`EtcdState` and :func:`apply` / :func:`expire`: the store as one frozen, hashable
  value and pure functions over it. ``model/`` puts an :class:`EtcdState` in its worlds and
  applies the control core's requests with these very functions, so the checker and the
  tests judge the core against one and the same etcd;
* :class:`MemoryEtcd`: a mutable store around it with a clock (milliseconds, any callable) and
  the event history a watch needs; :meth:`MemoryEtcd.request` answers every request type of
  :mod:`trioha.failover._etcd`.

What it keeps of etcd's semantics (``tests/failover/test_etcd_contract.py`` holds the
assertions, written so that they can run against a real etcd too):

* one revision per write request: every put and delete of a transaction shares it; a request
  that writes nothing leaves the revision alone; a fresh store is at revision 1;
* per key: ``create_revision``, ``mod_revision``, ``version`` (1 when created, +1 per put, gone
  with the key) and ``lease``; a missing key compares as 0 on CREATE, MOD, VERSION and LEASE,
  and never equal on VALUE;
* leases: granted with a TTL in seconds, expiring TTL after their grant or last keepalive as
  the clock reads when etcd receives it; expiry and revoke delete the lease's keys in one
  revision; a put naming a missing lease fails the whole request with LEASE_NOT_FOUND;
  a keepalive of a missing lease answers TTL 0;
* watches: every event at or after a start revision, in revision order; deletes carry the
  key and the revision of the delete. Compaction is not modelled (nothing is ever forgotten).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable

import attrs

from trioha.failover import (
    Cmp,
    Compare,
    DeleteRange,
    DeleteRangeResponse,
    ErrorCode,
    EtcdError,
    EventType,
    KeyValue,
    LeaseGrant,
    LeaseGrantResponse,
    LeaseKeepAlive,
    LeaseKeepAliveResponse,
    LeaseRevoke,
    LeaseRevokeResponse,
    OpResponse,
    Put,
    PutResponse,
    Range,
    RangeResponse,
    Request,
    Response,
    Target,
    Txn,
    TxnResponse,
    WatchEvent,
)

__all__ = ["EtcdState", "Lease", "MemoryEtcd", "apply", "expire"]


@attrs.frozen(order=True)
class Lease:
    """A granted lease: its id, TTL in seconds, and when it expires (clock milliseconds)."""

    id: int
    ttl: int
    expires_at: int


@attrs.frozen(cache_hash=True)
class EtcdState:
    """The whole store as a value: the revision, the keys (sorted), the leases (by id)."""

    revision: int = 1
    kvs: tuple[KeyValue, ...] = ()
    leases: tuple[Lease, ...] = ()
    #: The id the next granted lease gets (etcd picks its own; the double counts).
    next_lease: int = 1

    def get(self, key: bytes) -> KeyValue | None:
        i = bisect.bisect_left(self.kvs, key, key=_key)
        if i < len(self.kvs) and self.kvs[i].key == key:
            return self.kvs[i]
        return None

    def lease(self, lease_id: int) -> Lease | None:
        for lease in self.leases:
            if lease.id == lease_id:
                return lease
        return None

    def range(self, request: Range) -> tuple[KeyValue, ...]:
        if not request.range_end:
            kv = self.get(request.key)
            return () if kv is None else (kv,)
        lo = bisect.bisect_left(self.kvs, request.key, key=_key)
        hi = bisect.bisect_left(self.kvs, request.range_end, key=_key)
        if request.range_end == b"\0":
            hi = len(self.kvs)
        return self.kvs[lo:hi]


def _key(kv: KeyValue) -> bytes:
    return kv.key


def _lease_id(lease: Lease) -> int:
    return lease.id


# --- the pure functions -----------------------------------------------------------------------


def apply(
    state: EtcdState, request: Request, now: int
) -> tuple[EtcdState, Response, tuple[WatchEvent, ...]]:
    """Answer *request* at clock reading *now* (ms): the new store, the reply, the events.

    Leases that have expired by *now* are expired first (:func:`expire`), so a request never
    sees a lease etcd would already have dropped; their deletions are among the events.
    """
    state, events = expire(state, now)
    new, response, more = _apply(state, request, now)
    return new, response, events + more


def expire(state: EtcdState, now: int) -> tuple[EtcdState, tuple[WatchEvent, ...]]:
    """Drop every lease whose time is up by *now*, each with its keys in one revision."""
    events: tuple[WatchEvent, ...] = ()
    for lease in state.leases:
        if lease.expires_at <= now:
            state, more = _revoke(state, lease.id)
            events += more
    return state, events


def _apply(
    state: EtcdState, request: Request, now: int
) -> tuple[EtcdState, Response, tuple[WatchEvent, ...]]:
    match request:
        case Txn():
            return _txn(state, request)
        case Range():
            return state, RangeResponse(state.revision, state.range(request)), ()
        case LeaseGrant(ttl=ttl):
            if ttl <= 0:
                return state, EtcdError(ErrorCode.OTHER, f"lease TTL must be positive: {ttl}"), ()
            lease = Lease(state.next_lease, ttl, now + ttl * 1000)
            new = attrs.evolve(
                state, leases=_with_lease(state.leases, lease), next_lease=state.next_lease + 1
            )
            return new, LeaseGrantResponse(state.revision, lease.id, ttl), ()
        case LeaseKeepAlive(lease=lease_id):
            found = state.lease(lease_id)
            if found is None:
                return state, LeaseKeepAliveResponse(state.revision, lease_id, 0), ()
            renewed = attrs.evolve(found, expires_at=now + found.ttl * 1000)
            new = attrs.evolve(state, leases=_with_lease(state.leases, renewed))
            return new, LeaseKeepAliveResponse(state.revision, lease_id, found.ttl), ()
        case LeaseRevoke(lease=lease_id):
            if state.lease(lease_id) is None:
                return state, EtcdError(ErrorCode.LEASE_NOT_FOUND, _NO_LEASE.format(lease_id)), ()
            new, events = _revoke(state, lease_id)
            return new, LeaseRevokeResponse(new.revision), events
    raise TypeError(f"not an etcd request: {request!r}")


_NO_LEASE = "etcdserver: requested lease not found (lease {})"


def _with_lease(leases: tuple[Lease, ...], lease: Lease) -> tuple[Lease, ...]:
    return tuple(sorted((*(x for x in leases if x.id != lease.id), lease), key=_lease_id))


def _revoke(state: EtcdState, lease_id: int) -> tuple[EtcdState, tuple[WatchEvent, ...]]:
    leases = tuple(x for x in state.leases if x.id != lease_id)
    doomed = [kv for kv in state.kvs if kv.lease == lease_id]
    if not doomed:
        return attrs.evolve(state, leases=leases), ()
    revision = state.revision + 1
    kvs = tuple(kv for kv in state.kvs if kv.lease != lease_id)
    events = tuple(
        WatchEvent(EventType.DELETE, KeyValue(kv.key, mod_revision=revision)) for kv in doomed
    )
    return EtcdState(revision, kvs, leases, state.next_lease), events


def _holds(state: EtcdState, compare: Compare) -> bool:
    kv = state.get(compare.key)
    if kv is None:
        if compare.target is Target.VALUE:
            return False  # etcd: a missing key never matches a value compare
        kv = KeyValue(compare.key)
    actual: int | bytes
    match compare.target:
        case Target.VERSION:
            actual = kv.version
        case Target.CREATE:
            actual = kv.create_revision
        case Target.MOD:
            actual = kv.mod_revision
        case Target.VALUE:
            actual = kv.value
        case Target.LEASE:
            actual = kv.lease
    operand = compare.operand
    match compare.result:
        case Cmp.EQUAL:
            return actual == operand
        case Cmp.NOT_EQUAL:
            return actual != operand
        case Cmp.GREATER:
            return actual > operand  # type: ignore[operator]
        case Cmp.LESS:
            return actual < operand  # type: ignore[operator]


def _txn(state: EtcdState, txn: Txn) -> tuple[EtcdState, Response, tuple[WatchEvent, ...]]:
    succeeded = all(_holds(state, c) for c in txn.compare)
    ops = txn.success if succeeded else txn.failure
    writes = any(isinstance(op, Put | DeleteRange) for op in ops)
    for op in ops:
        if isinstance(op, Put) and op.lease and state.lease(op.lease) is None:
            return state, EtcdError(ErrorCode.LEASE_NOT_FOUND, _NO_LEASE.format(op.lease)), ()
    revision = state.revision + 1 if writes else state.revision
    kvs = {kv.key: kv for kv in state.kvs}
    changed = False
    responses: list[OpResponse] = []
    events: list[WatchEvent] = []
    for op in ops:
        match op:
            case Range():
                view = EtcdState(state.revision, tuple(sorted(kvs.values(), key=_key)))
                # Reads inside a transaction see its earlier writes, at the new revision.
                responses.append(RangeResponse(revision, view.range(op)))
            case Put(key=key, value=value, lease=lease):
                old = kvs.get(key)
                kv = KeyValue(
                    key,
                    value,
                    old.create_revision if old is not None else revision,
                    revision,
                    old.version + 1 if old is not None else 1,
                    lease,
                )
                kvs[key] = kv
                changed = True
                responses.append(PutResponse(revision))
                events.append(WatchEvent(EventType.PUT, kv))
            case DeleteRange():
                gone = [k for k in sorted(kvs) if Range(op.key, op.range_end).covers(k)]
                for key in gone:
                    del kvs[key]
                    events.append(
                        WatchEvent(EventType.DELETE, KeyValue(key, mod_revision=revision))
                    )
                changed = changed or bool(gone)
                responses.append(DeleteRangeResponse(revision, len(gone)))
    if not changed:
        # A branch whose writes all deleted nothing still took a revision in etcd only if
        # it wrote; a delete of nothing is not a write (etcd leaves the revision alone).
        revision = state.revision
        responses = [_at(r, revision) for r in responses]
        new = state
    else:
        kvs_sorted = tuple(sorted(kvs.values(), key=_key))
        new = EtcdState(revision, kvs_sorted, state.leases, state.next_lease)
    return new, TxnResponse(revision, succeeded, tuple(responses)), tuple(events)


def _at(response: OpResponse, revision: int) -> OpResponse:
    return attrs.evolve(response, revision=revision)


# --- the mutable store ------------------------------------------------------------------------


class MemoryEtcd:
    """One etcd cluster in memory: requests answered at once, events kept for watches.

    *clock* returns the time in milliseconds (a test passes an abstract clock, Trio code
    ``lambda: int(trio.current_time() * 1000)``). Leases expire when the clock says so; the
    expiry is applied before each request and by :meth:`tick`.
    """

    def __init__(self, clock: Callable[[], int]) -> None:
        self.clock = clock
        self.state = EtcdState()
        self.history: list[WatchEvent] = []

    @property
    def revision(self) -> int:
        return self.tick()

    def tick(self) -> int:
        """Expire what is due; the current revision."""
        self.state, events = expire(self.state, self.clock())
        self.history.extend(events)
        return self.state.revision

    def request(self, request: Request) -> Response:
        self.state, response, events = apply(self.state, request, self.clock())
        self.history.extend(events)
        return response

    def events(self, watched: Range, start_revision: int) -> list[WatchEvent]:
        """Every event on *watched* keys at *start_revision* or later, in revision order."""
        self.tick()
        revisions = [e.revision for e in self.history]
        first = bisect.bisect_left(revisions, start_revision)
        return [e for e in self.history[first:] if watched.covers(e.kv.key)]

    def kvs(self) -> Iterable[KeyValue]:
        """Every key, in key order, once due expiries are applied."""
        self.tick()
        return self.state.kvs
