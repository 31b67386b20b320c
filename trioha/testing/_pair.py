"""A master and a slave wired by byte queues: the sans-IO core driven one explicit step at a time.

:class:`ProtocolPair` does with :class:`~trioha.proto.MasterConnection` and
:class:`~trioha.proto.SlaveConnection` exactly what the Trio layer (``trioha.net``) does with
them, except that every read, write, tick and crash is a separate method call with an explicit
size or time, so a test (or :class:`~trioha.testing.ReplicationMachine`) can interleave them in
any order and cut the byte streams anywhere:

* the master's writer asks ``next_send``, writes the 12-byte header and ``log.read`` body into
  its outbox and moves any number of bytes of it onto the wire; ``frame_written`` follows the
  last byte (RocketMQ's ``lastWriteOver``, docs/rocketmq-protocol.md §1.5);
* the slave reads any number of bytes, appends each complete body with ``append_raw`` and
  reports what the store holds (with ``ack_flushed``, only what it has flushed);
* a :class:`Link` is one TCP connection. Closing one side lets the other drain what is in flight
  and then read EOF; :meth:`ProtocolPair.drop` kills the transport instead (bytes in flight are
  lost), and a side may not notice (a half-open connection) until housekeeping closes it;
* crashes cut the logs back the way a power cut does: a slave to any point between its flushed
  and written ends, the master to its flushed end; :meth:`ProtocolPair.lose_master_records`
  cuts the master further back, to any message boundary (recovery met a damaged record);
* with ``epoch_mode`` both ends speak the AutoSwitch protocol: the pair keeps both epoch
  histories (the master begins a new epoch at its recovered end on every restart), carries
  the handshakes, and executes the slave's ``Truncate`` and ``RecordEpoch``.

It also answers sync puts the way ``HAService.wait_replicated`` does (PUT_OK once a live
connection that carried the put, one served from at or before its start, has acked its end), so
tests can check RocketMQ's promise: a PUT_OK message is on the slave.

No hypothesis, no pytest, no trio: this module runs anywhere ``trioha`` does.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Iterable
from typing import Protocol, assert_never

import attrs

from trioha._config import BrokerConfig
from trioha._errors import StorageError
from trioha._status import PutStatus
from trioha.proto import (
    MAX_BODY_SIZE,
    SLAVE_TIMEOUT_MS,
    AckAdvanced,
    Append,
    Close,
    EpochHistory,
    LogView,
    MasterConnection,
    MasterOptions,
    MasterPhase,
    Quorum,
    RecordEpoch,
    SendHeartbeat,
    SendMasterHandshake,
    SendReport,
    SendSlaveHandshake,
    SendTransfer,
    SlaveAction,
    SlaveConnection,
    Timing,
    Truncate,
    Vouch,
    frame_header,
    replicated_offset,
    vouch,
)

__all__ = [
    "Link",
    "PairOptions",
    "ProtocolPair",
    "ReplicaLog",
    "Side",
    "SyncPut",
    "log_bytes",
    "pending_report_bytes",
]

MIB = 1 << 20


class ReplicaLog(Protocol):
    """The part of :class:`trioha.store.CommitLog` that replication touches."""

    @property
    def segment_size(self) -> int: ...
    @property
    def min_offset(self) -> int: ...
    @property
    def max_offset(self) -> int: ...
    @property
    def flushed_offset(self) -> int: ...
    def append_raw(self, offset: int, data: bytes | bytearray | memoryview) -> int: ...
    def read(self, offset: int, max_bytes: int) -> memoryview | bytes: ...
    def flush(self) -> int: ...
    def truncate(self, offset: int) -> None: ...


#: Appends one message to the master's log and returns ``(start, end)`` of its record.
Producer = Callable[[ReplicaLog, bytes, float], tuple[int, int]]


def pending_report_bytes(conn: MasterConnection) -> int:
    """Bytes of an incomplete report the master side keeps between reads (at most 7)."""
    return conn._words.pending


def log_bytes(log: ReplicaLog, start: int | None = None, end: int | None = None) -> bytes:
    """The log's bytes in ``[start, end)`` (default: everything), read segment by segment."""
    pos = log.min_offset if start is None else start
    stop = log.max_offset if end is None else end
    out = bytearray()
    while pos < stop:
        chunk = log.read(pos, stop - pos)
        if not chunk:
            raise StorageError(f"{log!r} returned nothing at {pos} (asked up to {stop})")
        out += chunk
        pos += len(chunk)
    return bytes(out)


