"""The master's HA service: accept slaves, keep a registry, wait for replication.

Mirrors ``HAService`` with ``AcceptSocketService`` and ``GroupTransferService``
(docs/rocketmq-protocol.md §2.1, §2.4). Differences, on purpose (docs/replication.md):

* a connection is added to the registry *before* its tasks start and removed in a ``finally``
  (RocketMQ #8875 leaked connections added after they had already failed);
* acks are tracked per live connection, and a sync put needs ``in_sync_replicas - 1`` of them
  (5.x semantics), not the maximum ack ever seen from anyone (``push2SlaveMaxOffset``);
* waiting puts sit in a heap ordered by the offset they need; one ack releases every put it
  covers at once (group commit), with no polling; each put's ``slave_timeout`` is its own
  (:class:`~trioha.net._waiters.OffsetWaiters`).

With automatic failover (``BrokerConfig.failover``, docs/failover.md) the service lives as
long as the broker and serves only while the broker is master (:meth:`HAService.start_serving`,
:meth:`HAService.stop_serving`); a sync put then asks failover mode's rule,
:class:`~trioha.proto.InSyncQuorum`, over the SyncStateSet the control core hands down
(:meth:`HAService.set_members`), each slave known by the broker id of its handshake.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, NoReturn

import attrs
import trio

from trioha._config import BrokerConfig
from trioha._errors import ConfigError
from trioha._status import PutStatus
from trioha.net._connection import HAConnection
from trioha.net._marks import MarkKeeper
from trioha.net._timeline import LogTimeline
from trioha.net._waiters import OffsetWaiters
from trioha.proto import (
    CloseKind,
    InSyncQuorum,
    MasterOptions,
    Quorum,
    Vouch,
    needed_acks,
    slaves_available,
)

if TYPE_CHECKING:
    from trioha.store import CommitLog, EpochFile, SentOffsets

log = logging.getLogger("trioha.ha")


@attrs.frozen
class SlaveStatistics:
    """One connected slave as the master sees it."""

    peer: str
    ack_offset: int
    lag: int
    bytes_sent: int
    frames_sent: int
    heartbeats_sent: int
    connected_seconds: float
    #: How long ago the master's log first went past ``ack_offset`` (None before a report).
    behind_seconds: float | None = None


@attrs.frozen
class HAServiceStatistics:
    """A snapshot of the master's HA service (``statistics()``, Trio style)."""

    address: tuple[str, int] | None
    slaves: tuple[SlaveStatistics, ...]
    replicated_offset: int
    waiting_puts: int
    connections_accepted: int
    connections_closed: int
    #: Epoch mode: the master's current epoch and where it began (-1, -1 in classic mode).
    epoch: int = -1
    epoch_start: int = -1
    #: Slaves refused because their log holds a history this master lost (classic mode).
    slaves_refused: int = 0
    #: Ranges ``(from, to)`` this master may have sent and then lost in a crash.
    lost_ranges: tuple[tuple[int, int], ...] = ()
    #: Connections closed so far, by kind (:attr:`~trioha.proto.CloseKind.category`).
    closed_by_reason: dict[str, int] = attrs.field(factory=dict)


StreamGate = Callable[[trio.abc.Stream, str], Awaitable[trio.abc.Stream | None]]
#: Failover: a slave's connection vouches up to an offset: ``(broker id, acked, caught up)``.
ReplicaAckSink = Callable[[int, int, bool], None]
#: Failover: the connection of the slave with this broker id ended.
ReplicaGoneSink = Callable[[int], None]


#: Samples of the log's growth kept before those every slave acked are dropped.
_TIMELINE_KEEP = 32


