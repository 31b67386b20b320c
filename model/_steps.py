"""What can happen in the replication world: steps, faults, and the production code they run.

Every protocol decision in here is made by the production core, :func:`trioha.proto.master_step`
and :func:`trioha.proto.slave_step`, with the production states, events and actions; sync
replication is decided by :class:`trioha.proto.Quorum`, as ``trioha.net.HAService`` and
``trioha.testing`` decide it. This module only
supplies what surrounds the core in a real deployment: the two commit logs, the TCP streams as
FIFO channels, the clock, the producers, and faults.

Abstractions (each one chosen to keep the state space small without hiding a behaviour):

* **Logs** are tuples with one small integer per byte offset: the id of the message that byte
  belongs to. Message *k* is ``message_size`` bytes of value *k*; ids are never reused, so a
  byte rewritten after a master crash is visibly different. Segments hold a whole number of
  messages, so no padding is needed.
* **Channels** are tuples (FIFO). Master to slave: :class:`FrameHeader` and :class:`FrameBody`
  items, so the slave may receive a header and only later its body (a partial frame). Slave to
  master: report offsets; the master may read several at once and, as ``ReadSocketService``
  does, only the newest counts.
* **Writes** are whole frames: ``SendReady`` and ``FrameWritten`` are fed in one step. A frame
  cut by a drop looks to the slave exactly like a header received before the drop.
* **Time** advances in ``Tick`` steps of one heartbeat interval, and only when every channel
  is empty and no append waits to be confirmed (delivery is much faster than 5 s). At a tick
  every heartbeat is due; housekeeping fires after two silent ticks (RocketMQ: 20 s against
  5 s heartbeats, so at least one heartbeat always fits in between). Counters of silent ticks
  live on each connection. A housekeeping close of a link whose peer is alive is a violation
  (its heartbeats should have kept it open); the housekeeping *fault* is a stall (GC pause,
  network) and may strike at any moment.
* **Symmetry.** Connections are kept sorted (with ``Config.symmetry``), so worlds that differ
  only in the order connections were opened are one world; step indices refer to that order.
* **Closes.** When the master side closes a connection the slave notices at once. When the
  slave side closes (drop, rejected frame, housekeeping, restart), the master side goes with it
  unless a *stale connection* fault is spent: then it lingers, its unread reports still arrive,
  its writer is blocked (nobody reads: a zero window), and it ends when the master notices
  (``ConnectionLost``) or by housekeeping.
* **Faults** have budgets so every run is finite; recovery never needs one (liveness ignores
  fault edges).
* **Epoch mode** (``Config.epoch_mode``): both epoch histories are part of the world (the
  master begins a new epoch at its recovered end after every crash; the slave's is its epoch
  file, which survives restarts). The slave's handshake travels up as the report
  :data:`HANDSHAKE`, the master's down as a :class:`Hello` item; frame headers carry the
  epoch and its start. Each slave-to-master message is read on its own, in order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar, assert_never

import attrs

from model._checks import check_frame, check_master_transition, check_report
from model._values import (
    FAULT_KINDS,
    HANDSHAKE,
    Config,
    Conn,
    FrameBody,
    FrameHeader,
    Hello,
    Item,
    Kind,
    Outcome,
    Step,
    World,
    oldest_segment_may_go,
)
from trioha._errors import LocalProtocolError
from trioha.proto import (
    AckAdvanced,
    Append,
    AppendConfirmed,
    BodyReceived,
    Close,
    Connected,
    ConnectionLost,
    EpochHistory,
    FrameWritten,
    HandshakeReceived,
    HeaderReceived,
    HeartbeatDue,
    LogView,
    MasterAction,
    MasterEvent,
    MasterHandshakeReceived,
    MasterPhase,
    MasterState,
    Quorum,
    ReadIdle,
    RecordEpoch,
    ReportReceived,
    SendHeartbeat,
    SendMasterHandshake,
    SendReady,
    SendReport,
    SendSlaveHandshake,
    SendTransfer,
    SlaveAction,
    SlaveEvent,
    SlavePhase,
    SlaveState,
    Truncate,
    Vouch,
    master_step,
    slave_step,
    vouch,
)

_T = TypeVar("_T")
_MasterResult = tuple[MasterState, tuple[MasterAction, ...]] | LocalProtocolError
_SlaveResult = tuple[SlaveState, tuple[SlaveAction, ...]] | LocalProtocolError


# --- applying a step --------------------------------------------------------------------------


class _Tx:
    """One transition being built: a mutable copy of the world plus what the step showed."""

    def __init__(self, model: HAModel, world: World, step: Step, *, explain: bool) -> None:
        self.cfg = model.config
        self.options = model.options
        self.intern = model.intern
        self.master_step = model.master_step
        self.slave_step = model.slave_step
        self.w = world
        self.step = step
        self.mlog = world.mlog
        self.mflushed = world.mflushed
        self.mmin = world.mmin
        self.puts = world.puts
        self.pending = world.pending
        self.acked = world.acked
        self.conns: list[Conn | None] = list(world.conns)
        self.slave = world.slave
        self.sbase = world.sbase
        self.slog = world.slog
        self.sflushed = world.sflushed
        self.budget = world.budget
        self.msent = world.msent
        self.mlost = world.mlost
        self.sdiverged = world.sdiverged
        self.sbehind = world.sbehind
        self.mepochs = world.mepochs
        self.sepochs = world.sepochs
        self.violations: list[tuple[str, str]] = []
        self.marks: set[str] = set()
        self.notes: list[str] | None = [] if explain else None
        self.slave_closed = False
        self.stale_used = False

    # --- small helpers --------------------------------------------------------------------
    def note(self, text: str) -> None:
        if self.notes is not None:
            self.notes.append(text)

    def spend(self, fault: str) -> None:
        self.budget = attrs.evolve(self.budget, **{fault: getattr(self.budget, fault) - 1})

    @property
    def send(self) -> int:
        return self.sbase + len(self.slog) if self.slog else 0

    def log(self) -> LogView:
        epochs = self.mepochs if self.cfg.epoch_mode else None
        return LogView(
            self.mmin, len(self.mlog), self.cfg.segment_size, lost=self.mlost, epochs=epochs
        )

    def conn(self, i: int) -> Conn:
        conn = self.conns[i]
        assert conn is not None
        return conn

    def attached(self) -> int:
        for i, conn in enumerate(self.conns):
            if conn is not None and conn.attached:
                return i
        return -1

    def live_acks(self) -> list[Vouch]:
        """What connections in TRANSFER vouch for (``HAService.live_vouches``)."""
        return [
            vouch(c.master)
            for c in self.conns
            if c is not None and c.master.phase is MasterPhase.TRANSFER
        ]

    def quorum(self) -> Quorum:
        """The one sync replication rule over the live vouches (``HAService._sync_quorum``)."""
        return Quorum.of(self.live_acks(), self.cfg.needed_acks)

    def freeze(self) -> World:
        intern = self.intern
        conns = tuple(intern(c) for c in self.conns if c is not None)
        if self.cfg.symmetry and len(conns) > 1:
            conns = tuple(sorted(conns, key=_conn_key))
        w = self.w
        return World(
            self.mlog if self.mlog is w.mlog else intern(self.mlog),
            self.mflushed,
            self.mmin,
            self.puts,
            self.pending,
            self.acked,
            conns,
            self.slave if self.slave is w.slave else intern(self.slave),
            self.sbase,
            self.slog if self.slog is w.slog else intern(self.slog),
            self.sflushed,
            self.budget if self.budget is w.budget else intern(self.budget),
            self.msent,
            self.mlost,
            self.sdiverged,
            self.mepochs if self.mepochs is w.mepochs else intern(self.mepochs),
            self.sepochs if self.sepochs is w.sepochs else intern(self.sepochs),
            self.sbehind,
        )

    # --- the master side ------------------------------------------------------------------
    def master_feed(self, i: int, event: MasterEvent) -> tuple[MasterAction, ...]:
        conn = self.conn(i)
        before = conn.master
        result = self.master_step(before, event)
        if isinstance(result, LocalProtocolError):
            self.violations.append(("NoLocalProtocolError", f"master c{i}: {result}"))
            return ()
        after, actions = result
        if after is not before:
            self.violations.extend(check_master_transition(before, after))
            self.conns[i] = conn.but(master=after)
        quiet = isinstance(event, FrameWritten) or (after == before and not actions)
        if self.notes is not None and not quiet:
            self.note(f"master c{i}: {_show(event)} -> {_show_master(after)}{_show_acts(actions)}")
        return actions

    def master_actions(self, i: int, actions: tuple[MasterAction, ...]) -> None:
        for action in actions:
            if self.conns[i] is None:
                return
            match action:
                case SendMasterHandshake():
                    conn = self.conn(i)
                    hello = Hello(action.max_offset, action.epochs)
                    self.conns[i] = conn.but(down=(*conn.down, hello))
                case SendTransfer() | SendHeartbeat():
                    self.master_wrote(i, action)
                case AckAdvanced():
                    self.release_waiters()
                case Close():
                    tag = _reason_tag(action.reason)
                    self.marks.add("master_closed:" + tag)
                    self.refused(i, action)
                    conn = self.conn(i)
                    if (
                        tag in ("ack_beyond_sent", "report_backwards")
                        and conn.attached
                        and self.budget.bogus == self.cfg.faults.bogus
                    ):
                        self.violations.append(
                            (
                                "HonestReportsAccepted",
                                f"master c{i} refused its slave's own report: {action.reason}",
                            )
                        )
                    if conn.attached:
                        self.healthy_close(i, f"master closed it: {action.reason}")
                    self.master_close(i)
                case _:
                    assert_never(action)

    def master_wrote(self, i: int, action: SendTransfer | SendHeartbeat) -> None:
        """The IO layer writes the whole frame, then tells the core (``FrameWritten``)."""
        conn = self.conn(i)
        log = self.log()
        size = action.size if isinstance(action, SendTransfer) else 0
        self.violations.extend(check_frame(conn, action.offset, size, log, self.cfg.batch_size))
        if size:
            end = action.offset + size
            if size < self.cfg.batch_size and end % self.cfg.segment_size == 0:
                self.marks.add("frame_cut_at_segment_end")
            if end % self.cfg.message_size:
                self.marks.add("frame_ends_mid_message")
        down = conn.down
        items: tuple[Item, ...] = (
            FrameHeader(action.offset, size, action.epoch, action.epoch_start),
        )
        if size:
            items += (FrameBody(self.mlog[action.offset : action.offset + size]),)
        down += items
        sent_end = action.offset + size if size else conn.sent_end
        if not size and conn.sent_end < 0:
            sent_end = action.offset
        if self.cfg.classic_refusal and size:
            self.msent = max(self.msent, action.offset + size)  # durable before it is sent
        self.conns[i] = conn.but(down=down, sent_end=sent_end)
        self.master_actions(i, self.master_feed(i, FrameWritten()))

    def release_waiters(self) -> None:
        """``HAService.on_ack``: every waiting sync put the live acks now cover is PUT_OK."""
        if not self.pending:
            return
        quorum = self.quorum()
        keep = []
        for end, mid in self.pending:
            start = end - self.cfg.message_size
            if quorum.holds(start, end):
                self.acked += ((end - self.cfg.message_size, end, mid),)
                self.marks.add("sync_acked")
                if self.budget.drops < self.cfg.faults.drops:
                    self.marks.add("sync_acked_after_drop")
                self.note(f"sync put of message {mid} (ends at {end}) answered PUT_OK")
            else:
                keep.append((end, mid))
        self.pending = tuple(keep)

    def healthy_close(self, i: int, why: str) -> None:
        """OneConnectionWhenHealthy: with no fault so far, the slave's connection never ends."""
        if self.budget == self.cfg.faults and self.step.kind not in FAULT_KINDS:
            self.violations.append(
                (
                    "OneConnectionWhenHealthy",
                    f"c{i}, the slave's connection, ended with no fault injected: {why}",
                )
            )

    def master_close(self, i: int) -> None:
        """The master side closed: the connection is gone; an attached slave notices at once."""
        conn = self.conn(i)
        self.conns[i] = None
        if conn.attached:
            self.slave_feed(ConnectionLost())

    def refused(self, i: int, close: Close) -> None:
        """Classic refusal: the attached slave is told where the histories part (sticky).

        A deleted offset (``Close.oldest``): the IO layer pushes the master's oldest offset as
        a heartbeat header before closing; the slave's own rule reads it (when it is between
        frames, as after a first report) and, told its next bytes are gone, stops for good.
        """
        conn = self.conn(i)
        slave = self.slave
        if (
            close.oldest is not None
            and conn.attached
            and slave.phase is SlavePhase.TRANSFER
            and slave.receiving is None
        ):
            result = self.slave_step(slave, HeaderReceived(close.oldest, 0))
            if isinstance(result, LocalProtocolError):
                self.violations.append(("NoLocalProtocolError", f"slave: {result}"))
            elif any(isinstance(a, Close) and a.oldest is not None for a in result[1]):
                self.sbehind = close.oldest
                self.marks.add("slave_fell_behind")
                self.note(f"slave told the master's log now begins at {close.oldest}: it stops")
        if self.cfg.classic_refusal and close.diverged_at is not None and conn.attached:
            self.sdiverged = close.diverged_at
            self.marks.add("slave_refused")
            held = self.mlog[self.sbase : self.send]
            if self.slog and held == self.slog:  # its bytes are the master's (padding)
                self.marks.add("slave_refused_holding_master_bytes")
            self.note(f"slave refused: the master's history parts from its own at {self.sdiverged}")

    # --- the slave side -------------------------------------------------------------------
    def slave_feed(self, event: SlaveEvent) -> tuple[SlaveAction, ...]:
        before = self.slave
        result = self.slave_step(before, event)
        if isinstance(result, LocalProtocolError):
            self.violations.append(("NoLocalProtocolError", f"slave: {result}"))
            return ()
        after, actions = result
        self.slave = after
        if self.notes is not None and (after != before or actions):
            self.note(f"slave: {_show(event)} -> {_show_slave(after)}{_show_acts(actions)}")
        return actions

    def slave_actions(
        self, i: int, actions: tuple[SlaveAction, ...], body: tuple[int, ...] = ()
    ) -> None:
        for action in actions:
            match action:
                case SendReport():
                    conn = self.conn(i)
                    self.violations.extend(check_report(conn, action.offset))
                    up = (*conn.up, action.offset)
                    self.conns[i] = conn.but(up=up, last_report=action.offset)
                case SendSlaveHandshake():
                    conn = self.conn(i)
                    self.conns[i] = conn.but(up=(*conn.up, HANDSHAKE))
                case Truncate():
                    self.truncate_slave(action.offset)
                case RecordEpoch():
                    self.sepochs = self.sepochs.append(action.epoch, action.start_offset)
                case Append():
                    self.append(action, body)
                case Close():
                    tag = _reason_tag(action.reason)
                    self.marks.add("slave_closed:" + tag)
                    if action.diverged_at is not None:
                        self.marks.add("slave_diverged")
                    if tag == "offset_mismatch":
                        self.violations.append(("NoFrameRejected", f"slave: {action.reason}"))
                    self.healthy_close(i, f"the slave closed it: {action.reason}")
                    self.slave_close(i)
                    return
                case _:
                    assert_never(action)

    def append(self, action: Append, body: tuple[int, ...]) -> None:
        """The slave's store appends a body (``appendToCommitLog``); only at the log's end."""
        if len(body) != action.size:
            self.violations.append(
                ("FramingIntact", f"Append of {action.size} bytes but the body has {len(body)}")
            )
            return
        if not self.slog:
            self.sbase, self.slog, self.sflushed = action.offset, body, action.offset
        elif action.offset == self.send:
            self.slog += body
        else:
            self.violations.append(
                (
                    "AppendAtEnd",
                    f"Append at {action.offset} but the slave's log ends at {self.send}",
                )
            )

    def truncate_slave(self, offset: int) -> None:
        """Epoch mode: the slave cuts its log and epoch file back to the consistent point."""
        if offset % self.cfg.message_size:
            self.violations.append(
                (
                    "TruncateAligned",
                    f"the slave was told to cut its log inside a message at {offset}",
                )
            )
        self.marks.add("slave_truncated")
        if offset <= self.sbase:
            self.sbase, self.slog, self.sflushed = 0, (), 0
        else:
            self.slog = self.slog[: offset - self.sbase]
            self.sflushed = min(self.sflushed, offset)
        self.sepochs = self.sepochs.truncate_suffix(offset)
        self.note(f"slave cuts its log back to {offset} (the consistent point)")

    def master_restarts(self, end: int) -> None:
        """The master goes down (every connection with it) and restarts with its log cut to
        *end*; in epoch mode it begins a new epoch there."""
        att = self.attached()
        for i in range(len(self.conns)):
            if i != att:
                self.conns[i] = None
        if att >= 0:
            self.master_close(att)
        self.mlog = self.mlog[:end]
        self.mflushed = min(self.mflushed, end)
        self.pending = ()
        if self.cfg.epoch_mode:
            self.mepochs = self.mepochs.begin_epoch(end)

    def slave_close(self, i: int) -> None:
        """The slave side closed connection *i*: the master side goes too, unless it lingers."""
        conn = self.conn(i)
        self.conns[i] = conn.but(attached=False, truth=self.send, down=(), s_read=0)
        self.slave_closed = True
        if self.step.stale and not self.stale_used and self.budget.stale > 0:
            self.stale_used = True
            self.spend("stale")
            self.note(f"master c{i} does not notice yet (stale connection)")
            return
        self.master_feed(i, ConnectionLost())
        self.conns[i] = None

    def detach_slave(self) -> None:
        """The slave's side of its connection ends (drop, restart): as ``slave_close``."""
        i = self.attached()
        if i >= 0:
            self.slave_close(i)


