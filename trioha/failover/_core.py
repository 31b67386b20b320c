"""The replica manager's control core: who is master, fenced by etcd. One table, pure functions.

Theory of operation
===================

Each broker of a group runs one core. It does no IO (like ``trioha.proto``): the Trio layer
feeds it events and carries out the actions it returns, in order, before it feeds the next
event. Time comes in as ``now``, milliseconds of a monotonic clock.

*Lease.* A core starts by granting itself an etcd lease (TTL ``lease_ttl`` seconds, 3 by
default) and keeps it alive three times per TTL. Everything the broker holds in etcd is bound
to that lease: its registration (``brokers/<id>``) and, while it is master, the master key.
A lease that etcd no longer knows (a keepalive answered TTL 0, a put refused with
LEASE_NOT_FOUND) is gone for good: the core starts again with a new one.

*Registration and view.* With the lease, one transaction registers the broker and reads the
group's keys; from that revision on the Trio layer watches the prefix. The core merges every
reply and event into a :class:`~trioha.failover._view.GroupView`, key by key, newest revision
wins (stale and duplicated events change nothing).

*Following.* While etcd names a master, the core tells the data plane to follow it
(:class:`BecomeSlave`). When the master key is vacant, an eligible broker (a SyncStateSet
member, see ``_rules``) reports its log's ``(epoch, max offset)`` in its registration, backs
off while a better live candidate exists, and campaigns: one transaction that creates the
master key bound to its lease and bumps the epoch counter, comparing that the key is absent
and that neither the counter nor the SyncStateSet changed since it read them. Its
``create_revision`` is the master's *fencing token*.

*Master.* The new master tells the data plane to begin the epoch etcd gave it
(:class:`BecomeMaster`: an epoch entry at its max offset, before it serves) and which brokers
the ack rule must wait for (:class:`SetSyncStateSet`), then allows acknowledgements until its
lease deadline (:class:`Unfence`): the send time of the last successful keepalive plus 4/5 of
the TTL. A tick at or past the deadline fences it (:class:`Fence`) and fails every put in
flight at once (:class:`FailInFlight`): none of them can turn into PUT_OK later. A keepalive
that succeeds in time unfences it. A master that learns that the key is no longer its own (a
watch event, a failed compare) steps down the same way and follows whoever etcd names.

*SyncStateSet.* Only the master changes the set, one transaction at a time, each comparing
the master key's ``create_revision`` with its token and the set's ``mod_revision`` with the
one it read. While a change is pending the data plane waits for the union of the old and the
new set; a shrink takes effect only once committed. A reply that never comes leaves the union
in force and the same change is sent again: either copy landing ends it, and the other then
fails its compare, so a late copy can never land afterwards.

*Handover.* An operator hands the master role to a chosen member on purpose (RocketMQ's
``mqadmin electMaster``) by writing the ``handover`` key (``REQUESTED``, naming the target and
the master's epoch, compared against the master key's ``create_revision``). The master judges
it at once: a target outside its SyncStateSet, not registered, or the master itself is
refused in the key (``REFUSED`` with the reason). Otherwise it fences itself and fails the
puts in flight (:class:`Fence`, :class:`FailInFlight`: phase ``HANDING_OVER``), waits until
the target's live connection vouches for its whole log, then in one transaction (fenced by
its token, the request's and the target's registration's ``mod_revision``) deletes the master
key and marks the request ``RELEASED``. While a released request names a live broker, only
that broker campaigns, at once; its campaign deletes the request. So the new master holds
everything the old one had, acknowledged or not, and takes the next epoch as in any
election. A target that does not catch up within the request's time (at most
``haMaxTimeSlaveNotCatchup``) is refused, and the master acknowledges again.

The table at the bottom lists every (phase, event) pair and the phases it may lead to;
anything else is a :class:`~trioha._errors.LocalProtocolError`. ``failover_table_mermaid``
draws it for docs/failover.md.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from typing import Any, TypeAlias, assert_never

import attrs

from trioha._errors import LocalProtocolError
from trioha._status import PutStatus
from trioha.failover._etcd import (
    Compare,
    DeleteRange,
    ErrorCode,
    EtcdError,
    EventType,
    KeyValue,
    LeaseGrant,
    LeaseGrantResponse,
    LeaseKeepAlive,
    LeaseKeepAliveResponse,
    LeaseRevoke,
    Put,
    Range,
    RangeResponse,
    Request,
    Response,
    Txn,
    TxnResponse,
    WatchEvent,
)
from trioha.failover._keys import (
    GroupKeys,
    Handover,
    HandoverState,
    MasterRecord,
    Registration,
    SyncStateSet,
    encode_epoch,
)
from trioha.failover._rules import (
    Decision,
    FailoverOptions,
    Replica,
    campaign_decision,
    fence_deadline,
    keepalive_interval,
    sss_change,
)
from trioha.failover._view import Entry, GroupView

__all__ = [
    "FAILOVER_TABLE",
    "NEVER",
    "Action",
    "Alert",
    "BecomeMaster",
    "BecomeSlave",
    "Event",
    "FailInFlight",
    "Failed",
    "Fence",
    "Handing",
    "LogChanged",
    "Outstanding",
    "Phase",
    "Proposal",
    "Purpose",
    "ReplicaAcked",
    "ReplicaGone",
    "ReplicaState",
    "Replied",
    "RoleChangeFailed",
    "SendRequest",
    "SetSyncStateSet",
    "Shutdown",
    "StartWatch",
    "Tick",
    "Unfence",
    "WatchBroken",
    "Watched",
    "effective_members",
    "failover_step",
    "failover_table_mermaid",
]


class Phase(enum.Enum):
    """Where one broker's control core is."""

    #: No lease: granting one.
    STARTING = "STARTING"
    #: Lease granted: registering and reading the group's keys.
    REGISTERING = "REGISTERING"
    #: Registered: following the master etcd names, or waiting to campaign for a vacancy.
    FOLLOWER = "FOLLOWER"
    #: A campaign transaction is on its way.
    CAMPAIGNING = "CAMPAIGNING"
    #: Holds the master key; the data plane acknowledges until the lease deadline.
    MASTER = "MASTER"
    #: Holds the master key as far as it knows, but its lease deadline passed: no acks.
    FENCED = "FENCED"
    #: Holds the master key and acknowledges nothing: handing it to a chosen member.
    HANDING_OVER = "HANDING_OVER"
    #: Shut down (the lease revoked); nothing more happens.
    STOPPED = "STOPPED"


class Purpose(enum.Enum):
    """Why a request was sent (its reply is handled accordingly; logs and metrics name it)."""

    GRANT = "grant"
    KEEPALIVE = "keepalive"
    REGISTER = "register"
    REPORT = "report"
    READ = "read"
    CAMPAIGN = "campaign"
    ALTER = "alter SyncStateSet"
    REVOKE = "revoke"
    HANDOVER = "handover"


# --- events -----------------------------------------------------------------------------------


@attrs.frozen
class Tick:
    """Time passed (``now`` is given with every event); keepalives and deadlines are due."""


@attrs.frozen
class Replied:
    """etcd answered request *request_id* (a :class:`SendRequest`)."""

    request_id: int
    response: Response


