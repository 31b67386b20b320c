"""What can happen in the failover world: steps, faults, and the production code they run.

Every decision about who is master, about fencing and about the SyncStateSet is made by
:func:`trioha.failover.failover_step` itself, fed the events the Trio layer will feed it;
etcd's answers come from :func:`trioha.testing.etcd_apply` (the in-memory double's pure core,
which the contract test holds to etcd's behaviour); which puts are PUT_OK is decided by
:class:`trioha.proto.InSyncQuorum`; a slave's cut back at a (re)connect is decided by
:func:`trioha.proto.slave_step` (the AutoSwitch handshake) and each new epoch it records by
the same function's frame-header rule. This module supplies only what surrounds them: the
network, the clock, the producers, the logs, and faults.

Abstractions, each chosen to keep the state space small without hiding a behaviour:

* **Logs** hold one ``(epoch, message id)`` entry per offset. A master flushes every put
  before it answers (failover mode's durability rule); a slave flushes before it
  acknowledges (``ack_flushed``), or, in the twin without it, in a separate ``Flush`` step.
* **Replication** moves one entry per ``Replicate`` step over a connection that starts with
  the handshake (``Connect``: cut back to the consistent point, first report). ``Ack`` sends
  the slave's report; the master releases the puts it covers and tells its core.
* **The coordinator** answers a request in flight in an ``Etcd`` step; its reply travels
  back and is delivered in a ``Reply`` step; messages form a bag (any order), may be lost
  or duplicated (faults), and wait while their broker is cut off. A broker gives up on a
  request whose message or reply is lost or stuck (``Timeout``: the core gets ``Failed``);
  the request may still land later.
* **Watches** queue every event from the revision the broker last read on; ``Watch``
  delivers the queue in one batch. A stale delivery (fault) delivers it and keeps it, so it
  comes again later, after newer news.
* **Time** advances by ``tick`` ms in ``Tick`` steps, at any moment: leases expire, and
  every running core gets ``Tick``. Worlds are kept as seen from now (module
  :mod:`model._failover_values`).
* **Crash** is a power cut: the unflushed tail and all memory are lost; the epoch file,
  the flushed log and etcd's copy of the lease (until it expires) remain. ``Restart`` brings
  the broker back with a new core. Pauses, cuts and link failures end with ``Resume`` and
  ``Heal``; none of these recovery steps is a fault, so liveness may count on them.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import Any, TypeVar

import attrs

from model._failover_values import (
    KEYS,
    Acked,
    Broker,
    FailoverConfig,
    FailoverFaults,
    FailoverWorld,
    Msg,
    MsgKind,
    Role,
    but,
    master_key,
    sort_net,
)
from trioha._errors import LocalProtocolError
from trioha.failover import (
    NEVER,
    Action,
    Alert,
    BecomeMaster,
    BecomeSlave,
    Event,
    Failed,
    FailInFlight,
    FailoverOptions,
    Fence,
    GroupView,
    HandoverState,
    LogChanged,
    Phase,
    Purpose,
    Replica,
    ReplicaAcked,
    ReplicaGone,
    ReplicaState,
    Replied,
    RoleChangeFailed,
    SendRequest,
    SetSyncStateSet,
    StartWatch,
    Tick,
    TxnResponse,
    Unfence,
    Watched,
    WatchEvent,
    failover_step,
    handover_txn,
)
from trioha.proto import (
    Close,
    HeaderReceived,
    InSyncQuorum,
    MasterHandshakeReceived,
    RecordEpoch,
    SlavePhase,
    SlaveState,
    slave_step,
)
from trioha.testing import EtcdState, Lease
from trioha.testing import etcd_apply as apply_request
from trioha.testing import etcd_expire as expire_leases


class FKind(enum.Enum):
    """What a step does; steps that feed a core are named after what happens to it."""

    TICK = "Tick"
    ETCD = "Etcd"
    REPLY = "Reply"
    WATCH = "Watch"
    TIMEOUT = "Timeout"
    PUT = "Put"
    CONNECT = "Connect"
    REPLICATE = "Replicate"
    ACK = "Ack"
    FLUSH = "Flush"
    RESTART = "Restart"
    RESUME = "Resume"
    HEAL = "Heal"
    #: An operator's handover request (``failover-elect``), not a fault.
    HANDOVER = "Handover"
    # faults
    CRASH = "Crash"
    PAUSE = "Pause"
    CUT = "Cut"
    CUT_LINK = "CutLink"
    LOSE = "Lose"
    DUPLICATE = "Duplicate"
    STALL = "StallWatch"


FAULTS = frozenset(
    {
        FKind.CRASH,
        FKind.PAUSE,
        FKind.CUT,
        FKind.CUT_LINK,
        FKind.LOSE,
        FKind.DUPLICATE,
        FKind.STALL,
    }
)


@attrs.frozen(cache_hash=True)
class FStep:
    """One step of a trace: its kind, the broker (index) and an argument or a message."""

    kind: FKind
    broker: int = -1
    arg: int = -1
    msg: Msg | None = None

    @property
    def fault(self) -> bool:
        return self.kind in FAULTS

    def __str__(self) -> str:
        parts = []
        if self.broker >= 0:
            parts.append(f"b{self.broker + 1}")
        if self.kind is FKind.CUT_LINK:
            parts.append(f"b{self.arg + 1}")
        elif self.kind is FKind.HANDOVER:
            parts[-1] = f"to b{self.broker + 1}"
        elif self.kind is FKind.TIMEOUT:
            parts.append(f"request {self.arg}")
        if self.msg is not None:
            m = self.msg
            what = "reply to" if m.kind is MsgKind.REPLY else "from"
            parts.append(f"{m.purpose.value} {what} b{m.broker + 1}")
            if self.kind is FKind.ETCD and self.arg == 1:
                parts.append("its watch events first")
        inner = ", ".join(parts)
        return f"{self.kind.value}({inner})" if inner else self.kind.value


@attrs.frozen
class FOutcome:
    """What applying one step produced."""

    world: FailoverWorld
    violations: tuple[tuple[str, str], ...] = ()
    marks: frozenset[str] = frozenset()
    notes: tuple[str, ...] = ()


_CoreResult = tuple[ReplicaState, tuple[Action, ...]] | LocalProtocolError
_V = TypeVar("_V")

# --- time -------------------------------------------------------------------------------------


def _clamp(value: int, floor: int) -> int:
    return value if value >= floor else floor


def shift_core(core: ReplicaState, delta: int, ttl_ms: int, ha_max: int) -> ReplicaState:
    """*core* seen *delta* ms later: every timestamp moves back; the far past is clamped.

    The core only ever asks ``now < deadline_at``, ``now >= keepalive_at``,
    ``now - caught_up_at >= ha_max`` and ``sent_at + 4/5 TTL`` (or ``+ TTL/3``), so values
    older than those spans decide nothing any more and are all alike.
    """
    span = ttl_ms  # covers the fence (4/5 TTL) and the keepalive interval (TTL/3)
    requests = core.requests
    if requests:
        requests = tuple(but(r, sent_at=_clamp(r.sent_at - delta, -span)) for r in requests)
    replicas = core.replicas
    if replicas:
        replicas = tuple(
            Replica(r.broker_id, r.acked, _clamp(r.caught_up_at - delta, -ha_max)) for r in replicas
        )
    handing = core.handing
    if handing is not None:
        handing = but(handing, until=_clamp(handing.until - delta, 0))
    return but(
        core,
        deadline_at=_clamp(core.deadline_at - delta, 0),
        keepalive_at=_clamp(core.keepalive_at - delta, 0),
        requests=requests,
        replicas=replicas,
        handing=handing,
    )


def _shift_until(until: int, delta: int) -> int:
    if until >= NEVER // 2:
        return until
    return _clamp(until - delta, 0)


# --- the transaction --------------------------------------------------------------------------


class _Tx:
    """One step being applied: a mutable copy of the world plus what the step showed."""

    def __init__(self, model: FailoverModel, world: FailoverWorld, *, explain: bool) -> None:
        self.model = model
        self.cfg = model.config
        self.w = world
        self.etcd = world.etcd
        self.brokers = list(world.brokers)
        self.net = list(world.net)
        self.cut = set(world.cut)
        self.down = set(world.down)
        self.stalled = set(world.stalled)
        self.puts = world.puts
        self.acked = world.acked
        self.budget = world.budget
        self.violations: list[tuple[str, str]] = []
        self.marks: set[str] = set()
        self.notes: list[str] | None = [] if explain else None
        self.busy = False
        self.later: list[tuple[int, Event]] = []

    def note(self, text: str) -> None:
        if self.notes is not None:
            self.notes.append(text)

    def spend(self, fault: str) -> None:
        self.budget = attrs.evolve(self.budget, **{fault: getattr(self.budget, fault) - 1})

    def put_broker(self, i: int, **changes: Any) -> Broker:
        b = but(self.brokers[i], **changes)
        self.brokers[i] = b
        return b

    def freeze(self) -> FailoverWorld:
        w = canonical(
            FailoverWorld(
                self.etcd,
                tuple(self.brokers),
                sort_net(self.net),
                frozenset(self.cut),
                frozenset(self.down),
                frozenset(self.stalled),
                self.puts,
                self.acked,
                self.budget,
            )
        )
        intern = self.model.intern
        return FailoverWorld(
            intern(w.etcd),
            tuple(intern(b) for b in w.brokers),
            w.net,
            w.cut,
            w.down,
            w.stalled,
            w.puts,
            w.acked,
            w.budget,
        )

    # --- the coordinator ----------------------------------------------------------------------
    def master_key(self) -> tuple[int, int, int] | None:
        return master_key(self.etcd)

    def publish(self, events: tuple[WatchEvent, ...]) -> None:
        """etcd wrote: every open watch queues the events (``flush_watches`` delivers them)."""
        if not events:
            return
        for i, b in enumerate(self.brokers):
            if b.watch is not None:
                self.brokers[i] = but(b, watch=b.watch + events)

    def reachable(self, i: int) -> bool:
        """Broker *i* runs and etcd's replies reach it."""
        b = self.brokers[i]
        return b.up and not b.paused and i not in self.cut

    def flush_watches(self) -> None:
        """A watch delivers within milliseconds, unless its broker is cut off, paused, or its
        stream is stuck: the events of this step go out in one batch to every broker that
        can take them. A backlog held up before this step waits for a ``Watch`` step, so
        that what happens first once the broker is reachable again is open."""
        for i in range(len(self.brokers)):
            b = self.brokers[i]
            if b.watch and not self.w.brokers[i].watch and self.deliverable(i):
                self.brokers[i] = but(b, watch=())
                self.feed(i, Watched(b.watch))

    def deliverable(self, i: int) -> bool:
        return self.reachable(i) and i not in self.stalled

    # --- feeding a core -------------------------------------------------------------------------
    def feed(self, i: int, event: Event) -> None:
        """Give *event* to broker *i*'s core and carry out its actions, as the Trio layer will:
        all of them, in order, before the next event. An event that carrying them out gives
        rise to (a fact of the data plane, a keepalive's reply) waits until they are done."""
        if self.busy:
            self.later.append((i, event))
            return
        self.busy = True
        try:
            self._feed(i, event)
        finally:
            self.busy = False
        while self.later:
            j, next_event = self.later.pop(0)
            self.feed(j, next_event)

    def _feed(self, i: int, event: Event) -> None:
        b = self.brokers[i]
        result = self.model.core_step(i, b.core, event)
        if isinstance(result, LocalProtocolError):
            self.violations.append(("NoLocalProtocolError", f"b{i + 1}: {result}"))
            return
        core, actions = result
        before = b.core.phase
        self.brokers[i] = but(b, core=core)
        if self.notes is not None and (core.phase is not before or actions):
            shown = ", ".join(_show(a) for a in actions)
            self.note(
                f"b{i + 1}: {_show_event(event)} -> {core.phase.value}"
                + (f"; {shown}" if shown else "")
            )
        if core.phase is Phase.FENCED and before is Phase.MASTER:
            self.marks.add("failover_self_fenced")
        if core.phase is Phase.MASTER and before is Phase.FENCED:
            self.marks.add("failover_unfenced")
        if before is Phase.HANDING_OVER and core.phase is not before:
            request = core.view.handover.current
            released = request is not None and request.state is HandoverState.RELEASED
            self.marks.add("failover_handed_over" if released else "failover_handover_ended")
        for action in actions:
            self.execute(i, action)

    def execute(self, i: int, action: Action) -> None:
        b = self.brokers[i]
        match action:
            case SendRequest(request_id=rid, purpose=purpose, request=request):
                if purpose is Purpose.KEEPALIVE and i not in self.cut:
                    # A keepalive reaches etcd at once unless a cut holds it up. Its reply
                    # comes back at once too, or (``keepalive_replies_travel``) travels like
                    # any other, so that a cut or a pause can hold it up after etcd renewed.
                    self.etcd, response, events = apply_request(self.etcd, request, 0)
                    self.publish(events)
                    if self.cfg.keepalive_replies_travel:
                        self.net.append(Msg(MsgKind.REPLY, i, rid, purpose, response))
                    else:
                        self.feed(i, Replied(rid, response))
                else:
                    self.net.append(Msg(MsgKind.REQUEST, i, rid, purpose, request))
            case StartWatch(start_revision=start):
                queue = tuple(e for e in (b.watch or ()) if e.revision >= start)
                self.put_broker(i, watch=queue)
            case BecomeMaster(epoch=epoch, members=members):
                self.become_master(i, epoch, members)
            case BecomeSlave(master=record):
                self.become_slave(i, record.broker_id - 1, record.epoch)
            case Fence():
                self.put_broker(i, ack_until=0)
            case FailInFlight():
                if b.pending:
                    self.marks.add("failover_failed_in_flight")
                    self.note(f"b{i + 1} fails its waiting puts {[p[2] for p in b.pending]}")
                self.put_broker(i, pending=())
            case Unfence(until=until):
                self.put_broker(i, ack_until=until)
                self.release(i)
            case SetSyncStateSet(members=members):
                self.put_broker(i, sss=members)
                self.release(i)
            case Alert(message=message):
                self.note(f"b{i + 1} alert: {message}")

    def facts(self, i: int) -> None:
        b = self.brokers[i]
        self.feed(i, LogChanged(b.end, b.last_epoch(), b.confirm))

    # --- the data plane -------------------------------------------------------------------------
    def become_master(self, i: int, epoch: int, members: frozenset[int]) -> None:
        b = self.brokers[i]
        if epoch <= b.last_epoch():
            self.feed(i, RoleChangeFailed(f"epoch file at {b.last_epoch()}, asked {epoch}"))
            return
        self.drop_link(i)
        self.put_broker(
            i,
            role=Role.MASTER,
            epoch=epoch,
            epochs=b.epochs.begin_epoch(b.end, epoch),
            leader=0,
            link=None,
            sss=members,
            ack_until=0,
            pending=(),
            confirm=b.end,
        )
        if i != 0:
            self.marks.add("failover_new_master")
        self.check_leader_complete(i)
        self.facts(i)

    def become_slave(self, i: int, leader: int, epoch: int) -> None:
        b = self.brokers[i]
        if epoch < b.epoch and b.up:
            self.violations.append(
                ("EpochMonotonic", f"b{i + 1} told to follow epoch {epoch} after epoch {b.epoch}")
            )
        self.drop_link(i)
        self.put_broker(
            i,
            role=Role.SLAVE,
            epoch=epoch,
            leader=leader + 1,
            link=None,
            sss=frozenset(),
            ack_until=0,
            pending=(),
        )

    def drop_link(self, i: int) -> None:
        """Broker *i*'s connection to its leader ends (both ends notice)."""
        b = self.brokers[i]
        if b.link is None:
            return
        self.brokers[i] = but(b, link=None)
        leader = b.leader - 1
        if self.brokers[leader].up and self.brokers[leader].role is Role.MASTER:
            self.feed(leader, ReplicaGone(i + 1))

    def drop_links_to(self, leader: int) -> None:
        for j, b in enumerate(self.brokers):
            if b.link is not None and b.leader == leader + 1:
                self.brokers[j] = but(b, link=None)

    def serving(self, j: int) -> int:
        """The index of the master slave *j* may stream from now, or -1."""
        b = self.brokers[j]
        if b.role is not Role.SLAVE or not b.up or b.paused or not b.leader:
            return -1
        m = b.leader - 1
        leader = self.brokers[m]
        if not leader.up or leader.paused or leader.role is not Role.MASTER:
            return -1
        if leader.epoch != b.epoch or _pair(j, m) in self.down:
            return -1
        return m

    def slave_and_master(self, j: int) -> tuple[int, Broker, Broker] | None:
        """Slave *j* and the master it may stream from now (its index too), or None."""
        m = self.serving(j)
        if m < 0:
            return None
        return m, self.brokers[j], self.brokers[m]

    def quorum(self, m: int, *, recheck: bool = True) -> InSyncQuorum:
        b = self.brokers[m]
        vouches = [
            (j + 1, s.link)
            for j, s in enumerate(self.brokers)
            if s.up
            and s.link is not None
            and s.leader == m + 1
            and s.role is Role.SLAVE
            and _pair(j, m) not in self.down
        ]
        return InSyncQuorum.of(
            m + 1,
            b.sss,
            vouches,
            self.cfg.min_in_sync_replicas if recheck else 1,
            all_ack=self.cfg.all_ack_in_sync_state_set,
            master_durable=b.flushed,
        )

    def release(self, m: int) -> None:
        """``HAService.on_ack``: every waiting put the ack rule now allows is PUT_OK."""
        b = self.brokers[m]
        if not b.pending or b.ack_until <= 0:
            return
        recheck = not self.cfg.min_in_sync_before_append_only
        quorum = self.quorum(m, recheck=recheck)
        keep = []
        for start, end, mid in b.pending:
            if quorum.holds(start, end):
                self.ack(m, start, end, mid)
            else:
                keep.append((start, end, mid))
        self.put_broker(m, pending=tuple(keep))

    def ack(self, m: int, start: int, end: int, mid: int) -> None:
        b = self.brokers[m]
        entry = b.log[start]
        key = self.master_key()
        epoch = key[1] if key is not None else 0
        self.acked = tuple(sorted((*self.acked, Acked(start, entry, m + 1, epoch))))
        self.brokers[m] = but(b, confirm=max(b.confirm, end))
        self.marks.add("failover_put_ok")
        if m != 0:
            self.marks.add("failover_put_ok_new_master")
        self.note(f"b{m + 1} answers PUT_OK for message {mid} at {start} (epoch {entry[0]})")
        # OneAckingMasterPerEpoch: only the holder of the coordinator's master key, at its
        # epoch, ever answers PUT_OK.
        if key is None or key[0] != m + 1 or key[1] != b.epoch:
            holder = f"broker {key[0]} at epoch {key[1]}" if key else "nobody"
            self.violations.append(
                (
                    "OneAckingMasterPerEpoch",
                    f"b{m + 1} answered PUT_OK at its epoch {b.epoch} while etcd's master key "
                    f"names {holder}",
                )
            )
        # PutOkHasMinCopies: at least minInSyncReplicas brokers hold it durably.
        copies = sum(1 for s in self.brokers if s.flushed > start and s.log[start] == entry)
        if copies < self.cfg.min_in_sync_replicas:
            self.violations.append(
                (
                    "PutOkHasMinCopies",
                    f"message {mid} answered PUT_OK with {copies} durable copies; "
                    f"minInSyncReplicas is {self.cfg.min_in_sync_replicas}",
                )
            )

    def check_leader_complete(self, m: int) -> None:
        """Noted here for the trace; the state invariant NoAckedWriteLost judges it."""
        b = self.brokers[m]
        missing = [a for a in self.acked if a.offset >= b.end or b.log[a.offset] != a.entry]
        if missing:
            self.note(f"b{m + 1} becomes master without acknowledged {missing[0].entry}")