def _conn_key(conn: Conn) -> tuple[object, ...]:
    m = conn.master
    return (
        not conn.attached,
        m.phase.value,
        m.request_offset,
        m.ack_offset,
        m.next_transfer,
        m.write_pending,
        tuple(
            (0, it.offset, it.size, it.epoch, it.epoch_start)
            if isinstance(it, FrameHeader)
            else (1, *it.data)
            if isinstance(it, FrameBody)
            else (
                2,
                it.max_offset,
                *(e for x in it.epochs.entries for e in (x.epoch, x.start_offset)),
            )
            for it in conn.down
        ),
        conn.up,
        conn.truth,
        conn.sent_end,
        conn.last_report,
        conn.m_read,
        conn.s_read,
    )


def _reason_tag(reason: str) -> str:
    """A short stable tag for a close reason, for probes."""
    for needle, tag in (
        ("no consistent point", "no_consistent_point"),
        ("no epoch history", "no_epoch_history"),
        ("pushed offset", "offset_mismatch"),
        ("#3388", "deleted_offset"),
        ("beyond what was sent", "ack_beyond_sent"),
        ("holds data this master does not", "request_beyond_end"),
        ("may have sent before it crashed", "lost_range"),
        ("went backwards", "report_backwards"),
        ("housekeeping", "housekeeping"),
    ):
        if needle in reason:
            return tag
    return "other"