@attrs.frozen
class Failed:
    """Request *request_id* got no answer (timeout, connection lost): it may or may not have
    been applied."""

    request_id: int
    reason: str = ""


@attrs.frozen
class Watched:
    """Events from the watch on the group's prefix, in the order etcd sent them."""

    events: tuple[WatchEvent, ...]


@attrs.frozen
class WatchBroken:
    """The watch ended (cancelled, compacted, disconnected): read the keys again."""

    reason: str = ""


@attrs.frozen
class LogChanged:
    """The data plane: this broker's log ends at *max_offset*, its epoch file's last epoch is
    *last_epoch*, and (as master) the last acknowledged put ends at *confirm_offset*."""

    max_offset: int
    last_epoch: int
    confirm_offset: int = 0


@attrs.frozen
class ReplicaAcked:
    """The data plane (master): slave *broker_id*'s live connection vouches up to *acked*;
    *caught_up* when that is everything the master had sent it (RocketMQ's
    ``lastCaughtUpTime`` rule); *confirm_offset* is the master's own, read at this moment."""

    broker_id: int
    acked: int
    caught_up: bool
    confirm_offset: int


@attrs.frozen
class ReplicaGone:
    """The data plane (master): slave *broker_id*'s connection ended."""

    broker_id: int


@attrs.frozen
class RoleChangeFailed:
    """The data plane could not become master at the epoch it was given (its epoch file is
    ahead, or its store failed): the master key must be given up."""

    reason: str


@attrs.frozen
class Shutdown:
    """The broker stops: give up the lease (and so the master key) at once."""


Event: TypeAlias = (
    Tick
    | Replied
    | Failed
    | Watched
    | WatchBroken
    | LogChanged
    | ReplicaAcked
    | ReplicaGone
    | RoleChangeFailed
    | Shutdown
)

# --- actions ----------------------------------------------------------------------------------


@attrs.frozen
class SendRequest:
    """Send *request* to etcd; answer with :class:`Replied` or :class:`Failed` (same id)."""

    request_id: int
    purpose: Purpose
    request: Request


@attrs.frozen
class StartWatch:
    """(Re)open the watch on *watched* from *start_revision* (inclusive), dropping any other."""

    start_revision: int
    watched: Range


@attrs.frozen
class BecomeMaster:
    """Become master at *epoch*: stop replicating, append the epoch entry at the log's end
    (refusing an epoch not above every recorded one: :class:`RoleChangeFailed`), serve
    slaves, and register with the name servers as brokerId 0. Acknowledge nothing until
    :class:`Unfence`. *unclean_lost* >= 0: an unclean election, that many bytes at least are
    lost (say so at ERROR)."""

    epoch: int
    members: frozenset[int]
    unclean_lost: int = -1


@attrs.frozen
class BecomeSlave:
    """Follow *master* (its HA address, at its epoch): connect, cut back to the consistent
    point, replicate. Register with the name servers as a slave."""

    master: MasterRecord


@attrs.frozen
class Fence:
    """Stop acknowledging puts now (the data plane refuses new sync puts)."""

    reason: str


@attrs.frozen
class FailInFlight:
    """Answer every put waiting for replicas with *status* now; none may become PUT_OK."""

    status: PutStatus


@attrs.frozen
class Unfence:
    """Acknowledge puts while the clock reads less than *until* (ms); checked at every ack."""

    until: int


@attrs.frozen
class SetSyncStateSet:
    """The brokers every put must reach (``trioha.proto.InSyncQuorum``'s *members*)."""

    members: frozenset[int]


@attrs.frozen
class Alert:
    """Something an operator must see (logged at ERROR), and why the core is holding back."""

    message: str


Action: TypeAlias = (
    SendRequest
    | StartWatch
    | BecomeMaster
    | BecomeSlave
    | Fence
    | FailInFlight
    | Unfence
    | SetSyncStateSet
    | Alert
)

# --- state ------------------------------------------------------------------------------------


@attrs.frozen(order=True)
class Outstanding:
    """A request sent and not yet answered, with what its reply needs to be understood."""

    request_id: int
    purpose: Purpose
    #: When it was sent (ms): a keepalive's deadline counts from here, never from its reply.
    sent_at: int
    #: CAMPAIGN: the epoch it asks for; ALTER: the set's version it writes.
    epoch: int = 0
    #: CAMPAIGN: the set the new master starts with; ALTER: the set it writes; HANDOVER: the
    #: target when it releases the master key (empty: it answers a refusal).
    members: frozenset[int] = frozenset()
    #: CAMPAIGN: bytes an unclean election loses at least (-1: a clean one).
    unclean_lost: int = -1
    #: CAMPAIGN: what it writes if it succeeds (folded into the view then).
    writes: tuple[Put, ...] = ()


@attrs.frozen
class Proposal:
    """A SyncStateSet change sent to etcd and not yet known to have landed or not."""

    members: frozenset[int]
    version: int
    #: The set's ``mod_revision`` the change compares against (0: the key does not exist).
    base_revision: int


@attrs.frozen
class Handing:
    """A handover this master accepted: the target, the request's ``mod_revision`` (it must
    stay that one) and when (ms) the master gives up waiting for the target."""

    target: int
    revision: int
    until: int


@attrs.frozen(cache_hash=True)
class ReplicaState:
    """One broker's control core. Timestamps (``*_at``) are milliseconds of ``now``."""

    phase: Phase = Phase.STARTING
    lease: int = 0
    #: The lease's TTL in seconds, as etcd granted it.
    ttl: int = 0
    #: Acknowledgements are allowed while ``now < deadline_at``.
    deadline_at: int = 0
    #: The next keepalive is due then.
    keepalive_at: int = 0
    view: GroupView = attrs.field(factory=GroupView)
    # --- the data plane's facts ---
    max_offset: int = 0
    last_epoch: int = 0
    confirm_offset: int = 0
    # --- requests in flight ---
    requests: tuple[Outstanding, ...] = ()
    next_request: int = 1
    #: The master the data plane was told to follow: ``(broker id, epoch)``.
    following: tuple[int, int] = (0, 0)
    # --- master only ---
    epoch: int = 0
    #: The master key's create_revision: compared by every SyncStateSet change.
    token: int = 0
    #: The SyncStateSet as committed in etcd, as far as this master knows.
    sss: frozenset[int] = frozenset()
    proposal: Proposal | None = None
    replicas: tuple[Replica, ...] = ()
    #: Why the core holds back from campaigning ("" when it does not), alerted once.
    blocked: str = ""
    #: HANDING_OVER: the handover in hand.
    handing: Handing | None = None
    #: The ``mod_revision`` of the last handover request this master answered.
    judged: int = 0

    def outstanding(self, purpose: Purpose) -> Outstanding | None:
        for out in self.requests:
            if out.purpose is purpose:
                return out
        return None


def effective_members(state: ReplicaState, options: FailoverOptions) -> frozenset[int]:
    """The set the data plane waits for: the committed set, united with a pending change."""
    if state.proposal is None or options.unsafe.expand_without_union:
        return state.sss
    return state.sss | state.proposal.members


_Step: TypeAlias = tuple[ReplicaState, tuple[Action, ...]]