@attrs.frozen(kw_only=True)
class PairOptions:
    """The settings that shape replication, in the units the sans-IO core uses.

    :meth:`from_config` takes them from a :class:`~trioha.BrokerConfig`, so a test can run the
    protocol with exactly a deployment's segment size, batch size and HA options.
    """

    #: ``mapped_file_size_commit_log``. Small values make frames stop at segment ends often.
    segment_size: int = 1024
    #: ``ha_transfer_batch_size``.
    batch_size: int = 32 * 1024
    #: ``ha_slave_ack_flushed``: the slave acks only what it flushed.
    ack_flushed: bool = False
    #: ``ha_sync_from_oldest``.
    sync_from_oldest: bool = False
    #: ``ha_send_heartbeat_interval`` and ``ha_housekeeping_interval``, in seconds.
    heartbeat: float = Timing().heartbeat
    housekeeping: float = Timing().housekeeping
    #: ``slave_timeout`` in seconds: a sync put not acked by then is FLUSH_SLAVE_TIMEOUT.
    slave_timeout: float = SLAVE_TIMEOUT_MS / 1000
    #: ``ha_slave_fallbehind_max``: a slave further behind cannot take a sync put.
    fallbehind_max: int = 256 * MIB
    #: The largest frame body the slave accepts.
    max_body: int = MAX_BODY_SIZE
    #: ``enable_controller_mode``: the AutoSwitch protocol with epochs.
    epoch_mode: bool = False

    @classmethod
    def from_config(cls, config: BrokerConfig, **overrides: object) -> PairOptions:
        """The options a broker with *config* runs replication with (*overrides* win)."""
        values: dict[str, object] = {
            "segment_size": config.mapped_file_size_commit_log,
            "batch_size": config.ha_transfer_batch_size,
            "ack_flushed": config.ha_slave_ack_flushed,
            "sync_from_oldest": config.ha_sync_from_oldest,
            "heartbeat": config.ha_send_heartbeat_interval / 1000,
            "housekeeping": config.ha_housekeeping_interval / 1000,
            "slave_timeout": config.slave_timeout / 1000,
            "fallbehind_max": config.ha_slave_fallbehind_max,
            "epoch_mode": config.enable_controller_mode,
        }
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]

    @property
    def master_options(self) -> MasterOptions:
        return MasterOptions(
            batch_size=self.batch_size,
            sync_from_oldest=self.sync_from_oldest,
            epoch_mode=self.epoch_mode,
        )

    @property
    def timing(self) -> Timing:
        return Timing(heartbeat=self.heartbeat, housekeeping=self.housekeeping)


#: The pair has one slave: a sync put needs its ack (``in_sync_replicas`` 2, the default).
SLAVES = 1


class Side(enum.Enum):
    """Which end of a :class:`Link` decided to close it."""

    MASTER = "master"
    SLAVE = "slave"


