"""The slave's HA client: connect, report, receive, append, report, and reconnect.

Mirrors ``HAService.HAClient`` (4.x) / ``DefaultHAClient`` (5.x) (docs/rocketmq-protocol.md §1.2,
§1.6, §2.3), with these differences on purpose (docs/replication.md):

* the first report goes out the moment the connection opens (RocketMQ waits a heartbeat
  interval, so a new slave sat idle for 5 s);
* a master silent for ``ha_housekeeping_interval`` is dropped, measured from the last byte
  *read* (5.x; 4.x measured from its own last write and so never noticed a silent master);
* an offset mismatch or a failed append closes the connection with nothing appended (RocketMQ
  ignored the append's result);
* reconnects back off from 100 ms doubling to ``ha_reconnect_backoff_max``;
* with ``ha_slave_ack_flushed`` the slave reports only what it has flushed, so an acked message
  survives a slave restart;
* an append the disk refuses (ENOSPC, EIO) pauses replication: the connection is dropped,
  one ERROR says why, and the slave reconnects every ``cleanResourceInterval`` until an
  append works again (RocketMQ's slave kept reconnecting at once);
* a peer that is not an HA master (a broker or name server port given by mistake) is
  recognised by what it does and named in a WARNING (:func:`not_ha_sign`);
* a master that says the two logs are not one history (a frame not at the slave's end: see
  ``proto.Close.diverged_at``) puts the client in a sticky *diverged* state, logged at ERROR
  with both offsets, recorded in ``<store>/haDiverged`` so that a restart remembers it, and
  shown by ``statistics()``: it stops replicating (no reconnect loop) until the operator cuts
  the log back (``trioha slave --truncate-to-master``, which reads that file) or re-seeds it;
* a master whose retention deleted what the slave needs next says so with a heartbeat past the
  slave's end (``proto.Close.oldest``; RocketMQ's master heartbeats forever instead, #3388):
  one ERROR names both offsets and says to re-seed, and the client stops (*fell behind*,
  shown by ``statistics()``) until the slave is restarted, re-seeded.

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
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, assert_never

import attrs
import trio

from trioha._config import BrokerConfig
from trioha._errors import (
    ConfigError,
    NotAMessageBoundaryError,
    ProtocolError,
    StorageError,
    StoreLayoutError,
)
from trioha.net._wakeup import Wakeup
from trioha.proto import (
    Append,
    Close,
    CloseKind,
    RecordEpoch,
    SendReport,
    SendSlaveHandshake,
    SlaveAction,
    SlaveConnection,
    SlaveHandshake,
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
#: While diverged, the ERROR is repeated this often (seconds) so that it cannot be missed.
DIVERGED_REMINDER = 60.0
DIVERGED_FILE = "haDiverged"

Connector = Callable[[str, int], Awaitable[trio.abc.Stream]]
#: Cuts the replica (commit log, consume queues) back to an offset; raises StorageError.
Truncator = Callable[[int], Awaitable[None]]


@attrs.frozen
class Divergence:
    """The slave's log and its master's are not one history (the sticky state)."""

    #: Where the master says the histories part: the master's log is the slave's up to here.
    master_offset: int
    #: Where the slave's log ended when it was told.
    slave_offset: int
    master: str
    reason: str

    def describe(self) -> str:
        return (
            f"diverged from master {self.master}: the master's history ends at "
            f"{self.master_offset} where this slave's differs, and this slave holds up to "
            f"{self.slave_offset} ({self.reason}). Replication is stopped: cut this slave back "
            f"to {self.master_offset} with `trioha slave --truncate-to-master` (the cut bytes "
            "are kept in lost+found) or re-seed it"
        )

    def to_text(self) -> str:
        return (
            f"master_offset {self.master_offset}\nslave_offset {self.slave_offset}\n"
            f"master {self.master}\nreason {self.reason.replace(chr(10), ' ')}\n"
        )

    @classmethod
    def read(cls, path: Path) -> Divergence | None:
        """The recorded divergence at ``path``, None without one."""
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise StoreLayoutError(f"cannot read {path}: {exc}") from None
        fields = dict(line.partition(" ")[::2] for line in text.splitlines() if line)
        try:
            return cls(
                int(fields["master_offset"]),
                int(fields["slave_offset"]),
                fields.get("master", "?"),
                fields.get("reason", ""),
            )
        except (KeyError, ValueError):
            raise StoreLayoutError(
                f"{path} does not record a divergence as trioha writes it ({text[:80]!r}); "
                "check it and remove it by hand if the slave was re-seeded"
            ) from None

    def write(self, path: Path) -> None:
        temp = path.with_name(path.name + ".tmp")
        try:
            temp.write_text(self.to_text(), encoding="utf-8")
            with open(temp, "rb") as handle:
                os.fsync(handle.fileno())
            os.replace(temp, path)
        except OSError as exc:
            log.error("cannot record the divergence in %s: %s", path, exc)


@attrs.frozen
class FellBehind:
    """What this slave needs next was deleted on its master (the sticky state)."""

    #: Where the master's log now begins.
    master_offset: int
    #: Where this slave's log ends.
    slave_offset: int
    master: str

    def describe(self) -> str:
        return (
            f"fell behind master {self.master}: this slave's log ends at {self.slave_offset}, "
            f"but the master's now begins at {self.master_offset}; the master deleted "
            f"[{self.slave_offset}, {self.master_offset}) (retention: fileReservedTime or a "
            "full disk) before this slave fetched it, so it can never catch up (RocketMQ "
            "#3388). Replication is stopped: re-seed this slave (stop it, empty its store or "
            "copy the master's, start it again; an empty slave copies from the master's last "
            "file, or from its oldest with haSyncFromOldest=true on the master)"
        )


@attrs.frozen
class HAClientStatistics:
    master: str
    connected: bool
    reported_offset: int
    bytes_received: int
    connects: int
    last_close_reason: str | None
    #: Why appends fail now (a full disk), or None while they work.
    append_error: str | None = None
    #: Sticky: this slave must be cut back or re-seeded before it replicates again.
    needs_reseed: bool = False
    #: Where the master's history ends (it parts from this slave's there); -1 if not diverged.
    diverged_master_offset: int = -1
    #: Where this slave's log ended when it was told; -1 if not diverged.
    diverged_slave_offset: int = -1
    #: Sticky until a restart: the master deleted what this slave needs next; where the
    #: master's log begins now (-1: not so).
    fell_behind_master_offset: int = -1
    #: Epoch mode: the newest epoch this slave holds (0: none yet; -1: classic mode).
    last_epoch: int = -1
    #: Epoch mode: cuts to a consistent point, as ``(from, to)`` offsets, oldest first.
    truncations: tuple[tuple[int, int], ...] = ()
    #: Replicated bytes written to this slave's commit log.
    bytes_appended: int = 0
    #: Connections to the master that ended (or could not be made), by kind of reason.
    closed_by_reason: dict[str, int] = attrs.field(factory=dict)
    #: ``connected``, ``connecting``, ``disk_full``, ``diverged`` or ``fell_behind``.
    state: str = "connecting"
    #: The master's log end as last learned (metadata sync), and how far this log is behind
    #: it; None until learned.
    master_end: int | None = None
    behind_bytes: int | None = None
    #: MySQL's Seconds_Behind_Master for this slave: 0 when it holds the master's end as last
    #: learned, else now minus the store timestamp of the last message it holds; None until
    #: the master's end is learned (or with no complete message to date it by).
    behind_seconds: float | None = None


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
        #: The kind of the close, decided with ``close_reason`` (None: cancelled).
        self.close_kind: CloseKind | None = None
        self.received_data = False
        #: The first bytes the master sent (what :func:`not_ha_sign` looks at).
        self.first_bytes = b""
        #: The master's bytes did not parse as HA frames.
        self.protocol_error = False
        #: The master's bytes parsed as at least one HA frame header or handshake.
        self.spoke_ha = False
        #: An append the disk refused (its StorageError chains the OSError).
        self.disk_error: StorageError | None = None
        self.started = trio.current_time()
        #: The offset this session asked the master for (its first report).
        self.requested = proto.state.expected
        #: The master pushed this offset where the slave's log does not end (a divergence).
        #: Epoch mode: where the histories part, when the master's says the slave diverged.
        self.diverged_at: int | None = None
        #: The master's oldest offset, past this slave's end: what it needs was deleted.
        self.deleted_to: int | None = None

    def _end(self, kind: CloseKind, reason: str, scope: trio.CancelScope) -> None:
        if self.close_reason is None:
            self.close_reason, self.close_kind = reason, kind
        scope.cancel()

    def _apply(
        self, actions: tuple[SlaveAction, ...] | list[SlaveAction], scope: trio.CancelScope
    ) -> bool:
        """Queue reports and note closes; returns False when the session must end.

        These are the actions of the core's answers that touch no store (its first
        actions, a tick, an append confirmed); the store's actions come only from a read,
        which :meth:`_reader` executes.
        """
        for action in actions:
            match action:
                case SendReport():
                    self.report = action.offset
                    self.wakeup.notify()
                case SendSlaveHandshake():
                    self.handshake_pending = True
                    self.wakeup.notify()
                case Close():
                    if action.diverged_at is not None:
                        self.diverged_at = action.diverged_at
                    if action.oldest is not None:
                        self.deleted_to = action.oldest
                    self._end(action.kind, action.reason, scope)
                    return False
                case Append() | Truncate() | RecordEpoch():
                    raise AssertionError(f"a store action outside a read: {action}")
                case _:
                    assert_never(action)
        return True

    def _disk_failed(self, exc: StorageError) -> CloseKind:
        """A write or flush the store refused: a disk error (ENOSPC, EIO, kept in
        ``disk_error``: replication pauses) when an OSError is its cause."""
        if isinstance(exc.__cause__, OSError):
            self.disk_error = exc
            return CloseKind.DISK
        return CloseKind.PROTOCOL_ERROR

    def _store_failed(
        self, action: Truncate | RecordEpoch, exc: StorageError | ProtocolError
    ) -> tuple[CloseKind, str]:
        """A cut or an epoch record that failed: said at ERROR; the close's kind and reason.

        A consistent point inside one of this slave's records (RocketMQ's truncateFiles
        "need manual fix") cannot be reached by any cut at a boundary that keeps only the
        master's bytes; retrying cannot help: the slave stops, as a refused slave does,
        until it is re-seeded. A store that refused is the disk's; an epoch the history
        refuses (EpochError), the protocol's.
        """
        if isinstance(action, Truncate):
            what = f"cut the log back to the consistent point {action.offset}"
        else:
            what = f"record epoch {action.epoch} from {action.start_offset}"
        log.error("cannot %s (master %s): %s", what, self.client.master, exc)
        reason = f"cannot {what}: {exc}"
        if isinstance(action, Truncate) and isinstance(exc, NotAMessageBoundaryError):
            self.diverged_at = action.offset
            return CloseKind.DIVERGED, reason
        if isinstance(exc, StorageError):
            return CloseKind.DISK, reason
        return CloseKind.PROTOCOL_ERROR, reason

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
                    self._end(CloseKind.PEER_CLOSED, "master closed the connection", scope)
                    return
                if len(self.first_bytes) < _SNIFF:
                    self.first_bytes += bytes(data[: _SNIFF - len(self.first_bytes)])
                actions = self.proto.receive_data(data, now=trio.current_time())
                if not self.received_data and any(
                    isinstance(a, Close) and a.diverged_at is None and a.oldest is None
                    for a in actions
                ):
                    self.protocol_error = True  # bytes that are no HA frame, not a refusal
                elif self.proto.bytes_received > self.proto.buffered and not any(
                    isinstance(a, Close) for a in actions
                ):
                    self.spoke_ha = True  # a whole header or handshake parsed and accepted
                appended = ended = False
                for action in actions:
                    match action:
                        case Truncate() | RecordEpoch():
                            try:
                                await self.client.execute(action)
                            except (StorageError, ProtocolError) as exc:  # EpochError
                                self._end(*self._store_failed(action, exc), scope)
                                ended = True
                                break
                        case Append():
                            try:
                                if not self.client.replicating:
                                    await self.client.become_replica()
                                commitlog.append_raw(action.offset, action.data)
                            except StorageError as exc:
                                self._end(
                                    self._disk_failed(exc),
                                    f"cannot append {action.size} bytes at {action.offset}: {exc}",
                                    scope,
                                )
                                ended = True
                                break
                            appended = True
                            self.client.bytes_appended += action.size
                            self.received_data = True
                            self.client.append_worked()
                        case SendReport() | SendSlaveHandshake() | Close():
                            if not self._apply((action,), scope):
                                ended = True
                                break
                        case _:
                            assert_never(action)
                if appended:
                    # Also when the batch ended the session (a bad frame after good ones): the
                    # bytes appended are in the log, and whoever waits for it to grow is told.
                    self.client.on_appended()
                if ended:
                    return
                if appended:
                    try:
                        ack = await self.client.ack_offset()
                    except StorageError as exc:  # ha_slave_ack_flushed: the fsync failed
                        self._end(
                            self._disk_failed(exc), f"cannot flush what was appended: {exc}", scope
                        )
                        return
                    if not self._apply(self.proto.appended(ack, now=trio.current_time()), scope):
                        return
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._end(
                CloseKind.BROKEN,
                f"connection broken while reading: {str(exc) or type(exc).__name__}",
                scope,
            )

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
            self._end(
                CloseKind.BROKEN,
                f"connection broken while writing: {str(exc) or type(exc).__name__}",
                scope,
            )


class HAClient:
    """Keeps the slave connected to its master and its commit log following the master's."""

    def __init__(
        self,
        config: BrokerConfig,
        commitlog: CommitLog,
        *,
        connect: Connector | None = None,
        on_appended: Callable[[], None] | None = None,
        diverged_file: Path | None = None,
        epoch_file: EpochFile | None = None,
        truncate: Truncator | None = None,
        wall_clock: Callable[[], float] = time.time,
        master_epoch: int = 0,
        become_replica: Callable[[], object] | None = None,
    ) -> None:
        master = config.ha_master
        if master is None:
            raise ConfigError("a slave needs ha_master_address (HOST:PORT of the master's HA port)")
        self.config = config
        self.commitlog = commitlog
        self.master_host, self.master_port = master
        self._connect = connect or _open_tcp
        self._on_appended = on_appended
        #: Seconds since the epoch, what store timestamps count from (seconds behind).
        self.wall_clock = wall_clock
        self.timing = config.ha_timing
        self.connected = False
        self.connects = 0
        self.reported_offset = -1
        self.bytes_received = 0
        self.bytes_appended = 0
        #: The current connection's protocol state (its bytes count until it ends).
        self._live: SlaveConnection | None = None
        self._closed_by_reason: dict[str, int] = {}
        #: The master's log end as last learned (:meth:`learn_master_end`); -1: not yet.
        self.master_end = -1
        self.last_close_reason: str | None = None
        self.append_error: str | None = None
        #: How long to wait before trying again when the disk refuses appends.
        self.disk_retry = config.clean_resource_interval / 1000
        self._not_ha_warned = False
        self._state_change = trio.lowlevel.ParkingLot()
        #: Where the sticky divergence is recorded (None: kept in memory only).
        self.diverged_file = diverged_file
        self.divergence = Divergence.read(diverged_file) if diverged_file is not None else None
        #: Set when the master deleted what this slave needs next; kept until a restart (a
        #: re-seed restarts the slave anyway).
        self.fell_behind: FellBehind | None = None
        if config.enable_controller_mode and epoch_file is None:
            raise ConfigError("epoch mode (enable_controller_mode) needs the store's epoch file")
        #: Epoch mode: this slave's epoch history (None: classic mode).
        self.epoch_file = epoch_file if config.enable_controller_mode else None
        self._truncate = truncate
        #: Epoch mode: cuts made to reach a consistent point, as ``(from, to)`` offsets.
        self.truncations: list[tuple[int, int]] = []
        #: Automatic failover: the epoch etcd names the master at; a master at another is
        #: refused (0: any).
        self.master_epoch = master_epoch
        #: Run (blocking, once) before the first replicated byte is appended: the store
        #: stops being a former master's (its master marks are removed).
        self._become_replica = become_replica
        #: Whether a byte from a master has been appended by this process.
        self.replicating = False
        #: Whether the peer has ever answered like an HA master (then an immediate close is
        #: a restart, a network blip or a refusal, never a wrong port).
        self._spoke_ha = False

    @property
    def master(self) -> str:
        return f"{self.master_host}:{self.master_port}"

    def on_appended(self) -> None:
        if self._on_appended is not None:
            self._on_appended()

    async def become_replica(self) -> None:
        """Before the first replicated append: the store now follows a master's history,
        so marks it kept as a master no longer describe it (raises StorageError)."""
        if self._become_replica is not None:
            await trio.to_thread.run_sync(self._become_replica)
        self.replicating = True

    async def execute(self, action: Truncate | RecordEpoch) -> None:
        """Epoch mode: cut the replica to the consistent point, or record a new epoch."""
        epoch_file = self.epoch_file
        assert epoch_file is not None
        if isinstance(action, RecordEpoch):
            await trio.to_thread.run_sync(epoch_file.append, action.epoch, action.start_offset)
            log.info(
                "epoch %d begins at %d (from master %s)",
                action.epoch,
                action.start_offset,
                self.master,
            )
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
            before,
            action.offset,
            self.master,
        )

    async def ack_offset(self) -> int:
        """What to report after an append: the written end, or the flushed end if acks must be."""
        if self.config.ha_slave_ack_flushed:
            return await trio.to_thread.run_sync(self.commitlog.flush)
        return self.commitlog.max_offset

    async def run(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> NoReturn:
        """Connect, replicate, and reconnect with a capped backoff, forever."""
        task_status.started()
        backoff = INITIAL_BACKOFF
        cap = self.config.ha_reconnect_backoff_max / 1000
        while True:
            if self.divergence is not None:
                await self._stay_diverged()
            while self.fell_behind is not None:  # nothing to fetch ever again from this master
                await self._state_change.park()
            try:
                with trio.fail_after(CONNECT_TIMEOUT):
                    stream = await self._connect(self.master_host, self.master_port)
            except (OSError, trio.TooSlowError) as exc:
                reason = "timed out" if isinstance(exc, trio.TooSlowError) else str(exc)
                self._count_close(CloseKind.CONNECT_FAILED)
                log.warning(
                    "cannot connect to master %s: %s; retrying in %.1f s",
                    self.master,
                    reason,
                    backoff,
                )
                await trio.sleep(backoff)
                backoff = min(backoff * 2, cap)
                continue
            if await self.session(stream):
                backoff = INITIAL_BACKOFF
            wait = backoff
            if self.append_error is not None:
                wait = max(wait, self.disk_retry)  # no point in refetching into a full disk
            await trio.sleep(wait)
            backoff = min(backoff * 2, cap)

    async def session(self, stream: trio.abc.Stream) -> bool:
        """Replicate over one connection until it ends; True if any data was received."""
        try:
            if self.config.ha_slave_ack_flushed:
                try:
                    await trio.to_thread.run_sync(self.commitlog.flush)
                except StorageError as exc:
                    if not isinstance(exc.__cause__, OSError):
                        raise
                    if self.append_error is None:
                        log.error(
                            "slave cannot flush its commit log: %s; retrying every %g s",
                            exc,
                            self.disk_retry,
                        )
                    self.append_error = str(exc)
                    return False
                self._disk_works("flushes its commit log")
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
                master_epoch=self.master_epoch,
            )
            session = _Session(self, stream, proto)
            self._live = proto
            self.connects += 1
            self._set_connected(True)
            log.info("connected to master %s; requesting from offset %d", self.master, log_max)
            try:
                await session.run()
            finally:
                self.bytes_received += proto.bytes_received
                self._live = None
                proto.connection_lost()
                self._set_connected(False)
                self.last_close_reason = session.close_reason
                reason = session.close_reason or "cancelled"
                kind = session.close_kind or CloseKind.SHUTDOWN
                self._count_close(kind)
                if session.disk_error is None:
                    log.log(kind.level, "disconnected from master %s: %s", self.master, reason)
            if session.diverged_at is not None:
                self._diverged(session.diverged_at, log_max, session.close_reason or "")
            if session.deleted_to is not None:
                end = self.commitlog.max_offset
                self.fell_behind = FellBehind(session.deleted_to, end, self.master)
                log.error(
                    "%s",
                    self.fell_behind.describe(),
                    extra={"peer": self.master, "offset": end, "reason": "fell_behind"},
                )
                self._state_change.unpark_all()
            self._after_session(session)
            return session.received_data
        finally:
            await trio.aclose_forcefully(stream)

    def append_worked(self) -> None:
        """An append succeeded: the end of a disk-full spell, if there was one."""
        self._disk_works("appends replicated data")

    def _disk_works(self, what: str) -> None:
        """A write to the log succeeded: the end of a disk spell, said once, if there was one.

        Either a successful append or a successful flush ends it; a slave that is caught up
        appends nothing, so waiting for an append would leave the error standing.
        """
        if self.append_error is not None:
            log.warning("slave %s again (after: %s)", what, self.append_error)
            self.append_error = None

    def _after_session(self, session: _Session) -> None:
        """Log, once per spell, what needs an operator: a full disk, a peer that is no HA master."""
        if session.disk_error is not None:
            if self.append_error is None:
                log.error(
                    "slave cannot append replicated data: %s; replication paused, retrying "
                    "every %g s until there is space",
                    session.disk_error,
                    self.disk_retry,
                )
            self.append_error = str(session.disk_error)
        if (
            session.received_data
            or session.diverged_at is not None
            or session.deleted_to is not None
            or session.spoke_ha
        ):
            # An HA master: it sent data or frames, or said we diverged.
            self._not_ha_warned = False
            self._spoke_ha = True
            return
        epoch_mode = self.epoch_file is not None
        level = logging.ERROR if self._not_ha_warned else logging.WARNING
        mismatch = mode_mismatch_sign(
            session.first_bytes, protocol_error=session.protocol_error, epoch_mode=epoch_mode
        )
        if mismatch is not None:
            log.log(level, "the master at %s %s", self.master, mismatch)
            self._not_ha_warned = True
            return
        closed_by_peer = session.close_kind is CloseKind.PEER_CLOSED
        if closed_by_peer and self._spoke_ha and not session.first_bytes:
            # It answered as an HA master before: a restart, a cut connection, a refusal.
            return
        sign = not_ha_sign(
            session.first_bytes,
            protocol_error=session.protocol_error,
            closed_by_peer=closed_by_peer,
            seconds=trio.current_time() - session.started,
            offset=session.requested,
            epoch_mode=epoch_mode,
        )
        if sign is not None:
            log.log(
                level,
                "the master at %s does not speak RocketMQ HA (is that the broker port? the HA "
                "port is usually listenPort+1): %s",
                self.master,
                sign,
            )
            self._not_ha_warned = True

    # --- the sticky divergence ----------------------------------------------------------------

    def _diverged(self, master_offset: int, slave_offset: int, reason: str) -> None:
        self.divergence = Divergence(
            master_offset, max(slave_offset, self.commitlog.max_offset), self.master, reason
        )
        log.error("%s", self.divergence.describe())
        if self.diverged_file is not None:
            self.divergence.write(self.diverged_file)
        self._state_change.unpark_all()

    async def _stay_diverged(self) -> None:
        """Replicate nothing while diverged; repeat the ERROR now and then."""
        while self.divergence is not None:
            log.error("%s", self.divergence.describe())
            with trio.move_on_after(DIVERGED_REMINDER):
                await self._state_change.park()

    def clear_divergence(self) -> None:
        """The operator cut the log back or re-seeded it: replicate again."""
        self.divergence = None
        if self.diverged_file is not None:
            self.diverged_file.unlink(missing_ok=True)
        self._state_change.unpark_all()

    async def _wait_state(self, reached: Callable[[], bool], deadline: float) -> bool:
        with trio.move_on_at(deadline):
            while not reached():
                await self._state_change.park()
            return True
        return False

    async def wait_fell_behind(self, deadline: float = math.inf) -> bool:
        """Wait until the master said it deleted what this slave needs; False at *deadline*."""
        return await self._wait_state(lambda: self.fell_behind is not None, deadline)

    async def wait_diverged(self, deadline: float = math.inf) -> bool:
        """Wait until the client is in the diverged state; False at *deadline*."""
        return await self._wait_state(lambda: self.divergence is not None, deadline)

    def _set_connected(self, value: bool) -> None:
        self.connected = value
        self._state_change.unpark_all()

    async def wait_connected(self, deadline: float = math.inf, *, connects: int = 1) -> bool:
        """Wait until connected for (at least) the *connects*-th time; False at *deadline*."""
        return await self._wait_state(
            lambda: self.connected and self.connects >= connects, deadline
        )

    def _count_close(self, kind: CloseKind) -> None:
        category = kind.category
        self._closed_by_reason[category] = self._closed_by_reason.get(category, 0) + 1

    def learn_master_end(self, end: int) -> None:
        """The master's commit log ends at *end* (its runtime info, fetched by the metadata
        sync): what "bytes behind" and the catch-up's ETA are measured against."""
        self.master_end = max(self.master_end, end)

    @property
    def state(self) -> str:
        """What the slave is doing, in one word (``/metrics``, ``status``)."""
        if self.divergence is not None:
            return "diverged"
        if self.fell_behind is not None:
            return "fell_behind"
        if self.append_error is not None:
            return "disk_full"
        if self.connected:
            return "connected"
        return "connecting"

    def behind_seconds(self, behind_bytes: int | None) -> float | None:
        """How far behind the master this slave is in time, the way MySQL's
        Seconds_Behind_Master is read: 0 when it holds the master's end as last learned,
        else the age of the last message it holds (now minus that record's STORETIMESTAMP,
        the master's clock when the message was put). The message is found backwards from
        the log's end (:meth:`CommitLog.last_record`), not by decoding what was appended.
        None while the master's end is unknown or no complete message is held."""
        if behind_bytes is None:
            return None
        if behind_bytes == 0:
            return 0.0
        last = self.commitlog.last_record()
        if last is None:
            return None
        return max(0.0, self.wall_clock() - last[1] / 1000)

    def statistics(self) -> HAClientStatistics:
        end = self.commitlog.max_offset
        behind = max(0, self.master_end - end) if self.master_end >= 0 else None
        return HAClientStatistics(
            master=self.master,
            connected=self.connected,
            reported_offset=self.reported_offset,
            bytes_received=self.bytes_received
            + (self._live.bytes_received if self._live is not None else 0),
            connects=self.connects,
            last_close_reason=self.last_close_reason,
            append_error=self.append_error,
            needs_reseed=self.divergence is not None or self.fell_behind is not None,
            diverged_master_offset=self.divergence.master_offset if self.divergence else -1,
            diverged_slave_offset=self.divergence.slave_offset if self.divergence else -1,
            fell_behind_master_offset=(
                self.fell_behind.master_offset if self.fell_behind is not None else -1
            ),
            last_epoch=-1 if self.epoch_file is None else self.epoch_file.history.last_epoch,
            truncations=tuple(self.truncations),
            bytes_appended=self.bytes_appended,
            closed_by_reason=dict(self._closed_by_reason),
            state=self.state,
            master_end=self.master_end if self.master_end >= 0 else None,
            behind_bytes=behind,
            behind_seconds=self.behind_seconds(behind),
        )