class _Ctx:
    """One step's surroundings: the time, the options, and the actions gathered so far."""

    __slots__ = ("acts", "now", "o")

    def __init__(self, now: int, options: FailoverOptions) -> None:
        self.now = now
        self.o = options
        self.acts: list[Action] = []

    def done(self, state: ReplicaState) -> _Step:
        return state, tuple(self.acts)

    def send(
        self, state: ReplicaState, purpose: Purpose, request: Request, **extra: Any
    ) -> ReplicaState:
        """Send *request*, remembering it as outstanding (with *extra* for its reply)."""
        out = Outstanding(state.next_request, purpose, self.now, **extra)
        self.acts.append(SendRequest(out.request_id, purpose, request))
        return attrs.evolve(
            state, requests=(*state.requests, out), next_request=state.next_request + 1
        )

    def fence(self, reason: str) -> None:
        self.acts.append(Fence(reason))
        self.acts.append(FailInFlight(PutStatus.FLUSH_SLAVE_TIMEOUT))


# --- small helpers ----------------------------------------------------------------------------


def _forget(state: ReplicaState, request_id: int) -> ReplicaState:
    kept = tuple(r for r in state.requests if r.request_id != request_id)
    return attrs.evolve(state, requests=kept)


def _register_txn(state: ReplicaState, o: FailoverOptions) -> Txn:
    """Put this broker's registration (bound to its lease) and read the whole group."""
    keys = o.keys
    me = Registration(o.broker_id, state.last_epoch, state.max_offset, o.broker_addr, o.ha_addr)
    put = Put(keys.broker(o.broker_id), me.encode(), state.lease)
    return Txn((), (put, Range.prefix(keys.prefix)))


def _snapshot(state: ReplicaState, c: _Ctx, response: Response) -> ReplicaState:
    """Merge the group read a reply carries (a range, or the range inside a transaction)."""
    reads: Iterable[RangeResponse] = ()
    if isinstance(response, RangeResponse):
        reads = (response,)
    elif isinstance(response, TxnResponse):
        reads = (r for r in response.responses if isinstance(r, RangeResponse))
    view = state.view
    for read in reads:
        view = view.snapshot(c.o.keys, read.revision, read.kvs)
    return attrs.evolve(state, view=view)


def _my_writes(state: ReplicaState, c: _Ctx, revision: int, puts: Iterable[Put]) -> ReplicaState:
    """Fold writes this core just saw succeed into its view (as the watch will show them)."""
    events = []
    for put in puts:
        created = _created(state.view, c.o.keys, put.key) or revision
        kv = KeyValue(put.key, put.value, created, revision, 0, put.lease)
        events.append(WatchEvent(EventType.PUT, kv))
    return attrs.evolve(state, view=state.view.events(c.o.keys, events))


def _created(view: GroupView, keys: GroupKeys, key: bytes) -> int:
    """The create_revision of one of the group's keys as known (0: absent)."""
    entry: Entry[Any]
    if key == keys.master:
        entry = view.master
    elif key == keys.epoch:
        entry = view.epoch
    elif key == keys.sync_state_set:
        entry = view.sss
    else:
        entry = view.broker(keys.broker_id_of(key) or 0)
    return entry.create_revision if entry.present else 0


def _replica_id(replica: Replica) -> int:
    return replica.broker_id


def _not_master(state: ReplicaState) -> ReplicaState:
    return attrs.evolve(
        state,
        epoch=0,
        token=0,
        sss=frozenset(),
        proposal=None,
        replicas=(),
        handing=None,
        judged=0,
    )


def _block(state: ReplicaState, c: _Ctx, reason: str) -> ReplicaState:
    """Record why the core holds back from campaigning; alert when the reason is new."""
    if reason == state.blocked:
        return state
    if reason:
        c.acts.append(Alert(reason))
    return attrs.evolve(state, blocked=reason)


def _read(state: ReplicaState, c: _Ctx) -> ReplicaState:
    if state.outstanding(Purpose.READ):
        return state
    return c.send(state, Purpose.READ, Range.prefix(c.o.keys.prefix))


# --- lease ------------------------------------------------------------------------------------


def _keepalive_due(state: ReplicaState, c: _Ctx) -> ReplicaState:
    if not state.lease or c.now < state.keepalive_at or state.outstanding(Purpose.KEEPALIVE):
        return state
    state = c.send(state, Purpose.KEEPALIVE, LeaseKeepAlive(state.lease))
    return attrs.evolve(state, keepalive_at=c.now + keepalive_interval(state.ttl))


def _lease_lost(state: ReplicaState, c: _Ctx, reason: str) -> ReplicaState:
    """The lease is gone, and with it the registration and any master key: start over, at
    once (a new lease is asked for now, not at the next tick)."""
    if state.phase in (Phase.MASTER, Phase.FENCED, Phase.HANDING_OVER):
        c.fence(f"lost the master key of epoch {state.epoch}: {reason}")
    state = attrs.evolve(
        _not_master(state), phase=Phase.STARTING, lease=0, ttl=0, deadline_at=0, requests=()
    )
    return c.send(state, Purpose.GRANT, LeaseGrant(c.o.lease_ttl))


# --- following and campaigning ----------------------------------------------------------------


def _eligible(state: ReplicaState, o: FailoverOptions) -> tuple[frozenset[int] | None, bool, str]:
    """Who may campaign for the vacancy (None: any registered broker), whether that is an
    unclean election, and why nobody may ("" when someone may)."""
    view, me = state.view, o.broker_id
    if view.sss.present:
        sss = view.sss.current
        if sss is None:
            return frozenset(), False, f"the SyncStateSet in etcd cannot be read ({view.sss.error})"
        if me in sss.members:
            return sss.members, False, ""
        if o.enable_elect_unclean_master and not sss.members & set(view.live()):
            return None, True, ""
        return sss.members, False, ""  # not a member: this broker follows, it never campaigns
    if view.epoch.present:
        return frozenset(), False, "etcd has an epoch counter but no SyncStateSet"
    return None, False, ""  # the group's first master (no set yet)


