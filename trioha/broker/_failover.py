"""The replica manager: the failover control core driven against a real etcd, in one nursery.

Mirrors RocketMQ 5.x's ``ReplicasManager`` (controller mode), with etcd in the controller's
place (docs/failover.md). The decisions are all :func:`trioha.failover.failover_step`'s; this
module only carries them out and feeds back what happened:

* **events in**: a tick every :data:`TICK` seconds (keepalives and the self-fence are due on
  it), the data plane's log facts when they change (``LogChanged``), each etcd reply or its
  failure (``Replied``/``Failed``), the watch's batches (``Watched``, ``WatchBroken``), and
  from the HA service each slave's ack and departure (``ReplicaAcked``, ``ReplicaGone``);
* **actions out**, carried out in order before the next event is fed: requests to etcd
  (each in a task of its own, bounded by the lease's TTL), the watch on the group's prefix
  (one task, replaced when the core asks for a new start revision), and the data plane's
  part, :class:`DataPlane`: fence and unfence, fail the puts in flight, the SyncStateSet,
  and the role changes.

Fencing, failing in-flight puts and the SyncStateSet take effect synchronously, inside the
step that decided them: nothing can be acknowledged between the decision and its effect.
The role changes take IO (stopping replication, the epoch file) and run one at a time, in
order, in a task of their own; the data plane acknowledges nothing meanwhile (a broker that
is changing role is not an acknowledging master until its epoch is written and it is
unfenced).

Every role change and fence is one WARNING line with the epoch and the log's offsets.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol, assert_never

import attrs
import trio

from trioha._errors import (
    ConfigError,
    CoordinatorError,
    HandoverRefusedError,
    ProtocolError,
    StorageError,
)
from trioha._status import PutStatus
from trioha.etcd import EtcdClientStatistics, open_etcd_client
from trioha.failover import (
    Action,
    Alert,
    BecomeMaster,
    BecomeSlave,
    Event,
    Failed,
    FailInFlight,
    FailoverOptions,
    Fence,
    GroupKeys,
    GroupView,
    HandoverState,
    LeaseGrant,
    LeaseGrantResponse,
    LeaseRevoke,
    LogChanged,
    MasterRecord,
    Phase,
    Range,
    RangeResponse,
    ReplicaAcked,
    ReplicaGone,
    ReplicaState,
    Replied,
    Request,
    Response,
    RoleChangeFailed,
    SendRequest,
    SetSyncStateSet,
    Shutdown,
    StartWatch,
    Tick,
    TxnResponse,
    Unfence,
    WatchBroken,
    Watched,
    WatchEvent,
    failover_step,
    handover_refusal,
    handover_txn,
)

__all__ = [
    "TICK",
    "DataPlane",
    "EtcdLike",
    "FailoverStatistics",
    "HandoverOutcome",
    "ReplicaManager",
    "describe_group",
    "hand_over",
    "open_replica_manager",
    "read_group",
    "run_replica_manager",
]

log = logging.getLogger("trioha.failover")

#: Seconds between ticks: keepalives are due every TTL/3 and the deadline is checked at every
#: acknowledgement anyway, so this only bounds how late a fence's WARNING and its failing of
#: in-flight puts can come.
TICK = 0.05


class EtcdLike(Protocol):
    """What the replica manager needs of etcd (:class:`trioha.etcd.EtcdClient` is one; a
    test may pass an in-memory etcd behind the same calls)."""

    @property
    def endpoint(self) -> str: ...

    def statistics(self) -> EtcdClientStatistics: ...

    async def request(self, request: Request) -> Response: ...

    def open_watch(
        self, watched: Range, start_revision: int
    ) -> AbstractAsyncContextManager[AsyncIterator[tuple[WatchEvent, ...]]]: ...


class DataPlane(Protocol):
    """What the replica manager asks of the broker (``trioha.broker.Broker`` implements it).

    Times are the core's milliseconds: ``trio.current_time() * 1000``.
    """

    def log_facts(self) -> tuple[int, int, int]:
        """``(max offset, last epoch, confirm offset)`` as they are now."""
        ...

    def replica_acks(self) -> dict[int, int]:
        """Master: each streaming slave's broker id and the newest offset it vouches for."""
        ...

    def fence(self, reason: str) -> None:
        """Acknowledge nothing from now on."""
        ...

    def unfence(self, until_ms: int) -> None:
        """Acknowledge puts while the clock reads less than *until_ms*."""
        ...

    def fail_in_flight(self, status: PutStatus) -> None:
        """Answer every put waiting for replicas with *status* now."""
        ...

    def set_sync_state_set(self, members: frozenset[int]) -> None:
        """The brokers every put must reach from now on."""
        ...

    async def become_master(self, epoch: int, members: frozenset[int]) -> None:
        """Stop replicating, begin *epoch* at the log's end, serve slaves, register as
        brokerId 0. Raises :class:`StorageError` or :class:`ProtocolError` (an epoch file
        that is ahead) when it cannot."""
        ...

    async def become_slave(self, master: MasterRecord) -> None:
        """Stop serving as master (if it was), follow *master*, register as a slave."""
        ...