def _pair(a: int, b: int) -> tuple[int, int]:
    return (a, b) if a < b else (b, a)


def _show(action: Action) -> str:
    match action:
        case SendRequest(purpose=purpose):
            return f"Send({purpose.value})"
        case BecomeSlave(master=record):
            return f"BecomeSlave(b{record.broker_id}, epoch {record.epoch})"
        case SetSyncStateSet(members=members):
            return f"SetSyncStateSet({sorted(members)})"
        case Fence():
            return "Fence"
        case Alert():
            return "Alert"
        case StartWatch(start_revision=rev):
            return f"StartWatch({rev})"
        case _:
            return repr(action)


def _show_event(event: Event) -> str:
    match event:
        case Replied(response=response):
            return f"Replied({type(response).__name__})"
        case Watched(events=events):
            return f"Watched({len(events)} events)"
        case _:
            return repr(event)


# --- canonical form ---------------------------------------------------------------------------


def canonical(w: FailoverWorld) -> FailoverWorld:
    """Request ids renumbered per broker; what nobody waits for any more stripped of its id.

    A core ignores a reply to a request it no longer waits for, so such a reply changes
    nothing wherever it is delivered and is dropped. A request nobody waits for may still
    land (that is the point of keeping it), but its reply goes nowhere: it keeps no id, and
    copies of one such request are one (a broker cut off from etcd would otherwise pile up
    a keepalive per tick). Ids are only ever compared for equality (and the next one taken),
    so any renumbering that keeps them apart and in order is the same world.
    """
    brokers = list(w.brokers)
    net: list[Msg] = []
    for i, b in enumerate(brokers):
        waiting = {r.request_id for r in b.core.requests}
        live: list[Msg] = []
        stale: set[Msg] = set()
        for m in w.net:
            if m.broker != i:
                continue
            if m.request_id in waiting:
                live.append(m)
            elif m.kind is MsgKind.REQUEST:
                stale.add(m if m.request_id == 0 else but(m, request_id=0))
        relabel = {old: new for new, old in enumerate(sorted(waiting), 1)}
        if (
            any(old != new for old, new in relabel.items())
            or b.core.next_request != len(relabel) + 1
        ):
            core = but(
                b.core,
                requests=tuple(but(r, request_id=relabel[r.request_id]) for r in b.core.requests),
                next_request=len(relabel) + 1,
            )
            brokers[i] = but(b, core=core)
            live = [but(m, request_id=relabel[m.request_id]) for m in live]
        net.extend(live)
        net.extend(stale)
    return FailoverWorld(
        w.etcd,
        tuple(brokers),
        sort_net(net),
        w.cut,
        w.down,
        w.stalled,
        w.puts,
        w.acked,
        w.budget,
    )