def _follow(state: ReplicaState, c: _Ctx) -> ReplicaState:
    """FOLLOWER: follow the master etcd names, or see about the vacancy."""
    view, me = state.view, c.o.broker_id
    master = view.master
    if master.present:
        record = master.current
        if record is None:
            return _block(state, c, f"the master key in etcd cannot be read ({master.error})")
        if record.broker_id != me:
            state = _block(state, c, "")
            if state.following != (record.broker_id, record.epoch):
                c.acts.append(BecomeSlave(record))
                state = attrs.evolve(state, following=(record.broker_id, record.epoch))
            return state
        if not state.lease or master.lease != state.lease:
            return _block(
                state,
                c,
                f"the master key names this broker from an earlier start (lease "
                f"{master.lease}); waiting for it to expire",
            )
        # This broker's own campaign landed though its reply never came: take the key. The
        # campaign compared the set's revision, so the set is still the one this view holds
        # (only the master writes it), unless the campaign wrote it itself (the first or an
        # unclean election: {me}), which the view shows once news of that revision comes.
        sss = view.sss.current
        if sss is None or me not in sss.members:
            return _read(state, c)
        members = sss.members
        return _became_master(
            state, c, epoch=record.epoch, token=master.create_revision, members=members
        )
    if not master.as_of or state.outstanding(Purpose.CAMPAIGN) or state.outstanding(Purpose.REPORT):
        return state
    if not state.lease or c.now >= state.deadline_at:
        return state  # a keepalive will tell whether the lease lives
    eligible, unclean, reason = _eligible(state, c.o)
    if reason:
        return _block(state, c, f"not campaigning: {reason}")
    if eligible is not None and me not in eligible:
        return _block(state, c, "")
    if view.epoch.present and view.epoch.current is None:
        return _block(state, c, f"the epoch counter in etcd cannot be read ({view.epoch.error})")
    bootstrap = not view.sss.present
    if state.last_epoch > view.counter() and not bootstrap:
        return _block(
            state,
            c,
            f"this broker's epoch file is at epoch {state.last_epoch}, ahead of etcd's "
            f"{view.counter()}: refusing to be master (was etcd's data lost?)",
        )
    state = _block(state, c, "")
    handover = view.handover.current
    if handover is not None and handover.state is HandoverState.RELEASED:
        if handover.target == me:
            # The master handed the role to this broker: it holds the whole log, go now.
            return _campaign(state, c, bootstrap=bootstrap, unclean=unclean)
        if view.broker(handover.target).present:
            return state  # the operator's choice goes first while it lives
    rivals = {
        bid: e.current
        for bid, e in view.live().items()
        if bid != me and (eligible is None or bid in eligible)
    }
    mine = view.broker(me)
    decision = campaign_decision(
        me,
        (state.last_epoch, state.max_offset),
        mine.current if mine.present and mine.lease == state.lease else None,
        rivals,
    )
    if decision is Decision.REPORT:
        return c.send(state, Purpose.REPORT, _register_txn(state, c.o))
    if decision is Decision.CAMPAIGN:
        return _campaign(state, c, bootstrap=bootstrap, unclean=unclean)
    return state


def _campaign(state: ReplicaState, c: _Ctx, *, bootstrap: bool, unclean: bool) -> ReplicaState:
    """One transaction: the master key (absent) bound to my lease, the counter bumped."""
    view, keys, me = state.view, c.o.keys, c.o.broker_id
    epoch = (max(view.counter(), state.last_epoch) if bootstrap else view.counter()) + 1
    record = MasterRecord(me, epoch, c.o.broker_addr, c.o.ha_addr)
    compares = (
        Compare.absent(keys.master),
        _unchanged(keys.sync_state_set, view.sss),
        _unchanged(keys.epoch, view.epoch),
        _unchanged(keys.handover, view.handover),
    )
    puts = [Put(keys.master, record.encode(), state.lease), Put(keys.epoch, encode_epoch(epoch))]
    lost = -1
    sss = view.sss.current
    if sss is None or unclean:
        # The group's first master, or an unclean one: the set becomes this broker alone.
        members = frozenset({me})
        version = (sss.version if sss is not None else 0) + 1
        puts.append(Put(keys.sync_state_set, SyncStateSet(members, version, epoch).encode()))
        if unclean:
            lost = _unclean_loss(state, sss.members if sss is not None else frozenset())
    else:
        members = sss.members
    # A handover request (served, or left from an earlier term) ends with the election.
    ends = (DeleteRange(keys.handover),) if view.handover.present else ()
    txn = Txn(compares, (*puts, *ends), (Range.prefix(keys.prefix),))
    state = c.send(
        state,
        Purpose.CAMPAIGN,
        txn,
        epoch=epoch,
        members=members,
        unclean_lost=lost,
        writes=tuple(puts),
    )
    return attrs.evolve(state, phase=Phase.CAMPAIGNING)


def _unchanged(key: bytes, entry: Entry[Any]) -> Compare:
    """The key is as this core last saw it: same mod_revision, or still absent."""
    return Compare.modified_at(key, entry.mod_revision) if entry.present else Compare.absent(key)


def _unclean_loss(state: ReplicaState, members: frozenset[int]) -> int:
    """At least this many bytes the set's members had that this broker has not."""
    known = [e.value.max_offset for bid, e in state.view.brokers if bid in members and e.value]
    return max(0, max(known, default=0) - state.max_offset)


# --- master -----------------------------------------------------------------------------------


def _became_master(
    state: ReplicaState,
    c: _Ctx,
    *,
    epoch: int,
    token: int,
    members: frozenset[int],
    unclean_lost: int = -1,
) -> ReplicaState:
    me = c.o.broker_id
    if _still_mine(attrs.evolve(state, token=token)):
        # The key was already seen gone again (the lease expired before the reply came).
        return _follow(attrs.evolve(state, phase=Phase.FOLLOWER), c)
    acting = c.now < state.deadline_at or c.o.unsafe.no_self_fence
    replicas = tuple(Replica(m, -1, c.now) for m in sorted(members) if m != me)
    state = attrs.evolve(
        state,
        phase=Phase.MASTER if acting else Phase.FENCED,
        epoch=epoch,
        token=token,
        sss=members,
        proposal=None,
        replicas=replicas,
        following=(0, 0),
        blocked="",
    )
    c.acts.append(BecomeMaster(epoch, members, unclean_lost))
    if unclean_lost >= 0:
        c.acts.append(
            Alert(
                f"unclean election: master at epoch {epoch} without being in the SyncStateSet;"
                f" at least {unclean_lost} bytes its members held are lost"
            )
        )
    c.acts.append(SetSyncStateSet(members))
    if acting:
        c.acts.append(Unfence(_ack_until(state, c.o)))
    return _maintain(state, c, None)


def _ack_until(state: ReplicaState, o: FailoverOptions) -> int:
    return NEVER if o.unsafe.no_self_fence else state.deadline_at


#: A deadline that never comes (the no-self-fence twin).
NEVER = 1 << 62


def _step_down(state: ReplicaState, c: _Ctx, why: str) -> ReplicaState:
    if state.phase is not Phase.HANDING_OVER:  # handing over, it fenced itself already
        c.fence(f"no longer master of epoch {state.epoch}: {why}")
    return _follow(attrs.evolve(_not_master(state), phase=Phase.FOLLOWER), c)


def _still_mine(state: ReplicaState) -> str:
    """Why the master key is no longer this master's ("" while it is)."""
    master = state.view.master
    if not master.present:
        return "the master key is gone from etcd"
    if master.create_revision != state.token:
        record = master.current
        who = f"broker {record.broker_id} at epoch {record.epoch}" if record else "someone else"
        return f"the master key now belongs to {who}"
    return ""


def _master(state: ReplicaState, c: _Ctx, confirm: int | None) -> ReplicaState:
    """MASTER or FENCED, after news: still master? the set as etcd has it? a change due?"""
    why = _still_mine(state)
    if why:
        return _step_down(state, c, why)
    sss = state.view.sss.current
    if sss is not None and sss.members != state.sss:
        proposal = state.proposal
        if proposal is not None and (sss.members, sss.version) == (
            proposal.members,
            proposal.version,
        ):
            state = _commit(state, c)  # the watch showed the change before its reply came
        elif proposal is None:
            # Changed by hand (only this master writes it otherwise): etcd's set is the truth.
            c.acts.append(
                Alert(f"the SyncStateSet was changed outside this master: {sorted(sss.members)}")
            )
            state = attrs.evolve(state, sss=sss.members)
            c.acts.append(SetSyncStateSet(effective_members(state, c.o)))
    state = _judge_handover(state, c)
    if state.phase is Phase.HANDING_OVER:
        # Judged on the next event, not this one: the data plane's log end as of the fence
        # (it cannot grow after it) comes first.
        return state
    return _maintain(state, c, confirm)


