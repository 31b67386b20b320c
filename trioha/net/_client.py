"""The slave's HA client: connect, report, receive, append, report, and reconnect.

Mirrors ``HAService.HAClient`` (4.x) / ``DefaultHAClient`` (5.x) (spec §1.2, §1.6, §2.3), with
these differences on purpose (docs/replication.md):

* the first report goes out the moment the connection opens (RocketMQ waits a heartbeat
  interval, so a new slave sat idle for 5 s);
* a master silent for ``ha_housekeeping_interval`` is dropped, measured from the last byte
  *read* (5.x; 4.x measured from its own last write and so never noticed a silent master);
* an offset mismatch or a failed append closes the connection with nothing appended (RocketMQ
  ignored the append's result);
* reconnects back off from 100 ms doubling to ``ha_reconnect_backoff_max``;
* with ``ha_slave_ack_flushed`` the slave reports only what it has flushed, so an acked message
  survives a slave restart.

In epoch mode (``enable_controller_mode``, RocketMQ 5.x ``AutoSwitchHAClient``) a session
starts with the handshake; the slave cuts its log (commit log, consume queues, epoch file) to
the consistent point before its first report, and records every new epoch before the bytes
of it are appended.

Per connection, one nursery owns a reader task (receive, append) and a writer task (the only
one that sends: reports after appends and heartbeats); either ending cancels the other.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, NoReturn

import attrs
import trio

from trioha._config import BrokerConfig
from trioha._errors import ConfigError, ProtocolError, StorageError
from trioha.net._wakeup import Wakeup
from trioha.proto import (
    Append,
    Close,
    RecordEpoch,
    SendReport,
    SendSlaveHandshake,
    SlaveAction,
    SlaveConnection,
    SlaveHandshake,
    Timing,
    Truncate,
)

if TYPE_CHECKING:
    from trioha.store import CommitLog, EpochFile

log = logging.getLogger("trioha.ha")

#: Bytes asked of the transport per read. Each read costs a couple of passes through Trio's
#: scheduler and ends in one report, so during a catch-up fewer, larger reads cost less; a
#: read returns at once with whatever has arrived, so latency does not depend on it.
READ_SIZE = 1024 * 1024
CONNECT_TIMEOUT = 5.0  # RemotingUtil.connect's 5000 ms
INITIAL_BACKOFF = 0.1

Connector = Callable[[str, int], Awaitable[trio.abc.Stream]]
#: Cuts the replica (commit log, consume queues) back to an offset; raises StorageError.
Truncator = Callable[[int], Awaitable[None]]


@attrs.frozen
class HAClientStatistics:
    master: str
    connected: bool
    reported_offset: int
    bytes_received: int
    connects: int
    last_close_reason: str | None
    #: Epoch mode: the newest epoch this slave holds (0: none yet; -1: classic mode).
    last_epoch: int = -1
    #: Epoch mode: cuts to a consistent point, as ``(from, to)`` offsets, oldest first.
    truncations: tuple[tuple[int, int], ...] = ()


class _Session:
    """One connection's reader and writer around a sans-IO :class:`SlaveConnection`."""

    def __init__(self, client: HAClient, stream: trio.abc.Stream, proto: SlaveConnection) -> None:
        self.client = client
        self.stream = stream
        self.proto = proto
        self.wakeup = Wakeup()
        self.report: int | None = None
        self.handshake_pending = False
        self.close_reason: str | None = None
        self.received_data = False
        #: Epoch mode: where the histories part, when the master's says the slave diverged.
        self.diverged_at: int | None = None

    def _end(self, reason: str, scope: trio.CancelScope) -> None:
        if self.close_reason is None:
            self.close_reason = reason
        scope.cancel()

    def _apply(self, actions: tuple[SlaveAction, ...] | list[SlaveAction],
               scope: trio.CancelScope) -> bool:
        """Queue reports and note closes; returns False when the session must end."""
        for action in actions:
            if isinstance(action, SendReport):
                self.report = action.offset
                self.wakeup.notify()
            elif isinstance(action, SendSlaveHandshake):
                self.handshake_pending = True
                self.wakeup.notify()
            elif isinstance(action, Close):
                if action.diverged_at is not None:
                    self.diverged_at = action.diverged_at
                self._end(action.reason, scope)
                return False
        return True

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._apply(self.proto.initial_actions(), nursery.cancel_scope)
            nursery.start_soon(self._reader, nursery.cancel_scope)
            nursery.start_soon(self._writer, nursery.cancel_scope)

    async def _reader(self, scope: trio.CancelScope) -> None:
        commitlog = self.client.commitlog
        try:
            while True:
                data = await self.stream.receive_some(READ_SIZE)
                if not data:
                    self._end("master closed the connection", scope)
                    return
                actions = self.proto.receive_data(data, now=trio.current_time())
                appended = False
                for action in actions:
                    if isinstance(action, Truncate | RecordEpoch):
                        try:
                            await self.client.execute(action)
                        except (StorageError, ProtocolError) as exc:  # ProtocolError: EpochError
                            if isinstance(action, Truncate):
                                what = f"cut the log back to the consistent point {action.offset}"
                            else:
                                what = f"record epoch {action.epoch} from {action.start_offset}"
                            log.error("cannot %s (master %s): %s", what, self.client.master, exc)
                            self._end(f"cannot {what}: {exc}", scope)
                            return
                    elif isinstance(action, Append):
                        try:
                            commitlog.append_raw(action.offset, action.data)
                        except StorageError as exc:
                            self._end(f"cannot append {action.size} bytes at {action.offset}: "
                                      f"{exc}", scope)
                            return
                        appended = True
                        self.received_data = True
                    elif not self._apply((action,), scope):
                        return
                if appended:
                    self.client.on_appended()
                    ack = await self.client.ack_offset()
                    if not self._apply(self.proto.appended(ack, now=trio.current_time()), scope):
                        return
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._end(f"connection broken while reading: {exc or type(exc).__name__}", scope)

    async def _writer(self, scope: trio.CancelScope) -> None:
        try:
            while True:
                if self.handshake_pending:
                    self.handshake_pending = False
                    await self.stream.send_all(self.proto.encode(SendSlaveHandshake()))
                    self.proto.report_written(now=trio.current_time())
                    continue
                if self.report is not None:
                    offset, self.report = self.report, None
                    await self.stream.send_all(self.proto.encode(SendReport(offset)))
                    self.proto.report_written(now=trio.current_time())
                    self.client.reported_offset = offset
                    continue
                if not self._apply(self.proto.tick(now=trio.current_time()), scope):
                    return
                if self.report is None:
                    deadline = min(self.proto.heartbeat_deadline, self.proto.read_deadline)
                    await self.wakeup.wait(deadline)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._end(f"connection broken while writing: {exc or type(exc).__name__}", scope)