def _show(obj: object) -> str:
    if isinstance(obj, ReportReceived):
        return f"ReportReceived({obj.offset})"
    if isinstance(obj, SendReady):
        return f"SendReady(heartbeat_due={obj.heartbeat_due})"
    return repr(obj)


def _show_master(m: MasterState) -> str:
    text = f"{m.phase.value}"
    if m.phase is not MasterPhase.AWAIT_REPORT:
        text += f" request={m.request_offset} ack={m.ack_offset} next={m.next_transfer}"
    return text


def _show_slave(s: SlaveState) -> str:
    text = f"{s.phase.value} expected={s.expected} reported={s.reported}"
    if s.receiving is not None:
        text += f" receiving={s.receiving}"
    return text


def _show_acts(actions: tuple[object, ...]) -> str:
    if not actions:
        return ""
    return "; " + ", ".join(
        f"Close({a.reason!r})" if isinstance(a, Close) else repr(a) for a in actions
    )


# --- the model --------------------------------------------------------------------------------


class HAModel:
    """The replication world of one :class:`Config`: its steps and their effects."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.options = config.options
        # One object per distinct part of a world, so revisited worlds compare by identity.
        self._interned: dict[object, object] = {}

        self._master_memo: dict[tuple[MasterState, MasterEvent], _MasterResult] = {}
        self._slave_memo: dict[tuple[SlaveState, SlaveEvent], _SlaveResult] = {}

    def intern(self, value: _T) -> _T:
        return self._interned.setdefault(value, value)  # type: ignore[return-value]

    def master_step(self, state: MasterState, event: MasterEvent) -> _MasterResult:
        """:func:`trioha.proto.master_step`, memoized: it is a pure function of its inputs."""
        key = (state, event)
        result = self._master_memo.get(key)
        if result is None:
            try:
                new, actions = master_step(state, event, self.options)
                result = (self.intern(new), actions)
            except LocalProtocolError as exc:
                result = exc
            self._master_memo[key] = result
        return result

    def slave_step(self, state: SlaveState, event: SlaveEvent) -> _SlaveResult:
        """:func:`trioha.proto.slave_step`, memoized likewise."""
        key = (state, event)
        result = self._slave_memo.get(key)
        if result is None:
            try:
                new, actions = slave_step(state, event)
                result = (self.intern(new), actions)
            except LocalProtocolError as exc:
                result = exc
            self._slave_memo[key] = result
        return result

    def initial(self) -> World:
        if self.config.epoch_mode:  # the master's first start: epoch 1 from offset 0
            return World(budget=self.config.faults, mepochs=EpochHistory().begin_epoch(0))
        return World(budget=self.config.faults)

    # --- enumerating steps ----------------------------------------------------------------
    def steps(self, w: World) -> Iterator[Step]:
        """Every step that may be enabled in *w* (``apply`` returns None for the others)."""
        cfg = self.config
        if w.puts < cfg.messages:
            if cfg.sync_puts:
                yield Step(Kind.PUT, arg=1)
            if cfg.async_puts:
                yield Step(Kind.PUT, arg=0)
        if not cfg.master_sync_flush and w.mflushed < w.mmax:
            yield Step(Kind.MASTER_FLUSH)
        if w.slog and w.sflushed < w.send:
            yield Step(Kind.SLAVE_FLUSH)
        att = w.attached()
        if att < 0 and w.sdiverged < 0 and w.sbehind < 0:
            yield Step(Kind.CONNECTED)
        if w.sdiverged >= 0:
            yield Step(Kind.TRUNCATE_TO_MASTER)
        elif w.slave.phase is SlavePhase.TRANSFER and w.send > w.slave.reported:
            yield Step(Kind.APPEND_CONFIRMED, att)
        for i, conn in enumerate(w.conns):
            # Epoch mode reads each message in order; classic may take several, newest counts.
            for k in range(1, 1 + (min(1, len(conn.up)) if cfg.epoch_mode else len(conn.up))):
                yield Step(Kind.REPORT_RECEIVED, i, k)
            if (
                conn.attached
                and conn.master.phase is MasterPhase.TRANSFER
                and len(conn.down) < 2 * cfg.window
            ):
                yield Step(Kind.SEND_READY, i)
            if conn.attached and conn.down:
                kind = Kind.HEADER_RECEIVED if w.slave.receiving is None else Kind.BODY_RECEIVED
                yield Step(kind, i)
            if not conn.attached and not conn.up:
                yield Step(Kind.CONNECTION_LOST, i)
        if cfg.time and self._quiescent(w):
            yield Step(Kind.TICK)
        if w.pending:
            yield Step(Kind.SYNC_TIMEOUT)
        # faults
        b = w.budget
        if b.drops and att >= 0:
            yield Step(Kind.DROP, att)
        if b.housekeeping:
            for i, conn in enumerate(w.conns):
                yield Step(Kind.READ_IDLE, i, 0)
                if conn.attached:
                    yield Step(Kind.READ_IDLE, i, 1)
        if b.restarts:
            low = w.sflushed if w.slog else 0
            for cut in range(low, w.send + 1):
                yield Step(Kind.SLAVE_RESTART, arg=cut)
        if b.crashes:
            yield Step(Kind.MASTER_CRASH)
        if b.tail_losses:
            for cut in range(w.mmin, w.mmax, cfg.message_size):
                yield Step(Kind.MASTER_LOSES_TAIL, arg=cut)
        if b.deletions and oldest_segment_may_go(w, cfg):
            yield Step(Kind.DELETE_SEGMENT)
        if b.bogus:
            yield Step(Kind.BOGUS_REPORT, arg=-1)
            if not cfg.rogue_reports_end:
                for i, conn in enumerate(w.conns):
                    yield Step(Kind.BOGUS_REPORT, i, cfg.bogus_offset)
                    if cfg.bogus_anywhere and conn.attached and not conn.up:
                        yield from (
                            Step(Kind.BOGUS_REPORT, i, offset)
                            for offset in _wrong_reports(conn, w.mmax)
                        )

    def _quiescent(self, w: World) -> bool:
        if any(c.up or c.down for c in w.conns):
            return False
        if w.slave.phase is SlavePhase.HANDSHAKE:
            return False
        return not (w.slave.phase is SlavePhase.TRANSFER and w.send > w.slave.reported)

    def successors(self, w: World) -> Iterator[tuple[Step, Outcome]]:
        for step in self.steps(w):
            out = self._apply(w, step)
            if out is None:
                continue
            yield step, out
            if out.slave_closed and w.budget.stale > 0:
                stale = Step(step.kind, step.conn, step.arg, stale=True)
                out2 = self._apply(w, stale)
                if out2 is not None:
                    yield stale, out2

    # --- applying a step ------------------------------------------------------------------
    def apply(self, w: World, step: Step, *, explain: bool = False) -> Outcome | None:
        """The world after *step*, or None when the step is not enabled in *w*."""
        plain = Step(step.kind, step.conn, step.arg) if step.stale else step
        if plain not in set(self.steps(w)):
            return None
        return self._apply(w, step, explain=explain)

    def _apply(self, w: World, step: Step, *, explain: bool = False) -> Outcome | None:
        tx = _Tx(self, w, step, explain=explain)
        handler = _HANDLERS[step.kind]
        if handler(self, tx, w, step) is False:
            return None
        if step.stale and not tx.stale_used:
            return None
        return Outcome(
            world=tx.freeze(),
            violations=tuple(tx.violations),
            marks=frozenset(tx.marks),
            notes=tuple(tx.notes or ()),
            slave_closed=tx.slave_closed,
        )

    # Each handler mutates the transaction; returning False means "not enabled here".

    def _put(self, tx: _Tx, w: World, step: Step) -> bool:
        cfg = self.config
        if w.puts >= cfg.messages:
            return False
        mid = w.puts + 1
        tx.puts = mid
        tx.mlog = w.mlog + (mid,) * cfg.message_size
        end = len(tx.mlog)
        if cfg.master_sync_flush:
            tx.mflushed = end
        tx.note(f"master appends message {mid} at [{end - cfg.message_size}, {end})")
        if step.arg:
            quorum = tx.quorum()
            available = quorum.available(end, cfg.fallbehind_max)
            att = tx.attached()
            master = tx.conn(att).master if att >= 0 else None
            if master is not None and master.phase is MasterPhase.TRANSFER:
                self._judge_availability(tx, end, end - master.ack_offset, available)
            if not available:
                tx.marks.add("slave_not_available")
                tx.note("sync put answered SLAVE_NOT_AVAILABLE (no slave streaming close enough)")
            elif quorum.holds(end - cfg.message_size, end):
                tx.acked += ((end - cfg.message_size, end, mid),)
                tx.note("sync put answered PUT_OK at once")
            else:
                tx.pending += ((end, mid),)
                tx.note("sync put waits for a slave")
        return True

    def _judge_availability(self, tx: _Tx, end: int, behind: int, available: bool) -> None:
        """HonestSlaveAvailable, and the marks that pin ``fallbehind_max`` from both sides."""
        cfg = self.config
        if cfg.fallbehind_edge:
            if behind == cfg.fallbehind_max and not available:
                tx.marks.add("refused_at_fallbehind_max")
            if behind == cfg.fallbehind_max - 1 and available:
                tx.marks.add("available_just_inside_fallbehind_max")
        if not available and behind < cfg.fallbehind_max and cfg.needed_acks == 1:
            tx.violations.append(
                (
                    "HonestSlaveAvailable",
                    f"sync put ending at {end} answered SLAVE_NOT_AVAILABLE although the "
                    f"streaming slave is {behind} behind (fallbehind_max {cfg.fallbehind_max})",
                )
            )

    def _master_flush(self, tx: _Tx, w: World, step: Step) -> bool:
        tx.mflushed = w.mmax
        return True

    def _slave_flush(self, tx: _Tx, w: World, step: Step) -> bool:
        tx.sflushed = w.send
        return True

    def _connected(self, tx: _Tx, w: World, step: Step) -> bool:
        if w.attached() >= 0 or w.sdiverged >= 0 or w.sbehind >= 0:
            return False
        if self.config.slave_ack_flushed and w.slog:
            tx.sflushed = w.send  # the slave flushes before its first report
        epochs = None
        phase = MasterPhase.AWAIT_REPORT
        if self.config.epoch_mode:
            # AutoSwitchHAClient's READY: epochs past the end of the log describe nothing.
            tx.sepochs = epochs = w.sepochs.truncate_suffix(w.send)
            phase = MasterPhase.HANDSHAKE
        conn = Conn(master=MasterState(phase=phase))
        tx.conns.append(conn)
        i = len(tx.conns) - 1
        tx.slave_actions(i, tx.slave_feed(Connected(w.send, epochs)))
        return True

    def _append_confirmed(self, tx: _Tx, w: World, step: Step) -> bool:
        if self.config.slave_ack_flushed:
            tx.sflushed = w.send
            target = tx.sflushed
        else:
            target = w.send
        tx.slave_actions(step.conn, tx.slave_feed(AppendConfirmed(target)))
        return True

    def _report_received(self, tx: _Tx, w: World, step: Step) -> bool:
        conn = tx.conn(step.conn)
        if not 1 <= step.arg <= len(conn.up):
            return False
        offset = conn.up[step.arg - 1]
        tx.conns[step.conn] = conn.but(up=conn.up[step.arg :], m_read=0)
        if not conn.attached and conn.last_report >= 0:
            tx.marks.add("late_report_on_stale_connection")
        if step.arg > 1:
            tx.marks.add("reports_coalesced")
        event: MasterEvent = (
            HandshakeReceived(tx.log()) if offset == HANDSHAKE else ReportReceived(offset, tx.log())
        )
        tx.master_actions(step.conn, tx.master_feed(step.conn, event))
        return True

    def _send_ready(self, tx: _Tx, w: World, step: Step) -> bool:
        actions = tx.master_feed(step.conn, SendReady(tx.log(), heartbeat_due=False))
        if not actions:
            return False
        tx.master_actions(step.conn, actions)
        return True

    def _header_received(self, tx: _Tx, w: World, step: Step) -> bool:
        conn = tx.conn(step.conn)
        item = conn.down[0]
        tx.conns[step.conn] = conn.but(down=conn.down[1:], s_read=0)
        if isinstance(item, Hello):
            tx.slave_actions(
                step.conn, tx.slave_feed(MasterHandshakeReceived(item.max_offset, item.epochs))
            )
            return True
        if not isinstance(item, FrameHeader):
            tx.violations.append(
                (
                    "FramingIntact",
                    "the slave expects a frame header but the next bytes are a frame body",
                )
            )
            return True
        if item.size == 0:
            tx.marks.add("heartbeat_received")
        tx.slave_actions(
            step.conn,
            tx.slave_feed(HeaderReceived(item.offset, item.size, item.epoch, item.epoch_start)),
        )
        return True

    def _body_received(self, tx: _Tx, w: World, step: Step) -> bool:
        conn = tx.conn(step.conn)
        item = conn.down[0]
        tx.conns[step.conn] = conn.but(down=conn.down[1:], s_read=0)
        if not isinstance(item, FrameBody):
            tx.violations.append(
                (
                    "FramingIntact",
                    f"the slave expects the body of {w.slave.receiving} but the next bytes "
                    f"are a new frame's header {item}: a partial frame outlived its connection",
                )
            )
            return True
        tx.slave_actions(step.conn, tx.slave_feed(BodyReceived()), item.data)
        return True

    def _connection_lost(self, tx: _Tx, w: World, step: Step) -> bool:
        conn = tx.conn(step.conn)
        if conn.attached or conn.up:
            return False
        tx.master_feed(step.conn, ConnectionLost())
        tx.conns[step.conn] = None
        return True

    def _tick(self, tx: _Tx, w: World, step: Step) -> bool:
        """One heartbeat interval passes: housekeeping first, then every heartbeat is due."""
        for i in range(len(tx.conns)):
            conn = tx.conns[i]
            if conn is None:
                continue
            conn = conn.but(m_read=conn.m_read + 1, s_read=conn.s_read + 1 if conn.attached else 0)
            tx.conns[i] = conn
            if conn.m_read >= 2:
                if conn.attached:
                    tx.violations.append(
                        (
                            "HeartbeatsKeepLinkOpen",
                            f"master c{i} closed by housekeeping although its slave is "
                            "connected: no report for two heartbeat intervals",
                        )
                    )
                tx.marks.add("stale_connection_reaped")
                tx.master_actions(i, tx.master_feed(i, ReadIdle()))
                if tx.conns[i] is not None:
                    tx.conns[i] = None
                continue
            if conn.attached:
                if conn.s_read >= 2:
                    tx.violations.append(
                        (
                            "HeartbeatsKeepLinkOpen",
                            f"slave closed c{i} by housekeeping although the master is "
                            "alive: nothing read for two heartbeat intervals",
                        )
                    )
                    tx.slave_actions(i, tx.slave_feed(ReadIdle()))
                    continue
                tx.slave_actions(i, tx.slave_feed(HeartbeatDue()))
            # A stale connection's writer is blocked: nobody reads it (zero window).
            live = tx.conns[i]
            if conn.attached and live is not None and live.master.phase is MasterPhase.TRANSFER:
                tx.master_actions(i, tx.master_feed(i, SendReady(tx.log(), heartbeat_due=True)))
        return True

    def _sync_timeout(self, tx: _Tx, w: World, step: Step) -> bool:
        _, mid = w.pending[0]
        tx.pending = w.pending[1:]
        tx.marks.add("sync_timeout")
        tx.note(f"sync put of message {mid} answered FLUSH_SLAVE_TIMEOUT")
        return True

    # --- faults ---------------------------------------------------------------------------
    def _drop(self, tx: _Tx, w: World, step: Step) -> bool:
        tx.spend("drops")
        if w.slave.receiving is not None:
            tx.marks.add("drop_mid_frame")
        tx.slave_feed(ConnectionLost())
        tx.slave_close(step.conn)
        return True

    def _read_idle(self, tx: _Tx, w: World, step: Step) -> bool:
        tx.spend("housekeeping")
        if step.arg == 0:
            tx.master_actions(step.conn, tx.master_feed(step.conn, ReadIdle()))
        else:
            tx.slave_actions(step.conn, tx.slave_feed(ReadIdle()))
        return True

    def _slave_restart(self, tx: _Tx, w: World, step: Step) -> bool:
        tx.spend("restarts")
        cut = step.arg
        if w.slave.receiving is not None:
            tx.marks.add("restart_mid_frame")
        tx.detach_slave()
        tx.slave = SlaveState()
        if cut <= w.sbase:
            tx.sbase, tx.slog, tx.sflushed = 0, (), 0
        else:
            tx.slog = w.slog[: cut - w.sbase]
            tx.sflushed = cut
        if w.slog and cut < w.send:
            tx.marks.add("restart_lost_unflushed")
            if cut % self.config.message_size:
                tx.marks.add("restart_cut_mid_message")
        tx.note(f"slave restarts with its log ending at {tx.send}")
        return True

    def _master_crash(self, tx: _Tx, w: World, step: Step) -> bool:
        tx.spend("crashes")
        if w.mflushed < w.mmax:
            tx.marks.add("master_lost_unflushed")
        tx.master_restarts(w.mflushed)
        tx.note(f"master restarts with its log ending at {len(tx.mlog)}")
        if self.config.classic_refusal:
            self._lost_sent_bytes(tx)
        return True

    # --- classic-mode divergence check (Config.classic_refusal) ---------------------------
    def _lost_sent_bytes(self, tx: _Tx) -> None:
        """``open_master_history``: a lost range, and END_OF_FILE padding past the mark."""
        end = len(tx.mlog)
        if tx.msent <= end:
            return
        size = self.config.segment_size
        tx.mlost = (*tx.mlost, (end, tx.msent))
        target = (tx.msent // size + 1) * size  # LogCore.skip_past
        tx.mlog = tx.mlog + (0,) * (target - end)
        tx.mflushed = target
        tx.marks.add("master_lost_sent")
        tx.note(f"master lost [{end}, {tx.msent}) it had sent; new messages start at {target}")

    def _truncate_to_master(self, tx: _Tx, w: World, step: Step) -> bool:
        """``trioha slave --truncate-to-master``: cut the slave back to the named offset."""
        if w.sdiverged < 0:
            return False
        cut = w.sdiverged
        if cut <= w.sbase:
            tx.sbase, tx.slog, tx.sflushed = 0, (), 0
        else:
            tx.slog = w.slog[: cut - w.sbase]
            tx.sflushed = min(w.sflushed, tx.send)
        tx.sdiverged = -1
        tx.marks.add("slave_truncated_to_master")
        tx.note(f"the operator cuts the slave back to {tx.send}")
        return True

    def _master_loses_tail(self, tx: _Tx, w: World, step: Step) -> bool:
        """The master crashes and its log comes back shorter, at message boundary ``arg``."""
        tx.spend("tail_losses")
        tx.marks.add("master_lost_records")
        tx.master_restarts(step.arg)
        tx.note(f"master restarts having lost its records from {step.arg} on")
        return True

    def _delete_segment(self, tx: _Tx, w: World, step: Step) -> bool:
        tx.spend("deletions")
        tx.mmin = w.mmin + self.config.segment_size
        tx.note(f"master deletes its oldest segment; oldest offset now {tx.mmin}")
        return True

    def _bogus_report(self, tx: _Tx, w: World, step: Step) -> bool:
        tx.spend("bogus")
        if step.arg < 0:
            bogus = w.mmax if self.config.rogue_reports_end else self.config.bogus_offset
            # A rogue client holds nothing: any ack above 0 from it is ahead of the truth.
            tx.conns.append(Conn(master=MasterState(), up=(bogus,), attached=False, truth=0))
        elif step.arg != self.config.bogus_offset:
            # Wrong for this connection *now*: the master reads it at once (a report sent later
            # could find more sent, and be right by then). Reports in flight go first (FIFO).
            tx.conns[step.conn] = tx.conn(step.conn).but(m_read=0)
            event = ReportReceived(step.arg, tx.log())
            tx.master_actions(step.conn, tx.master_feed(step.conn, event))
        else:
            conn = tx.conn(step.conn)
            tx.conns[step.conn] = conn.but(up=(*conn.up, step.arg))
        return True


_HANDLERS = {
    Kind.PUT: HAModel._put,
    Kind.MASTER_FLUSH: HAModel._master_flush,
    Kind.SLAVE_FLUSH: HAModel._slave_flush,
    Kind.CONNECTED: HAModel._connected,
    Kind.APPEND_CONFIRMED: HAModel._append_confirmed,
    Kind.REPORT_RECEIVED: HAModel._report_received,
    Kind.SEND_READY: HAModel._send_ready,
    Kind.HEADER_RECEIVED: HAModel._header_received,
    Kind.BODY_RECEIVED: HAModel._body_received,
    Kind.CONNECTION_LOST: HAModel._connection_lost,
    Kind.TICK: HAModel._tick,
    Kind.SYNC_TIMEOUT: HAModel._sync_timeout,
    Kind.DROP: HAModel._drop,
    Kind.READ_IDLE: HAModel._read_idle,
    Kind.SLAVE_RESTART: HAModel._slave_restart,
    Kind.MASTER_CRASH: HAModel._master_crash,
    Kind.DELETE_SEGMENT: HAModel._delete_segment,
    Kind.BOGUS_REPORT: HAModel._bogus_report,
    Kind.TRUNCATE_TO_MASTER: HAModel._truncate_to_master,
    Kind.MASTER_LOSES_TAIL: HAModel._master_loses_tail,
}


def _wrong_reports(conn: Conn, end: int) -> Iterator[int]:
    """Offsets the slave could never honestly report on *conn* next (besides beyond any end).

    Beyond what was sent up to the master's end, and below the last accepted ack. Only once the
    master has taken the first report: before it, any offset up to the end is a valid request.
    Such a report is read at once (``HAModel._bogus_report``), while it is still wrong.
    """
    m = conn.master
    if m.phase is not MasterPhase.TRANSFER:
        return
    yield from range(max(m.next_transfer, 0) + 1, end + 1)
    yield from range(0, m.ack_offset)