def _maintain(state: ReplicaState, c: _Ctx, confirm: int | None) -> ReplicaState:
    """Propose a SyncStateSet change when one is due (one at a time, never while fenced).

    One at a time means also: not while the request of the last one is unanswered, even if
    the watch already showed it landed; so a reply always belongs to the change in hand.
    """
    if (
        state.phase is not Phase.MASTER
        or state.proposal is not None
        or state.outstanding(Purpose.ALTER)
    ):
        return state
    view = state.view
    live = [bid for bid, e in view.brokers if e.present]
    new = sss_change(
        c.o.broker_id,
        state.sss,
        replicas=state.replicas,
        live=live,
        now=c.now,
        ha_max=c.o.ha_max_time_slave_not_catchup,
        confirm_offset=confirm,
    )
    if new is None:
        return state
    current = view.sss.current
    version = (current.version if current is not None else 0) + 1
    base = view.sss.mod_revision if view.sss.present else 0
    state = attrs.evolve(state, proposal=Proposal(new, version, base))
    after = effective_members(state, c.o)
    if after != state.sss:
        c.acts.append(SetSyncStateSet(after))
    return _send_proposal(state, c)


def _send_proposal(state: ReplicaState, c: _Ctx) -> ReplicaState:
    """The change as one transaction, fenced by the token and the set's mod_revision."""
    proposal = state.proposal
    assert proposal is not None
    keys = c.o.keys
    compares: tuple[Compare, ...] = (
        Compare.modified_at(keys.sync_state_set, proposal.base_revision)
        if proposal.base_revision
        else Compare.absent(keys.sync_state_set),
    )
    if not c.o.unsafe.sss_without_token:
        compares = (Compare.created_at(keys.master, state.token), *compares)
    value = SyncStateSet(proposal.members, proposal.version, state.epoch).encode()
    txn = Txn(compares, (Put(keys.sync_state_set, value),), (Range.prefix(keys.prefix),))
    return c.send(state, Purpose.ALTER, txn, members=proposal.members, epoch=proposal.version)


def _commit(state: ReplicaState, c: _Ctx) -> ReplicaState:
    """The proposal landed: it is the set now (a shrink takes effect only here)."""
    proposal = state.proposal
    assert proposal is not None
    known = {r.broker_id for r in state.replicas}
    added = tuple(Replica(m, -1, c.now) for m in proposal.members if m not in known)
    replicas = tuple(sorted((*state.replicas, *added), key=_replica_id))
    state = attrs.evolve(state, sss=proposal.members, proposal=None, replicas=replicas)
    c.acts.append(SetSyncStateSet(proposal.members))
    return state


# --- handing the master role over ------------------------------------------------------------


def _judge_handover(state: ReplicaState, c: _Ctx) -> ReplicaState:
    """MASTER or FENCED: answer a handover request not answered yet (module docstring).

    Accepting it fences the master; whether the target holds the whole log is asked from the
    next event on (``_handing``), once the Trio layer has fed the log's end as of the fence
    (``LogChanged``): a put appended just before it must be counted.
    """
    entry = state.view.handover
    request = entry.current
    if (
        request is None
        or request.state is not HandoverState.REQUESTED
        or entry.mod_revision == state.judged
    ):
        return state
    if state.proposal is not None or state.outstanding(Purpose.ALTER):
        return state  # judged once the SyncStateSet change in hand is settled
    state = attrs.evolve(state, judged=entry.mod_revision)
    why = _handover_refusal(state, c, request)
    if why:
        return _answer_handover(state, c, why)
    c.fence(f"handing the master role of epoch {state.epoch} over to broker {request.target}")
    wait = max(0, min(request.timeout_ms, c.o.ha_max_time_slave_not_catchup))
    handing = Handing(request.target, entry.mod_revision, c.now + wait)
    return attrs.evolve(state, phase=Phase.HANDING_OVER, handing=handing)


def _handover_refusal(state: ReplicaState, c: _Ctx, request: Handover) -> str:
    """Why this master will not hand over to the request's target ("" when it will)."""
    target = request.target
    if request.epoch != state.epoch:
        return (
            f"the request is addressed to the master of epoch {request.epoch}; broker "
            f"{c.o.broker_id} is master of epoch {state.epoch}"
        )
    if target == c.o.broker_id:
        return f"broker {target} is the master already"
    if target not in state.sss:
        return (
            f"broker {target} is not in the SyncStateSet {sorted(state.sss)}: it may not hold "
            "every acknowledged message"
        )
    if not state.view.broker(target).present:
        return f"broker {target} is not registered in etcd (not running, or cut off from etcd)"
    return ""


def _answer_handover(state: ReplicaState, c: _Ctx, reason: str) -> ReplicaState:
    """Mark the request REFUSED with *reason*, if it is still the one this master judged."""
    entry = state.view.handover
    request = entry.current
    if request is None:
        return state
    keys = c.o.keys
    refused = attrs.evolve(request, state=HandoverState.REFUSED, reason=reason)
    compares = (
        Compare.created_at(keys.master, state.token),
        Compare.modified_at(keys.handover, entry.mod_revision),
    )
    put = Put(keys.handover, refused.encode(), entry.lease)
    c.acts.append(Alert(f"handover to broker {request.target} refused: {reason}"))
    txn = Txn(compares, (put,), (Range.prefix(keys.prefix),))
    return c.send(state, Purpose.HANDOVER, txn, writes=(put,))


def _handing(state: ReplicaState, c: _Ctx) -> ReplicaState:
    """HANDING_OVER, after news: release the key once the target holds the whole log."""
    why = _still_mine(state)
    if why:
        return _step_down(state, c, why)
    handing = state.handing
    assert handing is not None
    entry = state.view.handover
    request = entry.current
    if (
        request is None
        or entry.mod_revision != handing.revision
        or request.state is not HandoverState.REQUESTED
    ):
        return _resume(state, c)  # withdrawn (the requester gave up, its lease expired)
    if state.outstanding(Purpose.HANDOVER):
        return state
    target = handing.target
    if not state.view.broker(target).present:
        return _answer_handover(_resume(state, c), c, f"broker {target} left etcd meanwhile")
    replica = next((r for r in state.replicas if r.broker_id == target), None)
    acked = replica.acked if replica is not None else -1
    if acked >= state.max_offset:
        return _release(state, c)
    if c.now >= handing.until:
        return _answer_handover(
            _resume(state, c),
            c,
            f"broker {target} did not catch up in time (it vouches for "
            f"{max(acked, 0)} of the master's {state.max_offset} bytes)",
        )
    return state


def _resume(state: ReplicaState, c: _Ctx) -> ReplicaState:
    """Back from HANDING_OVER: acknowledge again if the lease deadline still lies ahead."""
    acting = c.now < state.deadline_at or c.o.unsafe.no_self_fence
    state = attrs.evolve(state, phase=Phase.MASTER if acting else Phase.FENCED, handing=None)
    if acting:
        c.acts.append(Unfence(_ack_until(state, c.o)))
    return state