class HAClient:
    """Keeps the slave connected to its master and its commit log following the master's."""

    def __init__(
        self,
        config: BrokerConfig,
        commitlog: CommitLog,
        *,
        connect: Connector | None = None,
        on_appended: Callable[[], None] | None = None,
        epoch_file: EpochFile | None = None,
        truncate: Truncator | None = None,
    ) -> None:
        master = config.ha_master
        if master is None:
            raise ConfigError("a slave needs ha_master_address (HOST:PORT of the master's HA port)")
        self.config = config
        self.commitlog = commitlog
        self.master_host, self.master_port = master
        self._connect = connect or _open_tcp
        self._on_appended = on_appended
        self.timing = Timing.from_millis(
            config.ha_send_heartbeat_interval, config.ha_housekeeping_interval
        )
        self.connected = False
        self.connects = 0
        self.reported_offset = -1
        self.bytes_received = 0
        self.last_close_reason: str | None = None
        self._state_change = trio.lowlevel.ParkingLot()
        if config.enable_controller_mode and epoch_file is None:
            raise ConfigError("epoch mode (enable_controller_mode) needs the store's epoch file")
        #: Epoch mode: this slave's epoch history (None: classic mode).
        self.epoch_file = epoch_file if config.enable_controller_mode else None
        self._truncate = truncate
        #: Epoch mode: cuts made to reach a consistent point, as ``(from, to)`` offsets.
        self.truncations: list[tuple[int, int]] = []

    @property
    def master(self) -> str:
        return f"{self.master_host}:{self.master_port}"

    def on_appended(self) -> None:
        if self._on_appended is not None:
            self._on_appended()

    async def execute(self, action: Truncate | RecordEpoch) -> None:
        """Epoch mode: cut the replica to the consistent point, or record a new epoch."""
        epoch_file = self.epoch_file
        assert epoch_file is not None
        if isinstance(action, RecordEpoch):
            await trio.to_thread.run_sync(epoch_file.append, action.epoch, action.start_offset)
            log.info("epoch %d begins at %d (from master %s)", action.epoch,
                     action.start_offset, self.master)
            return
        before = self.commitlog.max_offset
        if self._truncate is not None:
            await self._truncate(action.offset)
        else:
            await trio.to_thread.run_sync(self.commitlog.truncate_to_boundary, action.offset)
        await trio.to_thread.run_sync(epoch_file.truncate_suffix, action.offset)
        self.truncations.append((before, action.offset))
        log.warning(
            "cut this slave's log back from %d to %d, the consistent point with master %s: "
            "the bytes after it were not the master's history (kept in lost+found)",
            before, action.offset, self.master,
        )

    async def ack_offset(self) -> int:
        """What to report after an append: the written end, or the flushed end if acks must be."""
        if self.config.ha_slave_ack_flushed:
            return await trio.to_thread.run_sync(self.commitlog.flush)
        return self.commitlog.max_offset

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> NoReturn:
        """Connect, replicate, and reconnect with a capped backoff, forever."""
        task_status.started()
        backoff = INITIAL_BACKOFF
        cap = self.config.ha_reconnect_backoff_max / 1000
        while True:
            try:
                with trio.fail_after(CONNECT_TIMEOUT):
                    stream = await self._connect(self.master_host, self.master_port)
            except (OSError, trio.TooSlowError) as exc:
                reason = "timed out" if isinstance(exc, trio.TooSlowError) else str(exc)
                log.warning("cannot connect to master %s: %s; retrying in %.1f s",
                            self.master, reason, backoff)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, cap)
                continue
            if await self.session(stream):
                backoff = INITIAL_BACKOFF
            await trio.sleep(backoff)
            backoff = min(backoff * 2, cap)

    async def session(self, stream: trio.abc.Stream) -> bool:
        """Replicate over one connection until it ends; True if any data was received."""
        try:
            if self.config.ha_slave_ack_flushed:
                await trio.to_thread.run_sync(self.commitlog.flush)
            log_max = self.commitlog.max_offset
            epochs = None
            if self.epoch_file is not None:
                # AutoSwitchHAClient's READY: epochs past the end of the log describe nothing.
                await trio.to_thread.run_sync(self.epoch_file.truncate_suffix, log_max)
                epochs = self.epoch_file.history
            proto = SlaveConnection(
                log_max=log_max,
                now=trio.current_time(),
                timing=self.timing,
                peer=self.master,
                epochs=epochs,
                handshake=SlaveHandshake(
                    sync_from_last_file=self.config.sync_from_last_file,
                    broker_id=self.config.broker_id,
                ),
            )
            session = _Session(self, stream, proto)
            self.connects += 1
            self._set_connected(True)
            log.info("connected to master %s; requesting from offset %d", self.master, log_max)
            try:
                await session.run()
            finally:
                self.bytes_received += proto.bytes_received
                proto.connection_lost()
                self._set_connected(False)
                self.last_close_reason = session.close_reason
                if session.diverged_at is not None:
                    log.error("this slave's log (end %d) is not a prefix of master %s's and "
                              "cannot continue from it: %s", self.commitlog.max_offset,
                              self.master, session.close_reason)
                else:
                    log.info("disconnected from master %s: %s", self.master,
                             session.close_reason or "cancelled")
            return session.received_data
        finally:
            await trio.aclose_forcefully(stream)

    def _set_connected(self, value: bool) -> None:
        self.connected = value
        self._state_change.unpark_all()

    async def wait_connected(self, deadline: float = math.inf, *, connects: int = 1) -> bool:
        """Wait until connected for (at least) the *connects*-th time; False at *deadline*."""
        with trio.move_on_at(deadline):
            while not self.connected or self.connects < connects:
                await self._state_change.park()
            return True
        return False

    def statistics(self) -> HAClientStatistics:
        return HAClientStatistics(
            master=self.master,
            connected=self.connected,
            reported_offset=self.reported_offset,
            bytes_received=self.bytes_received,
            connects=self.connects,
            last_close_reason=self.last_close_reason,
            last_epoch=-1 if self.epoch_file is None else self.epoch_file.history.last_epoch,
            truncations=tuple(self.truncations),
        )


async def _open_tcp(host: str, port: int) -> trio.abc.Stream:
    return await trio.open_tcp_stream(host, port)