# --- the model --------------------------------------------------------------------------------


class FailoverModel:
    """The failover world of one :class:`FailoverConfig`: its steps and their effects."""

    def __init__(self, config: FailoverConfig) -> None:
        self.config = config
        self.options: list[FailoverOptions] = [config.options(i + 1) for i in range(config.brokers)]
        self._memo: list[dict[tuple[ReplicaState, Event], _CoreResult]] = [
            {} for _ in range(config.brokers)
        ]
        self._initial: FailoverWorld | None = None
        self._interned: dict[object, object] = {}

    def core_step(self, i: int, state: ReplicaState, event: Event) -> _CoreResult:
        """:func:`trioha.failover.failover_step` at now = 0, memoized (it is pure)."""
        memo = self._memo[i]
        key = (state, event)
        result = memo.get(key)
        if result is None:
            try:
                new, actions = failover_step(state, event, 0, self.options[i])
                result = (self.intern(new), actions)
            except LocalProtocolError as exc:
                result = exc
            memo[key] = result
        return result

    def intern(self, value: _V) -> _V:
        """One object per distinct value, so that revisited worlds compare by identity."""
        return self._interned.setdefault(value, value)  # type: ignore[return-value]

    # --- the initial world ----------------------------------------------------------------------
    def initial(self) -> FailoverWorld:
        if self._initial is None:
            self._initial = _settle(self)
        return self._initial

    # --- enumerating steps ----------------------------------------------------------------------
    def steps(self, w: FailoverWorld) -> Iterator[FStep]:
        cfg = self.config
        if self._quiescent(w):
            yield FStep(FKind.TICK)
        for msg in w.net:
            if msg.broker in w.cut:
                continue
            if msg.kind is MsgKind.REQUEST:
                yield FStep(FKind.ETCD, arg=0, msg=msg)
                if msg.purpose in _WRITES:  # the reply and the watch events race
                    yield FStep(FKind.ETCD, arg=1, msg=msg)
            elif _running(w.brokers[msg.broker]):
                yield FStep(FKind.REPLY, msg=msg)
        for i, b in enumerate(w.brokers):
            if not b.up:
                yield FStep(FKind.RESTART, i)
                continue
            if b.paused:
                yield FStep(FKind.RESUME, i)
                continue
            if b.watch and i not in w.cut and i not in w.stalled:
                yield FStep(FKind.WATCH, i)
            for out in b.core.requests:
                if i in w.cut or not any(
                    m.broker == i and m.request_id == out.request_id for m in w.net
                ):
                    yield FStep(FKind.TIMEOUT, i, out.request_id)
            if b.role is Role.MASTER and b.ack_until > 0 and w.puts < cfg.messages:
                yield FStep(FKind.PUT, i)
            if b.role is Role.SLAVE:
                yield FStep(FKind.CONNECT if b.link is None else FKind.REPLICATE, i)
                if b.link is not None:
                    yield FStep(FKind.ACK, i)
            if not cfg.ack_flushed and b.flushed < b.end:
                yield FStep(FKind.FLUSH, i)
        if w.cut or w.down or w.stalled:
            yield FStep(FKind.HEAL)
        if w.budget.handovers and w.etcd.get(KEYS.handover) is None:
            holder = w.master_key()
            for j in range(len(w.brokers)):
                if holder is not None and holder[0] != j + 1:
                    yield FStep(FKind.HANDOVER, j)
        # faults
        budget = w.budget
        for i, b in enumerate(w.brokers):
            if budget.crashes and b.up:
                yield FStep(FKind.CRASH, i)
            if budget.pauses and b.up and not b.paused:
                yield FStep(FKind.PAUSE, i)
            if budget.cuts and b.up and i not in w.cut:
                yield FStep(FKind.CUT, i)
            if budget.stale_watches and b.up and i not in w.stalled:
                yield FStep(FKind.STALL, i)
        if budget.links:
            n = len(w.brokers)
            for a in range(n):
                for c in range(a + 1, n):
                    if (a, c) not in w.down:
                        yield FStep(FKind.CUT_LINK, a, c)
        if budget.losses or budget.duplicates:
            for msg in w.net:
                if budget.losses:
                    yield FStep(FKind.LOSE, msg=msg)
                if budget.duplicates and msg.kind is MsgKind.REQUEST:
                    yield FStep(FKind.DUPLICATE, msg=msg)

    def _quiescent(self, w: FailoverWorld) -> bool:
        """Time passes only once nothing is left that would take milliseconds: every message
        and watch event that can be delivered is, and every slave that can stream has caught
        up and acknowledged (a message held up by a cut, a pause or a loss does not wait)."""
        for msg in w.net:
            if msg.broker in w.cut:
                continue
            if msg.kind is MsgKind.REQUEST or _running(w.brokers[msg.broker]):
                return False
        tx = _Tx(self, w, explain=False)
        for i, b in enumerate(w.brokers):
            if not _running(b):
                continue
            if b.watch and i not in w.cut and i not in w.stalled:
                return False
            if b.flushed < b.end and not self.config.ack_flushed:
                return False
            m = tx.serving(i)
            if m >= 0 and (b.link is None or b.end < w.brokers[m].end or b.link[1] < b.end):
                return False
        return True

    def successors(self, w: FailoverWorld) -> Iterator[tuple[FStep, FOutcome]]:
        seen: set[FStep] = set()
        for step in self.steps(w):
            if step in seen:
                continue
            seen.add(step)
            out = self._apply(w, step)
            if out is not None:
                yield step, out

    def apply(self, w: FailoverWorld, step: FStep, *, explain: bool = False) -> FOutcome | None:
        if step not in set(self.steps(w)):
            return None
        return self._apply(w, step, explain=explain)

    def _apply(self, w: FailoverWorld, step: FStep, *, explain: bool = False) -> FOutcome | None:
        tx = _Tx(self, w, explain=explain)
        if _HANDLERS[step.kind](self, tx, step) is False:
            return None
        tx.flush_watches()
        return FOutcome(
            tx.freeze(), tuple(tx.violations), frozenset(tx.marks), tuple(tx.notes or ())
        )

    # --- handlers (False: not enabled here) -------------------------------------------------
    def _tick(self, tx: _Tx, step: FStep) -> bool:
        delta = self.config.tick
        ttl_ms = self.config.lease_ttl * 1000
        ha_max = self.config.ha_max_time_slave_not_catchup
        leases = tuple(Lease(x.id, x.ttl, x.expires_at - delta) for x in tx.etcd.leases)
        tx.etcd, events = expire_leases(attrs.evolve(tx.etcd, leases=leases), 0)
        if events:
            tx.marks.add("failover_lease_expired")
            tx.note(f"etcd expires a lease: {len(events)} keys deleted")
        for i, b in enumerate(tx.brokers):
            tx.brokers[i] = but(
                b,
                core=shift_core(b.core, delta, ttl_ms, ha_max),
                ack_until=_shift_until(b.ack_until, delta),
            )
        tx.publish(events)
        tx.flush_watches()
        # Every streaming slave's heartbeat report is due (many per haMaxTimeSlaveNotCatchup).
        for j in range(len(tx.brokers)):
            m = tx.serving(j)
            if m >= 0 and tx.brokers[j].link is not None:
                self._acked(tx, m, j)
        for i, b in enumerate(tx.brokers):
            if _running(b):
                tx.feed(i, Tick())
        return True

    def _etcd(self, tx: _Tx, step: FStep) -> bool:
        msg = step.msg
        assert msg is not None
        tx.net.remove(msg)
        before = tx.etcd.get(KEYS.sync_state_set)
        holder = tx.master_key()
        tx.etcd, response, events = apply_request(tx.etcd, msg.payload, 0)  # type: ignore[arg-type]
        after = tx.etcd.get(KEYS.sync_state_set)
        if before != after and msg.purpose is Purpose.ALTER:
            self._judge_sss_write(tx, msg, holder)
        failed = isinstance(response, TxnResponse) and not response.succeeded
        if failed and msg.purpose in (Purpose.CAMPAIGN, Purpose.ALTER):
            tx.marks.add("failover_compare_failed")
        tx.publish(events)
        i = msg.broker
        b = tx.brokers[i]
        if msg.purpose in (Purpose.REGISTER, Purpose.READ) and b.up and b.watch is None:
            tx.put_broker(i, watch=())  # the watch the reply will start covers what follows
        if not msg.request_id or not b.up:
            return step.arg == 0  # nobody waits for the reply
        if not tx.reachable(i):
            tx.net.append(Msg(MsgKind.REPLY, i, msg.request_id, msg.purpose, response))
            return step.arg == 0
        # The reply and the requester's own watch events race; both orders happen.
        if step.arg == 1:
            if not events or b.watch is None or i in tx.stalled:
                return False
            tx.flush_watches()
        tx.feed(i, Replied(msg.request_id, response))
        return True

    def _handover(self, tx: _Tx, step: FStep) -> bool:
        """The operator's command writes its request as it would (``handover_txn``), but
        without its own checks first: the master must refuse what it should not do, since
        the set may change between the command's read and its write."""
        view = GroupView().snapshot(KEYS, tx.etcd.revision, tx.etcd.kvs)
        txn = handover_txn(KEYS, view, step.broker + 1, lease=0, timeout_ms=self.config.tick)
        tx.etcd, response, events = apply_request(tx.etcd, txn, 0)
        assert isinstance(response, TxnResponse) and response.succeeded
        tx.spend("handovers")
        tx.marks.add("failover_handover_requested")
        tx.note(f"an operator asks the master to hand over to b{step.broker + 1}")
        tx.publish(events)
        return True

    def _judge_sss_write(self, tx: _Tx, msg: Msg, holder: tuple[int, int, int] | None) -> None:
        tx.marks.add("failover_sss_changed")
        writer = msg.broker + 1
        if holder is None or holder[0] != writer:
            tx.marks.add("failover_sss_written_by_non_master")
            tx.note(
                f"etcd takes b{writer}'s SyncStateSet change though the master key names "
                + (f"b{holder[0]}" if holder else "nobody")
            )

    def _reply(self, tx: _Tx, step: FStep) -> bool:
        msg = step.msg
        assert msg is not None
        tx.net.remove(msg)
        tx.feed(msg.broker, Replied(msg.request_id, msg.payload))  # type: ignore[arg-type]
        return True

    def _watch(self, tx: _Tx, step: FStep) -> bool:
        b = tx.brokers[step.broker]
        if not b.watch or not tx.deliverable(step.broker):
            return False
        tx.put_broker(step.broker, watch=())
        tx.feed(step.broker, Watched(b.watch))
        return True

    def _stall(self, tx: _Tx, step: FStep) -> bool:
        tx.spend("stale_watches")
        tx.stalled.add(step.broker)
        tx.marks.add("failover_stale_watch")
        return True

    def _timeout(self, tx: _Tx, step: FStep) -> bool:
        tx.feed(step.broker, Failed(step.arg, "no reply"))
        return True

    def _put(self, tx: _Tx, step: FStep) -> bool:
        i = step.broker
        b = tx.brokers[i]
        mid = tx.puts + 1
        tx.puts = mid
        if not tx.quorum(i).enough_members():
            tx.marks.add("failover_not_enough_replicas")
            tx.note(f"put {mid} at b{i + 1}: IN_SYNC_REPLICAS_NOT_ENOUGH (not stored)")
            return True
        entry = (b.epoch, mid)
        start = b.end
        b = tx.put_broker(i, log=(*b.log, entry), flushed=start + 1)
        tx.note(f"b{i + 1} appends message {mid} at {start} in epoch {b.epoch}")
        quorum = tx.quorum(i)
        if not quorum.available(start + 1, 1 << 30):
            tx.marks.add("failover_slave_not_available")
            tx.note(f"put {mid}: SLAVE_NOT_AVAILABLE (stored)")
        elif quorum.holds(start, start + 1) and b.ack_until > 0:
            tx.ack(i, start, start + 1, mid)
        else:
            tx.put_broker(i, pending=(*b.pending, (start, start + 1, mid)))
        tx.facts(i)
        return True

    def _connect(self, tx: _Tx, step: FStep) -> bool:
        j = step.broker
        pair = tx.slave_and_master(j)
        if pair is None:
            return False
        m, s, leader = pair
        if self.config.truncate_to_high_watermark:
            point = min(s.hw, s.end)
            epochs = s.epochs.truncate_suffix(point)
        else:
            mine = s.epochs.truncate_suffix(s.end)
            hs = SlaveState(phase=SlavePhase.HANDSHAKE, expected=s.end, epochs=mine)
            new, actions = slave_step(hs, MasterHandshakeReceived(leader.end, leader.epochs))
            if any(isinstance(a, Close) for a in actions):
                tx.marks.add("failover_slave_diverged")
                tx.note(f"b{j + 1} refuses b{m + 1}'s history: {actions}")
                return True
            point = new.expected  # a ``Truncate(point)`` first if below the end
            epochs = new.epochs if new.epochs is not None else mine.truncate_suffix(point)
        if point < s.end:
            tx.marks.add("failover_slave_truncated")
            tx.note(f"b{j + 1} cuts its log from {s.end} back to {point}")
        # The first report is an acknowledgement too: with ``ack_flushed`` the slave flushes
        # what it keeps before it reports (``HAClient``'s first report after the handshake).
        flushed = point if self.config.ack_flushed else min(s.flushed, point)
        tx.put_broker(
            j,
            log=s.log[:point],
            flushed=flushed,
            epochs=epochs,
            link=(point, point),
            hw=min(s.hw, point),
        )
        tx.note(f"b{j + 1} streams from b{m + 1} at {point}")
        self._acked(tx, m, j)
        tx.facts(j)
        return True

    def _replicate(self, tx: _Tx, step: FStep) -> bool:
        j = step.broker
        pair = tx.slave_and_master(j)
        if pair is None:
            return False
        _m, s, leader = pair
        if s.end >= leader.end or s.link is None:
            return False
        epoch, mid = leader.log[s.end]
        found = leader.epochs.entry(epoch)
        start = found[1].start_offset if found is not None else s.end
        state = SlaveState(
            phase=SlavePhase.TRANSFER, expected=s.end, reported=s.end, epochs=s.epochs
        )
        _new, actions = slave_step(state, HeaderReceived(s.end, 1, epoch, start))
        epochs = s.epochs
        for action in actions:
            if isinstance(action, Close):
                tx.violations.append(("NoFrameRejected", f"b{j + 1}: {action.reason}"))
                return True
            if isinstance(action, RecordEpoch):
                epochs = epochs.append(action.epoch, action.start_offset)
        tx.put_broker(
            j,
            log=(*s.log, (epoch, mid)),
            epochs=epochs,
            hw=max(s.hw, min(leader.confirm, s.end + 1)),
        )
        tx.facts(j)
        return True

    def _ack(self, tx: _Tx, step: FStep) -> bool:
        j = step.broker
        m = tx.serving(j)
        s = tx.brokers[j]
        if m < 0 or s.link is None:
            return False
        served, acked = s.link
        if self.config.ack_flushed:
            s = tx.put_broker(j, flushed=s.end)
            report = s.flushed
        else:
            report = s.end
        if report < acked:
            return False
        tx.put_broker(j, link=(served, report))
        tx.release(m)
        self._acked(tx, m, j)
        return True

    def _acked(self, tx: _Tx, m: int, j: int) -> None:
        leader = tx.brokers[m]
        s = tx.brokers[j]
        assert s.link is not None
        acked = s.link[1]
        tx.feed(m, ReplicaAcked(j + 1, acked, acked >= leader.end, leader.confirm))

    def _flush(self, tx: _Tx, step: FStep) -> bool:
        b = tx.brokers[step.broker]
        tx.put_broker(step.broker, flushed=b.end)
        return True

    def _restart(self, tx: _Tx, step: FStep) -> bool:
        i = step.broker
        tx.put_broker(i, up=True, core=ReplicaState())
        tx.note(f"b{i + 1} restarts with its log ending at {tx.brokers[i].end}")
        tx.facts(i)
        return True

    def _resume(self, tx: _Tx, step: FStep) -> bool:
        """The broker runs again; its timers, overdue, fire first."""
        tx.put_broker(step.broker, paused=False)
        tx.feed(step.broker, Tick())
        return True

    def _heal(self, tx: _Tx, step: FStep) -> bool:
        tx.cut.clear()
        tx.down.clear()
        tx.stalled.clear()
        return True

    # --- faults -------------------------------------------------------------------------------
    def _crash(self, tx: _Tx, step: FStep) -> bool:
        tx.spend("crashes")
        i = step.broker
        b = tx.brokers[i]
        if b.flushed < b.end:
            tx.marks.add("failover_crash_lost_unflushed")
        tx.drop_link(i)
        tx.drop_links_to(i)
        tx.brokers[i] = Broker(
            ReplicaState(),
            up=False,
            log=b.log[: b.flushed],
            flushed=b.flushed,
            epochs=b.epochs,
            epoch=0,
        )
        # Its replies go nowhere; its requests may still land, orphaned (id 0).
        tx.net = [
            but(m, request_id=0) if m.broker == i else m
            for m in tx.net
            if m.broker != i or m.kind is MsgKind.REQUEST
        ]
        tx.cut.discard(i)
        tx.note(f"b{i + 1} loses power; its log comes back ending at {b.flushed}")
        return True

    def _pause(self, tx: _Tx, step: FStep) -> bool:
        tx.spend("pauses")
        tx.put_broker(step.broker, paused=True)
        tx.marks.add("failover_paused")
        return True

    def _cut(self, tx: _Tx, step: FStep) -> bool:
        tx.spend("cuts")
        tx.cut.add(step.broker)
        return True

    def _cut_link(self, tx: _Tx, step: FStep) -> bool:
        tx.spend("links")
        a, c = step.broker, step.arg
        tx.down.add((a, c))
        for j, m in ((a, c), (c, a)):
            if tx.brokers[j].link is not None and tx.brokers[j].leader == m + 1:
                tx.drop_link(j)
        return True

    def _lose(self, tx: _Tx, step: FStep) -> bool:
        tx.spend("losses")
        assert step.msg is not None
        tx.net.remove(step.msg)
        tx.marks.add("failover_message_lost")
        return True

    def _duplicate(self, tx: _Tx, step: FStep) -> bool:
        tx.spend("duplicates")
        assert step.msg is not None
        tx.net.append(step.msg)
        return True