def _release(state: ReplicaState, c: _Ctx) -> ReplicaState:
    """Delete the master key and mark the request RELEASED, in one fenced transaction."""
    handing = state.handing
    assert handing is not None
    keys, view = c.o.keys, state.view
    entry = view.handover
    request = entry.current
    assert request is not None
    released = attrs.evolve(request, state=HandoverState.RELEASED, reason="")
    compares = (
        Compare.created_at(keys.master, state.token),
        Compare.modified_at(keys.handover, handing.revision),
        Compare.modified_at(keys.broker(handing.target), view.broker(handing.target).mod_revision),
    )
    put = Put(keys.handover, released.encode(), entry.lease)
    txn = Txn(compares, (DeleteRange(keys.master), put), (Range.prefix(keys.prefix),))
    return c.send(state, Purpose.HANDOVER, txn, members=frozenset({handing.target}), writes=(put,))


def _on_handover(
    state: ReplicaState, out: Outstanding, response: Response, c: _Ctx
) -> ReplicaState:
    releasing = bool(out.members) and state.phase is Phase.HANDING_OVER
    if not isinstance(response, TxnResponse):
        if releasing:
            # The request's lease is gone, or etcd refused the write: acknowledge again.
            why = response.message if isinstance(response, EtcdError) else str(response)
            c.acts.append(Alert(f"could not hand the master key over: {why}"))
            return _react(_resume(state, c), c)
        return state
    if not response.succeeded:
        return _react(_snapshot(state, c, response), c)
    state = _my_writes(state, c, response.revision, out.writes)
    if out.members:
        gone = KeyValue(c.o.keys.master, mod_revision=response.revision)
        view = state.view.event(c.o.keys, WatchEvent(EventType.DELETE, gone))
        state = attrs.evolve(state, view=view)
    return _react(state, c)


# --- the rules: one per (phase, event) ----------------------------------------------------------


def _react(state: ReplicaState, c: _Ctx, confirm: int | None = None) -> ReplicaState:
    match state.phase:
        case Phase.FOLLOWER:
            return _follow(state, c)
        case Phase.MASTER | Phase.FENCED:
            return _master(state, c, confirm)
        case Phase.HANDING_OVER:
            return _handing(state, c)
        case _:
            return state


def _tick(state: ReplicaState, event: Tick, c: _Ctx) -> ReplicaState:
    if state.phase is Phase.STARTING:
        if state.outstanding(Purpose.GRANT):
            return state
        return c.send(state, Purpose.GRANT, LeaseGrant(c.o.lease_ttl))
    state = _keepalive_due(state, c)
    if state.phase is Phase.MASTER and c.now >= state.deadline_at and not c.o.unsafe.no_self_fence:
        c.fence(f"lease deadline passed (epoch {state.epoch}): no keepalive succeeded in time")
        state = attrs.evolve(state, phase=Phase.FENCED)
    return _react(state, c)


def _replied(state: ReplicaState, event: Replied, c: _Ctx) -> ReplicaState:
    out = next((r for r in state.requests if r.request_id == event.request_id), None)
    if out is None:
        return state  # a reply to a request given up on: it tells nothing reliable
    return _REPLY_HANDLERS[out.purpose](_forget(state, out.request_id), out, event.response, c)


def _on_grant(state: ReplicaState, out: Outstanding, response: Response, c: _Ctx) -> ReplicaState:
    if not isinstance(response, LeaseGrantResponse):
        return state  # refused: the next tick asks again
    ttl = response.ttl
    state = attrs.evolve(
        state,
        phase=Phase.REGISTERING,
        lease=response.lease,
        ttl=ttl,
        deadline_at=fence_deadline(out.sent_at, ttl),
        keepalive_at=out.sent_at + keepalive_interval(ttl),
    )
    return c.send(state, Purpose.REGISTER, _register_txn(state, c.o))


def _on_keepalive(
    state: ReplicaState, out: Outstanding, response: Response, c: _Ctx
) -> ReplicaState:
    if not isinstance(response, LeaseKeepAliveResponse) or response.lease != state.lease:
        return state
    if not response.alive:
        return _lease_lost(state, c, f"etcd no longer knows lease {state.lease}")
    deadline = max(state.deadline_at, fence_deadline(out.sent_at, response.ttl))
    state = attrs.evolve(state, deadline_at=deadline, ttl=response.ttl)
    if state.phase is Phase.FENCED and c.now < deadline:
        state = attrs.evolve(state, phase=Phase.MASTER)
    if state.phase is not Phase.MASTER:
        return state
    c.acts.append(Unfence(_ack_until(state, c.o)))
    return _maintain(state, c, None)


def _on_register(
    state: ReplicaState, out: Outstanding, response: Response, c: _Ctx
) -> ReplicaState:
    if isinstance(response, EtcdError):
        if response.code is ErrorCode.LEASE_NOT_FOUND:
            return _lease_lost(state, c, response.message)
        return c.send(state, out.purpose, _register_txn(state, c.o))
    state = _snapshot(state, c, response)
    if state.phase is Phase.REGISTERING and isinstance(response, TxnResponse):
        c.acts.append(StartWatch(response.revision + 1, Range.prefix(c.o.keys.prefix)))
        state = attrs.evolve(state, phase=Phase.FOLLOWER)
    return _react(state, c)


def _on_read(state: ReplicaState, out: Outstanding, response: Response, c: _Ctx) -> ReplicaState:
    if not isinstance(response, RangeResponse):
        return _read(state, c)
    state = _snapshot(state, c, response)
    c.acts.append(StartWatch(response.revision + 1, Range.prefix(c.o.keys.prefix)))
    return _react(state, c)


def _on_campaign(
    state: ReplicaState, out: Outstanding, response: Response, c: _Ctx
) -> ReplicaState:
    if isinstance(response, EtcdError):
        if response.code is ErrorCode.LEASE_NOT_FOUND:
            return _lease_lost(state, c, response.message)
        return _read(attrs.evolve(state, phase=Phase.FOLLOWER), c)
    assert isinstance(response, TxnResponse)
    if not response.succeeded:
        return _follow(_snapshot(attrs.evolve(state, phase=Phase.FOLLOWER), c, response), c)
    state = _my_writes(state, c, response.revision, out.writes)
    return _became_master(
        state,
        c,
        epoch=out.epoch,
        token=response.revision,
        members=out.members,
        unclean_lost=out.unclean_lost,
    )


def _on_alter(state: ReplicaState, out: Outstanding, response: Response, c: _Ctx) -> ReplicaState:
    proposal = state.proposal
    if state.phase not in (Phase.MASTER, Phase.FENCED):
        return state
    if proposal is None or (out.members, out.epoch) != (proposal.members, proposal.version):
        # The change this answers was seen landing on the watch already.
        return _react(_snapshot(state, c, response), c)
    if not isinstance(response, TxnResponse):
        return _send_proposal(state, c)
    if response.succeeded:
        value = SyncStateSet(proposal.members, proposal.version, state.epoch).encode()
        state = _my_writes(state, c, response.revision, [Put(c.o.keys.sync_state_set, value)])
        return _maintain(_commit(state, c), c, None)
    state = _snapshot(state, c, response)
    why = _still_mine(state)
    if why:
        return _step_down(state, c, why)
    sss = state.view.sss.current
    if sss is not None and (sss.members, sss.version) == (proposal.members, proposal.version):
        return _commit(state, c)  # an earlier copy of this change landed
    # etcd's set is not what this master thought (changed by hand): take it, propose afresh.
    members = sss.members if sss is not None else state.sss
    state = attrs.evolve(state, sss=members, proposal=None)
    c.acts.append(SetSyncStateSet(members))
    return _maintain(state, c, None)