#: Bytes of a session's start kept to recognise a peer that is not an HA master.
_SNIFF = 16
#: A close this soon after connecting, with nothing sent, is a refusal, not a network event.
_IMMEDIATE = 1.0


def mode_mismatch_sign(first_bytes: bytes, *, protocol_error: bool, epoch_mode: bool) -> str | None:
    """What shows that the peer is an HA master in the other mode, or None.

    An epoch-mode slave reads a classic master's first frame (an 8-byte offset below 4 GiB,
    then a size) as a handshake whose state field is 0 (``READY``): the master speaks classic
    HA. (A classic slave cannot tell: an epoch-mode master closes on its report at once,
    without a byte, which :func:`not_ha_sign` describes with this reading among the others.)
    """
    if epoch_mode and protocol_error and len(first_bytes) >= 4 and first_bytes[:4] == bytes(4):
        return (
            "speaks classic HA, not the AutoSwitch (epoch) protocol: its first frame carries "
            "state 0, where a handshake carries 1. Both sides must set enableControllerMode "
            "alike (this slave: true, the master: false)"
        )
    return None


def not_ha_sign(
    first_bytes: bytes,
    *,
    protocol_error: bool,
    closed_by_peer: bool,
    seconds: float,
    offset: int | None = None,
    epoch_mode: bool = False,
) -> str | None:
    """What shows that the peer of a session that delivered no data is not an HA master,
    or None. The signs, as a broker or name server port answers a slave's 8-byte report:

    * a RocketMQ remoting frame (a 4-byte length, a serialize type byte 0 or 1, a header
      length, a JSON header ``{"``): the port speaks remoting;
    * bytes that are not an HA frame at all (a header whose size is impossible, an offset
      that has nothing to do with the slave's log);
    * an immediate close with nothing sent: a remoting server reads the report as a frame
      of length 0 (or a huge one) and hangs up, which a master never does.
    """
    if len(first_bytes) >= 10 and first_bytes[4] in (0, 1) and first_bytes[8:10] == b'{"':
        return "it answered with a RocketMQ remoting frame"
    if protocol_error:
        prefix = first_bytes[:12].hex(" ")
        return f"its first bytes ({prefix}) are not an HA frame"
    if closed_by_peer and not first_bytes and seconds < _IMMEDIATE:
        # An HA master does this too when it refuses the slave's offset (a diverged or
        # deleted one), or the other mode's report, so the line says that as well.
        what = "handshake" if epoch_mode else f"offset{'' if offset is None else f' {offset}'}"
        other = (
            ""
            if epoch_mode
            else ", or it runs the AutoSwitch (epoch) protocol, enableControllerMode=true, "
            "which this slave (enableControllerMode=false) does not speak"
        )
        return (
            "it closed the connection at once without sending anything (if it is the HA port, "
            f"it refused this slave's {what}{other}: its log says which)"
        )
    return None


async def _open_tcp(host: str, port: int) -> trio.abc.Stream:
    return await trio.open_tcp_stream(host, port)