@attrs.frozen
class FailoverStatistics:
    """A snapshot of the replica manager (``statistics()``, Trio style)."""

    #: The core's phase: STARTING, REGISTERING, FOLLOWER, CAMPAIGNING, MASTER, FENCED, STOPPED.
    phase: str
    broker_id: int
    #: The epoch this broker is master of (0: not master).
    epoch: int
    #: The master etcd names as this broker knows it (0: none) and its epoch.
    master_id: int
    master_epoch: int
    #: The SyncStateSet as etcd has it (as far as this broker knows).
    sync_state_set: tuple[int, ...]
    #: Seconds until this master must stop acknowledging (negative: past; None: not master).
    lease_deadline_in: float | None
    lease: int
    #: Elections this broker won, role changes it made, fences it went through.
    elections: int
    role_changes: int
    fences: int
    #: Seconds spent fenced while holding the master key, in all.
    fenced_seconds: float
    #: The last election this broker saw: the epoch and seconds ago (None before any).
    last_election_epoch: int
    last_election_ago: float | None
    #: The etcd endpoint in use and the last etcd failure ("" before any).
    etcd_endpoint: str
    etcd_last_error: str


class ReplicaManager:
    """Runs one broker's failover core; made by :func:`open_replica_manager`."""

    def __init__(
        self,
        options: FailoverOptions,
        client: EtcdLike,
        plane: DataPlane,
        nursery: trio.Nursery,
    ) -> None:
        self.options = options
        self.client = client
        self.plane = plane
        self._nursery = nursery
        self.state = ReplicaState()
        self._roles_send, self._roles_receive = trio.open_memory_channel[
            BecomeMaster | BecomeSlave
        ](math.inf)
        self._watch_scope: trio.CancelScope | None = None
        self._facts: tuple[int, int, int] | None = None
        self.elections = 0
        self.role_changes = 0
        self.fences = 0
        self._fenced_at: float | None = None
        self._fenced_total = 0.0
        self._last_election: tuple[int, float] | None = None
        self._last_master: tuple[int, int] = (0, 0)
        #: One line per etcd fault kind until it clears (a dead etcd would flood the log).
        self._etcd_fault = ""

    # --- the core ---------------------------------------------------------------------------
    def now_ms(self) -> int:
        return int(trio.current_time() * 1000)

    def feed(self, event: Event) -> None:
        """Step the core with *event* and carry out its actions (the synchronous ones now)."""
        self.state, actions = failover_step(self.state, event, self.now_ms(), self.options)
        for action in actions:
            self._carry_out(action)
        self._note_master()
        if any(isinstance(action, Fence) for action in actions):
            # The log cannot grow once fenced (a put is refused or appended without a
            # checkpoint in between): its end now is final, and a handover waits for it.
            self._log_facts()

    def _log_facts(self) -> tuple[int, int, int]:
        """Feed the data plane's log facts if they changed since last fed; return them."""
        facts = self.plane.log_facts()
        if facts != self._facts:
            self._facts = facts
            self.feed(LogChanged(*facts))
        return facts

    def replica_acked(self, broker_id: int, acked: int, caught_up: bool) -> None:
        """The HA service: slave *broker_id*'s connection vouches up to *acked*."""
        confirm = self._log_facts()[2]
        self.feed(ReplicaAcked(broker_id, acked, caught_up, confirm))

    def replica_gone(self, broker_id: int) -> None:
        self.feed(ReplicaGone(broker_id))

    def _carry_out(self, action: Action) -> None:
        match action:
            case SendRequest():
                self._nursery.start_soon(self._send, action)
            case StartWatch():
                self._start_watch(action)
            case BecomeMaster() | BecomeSlave():
                self._roles_send.send_nowait(action)
            case Fence(reason=reason):
                self.plane.fence(reason)
                self.fences += 1
                if self._fenced_at is None:
                    self._fenced_at = trio.current_time()
                end, epoch, confirm = self.plane.log_facts()
                log.warning(
                    "fenced: %s; acknowledging nothing (log end %d, epoch file at %d, "
                    "confirm offset %d)",
                    reason,
                    end,
                    epoch,
                    confirm,
                )
            case Unfence(until=until):
                self.plane.unfence(until)
                if self._fenced_at is not None:
                    self._fenced_total += trio.current_time() - self._fenced_at
                    self._fenced_at = None
            case FailInFlight(status=status):
                self.plane.fail_in_flight(status)
            case SetSyncStateSet(members=members):
                self.plane.set_sync_state_set(members)
            case Alert(message=message):
                log.error("failover: %s", message)
            case _:
                assert_never(action)

    def _note_master(self) -> None:
        """Remember when a new master (a new epoch) appeared, for ``last election``."""
        record = self.state.view.master.current
        if record is None:
            return
        key = (record.broker_id, record.epoch)
        if key != self._last_master:
            self._last_master = key
            self._last_election = (record.epoch, trio.current_time())

    # --- etcd ---------------------------------------------------------------------------------
    async def _send(self, action: SendRequest) -> None:
        # A reply later than the lease's TTL tells nothing the core can still use.
        with trio.move_on_after(self.options.lease_ttl) as scope:
            try:
                response = await self.client.request(action.request)
            except CoordinatorError as exc:
                self._etcd_failed(action, type(exc).__name__, str(exc))
                self.feed(Failed(action.request_id, str(exc)))
                return
        if scope.cancelled_caught:
            why = f"no answer from etcd within {self.options.lease_ttl} s"
            self._etcd_failed(action, "timeout", why)
            self.feed(Failed(action.request_id, why))
            return
        if self._etcd_fault:
            log.warning("etcd answers again (%s)", self.client.endpoint)
            self._etcd_fault = ""
        self.feed(Replied(action.request_id, response))

    def _etcd_failed(self, action: SendRequest, kind: str, reason: str) -> None:
        if kind != self._etcd_fault:
            self._etcd_fault = kind
            log.warning(
                "etcd %s failed: %s (serving reads and pulls meanwhile; a master fences "
                "itself if its lease cannot be kept alive)",
                action.purpose.value,
                reason,
            )

    def _start_watch(self, action: StartWatch) -> None:
        if self._watch_scope is not None:
            self._watch_scope.cancel()
        scope = self._watch_scope = trio.CancelScope()
        self._nursery.start_soon(self._watch, action, scope)

    async def _watch(self, action: StartWatch, scope: trio.CancelScope) -> None:
        reason = "the watch ended"
        with scope:
            try:
                async with self.client.open_watch(action.watched, action.start_revision) as watch:
                    async for events in watch:
                        self.feed(Watched(events))
            except CoordinatorError as exc:
                reason = str(exc)
                log.warning("etcd watch on the group's keys ended: %s; reading them again", exc)
            if scope is self._watch_scope:
                self._watch_scope = None
                self.feed(WatchBroken(reason))

    # --- running ------------------------------------------------------------------------------
    async def _tick(self) -> None:
        while True:
            facts = self._log_facts()
            self.feed(Tick())
            self._replicas_now(facts[0])
            await trio.sleep(TICK)

    def _replicas_now(self, end: int) -> None:
        """Every streaming slave's standing, now and then, not only when its ack moves: an
        idle master gets no new acks, and a slave that registered after its last ack must
        still be judged for the SyncStateSet (RocketMQ's slaves report every heartbeat)."""
        if self.state.phase not in (Phase.MASTER, Phase.FENCED, Phase.HANDING_OVER):
            return
        for broker_id, acked in self.plane.replica_acks().items():
            self.replica_acked(broker_id, acked, acked >= end)

    async def _roles(self) -> None:
        async for action in self._roles_receive:
            end, epoch, _confirm = self.plane.log_facts()
            match action:
                case BecomeMaster(epoch=new_epoch, members=members):
                    log.warning(
                        "becoming master of epoch %d at log end %d (epoch file at %d), "
                        "SyncStateSet %s",
                        new_epoch,
                        end,
                        epoch,
                        sorted(members),
                    )
                    try:
                        await self.plane.become_master(new_epoch, members)
                    except (StorageError, ProtocolError) as exc:
                        log.error("cannot become master of epoch %d: %s", new_epoch, exc)
                        self.feed(RoleChangeFailed(str(exc)))
                        continue
                    self.elections += 1
                case BecomeSlave(master=master):
                    log.warning(
                        "following master %d of epoch %d (HA %s), log end %d, epoch file at %d",
                        master.broker_id,
                        master.epoch,
                        master.ha_addr,
                        end,
                        epoch,
                    )
                    try:
                        await self.plane.become_slave(master)
                    except ConfigError as exc:  # a master key naming no usable HA address
                        log.error(
                            "cannot follow master %d of epoch %d: %s",
                            master.broker_id,
                            master.epoch,
                            exc,
                        )
                        continue
                case _:
                    assert_never(action)
            self.role_changes += 1

    async def _shutdown(self) -> None:
        """Give the lease back at once, so that a successor need not wait for it to expire."""
        self.state, actions = failover_step(self.state, Shutdown(), self.now_ms(), self.options)
        for action in actions:
            if isinstance(action, SendRequest):
                with trio.move_on_after(1.0):
                    try:
                        await self.client.request(action.request)
                    except CoordinatorError as exc:
                        log.info("could not give the etcd lease back: %s", exc)
            elif not isinstance(action, StartWatch | BecomeMaster | BecomeSlave):
                self._carry_out(action)

    def statistics(self) -> FailoverStatistics:
        state = self.state
        now = trio.current_time()
        record = state.view.master.current
        sss = state.view.sss.current
        master = state.phase in (Phase.MASTER, Phase.FENCED, Phase.HANDING_OVER)
        fenced = self._fenced_total + (
            now - self._fenced_at if self._fenced_at is not None else 0.0
        )
        etcd = self.client.statistics()
        return FailoverStatistics(
            phase=state.phase.value,
            broker_id=self.options.broker_id,
            epoch=state.epoch,
            master_id=record.broker_id if record else 0,
            master_epoch=record.epoch if record else 0,
            sync_state_set=tuple(sorted(sss.members)) if sss else (),
            lease_deadline_in=(state.deadline_at / 1000 - now) if master else None,
            lease=state.lease,
            elections=self.elections,
            role_changes=self.role_changes,
            fences=self.fences,
            fenced_seconds=fenced,
            last_election_epoch=self._last_election[0] if self._last_election else 0,
            last_election_ago=(now - self._last_election[1]) if self._last_election else None,
            etcd_endpoint=etcd.endpoint,
            etcd_last_error=etcd.last_error,
        )


