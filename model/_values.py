"""The replication world as values: its configuration, the logs and the wire, steps and outcomes.

Only frozen, hashable data and the small queries the properties ask (:func:`serving`,
:func:`caught_up`, :func:`divergence`, ...); what can happen to it is in :mod:`model._steps`,
the checks a transition must pass in :mod:`model._checks`. The abstractions these values stand
for (logs as message ids per byte, channels as FIFO tuples, time in heartbeat ticks, fault
budgets) are described there, beside the steps that give them their meaning.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import attrs

from trioha.proto import (
    EpochHistory,
    LogView,
    MasterOptions,
    MasterPhase,
    MasterState,
    SlavePhase,
    SlaveState,
    choose_epoch_start,
    choose_start,
)
from trioha.store import expired_count, segment_count

# --- configuration ----------------------------------------------------------------------------


@attrs.frozen
class Faults:
    """How many of each fault a run may inject (0 = never)."""

    #: The TCP connection breaks (both ends see it).
    drops: int = 0
    #: A side's housekeeping fires early (a stall longer than ``haHousekeepingInterval``).
    housekeeping: int = 0
    #: A slave-side close leaves the master's side alive; its late reports still arrive.
    stale: int = 0
    #: The slave restarts; its log is cut anywhere between flushed and written.
    restarts: int = 0
    #: The master crashes and restarts; its log is cut to what it flushed.
    crashes: int = 0
    #: The master deletes its oldest segment (retention, ``deleteWhen``).
    deletions: int = 0
    #: A report beyond the master's end arrives (RocketMQ #3015/#1155).
    bogus: int = 0
    #: The master crashes and loses its last records, flushed or not, down to any message
    #: boundary (recovery met a damaged record; or a power cut took a tail already sent).
    tail_losses: int = 0

    def total(self) -> int:
        return sum(attrs.astuple(self))


@attrs.frozen
class Config:
    """One named world: its size, the options under test, and the fault budgets."""

    name: str
    doc: str
    #: Messages put in total (producers stop after that).
    messages: int = 2
    message_size: int = 2
    #: ``mappedFileSizeCommitLog``; a multiple of ``message_size``.
    segment_size: int = 4
    #: ``haTransferBatchSize``: smaller than a message makes frames split messages.
    batch_size: int = 1
    #: Frames in flight per connection before the master's writes block (TCP back pressure).
    window: int = 2
    sync_puts: bool = True
    async_puts: bool = False
    #: SYNC_FLUSH on the master: a put is on disk before it is acknowledged or replicated.
    master_sync_flush: bool = True
    #: ``ha_slave_ack_flushed``: the slave reports only what it has flushed.
    slave_ack_flushed: bool = True
    #: ``ha_sync_from_oldest``: a slave reporting 0 gets the whole log, not the last segment.
    sync_from_oldest: bool = False
    #: Slaves whose ack a sync put waits for (``in_sync_replicas - 1``).
    needed_acks: int = 1
    #: ``haSlaveFallbehindMax`` in bytes.
    fallbehind_max: int = 1 << 30
    #: Model time: heartbeats and housekeeping (``Tick`` steps).
    time: bool = True
    faults: Faults = Faults()
    #: Also require the slave to end up with the master's whole log (not just its tail).
    full_copy_goal: bool = False
    #: Known-bad configurations: the property that must fail (the test asserts it does).
    expect: str | None = None
    #: Sort interchangeable connections (symmetry reduction).
    symmetry: bool = True
    #: A rogue client's first report is the master's current end (it guessed or read it)
    #: instead of an offset beyond any end; only rogue connections, never the slave's stream.
    rogue_reports_end: bool = False
    #: trioha's classic-mode divergence check (``trioha.net._divergence``): the master keeps a
    #: durable mark of what it sent; a crash that loses sent bytes records the lost range,
    #: closes the log with END_OF_FILE padding (message id 0) up to the first segment
    #: boundary past the mark, and refuses first reports inside the range. A refused slave
    #: stops (sticky) until the operator cuts it back (``TruncateToMaster``).
    classic_refusal: bool = False
    #: Speak the AutoSwitch protocol (``enable_controller_mode``): epochs and handshakes.
    epoch_mode: bool = False
    # --- assurance: what the checker could not see before (docs/model.md, "second round") ---
    #: Bogus reports on the slave's connection take every value that is wrong for it: each
    #: offset in ``(sent, master's end]`` (an ack checked against the log end instead of what
    #: was sent passes these) and each offset below the accepted ack (a backwards report),
    #: besides the one beyond any end.
    bogus_anywhere: bool = False

    def __attrs_post_init__(self) -> None:
        if self.segment_size % self.message_size:
            raise ValueError("segment_size must hold a whole number of messages")
        if self.messages * self.message_size >= 255 or self.messages >= 255:
            raise ValueError("message ids and offsets must fit a byte")

    @property
    def options(self) -> MasterOptions:
        return MasterOptions(
            batch_size=self.batch_size,
            sync_from_oldest=self.sync_from_oldest,
            epoch_mode=self.epoch_mode,
        )

    @property
    def odd_frames(self) -> bool:
        """Frames end inside messages and some are cut short at segment ends."""
        return (
            1 < self.batch_size < self.segment_size
            and self.batch_size % self.message_size != 0
            and self.segment_size % self.batch_size != 0
        )

    @property
    def honest_goal(self) -> bool:
        """HonestSlaveNeverRefused applies: nothing can legitimately shut the slave out.

        A deleted segment the slave still needs (#3388) and a slave ahead of a master that lost
        unflushed data (#323) are refused forever, on purpose.
        """
        return self.faults.deletions == 0 and (self.master_sync_flush or not self.faults.crashes)

    @property
    def fallbehind_edge(self) -> bool:
        """``fallbehind_max`` is small enough for the model's puts to meet it from both sides."""
        return self.fallbehind_max <= self.messages * self.message_size

    @property
    def bogus_offset(self) -> int:
        """A report beyond any end the master can reach."""
        return self.messages * self.message_size + self.message_size


# --- the world --------------------------------------------------------------------------------


#: Epoch mode: the slave's handshake, as it travels up among the reports.
HANDSHAKE = -1
_NO_EPOCHS = EpochHistory()


@attrs.frozen(cache_hash=True)
class FrameHeader:
    """The header of a frame on the wire: ``(offset, size)``; size 0 is a heartbeat.

    Epoch mode adds the frame's epoch and that epoch's start offset.
    """

    offset: int
    size: int
    epoch: int = -1
    epoch_start: int = -1


@attrs.frozen(cache_hash=True)
class Hello:
    """Epoch mode: the master's handshake, its max offset and epoch history."""

    max_offset: int
    epochs: EpochHistory


@attrs.frozen(cache_hash=True)
class FrameBody:
    """The body of the frame whose header precedes it: one message id per byte."""

    data: tuple[int, ...]


Item = FrameHeader | FrameBody | Hello


@attrs.frozen(cache_hash=True)
class Conn:
    """One TCP connection as the master holds it, with both directions in flight.

    ``attached``: the slave's client is on this connection. A detached connection is either a
    stale one (its slave side is gone) or one a rogue client opened. The other fields after
    ``up`` are bookkeeping the properties need (ghost variables); the protocol never reads them.
    """

    master: MasterState
    #: Master -> slave items not yet received (dropped when the slave leaves the connection).
    down: tuple[Item, ...] = ()
    #: Slave -> master reports not yet read.
    up: tuple[int, ...] = ()
    attached: bool = True
    #: The slave's written end when it left this connection (-1 while attached; 0 for a rogue
    #: client, which holds nothing).
    truth: int = -1
    #: End of the last frame the master sent here (-1: none yet).
    sent_end: int = -1
    #: The last report the slave sent here (-1: none yet).
    last_report: int = -1
    #: Ticks since the master last read anything here (housekeeping after 2).
    m_read: int = 0
    #: Ticks since the slave last read anything here (housekeeping after 2; 0 when detached).
    s_read: int = 0

    def but(
        self,
        *,
        master: MasterState | None = None,
        down: tuple[Item, ...] | None = None,
        up: tuple[int, ...] | None = None,
        attached: bool | None = None,
        truth: int | None = None,
        sent_end: int | None = None,
        last_report: int | None = None,
        m_read: int | None = None,
        s_read: int | None = None,
    ) -> Conn:
        """A copy with some fields changed (``attrs.evolve`` without its introspection cost)."""
        return Conn(
            self.master if master is None else master,
            self.down if down is None else down,
            self.up if up is None else up,
            self.attached if attached is None else attached,
            self.truth if truth is None else truth,
            self.sent_end if sent_end is None else sent_end,
            self.last_report if last_report is None else last_report,
            self.m_read if m_read is None else m_read,
            self.s_read if s_read is None else s_read,
        )


@attrs.frozen(cache_hash=True)
class World:
    """The whole system: master log and connections, slave core and log, ghosts, budgets."""

    #: The master's commit log: one message id per offset, from offset 0.
    mlog: tuple[int, ...] = ()
    #: Flushed end of the master's log (SYNC_FLUSH keeps it equal to the written end).
    mflushed: int = 0
    #: Oldest offset still stored on the master (segments below were deleted).
    mmin: int = 0
    #: Messages put so far; the next message's id is ``puts + 1``.
    puts: int = 0
    #: Sync puts waiting for a slave (``GroupTransferService``): ``(end, message id)``.
    pending: tuple[tuple[int, int], ...] = ()
    #: Sync puts answered PUT_OK: ``(start, end, message id)`` (ghost, for the properties).
    acked: tuple[tuple[int, int, int], ...] = ()
    conns: tuple[Conn, ...] = ()
    #: The slave's protocol core; DISCONNECTED between connections.
    slave: SlaveState = attrs.field(factory=SlaveState)
    #: The slave's log: ``slog[i]`` is offset ``sbase + i``; an empty log has ``sbase == 0``.
    sbase: int = 0
    slog: tuple[int, ...] = ()
    #: Flushed end of the slave's log (``sbase`` when nothing is flushed yet).
    sflushed: int = 0
    #: Fault budgets left.
    budget: Faults = Faults()
    # --- classic-mode divergence check (Config.classic_refusal; constant otherwise) ---------
    #: The master's durable "highest offset sent" mark.
    msent: int = 0
    #: Lost ranges ``(from, to)``: first reports ``from < r <= to`` are refused.
    mlost: tuple[tuple[int, int], ...] = ()
    #: The slave's sticky divergence: the offset the master named, -1 when none.
    sdiverged: int = -1
    #: Epoch mode: the master's epoch history and the slave's (its epoch file).
    mepochs: EpochHistory = _NO_EPOCHS
    sepochs: EpochHistory = _NO_EPOCHS
    #: The slave was told the master deleted what it needs (``Close.oldest``): it stops for
    #: good, until re-seeded (not modelled). The master's oldest offset then; -1 when not.
    sbehind: int = -1

    @property
    def send(self) -> int:
        """The slave's written end, 0 when its log is empty (its ``maxPhyOffset``)."""
        return self.sbase + len(self.slog) if self.slog else 0

    @property
    def mmax(self) -> int:
        return len(self.mlog)

    def attached(self) -> int:
        """Index of the connection the slave is on, or -1."""
        for i, conn in enumerate(self.conns):
            if conn.attached:
                return i
        return -1


# --- steps ------------------------------------------------------------------------------------


class Kind(enum.Enum):
    """What a step does; protocol steps are named after the event they feed to the core."""

    PUT = "Put"
    MASTER_FLUSH = "MasterFlush"
    SLAVE_FLUSH = "SlaveFlush"
    CONNECTED = "Connected"
    APPEND_CONFIRMED = "AppendConfirmed"
    REPORT_RECEIVED = "ReportReceived"
    SEND_READY = "SendReady"
    HEADER_RECEIVED = "HeaderReceived"
    BODY_RECEIVED = "BodyReceived"
    CONNECTION_LOST = "ConnectionLost"
    TICK = "Tick"
    SYNC_TIMEOUT = "SyncTimeout"
    # faults
    DROP = "Drop"
    READ_IDLE = "ReadIdle"
    SLAVE_RESTART = "SlaveRestart"
    MASTER_CRASH = "MasterCrash"
    DELETE_SEGMENT = "DeleteSegment"
    BOGUS_REPORT = "BogusReport"
    # the operator (not a fault: liveness may use it)
    TRUNCATE_TO_MASTER = "TruncateToMaster"
    MASTER_LOSES_TAIL = "MasterLosesTail"


FAULT_KINDS = frozenset(
    {
        Kind.MASTER_LOSES_TAIL,
        Kind.DROP,
        Kind.READ_IDLE,
        Kind.SLAVE_RESTART,
        Kind.MASTER_CRASH,
        Kind.DELETE_SEGMENT,
        Kind.BOGUS_REPORT,
    }
)


@attrs.frozen
class Step:
    """One step of a trace. ``conn`` indexes the connections of the state it is taken in.

    ``arg`` depends on the kind: Put 1 = sync / 0 = async; ReportReceived: how many reports one
    read takes (only the newest counts); ReadIdle: 0 = master side, 1 = slave side;
    SlaveRestart: the offset the log is cut to; BogusReport: -1 = on a new (rogue) connection,
    else the offset reported on this connection.
    ``stale``: a slave-side close in this step leaves the master side alive (a fault).
    """

    kind: Kind
    conn: int = -1
    arg: int = -1
    stale: bool = False

    @property
    def fault(self) -> bool:
        return self.kind in FAULT_KINDS or self.stale

    def __str__(self) -> str:
        parts = []
        if self.conn >= 0:
            parts.append(f"c{self.conn}")
        label = _ARG_LABELS.get(self.kind)
        if label is not None:
            parts.append(label(self.arg))
        if self.stale:
            parts.append("master side lingers")
        inner = ", ".join(parts)
        return f"{self.kind.value}({inner})" if inner else self.kind.value


def _reports(a: int) -> str:
    return "1 report" if a == 1 else f"{a} reports, newest counts"


_ARG_LABELS: dict[Kind, Callable[[int], str]] = {
    Kind.PUT: lambda a: "sync" if a else "async",
    Kind.REPORT_RECEIVED: _reports,
    Kind.READ_IDLE: lambda a: "slave side" if a else "master side",
    Kind.SLAVE_RESTART: lambda a: f"log cut to {a}",
    Kind.BOGUS_REPORT: lambda a: "rogue connection" if a < 0 else f"report {a} on this connection",
    Kind.MASTER_LOSES_TAIL: lambda a: f"log cut to {a}",
}


@attrs.frozen
class Outcome:
    """What applying one step produced."""

    world: World
    violations: tuple[tuple[str, str], ...] = ()
    marks: frozenset[str] = frozenset()
    notes: tuple[str, ...] = ()
    #: The step closed a slave side while the master side could have lingered.
    slave_closed: bool = False


# --- queries the properties ask -------------------------------------------------------------------


def serving(w: World) -> bool:
    """The master streams to the slave: its connection is attached and past the first report."""
    i = w.attached()
    return i >= 0 and w.conns[i].master.phase is MasterPhase.TRANSFER


def caught_up(w: World, config: Config) -> bool:
    """The slave holds everything the master would serve it, and agrees with it.

    With the last-segment rule an empty slave is served from the start of the master's last
    segment (:func:`trioha.proto.choose_start`); when that is the master's end, an empty slave
    whose connection is transferring has nothing left to receive, and is caught up too.
    """
    if not agree(w):
        return False
    if w.send == w.mmax:
        return True
    if w.send or w.slave.phase is not SlavePhase.TRANSFER:
        return False
    log = LogView(w.mmin, w.mmax, config.segment_size)
    i = w.attached()
    start = (
        choose_epoch_start(0, log, False)
        if config.epoch_mode
        else choose_start(0, log, config.options)
    )
    return start >= w.mmax and w.conns[i].master.phase is MasterPhase.TRANSFER


def oldest_segment_may_go(w: World, config: Config) -> bool:
    """Retention's rule, production's own (:func:`trioha.store.expired_count`): the oldest
    segment may be deleted unless it is the last one, the one written now. The model asks it
    about every segment as expired (a deletion may come at any moment: a ``deleteWhen`` hour,
    a full disk, ``deleteExpiredCommitLog``) and deletes one at a time."""
    segments = segment_count(w.mmin, w.mmax, config.segment_size)
    return expired_count((0,) * segments, now_ms=0, reserved_ms=0, at_once=True, batch_max=1) > 0


def full_copy(w: World) -> bool:
    """The slave holds the master's whole stored log ``[mmin, mmax)``, byte for byte."""
    if w.mmax == w.mmin:
        return True
    return bool(w.slog) and w.sbase <= w.mmin and w.send == w.mmax and agree(w)


def agree(w: World) -> bool:
    return divergence(w) is None


def divergence(w: World) -> int | None:
    """The first offset both logs hold with different bytes, or None."""
    if not w.slog:
        return None
    lo = max(w.mmin, w.sbase)
    hi = min(w.mmax, w.send)
    for offset in range(lo, hi):
        if w.mlog[offset] != w.slog[offset - w.sbase]:
            return offset
    return None