@attrs.define(eq=False)
class Link:
    """One TCP connection: both ends, the bytes in flight each way, and what went over it."""

    number: int
    #: Which life of the slave process opened it (a slave crash starts a new one).
    incarnation: int
    master: MasterConnection
    slave: SlaveConnection
    #: Bytes the master wrote that the slave has not read yet, and the other way round.
    to_slave: bytearray = attrs.field(factory=bytearray)
    to_master: bytearray = attrs.field(factory=bytearray)
    #: The rest of the frame the master's writer is writing (``!lastWriteOver``).
    outbox: bytearray = attrs.field(factory=bytearray)
    #: The outbox holds a frame (not the epoch-mode handshake): ``frame_written`` follows it.
    outbox_frame: bool = False
    #: The transport is gone (reset, cable, crash): nothing more is delivered either way.
    dead: bool = False
    #: Each side's view: open until it closes, reads EOF, or notices the transport died.
    master_open: bool = True
    slave_open: bool = True
    #: Reports the slave wrote, AckAdvanced values the master accepted, frames it sent.
    reports: list[int] = attrs.field(factory=list)
    acks: list[int] = attrs.field(factory=list)
    frames: list[tuple[int, int]] = attrs.field(factory=list)
    #: Epoch mode: offsets the slave cut its log back to on this connection.
    truncations: list[int] = attrs.field(factory=list)
    #: ``(side, reason)`` for each Close an end decided on.
    closes: list[tuple[Side, str]] = attrs.field(factory=list)
    #: The slave's request offset as the master recorded it (set once), and where the master
    #: chose to start serving it (``nextTransferFromWhere`` at the first report).
    request_offset: int | None = None
    start_offset: int | None = None

    @property
    def open(self) -> bool:
        return self.master_open or self.slave_open

    @property
    def ack_offset(self) -> int:
        return self.master.state.ack_offset

    @property
    def streaming(self) -> bool:
        """Counted by sync replication: the master side is open and has the first report."""
        return self.master_open and self.master.state.phase is MasterPhase.TRANSFER

    def __repr__(self) -> str:
        return (
            f"<Link #{self.number} slave life {self.incarnation} "
            f"master={'open' if self.master_open else 'closed'} "
            f"slave={'open' if self.slave_open else 'closed'}{' dead' if self.dead else ''} "
            f"in flight {len(self.to_slave)}B→ ←{len(self.to_master)}B>"
        )


@attrs.define(eq=False)
class SyncPut:
    """A put and how it was answered."""

    start: int
    end: int
    data: bytes
    sync: bool
    deadline: float
    #: None while a sync put waits for acks.
    status: PutStatus | None = None
    #: The incarnation of the slave whose ack answered PUT_OK (None if not by an ack).
    acked_by: int | None = None
    #: Why "a PUT_OK message is on the slave" no longer holds for it (a crash that lost it).
    lost: str | None = None

    def __repr__(self) -> str:
        return f"<SyncPut [{self.start}, {self.end}) {self.status}>"


def default_producer(log: ReplicaLog, body: bytes, now: float) -> tuple[int, int]:
    """Append *body* as a RocketMQ message with ``CommitLog.append`` (a real record)."""
    append = getattr(log, "append", None)
    if append is None:
        raise TypeError(f"{log!r} has no append(); pass a producer to ProtocolPair")
    from trioha.store import NewMessage  # the store only when a real log is in use

    stamp = int(now * 1000)
    result = append(NewMessage("TopicTest", body, born_timestamp=stamp, store_timestamp=stamp))
    return int(result.physical_offset), int(result.end_offset)


