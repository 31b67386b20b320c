"""The master's HA service: accept slaves, keep a registry, wait for replication.

Mirrors ``HAService`` with ``AcceptSocketService`` and ``GroupTransferService`` (spec §2.1,
§2.4). Differences, on purpose (docs/replication.md):

* a connection is added to the registry *before* its tasks start and removed in a ``finally``
  (RocketMQ #8875 leaked connections added after they had already failed);
* acks are tracked per live connection, and a sync put needs ``in_sync_replicas - 1`` of them
  (5.x semantics), not the maximum ack ever seen from anyone (``push2SlaveMaxOffset``);
* waiting puts sit in a heap ordered by the offset they need; one ack releases every put it
  covers at once (group commit), with no polling; each put's ``slave_timeout`` is its own
  (:class:`~trioha.net._waiters.OffsetWaiters`).
"""

from __future__ import annotations

import itertools
import logging
import math
from typing import TYPE_CHECKING, NoReturn

import attrs
import trio

from trioha._config import BrokerConfig
from trioha._errors import ConfigError
from trioha._status import PutStatus
from trioha.net._connection import HAConnection
from trioha.net._waiters import OffsetWaiters
from trioha.proto import (
    MasterOptions,
    Timing,
    Vouch,
    replicated_offset,
    slaves_available,
    vouch,
)

if TYPE_CHECKING:
    from trioha.store import CommitLog, EpochFile

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


class HAService:
    """Accepts slave connections and answers "is this offset replicated?"."""

    def __init__(
        self, config: BrokerConfig, commitlog: CommitLog, *, epoch_file: EpochFile | None = None
    ) -> None:
        self.config = config
        self.commitlog = commitlog
        if config.enable_controller_mode and epoch_file is None:
            raise ConfigError("epoch mode (enable_controller_mode) needs the store's epoch file")
        #: Epoch mode: the master's epoch history, begun anew at this start (None: classic).
        self.epoch_file = epoch_file if config.enable_controller_mode else None
        self.options = MasterOptions(
            batch_size=config.ha_transfer_batch_size,
            sync_from_oldest=config.ha_sync_from_oldest,
            epoch_mode=config.enable_controller_mode,
        )
        self.timing = Timing.from_millis(
            config.ha_send_heartbeat_interval, config.ha_housekeeping_interval
        )
        self.address: tuple[str, int] | None = None
        self.connections: dict[int, HAConnection] = {}
        self._ids = itertools.count(1)
        self._view: _SyncView | None = None  # cached; dropped on every ack and registry change
        self._waiters = OffsetWaiters(
            config.slave_timeout / 1000,
            covered=PutStatus.PUT_OK,
            expired=PutStatus.FLUSH_SLAVE_TIMEOUT,
        )
        self._accepted = 0
        self._closed = 0
        self._connection_change = trio.lowlevel.ParkingLot()

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
                f"cannot listen for slaves on {host}:{port}: {exc.strerror or exc}"
            ) from None
        sockname = listeners[0].socket.getsockname()
        self.address = (sockname[0], sockname[1])
        log.info("HA service listening on %s:%d", *self.address)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.time_out_puts)
            task_status.started(self.address)
            await trio.serve_listeners(self.handle_stream, listeners)
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
        )
        conn_id = next(self._ids)
        self.connections[conn_id] = conn
        self._view = None
        self._accepted += 1
        self._connection_change.unpark_all()
        log.info("slave connected from %s", peer)
        try:
            await conn.run()
        except Exception:
            conn.close_reason = conn.close_reason or "internal error"
            log.exception("HA connection with %s failed", peer)
        finally:
            del self.connections[conn_id]
            self._view = None
            self._closed += 1
            self._connection_change.unpark_all()
            await trio.aclose_forcefully(stream)
            log.info("slave %s disconnected: %s", peer, conn.close_reason or "cancelled")

    # --- acks and sync replication ----------------------------------------------------------
    def live_acks(self) -> list[int]:
        """The accepted ack of every streaming connection."""
        return [c.ack_offset for c in self.connections.values() if c.transferring]

    def live_vouches(self) -> list[Vouch]:
        """``(served_from, ack)`` of each streaming connection (``proto.replicated_offset``)."""
        return [vouch(c.proto.state) for c in self.connections.values() if c.transferring]

    @property
    def required_acks(self) -> int:
        return self.config.required_slave_acks

    def replicated_offset(self) -> int:
        """The offset the required number of live slaves have acked (-1: not enough).

        For statistics; whether a given put is replicated also depends on where it starts.
        """
        return replicated_offset(self.live_vouches(), max(1, self.required_acks))

    def _sync_view(self) -> _SyncView:
        """What every sync put asks of the live connections, computed once per ack."""
        view = self._view
        if view is None:
            vouches = tuple(self.live_vouches())
            needed = max(1, self.required_acks)
            view = self._view = _SyncView(
                vouches,
                needed,
                replicated_offset(vouches, needed),
                max((served_from for served_from, _ack in vouches), default=0),
            )
        return view

    def on_ack(self, connection: HAConnection, offset: int) -> None:
        self._view = None
        if self._connection_change:
            self._connection_change.unpark_all()  # a first report makes it "streaming"
        if self._waiters:
            view = self._sync_view()
            if view.highest >= 0:
                self._waiters.release(view.highest, view.holds)

    def notify_log_grew(self) -> None:
        """Wake every writer at once (RocketMQ's async path polls every 100 ms; we don't)."""
        for conn in self.connections.values():
            conn.wakeup.notify()

    async def wait_replicated(self, end: int, *, start: int = 0) -> PutStatus:
        """Wait until *end* is on enough slaves; PUT_OK, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE.

        ``CommitLog.submitReplicaRequest`` + ``GroupTransferService`` (spec §5.1): a put that no
        slave can take in time is answered SLAVE_NOT_AVAILABLE at once; one that waits gets
        ``slave_timeout`` of its own. *start* and *end* bound the put's bytes (the default
        *start* 0 is the strictest: only connections that served from the log's start count).
        """
        if self.required_acks == 0:
            return PutStatus.PUT_OK
        view = self._sync_view()
        if not slaves_available(
            view.vouches, view.needed, end, self.config.ha_slave_fallbehind_max
        ):
            return PutStatus.SLAVE_NOT_AVAILABLE
        if view.highest >= end and view.holds(start, end):
            return PutStatus.PUT_OK
        self.notify_log_grew()
        return await self._waiters.wait(end, start=start)

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
            epoch=last.epoch if last else -1,
            epoch_start=last.start_offset if last else -1,
        )


@attrs.frozen
class _SyncView:
    """The live connections' vouches, and what follows from them for every waiting put."""

    vouches: tuple[Vouch, ...]
    needed: int
    highest: int  # replicated_offset(vouches, needed): the most any put can be covered to
    latest_served_from: int

    def holds(self, start: int, end: int) -> bool:
        """Do *needed* connections that carried ``[start, end)`` vouch for it?"""
        # A put starting at or after every connection's served_from is covered by all of them;
        # otherwise only the connections that carried it count: one served from later on (a
        # slave that reconnected empty) does not vouch for it, and the put stays until one that
        # did acks it, or it times out.
        if start >= self.latest_served_from:
            return self.highest >= end
        return replicated_offset(self.vouches, self.needed, start) >= end


def _peer_name(stream: trio.abc.Stream) -> str:
    sock = getattr(stream, "socket", None)
    if sock is None:
        return "?"
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "?"
    return f"{host}:{port}"