def _on_revoke(state: ReplicaState, out: Outstanding, response: Response, c: _Ctx) -> ReplicaState:
    return state


_ReplyHandler = Callable[[ReplicaState, Outstanding, Response, _Ctx], ReplicaState]
_REPLY_HANDLERS: dict[Purpose, _ReplyHandler] = {
    Purpose.GRANT: _on_grant,
    Purpose.KEEPALIVE: _on_keepalive,
    Purpose.REGISTER: _on_register,
    Purpose.REPORT: _on_register,
    Purpose.READ: _on_read,
    Purpose.CAMPAIGN: _on_campaign,
    Purpose.ALTER: _on_alter,
    Purpose.REVOKE: _on_revoke,
    Purpose.HANDOVER: _on_handover,
}


def _failed(state: ReplicaState, event: Failed, c: _Ctx) -> ReplicaState:
    out = next((r for r in state.requests if r.request_id == event.request_id), None)
    if out is None:
        return state
    state = _forget(state, out.request_id)
    match out.purpose:
        case Purpose.GRANT | Purpose.KEEPALIVE | Purpose.REVOKE:
            return state  # the next tick sends another
        case Purpose.REGISTER | Purpose.REPORT:
            return c.send(state, out.purpose, _register_txn(state, c.o))
        case Purpose.READ:
            return _read(state, c)
        case Purpose.CAMPAIGN:
            # It may have landed. Following again either takes the key, if the view already
            # shows it is this broker's, or campaigns again: a second copy fails its compare
            # if the first landed, and its failure branch reads the group (``_follow``).
            return _follow(attrs.evolve(state, phase=Phase.FOLLOWER), c)
        case Purpose.ALTER:
            # The change stays pending (the union in force) and goes again, compared against
            # the same revision: whichever copy lands first, the other can never land after.
            if state.proposal is not None and state.phase in (Phase.MASTER, Phase.FENCED):
                return _send_proposal(state, c)
            return state
        case Purpose.HANDOVER:
            # A release may have landed: read the keys, and go on from what they show. A
            # refusal that got lost leaves the request to its requester's deadline.
            return _read(state, c) if state.phase is Phase.HANDING_OVER else state
    assert_never(out.purpose)


def _watched(state: ReplicaState, event: Watched, c: _Ctx) -> ReplicaState:
    return _react(attrs.evolve(state, view=state.view.events(c.o.keys, event.events)), c)


def _watch_broken(state: ReplicaState, event: WatchBroken, c: _Ctx) -> ReplicaState:
    return _read(state, c)


def _facts(state: ReplicaState, event: LogChanged) -> ReplicaState:
    return attrs.evolve(
        state,
        max_offset=event.max_offset,
        last_epoch=event.last_epoch,
        confirm_offset=event.confirm_offset,
    )


def _log_changed(state: ReplicaState, event: LogChanged, c: _Ctx) -> ReplicaState:
    return _react(_facts(state, event), c)


def _with_ack(state: ReplicaState, event: ReplicaAcked, c: _Ctx) -> ReplicaState:
    """The master's knowledge of the slave after its ack (and the confirm offset then)."""
    ha_max = c.o.ha_max_time_slave_not_catchup
    old = next((r for r in state.replicas if r.broker_id == event.broker_id), None)
    caught_up_at = c.now if event.caught_up else (old.caught_up_at if old else c.now - ha_max)
    replica = Replica(event.broker_id, event.acked, caught_up_at)
    others = tuple(r for r in state.replicas if r.broker_id != event.broker_id)
    return attrs.evolve(
        state,
        replicas=tuple(sorted((*others, replica), key=_replica_id)),
        confirm_offset=event.confirm_offset,
    )


def _replica_acked(state: ReplicaState, event: ReplicaAcked, c: _Ctx) -> ReplicaState:
    return _master(_with_ack(state, event, c), c, event.confirm_offset)


def _handing_acked(state: ReplicaState, event: ReplicaAcked, c: _Ctx) -> ReplicaState:
    """HANDING_OVER: a slave's ack (no SyncStateSet judgement meanwhile); the target's?"""
    return _handing(_with_ack(state, event, c), c)


def _replica_gone(state: ReplicaState, event: ReplicaGone, c: _Ctx) -> ReplicaState:
    replicas = tuple(
        attrs.evolve(r, acked=-1) if r.broker_id == event.broker_id else r for r in state.replicas
    )
    return attrs.evolve(state, replicas=replicas)


def _role_change_failed(state: ReplicaState, event: RoleChangeFailed, c: _Ctx) -> ReplicaState:
    c.acts.append(
        Alert(
            f"could not become master at epoch {state.epoch}: {event.reason}; "
            "giving up the master key"
        )
    )
    lease = state.lease
    state = _lease_lost(state, c, event.reason)
    return c.send(state, Purpose.REVOKE, LeaseRevoke(lease)) if lease else state


def _shutdown(state: ReplicaState, event: Shutdown, c: _Ctx) -> ReplicaState:
    if state.phase in (Phase.MASTER, Phase.FENCED):
        c.fence(f"shutting down (master of epoch {state.epoch})")
    lease = state.lease
    state = attrs.evolve(_not_master(state), phase=Phase.STOPPED, requests=(), lease=0)
    return c.send(state, Purpose.REVOKE, LeaseRevoke(lease)) if lease else state


def _ignore(state: ReplicaState, event: Event, c: _Ctx) -> ReplicaState:
    return state


def _merge_only(state: ReplicaState, event: Watched, c: _Ctx) -> ReplicaState:
    return attrs.evolve(state, view=state.view.events(c.o.keys, event.events))


def _facts_only(state: ReplicaState, event: LogChanged, c: _Ctx) -> ReplicaState:
    return _facts(state, event)


# --- the table --------------------------------------------------------------------------------


@attrs.frozen
class Rule:
    """One allowed (phase, event) pair: the function and the phases it may lead to."""

    apply: Callable[[ReplicaState, Any, _Ctx], ReplicaState]
    targets: tuple[Phase, ...]


_S, _R, _F, _C, _M, _X, _H, _Z = (
    Phase.STARTING,
    Phase.REGISTERING,
    Phase.FOLLOWER,
    Phase.CAMPAIGNING,
    Phase.MASTER,
    Phase.FENCED,
    Phase.HANDING_OVER,
    Phase.STOPPED,
)
_EVENTS = (
    Tick,
    Replied,
    Failed,
    Watched,
    WatchBroken,
    LogChanged,
    ReplicaAcked,
    ReplicaGone,
    RoleChangeFailed,
    Shutdown,
)