def failover_options(
    *,
    broker_id: int,
    cluster: str,
    broker_name: str,
    root: str,
    broker_addr: str,
    ha_addr: str,
    lease_ttl: int,
    ha_max_time_slave_not_catchup: int,
    enable_elect_unclean_master: bool,
) -> FailoverOptions:
    """The core's options from the broker's settings (``ValueError`` names a bad one)."""
    return FailoverOptions(
        broker_id=broker_id,
        keys=GroupKeys.of(cluster, broker_name, root=root),
        broker_addr=broker_addr,
        ha_addr=ha_addr,
        lease_ttl=lease_ttl,
        ha_max_time_slave_not_catchup=ha_max_time_slave_not_catchup,
        enable_elect_unclean_master=enable_elect_unclean_master,
    )


@asynccontextmanager
async def run_replica_manager(
    options: FailoverOptions,
    plane: DataPlane,
    client: EtcdLike,
    *,
    on_started: Callable[[ReplicaManager], None] = lambda manager: None,
) -> AsyncIterator[ReplicaManager]:
    """Run the replica manager over *client* until the block exits; then give the etcd
    lease back (a clean stop hands the master key over at once)."""
    async with trio.open_nursery() as nursery:
        manager = ReplicaManager(options, client, plane, nursery)
        on_started(manager)
        nursery.start_soon(manager._roles)
        nursery.start_soon(manager._tick)
        try:
            yield manager
        finally:
            with trio.CancelScope(shield=True):
                await manager._shutdown()
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def open_replica_manager(
    options: FailoverOptions,
    plane: DataPlane,
    *,
    endpoints: str,
    user: str = "",
    password: str = "",
    on_started: Callable[[ReplicaManager], None] = lambda manager: None,
) -> AsyncIterator[ReplicaManager]:
    """:func:`run_replica_manager` over a client of the etcd at *endpoints*.

    Requests to etcd are bounded by the lease's TTL: a keepalive answered later than that
    is of no use (the core has fenced, and the lease may be gone).
    """
    ttl = options.lease_ttl
    async with (
        open_etcd_client(
            endpoints,
            user=user,
            password=password,
            request_timeout=max(0.5, ttl / 3),
            retry_for=max(1.0, ttl * 0.8),
            probe_interval=max(0.5, ttl / 3),
        ) as client,
        run_replica_manager(options, plane, client, on_started=on_started) as manager,
    ):
        yield manager