class ProtocolPair:
    """One master log, one slave log, and the connections between them; see the module doc."""

    def __init__(
        self,
        *,
        master_log: ReplicaLog,
        slave_log: ReplicaLog,
        options: PairOptions | None = None,
        producer: Producer = default_producer,
        now: float = 0.0,
    ) -> None:
        self.master_log = master_log
        self.slave_log = slave_log
        self.options = options or PairOptions()
        self.producer = producer
        self.now = now
        self.links: list[Link] = []
        self.incarnation = 0
        self.puts: list[SyncPut] = []
        self._numbers = itertools.count(1)
        #: Epoch mode: the master's history (begun at its log's end, as at a start) and the
        #: slave's (its epoch file, which survives its crashes).
        self.master_epochs = EpochHistory()
        self.slave_epochs = EpochHistory()
        if self.options.epoch_mode:
            self.master_epochs = self.master_epochs.begin_epoch(master_log.max_offset)
        #: Ranges a classic master lost after sending them (``trioha.store.SentOffsets``).
        self.master_lost: tuple[tuple[int, int], ...] = ()

    # --- queries ------------------------------------------------------------------------------

    def master_view(self) -> LogView:
        log = self.master_log
        epochs = self.master_epochs if self.options.epoch_mode else None
        return LogView(
            log.min_offset, log.max_offset, log.segment_size, lost=self.master_lost, epochs=epochs
        )

    @property
    def current(self) -> Link | None:
        """The connection the slave has open (a slave holds at most one)."""
        for link in reversed(self.links):
            if link.slave_open:
                return link
        return None

    @property
    def open_links(self) -> list[Link]:
        return [link for link in self.links if link.open]

    def live_acks(self, *, incarnation: int | None = None) -> list[int]:
        """What sync replication counts: acks of connections the master still serves."""
        return [
            link.ack_offset
            for link in self.links
            if link.streaming and (incarnation is None or link.incarnation == incarnation)
        ]

    def live_vouches(self) -> list[Vouch]:
        """``(served_from, ack)`` of the connections the master still serves."""
        return [vouch(link.master.state) for link in self.links if link.streaming]

    def quorum(self) -> Quorum:
        """The sync replication rule ``HAService`` applies, over this pair's live links.

        The pair has one slave, so a put needs that slave's ack (``in_sync_replicas`` 2).
        """
        return Quorum.of(self.live_vouches(), SLAVES)

    def replicated_offset(self, start: int | None = None) -> int:
        """As ``HAService``: with *start*, only connections that carried the put count."""
        return replicated_offset(self.live_vouches(), SLAVES, start)

    def slave_is_prefix(self) -> bool:
        """Every byte the slave holds equals the master's at the same offset."""
        slave, master = self.slave_log, self.master_log
        if slave.max_offset > master.max_offset:
            return False
        if slave.max_offset == slave.min_offset:
            return True
        if slave.min_offset < master.min_offset:
            return False
        return log_bytes(slave) == log_bytes(master, slave.min_offset, slave.max_offset)

    def common_prefix_end(self) -> int:
        """The end of the slave's bytes that agree with the master's (from the slave's start)."""
        slave, master = self.slave_log, self.master_log
        start = slave.min_offset
        end = min(slave.max_offset, master.max_offset)
        if end <= start or start < master.min_offset:
            return start
        mine, theirs = log_bytes(slave, start, end), log_bytes(master, start, end)
        for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            if a != b:
                return start + i
        return end

    # --- connections --------------------------------------------------------------------------

    def connect(self) -> Link:
        """The slave opens a connection and reports its log's end (flushed first if acks are).

        Mirrors ``HAClient.session``: with ``ack_flushed`` the first report, which the master
        also counts as an ack, must not cover unflushed bytes.
        """
        if self.current is not None:
            raise RuntimeError(f"the slave already has {self.current!r}")
        if self.options.ack_flushed:
            self.slave_log.flush()
        opts = self.options
        epochs = None
        if opts.epoch_mode:  # AutoSwitchHAClient's READY: drop epochs past the log's end
            epochs = self.slave_epochs = self.slave_epochs.truncate_suffix(
                self.slave_log.max_offset
            )
        link = Link(
            number=next(self._numbers),
            incarnation=self.incarnation,
            master=MasterConnection(
                now=self.now, options=opts.master_options, timing=opts.timing, peer="slave"
            ),
            slave=SlaveConnection(
                log_max=self.slave_log.max_offset,
                now=self.now,
                timing=opts.timing,
                max_body=opts.max_body,
                peer="master",
                epochs=epochs,
            ),
        )
        self.links.append(link)
        self._slave_actions(link, link.slave.initial_actions())
        return link

    def drop(self, link: Link, *, master_notices: bool = True, slave_notices: bool = True) -> None:
        """The transport dies: bytes in flight are lost; a side that does not notice stays
        half-open until housekeeping closes it."""
        link.dead = True
        if master_notices:
            self._master_lost(link)
        if slave_notices:
            self._slave_lost(link)

    # --- the master's writer ------------------------------------------------------------------

    def master_write(self, link: Link, n: int | None = None) -> int:
        """The master's writer moves up to *n* bytes (default: the whole frame) onto the wire.

        When its outbox is empty it first asks ``next_send``; a frame is ``frame_written`` once
        its last byte is written. Returns how many bytes were written.
        """
        if not link.master_open:
            return 0
        if not link.outbox:
            match link.master.next_send(now=self.now, log=self.master_view()):
                case None:
                    return 0
                case Close() as close:
                    self._master_close(link, close.reason)
                    return 0
                case SendTransfer() | SendHeartbeat() as action:
                    pass
                case unknown:
                    assert_never(unknown)
            body = b""
            if isinstance(action, SendTransfer):
                body = bytes(self.master_log.read(action.offset, action.size))
                if len(body) != action.size:
                    raise AssertionError(
                        f"master log gave {len(body)} bytes at {action.offset}, "
                        f"the frame needs {action.size}"
                    )
            self._check_frame(link, action)
            header = link.master.header(action, confirm_offset=self.master_log.max_offset)
            link.outbox += header + body
            link.outbox_frame = True
        k = len(link.outbox) if n is None else min(n, len(link.outbox))
        if not link.dead:
            link.to_slave += link.outbox[:k]
        del link.outbox[:k]
        if not link.outbox and link.outbox_frame:
            link.outbox_frame = False
            link.master.frame_written(now=self.now)
        return k

    def _check_frame(self, link: Link, action: SendTransfer | SendHeartbeat) -> None:
        """A master sends a contiguous slice of its log (docs/rocketmq-protocol.md §1.3)."""
        opts = self.options
        offset = action.offset
        if link.frames:
            prev_offset, prev_size = link.frames[-1]
            if offset != prev_offset + prev_size:
                raise AssertionError(
                    f"{link!r}: frame at {offset} after a frame that ended at "
                    f"{prev_offset + prev_size}"
                )
        size = action.size if isinstance(action, SendTransfer) else 0
        if opts.epoch_mode:
            found = self.master_epochs.find_by_offset(offset)
            assert found is not None, f"frame at {offset} outside every epoch"
            index, entry = found
            end = self.master_epochs.end_of(index, self.master_log.max_offset)
            if (action.epoch, action.epoch_start) != (entry.epoch, entry.start_offset):
                raise AssertionError(f"frame at {offset} labelled {action}, not {entry}")
            if offset + size > end:
                raise AssertionError(f"frame [{offset}, {offset + size}) crosses its epoch's end")
        if size > opts.batch_size:
            raise AssertionError(f"frame of {size} bytes exceeds batch size {opts.batch_size}")
        if size and offset // opts.segment_size != (offset + size - 1) // opts.segment_size:
            raise AssertionError(f"frame [{offset}, {offset + size}) crosses a segment boundary")
        link.frames.append((offset, size))

    # --- the slave's reader -------------------------------------------------------------------

    def deliver_to_slave(self, link: Link, n: int | None = None) -> int:
        """The slave reads up to *n* bytes in flight (all by default); EOF once drained after
        the master closed. Returns how many bytes were read."""
        if not link.slave_open:
            return 0
        if not link.to_slave:
            if not link.master_open and not link.dead:
                self._slave_lost(link)  # EOF
            return 0
        k = len(link.to_slave) if n is None else min(n, len(link.to_slave))
        chunk = bytes(link.to_slave[:k])
        del link.to_slave[:k]
        actions = link.slave.receive_data(chunk, now=self.now)
        appended = False
        for action in actions:
            match action:
                case Append():
                    try:
                        self.slave_log.append_raw(action.offset, action.data)
                    except StorageError as exc:
                        # HAClient: a failed append closes the connection, nothing appended.
                        self._slave_close(link, f"cannot append at {action.offset}: {exc}")
                        return k
                    appended = True
                case Truncate():
                    try:
                        truncate = getattr(self.slave_log, "truncate_to_boundary", None)
                        if truncate is None or action.offset < self.slave_log.min_offset:
                            self.slave_log.truncate(action.offset)
                        else:
                            truncate(action.offset)
                    except StorageError as exc:
                        self._slave_close(link, f"cannot cut back to {action.offset}: {exc}")
                        return k
                    self.slave_log.flush()
                    self.slave_epochs = self.slave_epochs.truncate_suffix(action.offset)
                    link.truncations.append(action.offset)
                    for put in self.puts:
                        if put.lost is None and put.end > action.offset:
                            put.lost = f"cut from the slave at the consistent point {action.offset}"
                case RecordEpoch():
                    self.slave_epochs = self.slave_epochs.append(action.epoch, action.start_offset)
                case SendReport() | SendSlaveHandshake() | Close():
                    if not self._slave_actions(link, (action,)):
                        return k
                case _:
                    assert_never(action)
        if appended:
            ack = self.slave_log.flushed_offset if self.options.ack_flushed else None
            self._slave_actions(
                link,
                link.slave.appended(
                    self.slave_log.max_offset if ack is None else ack, now=self.now
                ),
            )
        return k

    def _slave_actions(self, link: Link, actions: Iterable[SlaveAction]) -> bool:
        """Write reports, obey a Close; False once the slave side is closed."""
        for action in actions:
            match action:
                case SendReport() | SendSlaveHandshake():
                    if not link.slave_open:
                        raise AssertionError(f"{link!r}: a report after the slave side closed")
                    data = link.slave.encode(action)
                    if not link.dead:
                        link.to_master += data
                    if isinstance(action, SendReport):
                        link.reports.append(action.offset)
                    link.slave.report_written(now=self.now)
                case Close():
                    self._slave_close(link, action.reason)
                    return False
                case Append() | Truncate() | RecordEpoch():
                    raise AssertionError(f"{link!r}: unexpected slave action {action!r}")
                case _:
                    assert_never(action)
        return link.slave_open

    # --- the master's reader ------------------------------------------------------------------

    def deliver_to_master(self, link: Link, n: int | None = None) -> int:
        """The master reads up to *n* bytes of reports (all by default); EOF once drained after
        the slave closed. Returns how many bytes were read."""
        if not link.master_open:
            return 0
        if not link.to_master:
            if not link.slave_open and not link.dead:
                self._master_lost(link)  # EOF
            return 0
        k = len(link.to_master) if n is None else min(n, len(link.to_master))
        chunk = bytes(link.to_master[:k])
        del link.to_master[:k]
        for action in link.master.receive_data(chunk, now=self.now, log=self.master_view()):
            match action:
                case AckAdvanced():
                    link.acks.append(action.offset)
                case SendMasterHandshake():
                    link.outbox += link.master.handshake_bytes(action)  # the writer sends it next
                case Close():
                    if action.diverged_at is not None:  # HAConnection._refuse: the signal header
                        link.to_slave += frame_header(SendHeartbeat(action.diverged_at))
                    self._master_close(link, action.reason)
                    break
                case SendTransfer() | SendHeartbeat():
                    raise AssertionError(f"{link!r}: a frame to send from a read: {action!r}")
                case _:
                    assert_never(action)
        request = link.master.state.request_offset
        if request >= 0 and link.request_offset is None:
            link.request_offset = request
            link.start_offset = link.master.state.next_transfer
        self._settle()
        return k

    # --- time -----------------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Move the clock; heartbeats and housekeeping run as the Trio tasks would run them."""
        self.now += seconds
        for link in list(self.links):
            if link.master_open:
                for action in link.master.tick(now=self.now):
                    match action:
                        case Close():
                            self._master_close(link, action.reason)
                        case (
                            SendMasterHandshake() | SendTransfer() | SendHeartbeat() | AckAdvanced()
                        ):
                            raise AssertionError(f"{link!r}: a tick's {action!r}")
                        case _:
                            assert_never(action)
            if link.slave_open:
                self._slave_actions(link, link.slave.tick(now=self.now))
        for put in self.puts:
            if put.status is None and self.now >= put.deadline:
                put.status = PutStatus.FLUSH_SLAVE_TIMEOUT
        self._settle()

    # --- producers and sync replication -------------------------------------------------------

    def put(self, body: bytes, *, sync: bool = True) -> SyncPut:
        """A producer's put: append to the master's log and, if *sync*, wait for a slave's ack
        (answered by later steps; see :attr:`SyncPut.status`)."""
        start, end = self.producer(self.master_log, body, self.now)
        data = log_bytes(self.master_log, start, end)
        put = SyncPut(start, end, data, sync, self.now + self.options.slave_timeout)
        self.puts.append(put)
        if not sync:
            put.status = PutStatus.PUT_OK
        elif not self.quorum().available(end, self.options.fallbehind_max):
            put.status = PutStatus.SLAVE_NOT_AVAILABLE
        self._settle()
        return put

    def _settle(self) -> None:
        """Answer waiting sync puts that the live connections' acks now cover."""
        quorum: Quorum | None = None
        for put in self.puts:
            if put.status is not None:
                continue
            quorum = quorum or self.quorum()
            if quorum.holds(put.start, put.end):
                put.status = PutStatus.PUT_OK
                streaming = [link for link in self.links if link.streaming]
                put.acked_by = streaming[quorum.vouchers(put.start, put.end)[0]].incarnation

    # --- durability and crashes ---------------------------------------------------------------

    def flush_slave(self) -> None:
        """The slave's flush; with ``ack_flushed`` it then reports the new flushed end."""
        self.slave_log.flush()
        link = self.current
        if self.options.ack_flushed and link is not None:
            self._slave_actions(
                link, link.slave.appended(self.slave_log.flushed_offset, now=self.now)
            )

    def flush_master(self) -> None:
        self.master_log.flush()

    def crash_slave(self, cut: int, *, master_notices: bool = True) -> int:
        """The slave process dies and restarts with its log cut to *cut*, which must lie
        between its flushed and written ends (what a power cut can leave). Returns the number
        of bytes lost."""
        log = self.slave_log
        if not log.flushed_offset <= cut <= log.max_offset:
            raise ValueError(
                f"a crash keeps everything flushed ({log.flushed_offset}) and nothing beyond "
                f"what was written ({log.max_offset}); {cut} is outside"
            )
        for link in self.links:
            if link.slave_open:
                self.drop(link, master_notices=master_notices)
        lost = log.max_offset - cut
        log.truncate(cut)
        log.flush()  # what recovery finds on disk is durable
        self.incarnation += 1
        for put in self.puts:
            if put.lost is None and put.end > cut:
                put.lost = f"cut by a slave crash at {cut}"
        return lost

    def crash_master(self) -> int:
        """The master dies and restarts with its log cut to its flushed end; every connection
        is reset. Returns the number of bytes lost."""
        return self._master_restarts(self.master_log.flushed_offset, "a master crash")

    def lose_master_records(self, cut: int) -> int:
        """The master dies and its recovery ends at *cut*, a message boundary below what it
        flushed (a damaged record moved aside with all after it; or the last records it had
        sent lost): what classic HA cannot detect once the log grows back past a slave."""
        return self._master_restarts(cut, "the master's lost records")

    def _master_restarts(self, cut: int, why: str) -> int:
        for link in self.links:
            if link.open:
                self.drop(link)
        log = self.master_log
        lost = log.max_offset - cut
        log.truncate(cut)
        log.flush()
        if self.options.epoch_mode:  # a master's start opens a new epoch at its end
            self.master_epochs = self.master_epochs.begin_epoch(cut)
        for put in self.puts:
            if put.end > cut:
                if put.status is None:
                    put.status = PutStatus.UNKNOWN_ERROR  # the producer's connection broke
                if put.lost is None:
                    put.lost = f"cut by {why} at {cut}"
        return lost

    # --- running to quiet ---------------------------------------------------------------------

    def step_all(self) -> int:
        """One round of every task doing all it can without time passing; bytes moved."""
        moved = 0
        for link in list(self.links):
            if not link.open:
                continue
            while k := self.master_write(link):
                moved += k
            moved += self.deliver_to_slave(link)
            moved += self.deliver_to_master(link)
        return moved

    def run_until_quiet(self, *, max_rounds: int = 100_000, reconnect: bool = True) -> int:
        """Reconnect if needed and move bytes until nothing changes; returns the rounds used.

        Time does not pass, so neither heartbeats nor housekeeping happen. Raises
        AssertionError if it has not settled within *max_rounds* (a livelock).
        """
        for rounds in range(1, max_rounds + 1):
            if reconnect and self.current is None:
                self.connect()
            if self.options.ack_flushed:
                self.flush_slave()
            before = self._open_sides()
            if not self.step_all() and self._open_sides() == before:
                return rounds
        raise AssertionError(f"replication did not settle within {max_rounds} rounds")

    def _open_sides(self) -> tuple[int, int]:
        return len(self.links), sum(link.master_open + link.slave_open for link in self.links)

    # --- closing ------------------------------------------------------------------------------

    def _master_close(self, link: Link, reason: str) -> None:
        link.closes.append((Side.MASTER, reason))
        self._master_lost(link)

    def _master_lost(self, link: Link) -> None:
        if link.master_open:
            link.master_open = False
            link.outbox.clear()
            link.master.connection_lost()  # HAConnection.run's finally

    def _slave_close(self, link: Link, reason: str) -> None:
        link.closes.append((Side.SLAVE, reason))
        self._slave_lost(link)

    def _slave_lost(self, link: Link) -> None:
        if link.slave_open:
            link.slave_open = False
            link.slave.connection_lost()  # HAClient.session's finally
