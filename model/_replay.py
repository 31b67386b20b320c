"""Replay a model trace against the byte-level production objects.

The checker explores the pure core; production wraps it in :class:`trioha.proto.MasterConnection`
and :class:`trioha.proto.SlaveConnection`, which turn bytes and clock readings into events. This
module drives those two classes with real frames and reports, step by step, exactly as a trace
says, the way ``trioha.net`` does (same calls, same order), with real commit-log bytes:

* after every step it projects the byte-level objects back into a :class:`~model._world.World`
  and requires it to equal the world the model computed (a refinement check: the wrappers add
  nothing the model does not know about);
* it re-judges the named properties on what the byte-level run did, so a counterexample found
  by the checker becomes a deterministic test against production code.

With ``store=True`` both logs are real :class:`trioha.store.MemoryCommitLog` objects: the master
appends each message with ``append_raw``, every frame body is what the store's ``read`` returns
(which never crosses a segment end), the slave appends with ``append_raw`` (which refuses any
offset but its end), crashes and restarts ``truncate`` and retention uses
``delete_segments_before``; after every step the stores must hold exactly the model's bytes.

Time: ``Tick`` advances a clock by 1.0; the heartbeat interval is 0.5 and housekeeping 1.5, so
a heartbeat is due at every tick and housekeeping needs two silent ticks, as in the model.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence
from typing import assert_never

import attrs

from model._checks import check_frame, check_master_transition, check_report
from model._engine import Trace
from model._properties import STATE_INVARIANTS
from model._steps import HAModel
from model._values import (
    Config,
    Conn,
    FrameBody,
    FrameHeader,
    Item,
    Kind,
    Step,
    World,
    caught_up,
)
from trioha._errors import OffsetMismatchError
from trioha.proto import (
    AckAdvanced,
    Append,
    Close,
    HeaderReceived,
    LogView,
    MasterAction,
    MasterConnection,
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
    SlavePhase,
    SlaveState,
    Timing,
    Truncate,
    Vouch,
    encode_report,
    frame_header,
    slave_step,
    vouch,
)
from trioha.store import MemoryCommitLog
from trioha.store._logcore import LogCore

TIMING = Timing(heartbeat=0.5, housekeeping=1.5)
_HEADER = struct.Struct(">qi")
_REPORT = struct.Struct(">q")


class ReplayMismatch(AssertionError):
    """The byte-level objects and the model disagree: one of them does not do what it says."""


@attrs.frozen
class ReplayResult:
    """What the byte-level run did: the projected worlds and the properties it broke."""

    worlds: tuple[World, ...]
    #: ``(property, message)`` for each property the byte-level run broke, in order.
    violations: tuple[tuple[str, str], ...]
    #: How many of the steps came from the trace (the rest are the fair tail).
    traced: int
    #: The reason of every Close either side's object returned, in order.
    closes: tuple[str, ...] = ()

    @property
    def final(self) -> World:
        return self.worlds[-1]

    def caught_up_in_tail(self, config: Config) -> bool:
        """Did any world after the trace (in the fair tail) catch up?"""
        return any(caught_up(w, config) for w in self.worlds[self.traced :])

    def broke(self, name: str) -> bool:
        return any(n == name for n, _ in self.violations)


class _ModelLog(MemoryCommitLog):
    """The in-memory commit log at the model's segment size (a few bytes).

    :class:`MemoryCommitLog` refuses segments below ``MIN_SEGMENT_SIZE``, the room a segment
    needs for RocketMQ's END_OF_FILE blank record; the replay never writes one (nor records:
    the model's messages are plain bytes), so everything else, segment arithmetic included,
    runs unchanged at the model's size.
    """

    def __init__(self, segment_size: int) -> None:
        LogCore.__init__(self, segment_size=segment_size)
        self.kept_bytes = {}
        self._mtime_ms = lambda: 0  # retention's rule is the model's, not the segments' times


def _store_bytes(store: MemoryCommitLog) -> bytes:
    """Everything *store* holds, from its first offset, read segment by segment."""
    out, pos = bytearray(), store.min_offset
    while pos < store.max_offset:
        chunk = store.read(pos, store.max_offset - pos)
        out += chunk
        pos += len(chunk)
    return bytes(out)


class _Wire:
    """One TCP connection at byte level: the master's object and both directions' bytes."""

    def __init__(self, mc: MasterConnection, *, attached: bool) -> None:
        self.mc = mc
        self.down: list[tuple[str, bytes]] = []  # ("H", 12 header bytes) / ("B", body bytes)
        self.up: list[bytes] = []  # 8-byte reports
        self.attached = attached
        self.truth = -1
        self.sent_end = -1
        self.last_report = -1


class _Harness:
    """The byte-level system: production protocol objects, real log bytes, a clock."""

    def __init__(self, config: Config) -> None:
        self.cfg = config
        self.options = config.options
        self.split = False
        self.now = 0.0
        self.mlog = bytearray()
        self.mflushed = 0
        self.mmin = 0
        self.puts = 0
        self.pending: list[tuple[int, int]] = []
        self.acked: list[tuple[int, int, int]] = []
        self.wires: list[_Wire] = []
        self.sc: SlaveConnection | None = None
        self.core = SlaveState()  # the slave's core while no SlaveConnection exists
        self.slog = bytearray()
        self.sbase = 0
        self.sflushed = 0
        #: The slave was told its next bytes were deleted on the master (World.sbehind).
        self.sbehind = -1
        self.budget = config.faults
        self.violations: list[tuple[str, str]] = []
        self.closes: list[str] = []
        self.step = Step(Kind.TICK)  # the step being applied
        self.stale_used = False
        #: With ``store=True``: the real commit logs behind ``mlog`` and ``slog``.
        self.mstore: MemoryCommitLog | None = None
        self.sstore: MemoryCommitLog | None = None

    def use_store(self) -> None:
        self.mstore = _ModelLog(self.cfg.segment_size)
        self.sstore = _ModelLog(self.cfg.segment_size)

    def check_store(self) -> None:
        """The real logs hold exactly the bytes the harness (and so the model) says."""
        if self.mstore is None or self.sstore is None:
            return
        m = self.mstore
        if (m.max_offset, _store_bytes(m)) != (len(self.mlog), bytes(self.mlog[m.min_offset :])):
            raise ReplayMismatch(f"master store {m} holds other bytes than the model's log")
        if m.max_offset and m.min_offset != self.mmin:
            raise ReplayMismatch(f"master store starts at {m.min_offset}, the model at {self.mmin}")
        s = self.sstore
        if s.max_offset != self.send or _store_bytes(s) != bytes(self.slog):
            raise ReplayMismatch(f"slave store {s} holds other bytes than the model's log")

    # --- views ------------------------------------------------------------------------------
    @property
    def send(self) -> int:
        return self.sbase + len(self.slog) if self.slog else 0

    def log(self) -> LogView:
        if self.mstore is not None:
            m = self.mstore
            return LogView(m.min_offset, m.max_offset, m.segment_size)
        return LogView(self.mmin, len(self.mlog), self.cfg.segment_size)

    def project(self) -> World:
        conns = tuple(self._project_wire(w) for w in self.wires)
        return World(
            mlog=tuple(self.mlog),
            mflushed=self.mflushed,
            mmin=self.mmin,
            puts=self.puts,
            pending=tuple(self.pending),
            acked=tuple(self.acked),
            conns=conns,
            slave=self.sc.state if self.sc is not None else self.core,
            sbase=self.sbase,
            slog=tuple(self.slog),
            sflushed=self.sflushed,
            budget=self.budget,
            sbehind=self.sbehind,
        )

    def _project_wire(self, w: _Wire) -> Conn:
        down: list[Item] = []
        for kind, data in w.down:
            if kind == "H":
                down.append(FrameHeader(*_HEADER.unpack(data)))
            else:
                down.append(FrameBody(tuple(data)))
        s_read = 0
        if w.attached:
            assert self.sc is not None
            s_read = round(self.now - self.sc.last_read)
        return Conn(
            master=w.mc.state,
            down=tuple(down),
            up=tuple(_REPORT.unpack(r)[0] for r in w.up),
            attached=w.attached,
            truth=w.truth,
            sent_end=w.sent_end,
            last_report=w.last_report,
            m_read=round(self.now - w.mc.last_read),
            s_read=s_read,
        )

    def spend(self, fault: str) -> None:
        self.budget = attrs.evolve(self.budget, **{fault: getattr(self.budget, fault) - 1})

    def attached(self) -> int:
        for i, w in enumerate(self.wires):
            if w.attached:
                return i
        return -1

    # --- the master side (what trioha.net.HAConnection and HAService do) ---------------------
    def master_actions(self, w: _Wire, actions: Sequence[MasterAction]) -> None:
        for action in actions:
            if w not in self.wires:
                return
            match action:
                case SendTransfer() | SendHeartbeat():
                    self.write_frame(w, action)
                case AckAdvanced():
                    self.on_ack()
                case Close():
                    self.closes.append(action.reason)
                    self.told_deleted(w, action)
                    self.master_close(w)
                case SendMasterHandshake():
                    raise AssertionError(f"a classic-mode replay got {action!r}")
                case _:
                    assert_never(action)

    def told_deleted(self, w: _Wire, close: Close) -> None:
        """``HAConnection._push_offset``: the master's oldest offset goes out as a heartbeat
        header before the close; a slave between frames reads it with its own rule and, told
        its next bytes are gone, stops for good (the model's ``refused``)."""
        sc = self.sc
        if close.oldest is None or not w.attached or sc is None:
            return
        if sc.state.phase is not SlavePhase.TRANSFER or sc.state.receiving is not None:
            return
        _, actions = slave_step(sc.state, HeaderReceived(close.oldest, 0))
        if any(isinstance(a, Close) and a.oldest is not None for a in actions):
            self.sbehind = close.oldest

    def write_frame(self, w: _Wire, action: SendTransfer | SendHeartbeat) -> None:
        size = action.size if isinstance(action, SendTransfer) else 0
        conn = self._project_wire(w)
        batch = self.cfg.batch_size
        self.violations.extend(check_frame(conn, action.offset, size, self.log(), batch))
        w.down.append(("H", frame_header(action)))
        if size:
            if self.mstore is not None:
                body = bytes(self.mstore.read(action.offset, size))
            else:
                body = bytes(self.mlog[action.offset : action.offset + size])
            w.down.append(("B", body))
            w.sent_end = action.offset + size
        elif w.sent_end < 0:
            w.sent_end = action.offset
        before = w.mc.state
        w.mc.frame_written(now=self.now)
        self.violations.extend(check_master_transition(before, w.mc.state))

    def live_acks(self) -> list[Vouch]:
        live = (w.mc.state for w in self.wires)
        return [vouch(m) for m in live if m.phase is MasterPhase.TRANSFER]

    def quorum(self) -> Quorum:
        return Quorum.of(self.live_acks(), self.cfg.needed_acks)

    def on_ack(self) -> None:
        keep = []
        quorum = self.quorum()
        for end, mid in self.pending:
            start = end - self.cfg.message_size
            if quorum.holds(start, end):
                self.acked.append((end - self.cfg.message_size, end, mid))
            else:
                keep.append((end, mid))
        self.pending = keep

    def master_close(self, w: _Wire) -> None:
        self.wires.remove(w)
        if w.attached:
            self.slave_connection_lost()

    # --- the slave side (what trioha.net.HAClient does) ---------------------------------------
    def slave_actions(self, w: _Wire, actions: Sequence[SlaveAction]) -> None:
        for action in actions:
            match action:
                case SendReport():
                    self.violations.extend(check_report(self._project_wire(w), action.offset))
                    w.up.append(encode_report(action.offset))
                    w.last_report = action.offset
                    assert self.sc is not None
                    self.sc.report_written(now=self.now)
                case Append():
                    self.append(action)
                case Close():
                    self.closes.append(action.reason)
                    if "pushed offset" in action.reason:
                        self.violations.append(("NoFrameRejected", f"slave: {action.reason}"))
                    self.slave_close(w)
                    return
                case SendSlaveHandshake() | Truncate() | RecordEpoch():
                    raise AssertionError(f"a classic-mode replay got {action!r}")
                case _:
                    assert_never(action)

    def append(self, action: Append) -> None:
        if self.sstore is not None:
            try:
                self.sstore.append_raw(action.offset, action.data)
            except OffsetMismatchError as exc:
                self.violations.append(("AppendAtEnd", f"slave store: {exc}"))
                return
        if not self.slog:
            self.sbase, self.sflushed = action.offset, action.offset
            self.slog = bytearray(action.data)
        elif action.offset == self.send:
            self.slog += action.data
        else:
            message = f"Append at {action.offset} but the slave's log ends at {self.send}"
            self.violations.append(("AppendAtEnd", message))

    def slave_connection_lost(self) -> None:
        i = self.attached()
        if i >= 0:
            self._detach(self.wires[i])
        if self.sc is not None:
            self.sc.connection_lost()
            self.core = self.sc.state
            self.sc = None

    def _detach(self, w: _Wire) -> None:
        w.attached = False
        w.truth = self.send
        w.down.clear()

    def slave_close(self, w: _Wire, *, stale: bool | None = None) -> None:
        """The slave side of *w* ended; the master side goes too unless it lingers (stale)."""
        if self.sc is not None:
            self.core = self.sc.state
            self.sc = None
        self._detach(w)
        if (self.step.stale if stale is None else stale) and not self.stale_used:
            self.stale_used = True
            self.spend("stale")
            return
        before = w.mc.state
        w.mc.connection_lost()
        self.violations.extend(check_master_transition(before, w.mc.state))
        self.wires.remove(w)

    # --- steps ----------------------------------------------------------------------------------
    def do(self, step: Step) -> None:
        self.step = step
        self.stale_used = False
        getattr(self, "_" + step.kind.name.lower())(step)

    def _wire(self, step: Step) -> _Wire:
        return self.wires[step.conn]

    def _put(self, step: Step) -> None:
        cfg = self.cfg
        self.puts += 1
        mid = self.puts
        if self.mstore is not None:
            self.mstore.append_raw(len(self.mlog), bytes([mid]) * cfg.message_size)
        self.mlog += bytes([mid]) * cfg.message_size
        end = len(self.mlog)
        if cfg.master_sync_flush:
            self.mflushed = end
        if step.arg:
            quorum = self.quorum()
            if not quorum.available(end, cfg.fallbehind_max):
                return
            if quorum.holds(end - cfg.message_size, end):
                self.acked.append((end - cfg.message_size, end, mid))
            else:
                self.pending.append((end, mid))

    def _master_flush(self, step: Step) -> None:
        self.mflushed = len(self.mlog)
        if self.mstore is not None:
            self.mstore.flush()

    def _slave_flush(self, step: Step) -> None:
        self.sflushed = self.send
        if self.sstore is not None:
            self.sstore.flush()

    def _connected(self, step: Step) -> None:
        if self.cfg.slave_ack_flushed and self.slog:
            self.sflushed = self.send
        self.sc = SlaveConnection(log_max=self.send, now=self.now, timing=TIMING)
        mc = MasterConnection(now=self.now, options=self.options, timing=TIMING)
        w = _Wire(mc, attached=True)
        self.wires.append(w)
        self.slave_actions(w, self.sc.initial_actions())

    def _append_confirmed(self, step: Step) -> None:
        if self.cfg.slave_ack_flushed:
            self.sflushed = self.send
            target = self.sflushed
        else:
            target = self.send
        assert self.sc is not None
        self.slave_actions(self._wire(step), self.sc.appended(target, now=self.now))

    def _report_received(self, step: Step) -> None:
        w = self._wire(step)
        data = b"".join(w.up[: step.arg])
        del w.up[: step.arg]
        before = w.mc.state
        actions = w.mc.receive_data(data, now=self.now, log=self.log())
        self.violations.extend(check_master_transition(before, w.mc.state))
        self.master_actions(w, actions)

    def _send_ready(self, step: Step) -> None:
        w = self._wire(step)
        before = w.mc.state
        action = w.mc.next_send(now=self.now, log=self.log())
        self.violations.extend(check_master_transition(before, w.mc.state))
        if action is not None:
            self.master_actions(w, (action,))

    def _receive(self, step: Step) -> None:
        w = self._wire(step)
        _, data = w.down.pop(0)
        assert self.sc is not None
        if not self.split:
            self.slave_actions(w, self.sc.receive_data(data, now=self.now))
            return
        # Split deliveries: TCP hands the slave a frame in pieces of 1, 2, 3, ... bytes; every
        # piece but the last must leave the slave without an action and its state unchanged.
        pieces = _split(data)
        for piece in pieces[:-1]:
            before = self.sc.state
            if self.sc.receive_data(piece, now=self.now) or self.sc.state != before:
                raise ReplayMismatch(
                    f"a partial delivery of {len(piece)} of {len(data)} bytes changed the slave"
                )
        self.slave_actions(w, self.sc.receive_data(pieces[-1], now=self.now))

    _header_received = _receive
    _body_received = _receive

    def _connection_lost(self, step: Step) -> None:
        w = self._wire(step)
        w.mc.connection_lost()
        self.wires.remove(w)

    def _tick(self, step: Step) -> None:
        self.now += 1.0
        for w in list(self.wires):
            if w not in self.wires:
                continue
            before = w.mc.state
            actions = w.mc.tick(now=self.now)
            self.violations.extend(check_master_transition(before, w.mc.state))
            if actions:
                if w.attached:
                    self.violations.append(
                        ("HeartbeatsKeepLinkOpen", "master closed a live link by housekeeping")
                    )
                self.master_actions(w, actions)
                continue
            if not w.attached:
                continue
            assert self.sc is not None
            reading_deadline = self.sc.read_deadline
            slave_actions = self.sc.tick(now=self.now)
            if self.now >= reading_deadline:
                self.violations.append(
                    ("HeartbeatsKeepLinkOpen", "slave closed a live link by housekeeping")
                )
            self.slave_actions(w, slave_actions)
            if w in self.wires and w.attached and w.mc.state.phase is MasterPhase.TRANSFER:
                before = w.mc.state
                action = w.mc.next_send(now=self.now, log=self.log())
                self.violations.extend(check_master_transition(before, w.mc.state))
                if action is not None:
                    self.master_actions(w, (action,))

    def _sync_timeout(self, step: Step) -> None:
        self.pending.pop(0)

    def _drop(self, step: Step) -> None:
        self.spend("drops")
        w = self._wire(step)
        assert self.sc is not None
        self.sc.connection_lost()
        self.slave_close(w)

    def _read_idle(self, step: Step) -> None:
        self.spend("housekeeping")
        w = self._wire(step)
        if step.arg == 0:  # a stall: the master's clock jumps past its read deadline
            before = w.mc.state
            actions = w.mc.tick(now=max(self.now, w.mc.read_deadline))
            self.violations.extend(check_master_transition(before, w.mc.state))
            self.master_actions(w, actions)
        else:
            assert self.sc is not None
            self.slave_actions(w, self.sc.tick(now=max(self.now, self.sc.read_deadline)))

    def _slave_restart(self, step: Step) -> None:
        self.spend("restarts")
        i = self.attached()
        if i >= 0:
            assert self.sc is not None
            self.sc.connection_lost()
            self.slave_close(self.wires[i])
        self.sc = None
        self.core = SlaveState()
        cut = step.arg
        if cut <= self.sbase:
            self.slog, self.sbase, self.sflushed = bytearray(), 0, 0
            if self.sstore is not None:
                self.sstore = _ModelLog(self.cfg.segment_size)
        else:
            del self.slog[cut - self.sbase :]
            self.sflushed = cut
            if self.sstore is not None:
                self.sstore.truncate(cut)

    def _master_crash(self, step: Step) -> None:
        self.spend("crashes")
        for w in list(self.wires):
            w.mc.connection_lost()
            self.wires.remove(w)
            if w.attached:
                self.slave_connection_lost()
        del self.mlog[self.mflushed :]
        if self.mstore is not None and self.mstore.max_offset > self.mflushed:
            self.mstore.truncate(self.mflushed)
        self.pending.clear()

    def _delete_segment(self, step: Step) -> None:
        self.spend("deletions")
        self.mmin += self.cfg.segment_size
        if self.mstore is not None:
            self.mstore.delete_segments_before(self.mmin)

    def _bogus_report(self, step: Step) -> None:
        self.spend("bogus")
        if self.cfg.rogue_reports_end:
            bogus = len(self.mlog)
        else:
            bogus = self.cfg.bogus_offset if step.arg < 0 else step.arg
        report = encode_report(bogus)
        if step.arg >= 0 and bogus != self.cfg.bogus_offset:  # read at once, as the model does
            w = self._wire(step)
            before = w.mc.state
            actions = w.mc.receive_data(report, now=self.now, log=self.log())
            self.violations.extend(check_master_transition(before, w.mc.state))
            self.master_actions(w, actions)
            return
        if step.arg < 0:
            w = _Wire(
                MasterConnection(now=self.now, options=self.options, timing=TIMING), attached=False
            )
            w.truth = 0
            w.up.append(report)
            self.wires.append(w)
        else:
            self._wire(step).up.append(report)

    # --- keeping the connection order the model uses ------------------------------------------
    def align(self, world: World) -> None:
        """Order the wires as the model orders its connections (it sorts them for symmetry)."""
        projected = [(self._project_wire(w), w) for w in self.wires]
        ordered: list[_Wire] = []
        for conn in world.conns:
            for k, (p, w) in enumerate(projected):
                if p == conn:
                    ordered.append(w)
                    del projected[k]
                    break
            else:
                raise ReplayMismatch(f"no byte-level connection matches the model's {conn}")
        if projected:
            raise ReplayMismatch(f"byte-level connections the model does not have: {projected}")
        self.wires = ordered


def _split(data: bytes) -> list[bytes]:
    """*data* cut into pieces of 1, 2, 3, ... bytes (the last one what is left)."""
    pieces, pos, size = [], 0, 1
    while pos < len(data):
        pieces.append(data[pos : pos + size])
        pos += size
        size += 1
    return pieces or [data]


def replay(
    config: Config,
    trace: Trace[World, Step] | Sequence[Step],
    *,
    then: int = 0,
    split: bool = False,
    store: bool = False,
) -> ReplayResult:
    """Drive the byte-level objects through *trace*; raise :class:`ReplayMismatch` on drift.

    With *then* > 0, continue for that many fault-free steps (no puts either) chosen
    round-robin among those the model enables: a fair schedule, e.g. to show that a stuck
    state stays stuck whatever the protocol does. With *split*, every frame header and body
    reaches the slave in pieces (1, 2, 3, ... bytes), as a real socket may deliver it. With
    *store*, both logs are real commit logs (see the module docstring), checked after each step.
    """
    steps = list(trace.actions if isinstance(trace, Trace) else trace)
    model = HAModel(config)
    tail = fair_tail(model, steps, then) if then else []
    world = model.initial()
    harness = _Harness(config)
    harness.split = split
    if store:
        harness.use_store()
    worlds = [harness.project()]
    if worlds[0] != world:
        raise ReplayMismatch("initial worlds differ")
    for n, step in enumerate((*steps, *tail)):
        out = model.apply(world, step)
        if out is None:
            raise ReplayMismatch(f"step {n + 1} {step} is not enabled in the model")
        harness.do(step)
        harness.check_store()
        world = out.world
        try:
            harness.align(world)
        except ReplayMismatch as exc:
            raise ReplayMismatch(f"after step {n + 1} {step}: {exc}") from None
        projected = harness.project()
        if projected != world:
            raise ReplayMismatch(
                f"after step {n + 1} {step}:\n  model:      {world}\n  byte level: {projected}"
            )
        worlds.append(projected)
    violations = list(harness.violations)
    for inv in STATE_INVARIANTS:
        for w in worlds:
            message = inv.check(w)
            if message is not None:
                violations.append((inv.name, message))
                break
    return ReplayResult(tuple(worlds), tuple(violations), len(steps), tuple(harness.closes))


def random_walk(model: HAModel, rng: random.Random, length: int) -> tuple[list[Step], World]:
    """Up to *length* steps chosen by *rng* among those the model enables; and where they end."""
    world = model.initial()
    steps: list[Step] = []
    for _ in range(length):
        options = list(model.successors(world))
        if not options:
            break
        step, out = rng.choice(options)
        steps.append(step)
        world = out.world
    return steps, world


def fair_tail(model: HAModel, steps: Sequence[Step], count: int) -> list[Step]:
    """*count* fault-free, put-free steps after *steps*, chosen round-robin on the model."""
    world = model.initial()
    for step in steps:
        out = model.apply(world, step)
        if out is None:
            return []  # replay reports the problem
        world = out.world
    tail: list[Step] = []
    for k in range(count):
        options = [
            (step, out)
            for step, out in model.successors(world)
            if not step.fault and step.kind is not Kind.PUT
        ]
        if not options:
            break
        step, out = options[k % len(options)]
        tail.append(step)
        world = out.world
    return tail