#: Requests that may write (their reply races with the watch events they cause).
_WRITES = frozenset(
    {
        Purpose.REGISTER,
        Purpose.REPORT,
        Purpose.CAMPAIGN,
        Purpose.ALTER,
        Purpose.REVOKE,
        Purpose.HANDOVER,
    }
)


def _running(b: Broker) -> bool:
    return b.up and not b.paused


_HANDLERS = {
    FKind.TICK: FailoverModel._tick,
    FKind.ETCD: FailoverModel._etcd,
    FKind.HANDOVER: FailoverModel._handover,
    FKind.REPLY: FailoverModel._reply,
    FKind.TIMEOUT: FailoverModel._timeout,
    FKind.PUT: FailoverModel._put,
    FKind.CONNECT: FailoverModel._connect,
    FKind.REPLICATE: FailoverModel._replicate,
    FKind.ACK: FailoverModel._ack,
    FKind.FLUSH: FailoverModel._flush,
    FKind.RESTART: FailoverModel._restart,
    FKind.RESUME: FailoverModel._resume,
    FKind.HEAL: FailoverModel._heal,
    FKind.CRASH: FailoverModel._crash,
    FKind.PAUSE: FailoverModel._pause,
    FKind.CUT: FailoverModel._cut,
    FKind.CUT_LINK: FailoverModel._cut_link,
    FKind.LOSE: FailoverModel._lose,
    FKind.DUPLICATE: FailoverModel._duplicate,
    FKind.STALL: FailoverModel._stall,
    FKind.WATCH: FailoverModel._watch,
}