# --- reading a group's state (``python -m trioha failover-state``) ----------------------------


async def read_group(client: EtcdLike, keys: GroupKeys) -> tuple[int, GroupView]:
    """The group's keys as etcd has them now: the revision read at, and the view."""
    response = await client.request(Range.prefix(keys.prefix))
    if not isinstance(response, RangeResponse):
        raise CoordinatorError(f"etcd refused to read {keys.prefix.decode()}: {response}")
    return response.revision, GroupView().snapshot(keys, response.revision, response.kvs)


def describe_group(keys: GroupKeys, revision: int, view: GroupView) -> list[str]:
    """What an operator reads of a group: the master, the epoch, the set and every broker
    (a value trioha cannot read is shown with why)."""
    lines = [f"group {keys.prefix.decode()} at etcd revision {revision}"]
    master = view.master
    if not master.present:
        lines.append("master: none (the key is vacant: an election is due)")
    elif master.current is None:
        lines.append(f"master: unreadable ({master.error})")
    else:
        m = master.current
        lines.append(
            f"master: broker {m.broker_id}, epoch {m.epoch}, broker port {m.broker_addr}, "
            f"HA {m.ha_addr} (lease {master.lease:x}, fencing token {master.create_revision})"
        )
    if view.epoch.present and view.epoch.current is None:
        lines.append(f"epoch counter: unreadable ({view.epoch.error})")
    else:
        lines.append(f"epoch counter: {view.counter()}")
    sss = view.sss
    if not sss.present:
        lines.append("SyncStateSet: none (no master was ever elected)")
    elif sss.current is None:
        lines.append(f"SyncStateSet: unreadable ({sss.error})")
    else:
        lines.append(
            f"SyncStateSet: {sorted(sss.current.members)}, version {sss.current.version}, "
            f"written by the master of epoch {sss.current.master_epoch}"
        )
    handover = view.handover
    if handover.present:
        request = handover.current
        if request is None:
            lines.append(f"handover: unreadable ({handover.error})")
        else:
            why = f": {request.reason}" if request.reason else ""
            lines.append(
                f"handover: {request.state.value}, to broker {request.target}, addressed to "
                f"the master of epoch {request.epoch}{why}"
            )
    live = view.live()
    lines.append(f"brokers registered (alive): {len(live)}")
    for bid, entry in sorted(live.items()):
        reg = entry.current
        if reg is None:
            lines.append(f"  broker {bid}: unreadable ({entry.error})")
        else:
            lines.append(
                f"  broker {bid}: epoch {reg.epoch}, max offset {reg.max_offset}, "
                f"broker port {reg.broker_addr}, HA {reg.ha_addr}"
            )
    return lines