class HAService:
    """Accepts slave connections and answers "is this offset replicated?"."""

    def __init__(
        self,
        config: BrokerConfig,
        commitlog: CommitLog,
        *,
        sent: SentOffsets | None = None,
        epoch_file: EpochFile | None = None,
        accept: StreamGate | None = None,
        marks: MarkKeeper | None = None,
    ) -> None:
        self.config = config
        self.commitlog = commitlog
        #: Runs on each accepted socket before the HA protocol (trioha.acl.HASecurity.accept):
        #: the stream to serve, or None to drop the connection.
        self.accept = accept
        if marks is None and sent is not None:
            marks = MarkKeeper(sent, retry_interval=config.clean_resource_interval / 1000)
        #: The durable marks every writer reserves before sending (shared by the connections).
        self.marks = marks
        #: The durable "highest offset sent" mark and lost ranges (classic divergence check).
        self.sent = marks.sent if marks is not None else None
        self._refused = 0
        if config.enable_controller_mode and epoch_file is None:
            raise ConfigError("epoch mode (enable_controller_mode) needs the store's epoch file")
        #: Epoch mode: the master's epoch history, begun anew at this start (None: classic).
        self.epoch_file = epoch_file if config.enable_controller_mode else None
        self.options = MasterOptions(
            batch_size=config.ha_transfer_batch_size,
            sync_from_oldest=config.ha_sync_from_oldest,
            epoch_mode=config.enable_controller_mode,
        )
        self.timing = config.ha_timing
        self.address: tuple[str, int] | None = None
        self.connections: dict[int, HAConnection] = {}
        self._ids = itertools.count(1)
        #: Each connection's vouch as of its last accepted ack (``on_ack``); a connection counts
        #: while it is streaming (``transferring``) and leaves with the registry.
        self._vouches: dict[HAConnection, Vouch] = {}
        self._quorum: Quorum | None = None  # cached; dropped on every ack and registry change
        self._waiters = OffsetWaiters(
            config.slave_timeout / 1000,
            covered=PutStatus.PUT_OK,
            expired=PutStatus.FLUSH_SLAVE_TIMEOUT,
        )
        self._accepted = 0
        self._closed = 0
        self._closed_by_reason: collections.Counter[str] = collections.Counter()
        #: When the log reached each offset, for a slave's seconds behind.
        self.timeline = LogTimeline(commitlog.max_offset)
        self._connection_change = trio.lowlevel.ParkingLot()
        #: Failover: serve slaves only while master; the SyncStateSet and the ack rule's
        #: settings; the control core's ears (``on_replica_ack``, ``on_replica_gone``).
        self.failover = config.failover
        self.serving = not self.failover
        self.master_id = config.failover_broker_id
        self.members: frozenset[int] = frozenset({self.master_id})
        self.on_replica_ack: ReplicaAckSink | None = None
        self.on_replica_gone: ReplicaGoneSink | None = None
        self._scopes: dict[HAConnection, trio.CancelScope] = {}

    # --- failover: serving by role, and the SyncStateSet rule ---------------------------------
    def start_serving(self) -> None:
        """This broker became master: accept slaves from now on."""
        self.serving = True
        self.timeline = LogTimeline(self.commitlog.max_offset)

    def stop_serving(self, reason: str) -> None:
        """This broker is master no more: close every slave connection now, refuse new ones."""
        self.serving = False
        for conn, scope in self._scopes.items():
            conn.close_reason = conn.close_reason or reason
            scope.cancel()

    def set_members(self, members: frozenset[int]) -> None:
        """The SyncStateSet every put must reach (the control core's ``SetSyncStateSet``);
        the waiting puts are judged again at once against it."""
        self.members = members | {self.master_id}
        quorum = self.in_sync_quorum()
        self._waiters.release(self.commitlog.max_offset, quorum.holds)

    def fail_waiting(self, status: PutStatus) -> int:
        """Answer every put waiting for replicas with *status* now (``FailInFlight``)."""
        return self._waiters.fail_all(status)

    def _slave_id(self, conn: HAConnection) -> int | None:
        handshake = getattr(conn.proto, "handshake", None)
        return None if handshake is None else int(handshake.broker_id)

    def in_sync_quorum(self) -> InSyncQuorum:
        """Failover mode's ack rule over the live connections, as of now."""
        vouches: dict[int, Vouch] = {}
        for conn, v in self._vouches.items():
            bid = self._slave_id(conn)
            if bid is None or not conn.transferring or bid == self.master_id:
                continue
            if bid not in vouches or v[1] > vouches[bid][1]:
                vouches[bid] = v
        return InSyncQuorum.of(
            self.master_id,
            self.members,
            vouches,
            self.config.min_in_sync_replicas,
            all_ack=self.config.all_ack_in_sync_state_set,
            master_durable=self.commitlog.flushed_offset,
        )

    async def wait_in_sync(self, end: int, *, start: int) -> PutStatus:
        """Failover mode's :meth:`wait_replicated`: wait until :class:`InSyncQuorum` holds
        ``[start, end)``; PUT_OK, FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE. The caller
        asks :meth:`in_sync_holds` again when it resumes (docs/failover.md, "The ack rule")."""
        quorum = self.in_sync_quorum()
        if quorum.holds(start, end):
            return PutStatus.PUT_OK
        if not quorum.available(end, self.config.ha_slave_fallbehind_max):
            return PutStatus.SLAVE_NOT_AVAILABLE
        self.notify_log_grew()
        return await self._waiters.wait(end, start=start)

    def replica_acks(self) -> dict[int, int]:
        """Failover: each streaming slave's broker id and the newest offset it vouches for."""
        acks: dict[int, int] = {}
        for conn, (_served, ack) in self._vouches.items():
            bid = self._slave_id(conn)
            if bid is not None and conn.transferring and ack > acks.get(bid, -1):
                acks[bid] = ack
        return acks

    def in_sync_holds(self, start: int, end: int) -> bool:
        return self.in_sync_quorum().holds(start, end)

    # --- serving ----------------------------------------------------------------------------
    async def serve(
        self,
        *,
        task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
    ) -> NoReturn:
        """Listen on ``ha_listen_host:ha_listen_port`` (port 0 picks one) and serve slaves.

        Also runs :meth:`time_out_puts`.
        """
        host, port = self.config.ha_listen_host, self.config.ha_listen_port
        try:
            listeners = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:
            raise ConfigError(
                f"cannot listen for slaves on {host}:{port} (haListenPort, --ha-listen): "
                f"{exc.strerror or exc}"
            ) from exc
        sockname = listeners[0].socket.getsockname()
        self.address = (sockname[0], sockname[1])
        log.info("HA service listening on %s:%d", *self.address)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.time_out_puts)
            task_status.started(self.address)
            await trio.serve_listeners(self._serve_accepted, listeners)
        raise AssertionError("unreachable: serve_listeners never returns")

    async def time_out_puts(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> NoReturn:
        """Answer FLUSH_SLAVE_TIMEOUT to sync puts waiting longer than ``slave_timeout``.

        :meth:`serve` runs it; whoever serves streams through :meth:`handle_stream` alone starts
        it (``await nursery.start(service.time_out_puts)``) next to them: without it,
        :meth:`wait_replicated` refuses to wait rather than wait forever.
        """
        await self._waiters.expire(task_status=task_status)

    async def _serve_accepted(self, stream: trio.SocketStream) -> None:
        peer = _peer_name(stream)
        served: trio.abc.Stream | None = stream
        if self.accept is not None:
            served = await self.accept(stream, peer)
        if served is None or not self.serving:
            if served is not None:
                log.info("slave %s refused: this broker is not master", peer)
            await trio.aclose_forcefully(served or stream)
            return
        await self.handle_stream(served, peer)

    async def handle_stream(self, stream: trio.abc.Stream, peer: str | None = None) -> None:
        """Serve one slave on *stream* until the connection ends; never raises."""
        if peer is None:
            peer = _peer_name(stream)
        conn = HAConnection(
            stream,
            commitlog=self.commitlog,
            listener=self,
            options=self.options,
            timing=self.timing,
            peer=peer,
            epoch_file=self.epoch_file,
            marks=self.marks,
        )
        conn_id = next(self._ids)
        self.connections[conn_id] = conn
        self._quorum = None
        self._accepted += 1
        self._connection_change.unpark_all()
        log.info("slave connected from %s", peer)
        scope = self._scopes[conn] = trio.CancelScope()
        try:
            with scope:
                await conn.run()
        except Exception:
            if conn.close_reason is None:
                conn.close_reason, conn.close_kind = "internal error", CloseKind.INTERNAL_ERROR
            log.exception("HA connection with %s failed", peer)
        finally:
            del self.connections[conn_id]
            del self._scopes[conn]
            self._vouches.pop(conn, None)
            gone = self._slave_id(conn)
            if self.on_replica_gone is not None and gone is not None:
                self.on_replica_gone(gone)
            self._quorum = None
            self._closed += 1
            self._refused += conn.refused
            self._connection_change.unpark_all()
            reason = conn.close_reason or "cancelled"
            kind = conn.close_kind or CloseKind.SHUTDOWN
            self._closed_by_reason[kind.category] += 1
            log.log(
                kind.level,
                "slave %s disconnected: %s",
                peer,
                reason,
                extra={"peer": peer, "reason": reason, "ack_offset": conn.ack_offset},
            )
            # Last: under cancellation (the service stopping) the forced close re-raises it,
            # and nothing after this line would run.
            await trio.aclose_forcefully(stream)

    # --- acks and sync replication ----------------------------------------------------------
    def live_acks(self) -> list[int]:
        """The accepted ack of every streaming connection."""
        return [c.ack_offset for c in self.connections.values() if c.transferring]

    def live_vouches(self) -> list[Vouch]:
        """``(served_from, ack)`` of each streaming connection (:class:`~trioha.proto.Quorum`)."""
        return [v for c, v in self._vouches.items() if c.transferring]

    @property
    def required_acks(self) -> int:
        return self.config.required_slave_acks

    def replicated_offset(self) -> int:
        """The offset the required number of live slaves have acked (-1: not enough).

        For statistics; whether a given put is replicated also depends on where it starts.
        """
        return self._sync_quorum().highest

    def _sync_quorum(self) -> Quorum:
        """What every sync put asks of the live connections, computed once per ack."""
        quorum = self._quorum
        if quorum is None:
            quorum = self._quorum = Quorum.of(self.live_vouches(), needed_acks(self.required_acks))
        return quorum

    def on_ack(self, connection: HAConnection, offset: int) -> None:
        """*connection*'s slave now holds the log up to *offset* (``notifyTransferSome``).

        Only this connection's vouch changed, so only puts ending at or before *offset* can
        have become replicated: a put nobody waits for that low costs nothing more.
        """
        self._vouches[connection] = (connection.proto.state.served_from, offset)
        self._quorum = None
        if self.marks is not None:
            self.marks.note_slave(connection.peer_host, offset)
        if self.failover:
            self._on_in_sync_ack(connection, offset)
            return
        if len(self.timeline) > _TIMELINE_KEEP:
            acks = self.live_acks()
            if acks:
                self.timeline.acked(min(acks))
        if self._connection_change:
            self._connection_change.unpark_all()  # a first report makes it "streaming"
        if self._waiters.lowest_end <= offset:
            quorum = self._sync_quorum()
            if quorum.highest >= 0:
                self._waiters.release(min(quorum.highest, offset), quorum.holds)

    def _on_in_sync_ack(self, connection: HAConnection, offset: int) -> None:
        """Failover: tell the control core first (a slave that caught up joins the set, and
        the union takes effect before anything more is acknowledged), then release."""
        if self._connection_change:
            self._connection_change.unpark_all()
        bid = self._slave_id(connection)
        if bid is not None and self.on_replica_ack is not None:
            self.on_replica_ack(bid, offset, offset >= self.commitlog.max_offset)
        if self._waiters.lowest_end <= offset:
            self._waiters.release(offset, self.in_sync_quorum().holds)

    def notify_log_grew(self) -> None:
        """Wake every writer at once (RocketMQ's async path polls every 100 ms; we don't)."""
        self.timeline.grew(self.commitlog.max_offset)
        for conn in self.connections.values():
            conn.wakeup.notify()

    async def wait_replicated(self, end: int, *, start: int = 0) -> PutStatus:
        """Wait until *end* is on enough slaves; PUT_OK, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE.

        ``CommitLog.submitReplicaRequest`` + ``GroupTransferService`` (docs/rocketmq-protocol.md
        §5.1): a put that no slave can take in time is answered SLAVE_NOT_AVAILABLE at once; one
        that waits gets ``slave_timeout`` of its own. *start* and *end* bound the put's bytes (the
        default *start* 0 is the strictest: only connections that served from the log's start
        count).
        """
        if self.required_acks == 0:
            return PutStatus.PUT_OK
        quorum = self._sync_quorum()
        if not quorum.available(
            end, self.config.ha_slave_fallbehind_max
        ) and not self._first_reports_may_do(quorum, end):
            return PutStatus.SLAVE_NOT_AVAILABLE
        if quorum.holds(start, end):
            return PutStatus.PUT_OK
        self.notify_log_grew()
        return await self._waiters.wait(end, start=start)

    def _first_reports_may_do(self, quorum: Quorum, end: int) -> bool:
        """May connections that have not reported yet still make the quorum for *end*?

        ``HAService.isSlaveOK`` counts every accepted connection (``connectionCount``), one
        that has not reported as having acked 0 (``push2SlaveMaxOffset``). A Java slave first
        reports 5 s after connecting: a put in that window waits (``slave_timeout`` at most)
        for the report, instead of SLAVE_NOT_AVAILABLE. Only the availability test counts
        them; a put is still acked only by connections that carried it.
        """
        awaiting = sum(1 for c in self.connections.values() if not c.transferring)
        if not awaiting:
            return False
        unreported: tuple[Vouch, ...] = ((0, 0),) * awaiting
        return slaves_available(
            (*quorum.vouches, *unreported), quorum.needed, end, self.config.ha_slave_fallbehind_max
        )

    async def wait_connections(self, count: int, deadline: float = math.inf) -> bool:
        """Wait until at least *count* slaves are streaming; False at *deadline*."""
        with trio.move_on_at(deadline):
            while sum(1 for c in self.connections.values() if c.transferring) < count:
                await self._connection_change.park()
            return True
        return False

    async def wait_no_connections(self, deadline: float = math.inf) -> bool:
        """Wait until every connection has left the registry; False at *deadline*."""
        with trio.move_on_at(deadline):
            while self.connections:
                await self._connection_change.park()
            return True
        return False

    def statistics(self) -> HAServiceStatistics:
        now = trio.current_time()
        history = self.epoch_file.history if self.epoch_file is not None else None
        last = history.entries[-1] if history else None
        max_offset = self.commitlog.max_offset
        slaves = tuple(
            SlaveStatistics(
                peer=c.peer,
                ack_offset=c.ack_offset,
                lag=max_offset - c.ack_offset if c.ack_offset >= 0 else max_offset,
                bytes_sent=c.bytes_sent,
                frames_sent=c.frames_sent,
                heartbeats_sent=c.heartbeats_sent,
                connected_seconds=now - c.connected_at,
                behind_seconds=(
                    self.timeline.seconds_behind(c.ack_offset, max_offset)
                    if c.ack_offset >= 0
                    else None
                ),
            )
            for c in self.connections.values()
        )
        return HAServiceStatistics(
            address=self.address,
            slaves=slaves,
            replicated_offset=self.replicated_offset(),
            waiting_puts=len(self._waiters),
            connections_accepted=self._accepted,
            connections_closed=self._closed,
            slaves_refused=self._refused,
            lost_ranges=self.sent.lost if self.sent is not None else (),
            epoch=last.epoch if last else -1,
            epoch_start=last.start_offset if last else -1,
            closed_by_reason=dict(self._closed_by_reason),
        )


def _peer_name(stream: trio.abc.Stream) -> str:
    sock = getattr(stream, "socket", None)
    if sock is None:
        return "?"
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "?"
    return f"{host}:{port}"