# --- the initial world: a group that started and settled ---------------------------------------


def _settle(model: FailoverModel) -> FailoverWorld:
    """Start every broker on an empty etcd and let the group settle, without faults.

    From an empty etcd (``initial_sss == ()``) that is all. Otherwise steps are taken in a
    fixed order of preference until broker 1 is master at epoch 1 with the configured set,
    the others follow it (those in the set streaming), and nothing is left in flight: the
    world a running group is in.
    """
    cfg = model.config
    n = cfg.brokers
    world = FailoverWorld(
        EtcdState(),
        tuple(Broker(ReplicaState()) for _ in range(n)),
        budget=FailoverFaults(),
    )
    if not cfg.initial_sss:
        return attrs.evolve(world, budget=cfg.faults)
    want = frozenset(cfg.initial_sss)
    for _ in range(500):
        if _settled(world, want):
            return attrs.evolve(world, budget=cfg.faults)
        for step in _preferred(model, world, want):
            out = model._apply(world, step)
            if out is not None and out.world != world:
                world = out.world
                break
        else:
            raise RuntimeError(f"{cfg.name}: the group did not settle")
    raise RuntimeError(f"{cfg.name}: the group did not settle in 500 steps")


def _settled(w: FailoverWorld, want: frozenset[int]) -> bool:
    if w.net or any(b.watch for b in w.brokers):
        return False
    key = w.master_key()
    if key is None or key[0] != 1 or w.coordinator_sss() != want:
        return False
    master = w.brokers[0]
    if master.core.phase is not Phase.MASTER or master.core.proposal is not None:
        return False
    for i, b in enumerate(w.brokers[1:], 1):
        if b.core.phase is not Phase.FOLLOWER or b.role is not Role.SLAVE:
            return False
        if (i + 1 in want) != (b.link is not None and b.link[1] == b.end == master.end):
            return False
    return True