FAILOVER_TABLE: dict[tuple[Phase, type], Rule] = {
    # STARTING: no lease yet.
    (_S, Tick): Rule(_tick, (_S,)),
    (_S, Replied): Rule(_replied, (_S, _R)),
    (_S, Failed): Rule(_failed, (_S,)),
    (_S, Watched): Rule(_merge_only, (_S,)),
    (_S, WatchBroken): Rule(_ignore, (_S,)),
    (_S, LogChanged): Rule(_facts_only, (_S,)),
    (_S, ReplicaAcked): Rule(_ignore, (_S,)),
    (_S, ReplicaGone): Rule(_ignore, (_S,)),
    (_S, RoleChangeFailed): Rule(_ignore, (_S,)),
    (_S, Shutdown): Rule(_shutdown, (_Z,)),
    # REGISTERING: lease granted, registration and first read on their way.
    (_R, Tick): Rule(_tick, (_R,)),
    (_R, Replied): Rule(_replied, (_R, _S, _F, _C)),
    (_R, Failed): Rule(_failed, (_R,)),
    (_R, Watched): Rule(_merge_only, (_R,)),
    (_R, WatchBroken): Rule(_ignore, (_R,)),
    (_R, LogChanged): Rule(_facts_only, (_R,)),
    (_R, ReplicaAcked): Rule(_ignore, (_R,)),
    (_R, ReplicaGone): Rule(_ignore, (_R,)),
    (_R, RoleChangeFailed): Rule(_ignore, (_R,)),
    (_R, Shutdown): Rule(_shutdown, (_Z,)),
    # FOLLOWER: registered; following, or about to campaign (or taking a key that is its own).
    (_F, Tick): Rule(_tick, (_F, _C, _M, _X)),
    (_F, Replied): Rule(_replied, (_F, _S, _C, _M, _X)),
    (_F, Failed): Rule(_failed, (_F,)),
    (_F, Watched): Rule(_watched, (_F, _C, _M, _X)),
    (_F, WatchBroken): Rule(_watch_broken, (_F,)),
    (_F, LogChanged): Rule(_log_changed, (_F, _C, _M, _X)),
    (_F, ReplicaAcked): Rule(_ignore, (_F,)),
    (_F, ReplicaGone): Rule(_ignore, (_F,)),
    (_F, RoleChangeFailed): Rule(_ignore, (_F,)),
    (_F, Shutdown): Rule(_shutdown, (_Z,)),
    # CAMPAIGNING: the campaign's reply decides.
    (_C, Tick): Rule(_tick, (_C,)),
    (_C, Replied): Rule(_replied, (_C, _S, _F, _M, _X)),
    (_C, Failed): Rule(_failed, (_C, _F, _M, _X)),
    (_C, Watched): Rule(_merge_only, (_C,)),
    (_C, WatchBroken): Rule(_watch_broken, (_C,)),
    (_C, LogChanged): Rule(_facts_only, (_C,)),
    (_C, ReplicaAcked): Rule(_ignore, (_C,)),
    (_C, ReplicaGone): Rule(_ignore, (_C,)),
    (_C, RoleChangeFailed): Rule(_ignore, (_C,)),
    (_C, Shutdown): Rule(_shutdown, (_Z,)),
    # MASTER: acknowledging until the deadline (or until it hands the role over).
    (_M, Tick): Rule(_tick, (_M, _X, _H)),
    (_M, Replied): Rule(_replied, (_M, _S, _F, _C, _H)),
    (_M, Failed): Rule(_failed, (_M,)),
    (_M, Watched): Rule(_watched, (_M, _F, _C, _H)),
    (_M, WatchBroken): Rule(_watch_broken, (_M,)),
    (_M, LogChanged): Rule(_log_changed, (_M, _H)),
    (_M, ReplicaAcked): Rule(_replica_acked, (_M, _H)),
    (_M, ReplicaGone): Rule(_replica_gone, (_M,)),
    (_M, RoleChangeFailed): Rule(_role_change_failed, (_S,)),
    (_M, Shutdown): Rule(_shutdown, (_Z,)),
    # FENCED: past the deadline; a keepalive in time brings it back.
    (_X, Tick): Rule(_tick, (_X, _H)),
    (_X, Replied): Rule(_replied, (_X, _M, _S, _F, _C, _H)),
    (_X, Failed): Rule(_failed, (_X,)),
    (_X, Watched): Rule(_watched, (_X, _F, _C, _H)),
    (_X, WatchBroken): Rule(_watch_broken, (_X,)),
    (_X, LogChanged): Rule(_log_changed, (_X, _H)),
    (_X, ReplicaAcked): Rule(_replica_acked, (_X, _H)),
    (_X, ReplicaGone): Rule(_replica_gone, (_X,)),
    (_X, RoleChangeFailed): Rule(_role_change_failed, (_S,)),
    (_X, Shutdown): Rule(_shutdown, (_Z,)),
    # HANDING_OVER: fenced, waiting for the target; then the key goes (or the master resumes).
    (_H, Tick): Rule(_tick, (_H, _M, _X, _F, _C)),
    (_H, Replied): Rule(_replied, (_H, _M, _X, _S, _F, _C)),
    (_H, Failed): Rule(_failed, (_H,)),
    (_H, Watched): Rule(_watched, (_H, _M, _X, _F, _C)),
    (_H, WatchBroken): Rule(_watch_broken, (_H,)),
    (_H, LogChanged): Rule(_log_changed, (_H, _M, _X, _F, _C)),
    (_H, ReplicaAcked): Rule(_handing_acked, (_H, _M, _X, _F, _C)),
    (_H, ReplicaGone): Rule(_replica_gone, (_H,)),
    (_H, RoleChangeFailed): Rule(_role_change_failed, (_S,)),
    (_H, Shutdown): Rule(_shutdown, (_Z,)),
    # STOPPED: nothing more happens.
    **{(_Z, event): Rule(_ignore, (_Z,)) for event in _EVENTS},
}


def failover_step(state: ReplicaState, event: Event, now: int, options: FailoverOptions) -> _Step:
    """Apply *event* at *now* (ms) to one broker's core: the new state and its actions."""
    rule = FAILOVER_TABLE.get((state.phase, type(event)))
    if rule is None:
        raise LocalProtocolError(
            f"the failover core cannot handle {type(event).__name__} in phase {state.phase.value}"
        )
    ctx = _Ctx(now, options)
    new, actions = ctx.done(rule.apply(state, event, ctx))
    if new.phase not in rule.targets:
        declared = ", ".join(t.value for t in rule.targets)
        raise AssertionError(
            f"failover rule for {type(event).__name__} in {state.phase.value} led to "
            f"{new.phase.value}, but the table declares only {declared}"
        )
    return new, actions


def failover_table_mermaid() -> str:
    """The table as a Mermaid state diagram (what docs/failover.md shows).

    Self-loops are left out (every phase keeps most events to itself); each remaining edge is
    labelled with the events that may take it.
    """
    edges: dict[tuple[Phase, Phase], list[str]] = {}
    for (phase, event), rule in FAILOVER_TABLE.items():
        for target in rule.targets:
            if target is not phase:
                edges.setdefault((phase, target), []).append(event.__name__)
    lines = ["stateDiagram-v2"]
    for (src, dst), events in edges.items():
        lines.append(f"    {src.value} --> {dst.value}: {', '.join(events)}")
    return "\n".join(lines) + "\n"