# --- handing the master role over (``python -m trioha failover-elect``) -----------------------


@attrs.frozen
class HandoverOutcome:
    """What a handover did: the new master and its epoch, the old one, and how long it took
    (*seconds*, from the request to the new master key). *already*: the target was master."""

    master_id: int
    epoch: int
    old_master_id: int
    old_epoch: int
    seconds: float
    already: bool = False


async def hand_over(
    client: EtcdLike, keys: GroupKeys, target: int, *, catch_up: float, lease_ttl: int
) -> HandoverOutcome:
    """Hand the master role of the group at *keys* to broker *target* (docs/failover.md,
    "Handing the master role over"): check the request against etcd's keys, write it bound
    to a lease of its own (so an abandoned request goes by itself), and watch until a master
    key of a later epoch appears or the master refuses.

    *catch_up* (seconds) is how long the master may stay fenced waiting for the target to
    catch up (it caps it at ``haMaxTimeSlaveNotCatchup``); the whole call waits that long
    plus two of the group's lease TTLs at most. Raises :class:`HandoverRefusedError` with the
    reason, and :class:`CoordinatorError` when etcd cannot be used.
    """
    start = trio.current_time()
    revision, view = await read_group(client, keys)
    old = view.master.current
    if view.master.present and old is not None and old.broker_id == target:
        return HandoverOutcome(target, old.epoch, target, old.epoch, 0.0, already=True)
    why = handover_refusal(keys, view, target)
    if why:
        raise HandoverRefusedError(why)
    assert old is not None
    grant = await client.request(LeaseGrant(math.ceil(catch_up) + 2 * lease_ttl))
    if not isinstance(grant, LeaseGrantResponse):
        raise CoordinatorError(f"etcd refused a lease for the handover request: {grant}")
    try:
        txn = handover_txn(keys, view, target, lease=grant.lease, timeout_ms=int(catch_up * 1000))
        reply = await client.request(txn)
        if not isinstance(reply, TxnResponse):
            raise CoordinatorError(f"etcd refused the handover request: {reply}")
        if not reply.succeeded:
            now = view
            for read in reply.responses:
                if isinstance(read, RangeResponse):
                    now = GroupView().snapshot(keys, read.revision, read.kvs)
            record = now.master.current
            who = f"broker {record.broker_id} at epoch {record.epoch}" if record else "none"
            raise HandoverRefusedError(
                handover_refusal(keys, now, target)
                or f"the master changed while the request was written (now {who}); try again"
            )
        wait = catch_up + 2 * lease_ttl
        result: HandoverOutcome | str = (
            f"no master of a later epoch than {old.epoch} within {wait:g} s; the request is "
            "withdrawn (see failover-state)"
        )
        with trio.move_on_after(wait):
            async with client.open_watch(Range.prefix(keys.prefix), revision + 1) as watch:
                async for events in watch:
                    view = view.events(keys, events)
                    found = _handover_outcome(view, reply.revision, old, target, start)
                    if found is not None:
                        result = found
                        break
        if isinstance(result, str):
            raise HandoverRefusedError(result)
        return result
    finally:
        # The request goes with its lease: answered, refused or abandoned.
        with trio.CancelScope(shield=True), trio.move_on_after(2.0):
            try:
                await client.request(LeaseRevoke(grant.lease))
            except CoordinatorError as exc:
                log.info("could not revoke the handover request's lease: %s", exc)


def _handover_outcome(
    view: GroupView, requested_at: int, old: MasterRecord, target: int, start: float
) -> HandoverOutcome | str | None:
    """The end of a handover as the watch shows it: what it did, why it did not happen, or
    None (not yet)."""
    record = view.master.current
    if view.master.present and record is not None and record.epoch > old.epoch:
        if record.broker_id != target:
            return (
                f"broker {record.broker_id} became master of epoch {record.epoch} instead of "
                f"broker {target} (the master was lost before it released the key)"
            )
        took = trio.current_time() - start
        return HandoverOutcome(target, record.epoch, old.broker_id, old.epoch, took)
    answer = view.handover.current
    if (
        answer is not None
        and answer.state is HandoverState.REFUSED
        and view.handover.mod_revision > requested_at
    ):
        return f"broker {old.broker_id} refused: {answer.reason}"
    return None