def _preferred(model: FailoverModel, w: FailoverWorld, want: frozenset[int]) -> list[FStep]:
    steps = [s for s in model.steps(w) if not s.fault and s.kind is not FKind.PUT]
    order = {
        FKind.ETCD: 0,
        FKind.REPLY: 1,
        FKind.CONNECT: 3,
        FKind.REPLICATE: 4,
        FKind.ACK: 5,
        FKind.TICK: 9,
    }
    keep = []
    for s in steps:
        if s.kind not in order:
            continue
        # Brokers outside the wanted set stay unconnected (they lag behind).
        if (
            s.kind is FKind.CONNECT
            and s.broker + 1 not in want
            and model.config.lagging_outside_sss
        ):
            continue
        # Broker 1 goes first: the others start once it is master.
        if s.kind is FKind.TICK and w.brokers[0].core.phase is Phase.MASTER:
            others = [b for b in w.brokers[1:] if b.core.phase is Phase.STARTING]
            if not others:
                continue
        keep.append(s)
    keep.sort(key=lambda s: (order[s.kind], s.broker, s.msg.sort_key() if s.msg else ()))
    return keep


__all__ = [
    "FAULTS",
    "FKind",
    "FOutcome",
    "FStep",
    "FailoverModel",
    "canonical",
    "shift_core",
]
