"""The replication protocol's transition rules: one table, pure functions, frozen values.

Theory of operation
===================

RocketMQ's classic HA has two ends per connection (docs/rocketmq-protocol.md §1, §2):

* the **master side** (``HAConnection``): it waits for the slave's first 8-byte report, which is
  the slave's *request offset*; it then chooses ``nextTransferFromWhere`` once for the life of
  the connection (a report of 0 means "start of the master's last segment", or with
  ``sync_from_oldest`` the oldest offset) and streams frames from there without ever rewinding.
  Every later report is an *ack*: it only moves ``slaveAckOffset``, which sync replication
  waits on. A frame is handed to the IO layer and nothing else is sent until it is written
  (RocketMQ's ``lastWriteOver``). On an idle link a heartbeat (a header with size 0) goes out
  after ``haSendHeartbeatInterval`` of write silence.
* the **slave side** (``HAClient``): it reports its max offset as soon as it connects (RocketMQ
  waits a heartbeat interval first; we do not, and a Java master is served the same way),
  checks every frame header against the end of its log (skipped only while its log is empty),
  appends each complete body at exactly that end, and reports again once the store confirms
  the append (etcd raft's "ack after durable" rule). It heartbeats its last report after
  ``haSendHeartbeatInterval`` of write silence.

Either side closes a connection that has been silent for ``haHousekeepingInterval``.

**Epoch mode** (RocketMQ 5.x ``AutoSwitchHAConnection`` / ``AutoSwitchHAClient``,
docs/rocketmq-protocol.md §7.2, docs/replication.md) adds a HANDSHAKE phase on both sides before
TRANSFER:

* the slave opens with its handshake; the master answers with its max offset and its epoch
  history (:mod:`trioha.proto._epochs`), then waits for the first report as in classic mode;
* the slave computes the *consistent point* (``findConsistentPoint``) of its history and the
  master's, truncates its log to it (:class:`Truncate`, executed before anything else) and
  reports it. No common history, or a non-empty log with no history at all, closes the
  connection with ``diverged_at`` set: the slave must not reconnect until an operator acts;
* every frame carries its epoch and the epoch's start; the master never lets a frame cross
  the end of an epoch, and the slave records each new epoch (:class:`RecordEpoch`) before the
  first bytes of it are appended, so its history always describes its log.

The functions here are *pure*: a frozen, hashable state and an event go in; a new state and a
tuple of actions come out. They never see bytes, sockets or clocks: the byte-level wrappers in
``_master.py`` and ``_slave.py`` turn bytes and time into events, and the Trio layer executes
the actions in order. ``model/`` explores exactly these functions, so what the model checker
proves is what production runs.

The table at the bottom is the single place where (phase, event) pairs are allowed; anything
else is a :class:`LocalProtocolError` (the IO layer fed an event that cannot happen).
``transition_table_mermaid`` draws it for ``docs/replication.md``.

Where trioha deliberately differs from RocketMQ (docs/replication.md says why):

* a report beyond what this connection has sent, beyond the master's end, or going backwards
  closes the connection and never counts as an ack (RocketMQ #3015/#1155; 5.x dropped even
  the 4.9 check);
* a first report beyond the master's end (the slave holds data the master does not) and a
  request offset that no longer exists on the master (RocketMQ #3388) close the connection with
  a reason that says so, instead of heartbeating forever; the deleted case carries
  ``Close.oldest``, which the IO layer pushes as a heartbeat header past the slave's end, and
  a slave that reads a heartbeat past its end stops for good (``Close.oldest`` again): it must be
  re-seeded;
* classic mode's divergence check: a first report inside a range the master may have sent and
  then lost in a crash, or, promoted from a slave, a range of the history it took over that it
  never had (``LogView.lost``, kept by ``trioha.store.SentOffsets``) is refused,
  and a refusal of a diverged slave carries ``Close.diverged_at``, which the IO layer sends as
  a heartbeat header that the slave's own offset check rejects. On the slave side a frame off
  its end is such a signal (``Close.diverged_at`` again), and the client stops for good.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Generic, TypeAlias, TypeVar

import attrs

from trioha._errors import LocalProtocolError
from trioha.proto._close import CloseKind
from trioha.proto._epochs import EpochHistory, find_consistent_point

# --- inputs the core needs to know about the log --------------------------------------------


@attrs.frozen
class LogView:
    """What the master side needs to know about its commit log, as plain numbers.

    ``min_offset`` is the start of the oldest segment still present, ``max_offset`` the end of
    written data; a message never crosses ``segment_size`` boundaries and neither may a frame.
    """

    min_offset: int
    max_offset: int
    segment_size: int
    #: Ranges ``(from, to)`` of bytes this master may have sent and then lost in a crash, or
    #: that a broker it was promoted over may hold (``trioha.store.SentOffsets``): a first
    #: report ``from < offset <= to`` comes from a slave holding a history this master does
    #: not have (classic mode's divergence check). A report beyond the end is cut back to
    #: the newest range's ``from`` when there is one.
    lost: tuple[tuple[int, int], ...] = attrs.field(default=(), kw_only=True)
    #: The master's epoch history (epoch mode only; None in classic mode).
    epochs: EpochHistory | None = attrs.field(default=None, kw_only=True)

    def segment_start(self, offset: int) -> int:
        return offset - offset % self.segment_size

    def readable_end(self, offset: int) -> int:
        """End of what one frame starting at *offset* may carry (``getCommitLogData``)."""
        return min(self.max_offset, self.segment_start(offset) + self.segment_size)


@attrs.frozen
class MasterOptions:
    """The settings that shape the master side's decisions."""

    #: ``haTransferBatchSize``: the most body bytes in one frame.
    batch_size: int = 32 * 1024
    #: Serve a slave reporting 0 from the oldest offset, not the last segment (RocketMQ #3661).
    sync_from_oldest: bool = False
    #: Speak the AutoSwitch (epoch) protocol: a connection starts in HANDSHAKE.
    epoch_mode: bool = False


# --- phases --------------------------------------------------------------------------------


class MasterPhase(enum.Enum):
    """Where one master-side connection is in its life."""

    #: Epoch mode: connected, waiting for the slave's handshake.
    HANDSHAKE = "HANDSHAKE"
    #: Connected; ``slaveRequestOffset == -1``: nothing is sent until the first report.
    AWAIT_REPORT = "AWAIT_REPORT"
    #: ``nextTransferFromWhere`` is chosen; frames and heartbeats flow.
    TRANSFER = "TRANSFER"
    #: Closed; the IO layer tears the connection down.
    CLOSED = "CLOSED"


class SlavePhase(enum.Enum):
    """Where the slave's HA client is."""

    DISCONNECTED = "DISCONNECTED"
    #: Epoch mode: handshake sent, waiting for the master's (its epochs and max offset).
    HANDSHAKE = "HANDSHAKE"
    #: Connected and reported; receiving frames.
    TRANSFER = "TRANSFER"


# --- events ----------------------------------------------------------------------------------


@attrs.frozen
class ReportReceived:
    """Master: a complete report arrived (the newest complete 8-byte word of a read)."""

    offset: int
    log: LogView


@attrs.frozen
class HandshakeReceived:
    """Master, epoch mode: the slave's handshake arrived."""

    log: LogView
    #: The slave's ``isSyncFromLastFile``: serve a report of 0 from the last segment.
    sync_from_last_file: bool = False


@attrs.frozen
class SendReady:
    """Master: the writer is idle and asks what to send now."""

    log: LogView
    heartbeat_due: bool = False


@attrs.frozen
class FrameWritten:
    """Master: the frame last handed out is completely written (``lastWriteOver``)."""


@attrs.frozen
class Connected:
    """Slave: a connection to the master is open; *log_max* is where the log ends.

    *epochs* is the slave's epoch history in epoch mode, None in classic mode.
    """

    log_max: int
    epochs: EpochHistory | None = None


@attrs.frozen
class MasterHandshakeReceived:
    """Slave, epoch mode: the master's handshake (its max offset and epoch history)."""

    max_offset: int
    epochs: EpochHistory


@attrs.frozen
class HeaderReceived:
    """Slave: a frame's header has arrived (its body may still be on the way).

    Epoch mode adds the frame's epoch and that epoch's start offset (-1 in classic mode).
    """

    offset: int
    size: int
    epoch: int = -1
    epoch_start: int = -1


@attrs.frozen
class BodyReceived:
    """Slave: the body of the frame whose header came last is complete."""


@attrs.frozen
class AppendConfirmed:
    """Slave: the store holds everything up to *offset* (written, or flushed when acks must be)."""

    offset: int


@attrs.frozen
class HeartbeatDue:
    """Slave: ``haSendHeartbeatInterval`` passed without a report written."""


@attrs.frozen
class ReadIdle:
    """Either side: nothing was read for ``haHousekeepingInterval``."""


@attrs.frozen
class ConnectionLost:
    """Either side: the transport ended (EOF, reset, or the IO layer closed it)."""


MasterEvent: TypeAlias = (
    HandshakeReceived | ReportReceived | SendReady | FrameWritten | ReadIdle | ConnectionLost
)
SlaveEvent: TypeAlias = (
    Connected
    | MasterHandshakeReceived
    | HeaderReceived
    | BodyReceived
    | AppendConfirmed
    | HeartbeatDue
    | ReadIdle
    | ConnectionLost
)

# --- actions ---------------------------------------------------------------------------------


@attrs.frozen
class SendMasterHandshake:
    """Master, epoch mode: send the handshake with *max_offset* and the epoch history."""

    max_offset: int
    epochs: EpochHistory


@attrs.frozen
class SendTransfer:
    """Master: send the header ``(offset, size)`` and commit log bytes ``[offset, offset+size)``.

    In epoch mode the header also carries the epoch holding these bytes and its start.
    """

    offset: int
    size: int
    epoch: int = -1
    epoch_start: int = -1


@attrs.frozen
class SendHeartbeat:
    """Master: send the header ``(offset, 0)`` with no body."""

    offset: int
    epoch: int = -1
    epoch_start: int = -1


@attrs.frozen
class AckAdvanced:
    """Master: this slave now holds the log up to *offset* (``notifyTransferSome``)."""

    offset: int


@attrs.frozen
class SendReport:
    """Slave: send the 8-byte report *offset*."""

    offset: int


@attrs.frozen
class Append:
    """Slave: append the frame body at exactly *offset* (the end of the log).

    The pure core knows only the size; the byte-level wrapper fills in ``data``.
    """

    offset: int
    size: int
    data: bytes = attrs.field(default=b"", repr=False, eq=False)


@attrs.frozen
class Close:
    """Either side: tear the connection down; *reason* says why, *remote* whose fault it was.

    ``diverged_at`` says the two logs are not one history. On the master it refuses the
    slave: before closing, the IO layer sends the heartbeat header ``(diverged_at, 0)``,
    where the histories part. Every slave's offset check (``HAClient.dispatchReadRequest``,
    ours and Java's) rejects a frame that does not start at its own end, so the slave is
    told in the protocol it already speaks. On the slave it is the offset the master pushed:
    the slave stops and waits for the operator instead of reconnecting.

    In epoch mode ``diverged_at`` is the end of what the two logs are known to share (0 when
    nothing is: re-seed); reconnecting will not help until an operator cuts the slave back
    there or re-seeds it.
    """

    reason: str
    remote: bool = True
    diverged_at: int | None = None
    #: The master's oldest offset, past where the slave needs to continue: what the slave needs
    #: was deleted on the master (retention, RocketMQ #3388). On the master the IO layer
    #: pushes it as a heartbeat header ``(oldest, 0)`` before closing, which every slave's
    #: offset check rejects (Java's names both offsets); on the slave it is that offset, and
    #: the client stops for good instead of reconnecting: only a re-seed helps.
    oldest: int | None = None
    #: What kind of close this is (:class:`~trioha.proto.CloseKind`: the metric category
    #: and the log level), decided here, where the close is decided.
    kind: CloseKind = attrs.field(kw_only=True)


@attrs.frozen
class SendSlaveHandshake:
    """Slave, epoch mode: send the 16-byte handshake."""


@attrs.frozen
class Truncate:
    """Slave, epoch mode: cut the commit log, its consume queues and the epoch file to
    *offset* (the consistent point) before anything else is done or sent."""

    offset: int


@attrs.frozen
class RecordEpoch:
    """Slave, epoch mode: append ``(epoch, start_offset)`` to the epoch file, durably, before
    the frame's bytes are appended."""

    epoch: int
    start_offset: int


MasterAction: TypeAlias = SendMasterHandshake | SendTransfer | SendHeartbeat | AckAdvanced | Close
SlaveAction: TypeAlias = SendSlaveHandshake | Truncate | RecordEpoch | SendReport | Append | Close

# --- states ----------------------------------------------------------------------------------


@attrs.frozen
class MasterState:
    """One master-side connection (``HAConnection``'s fields), hashable for model checking."""

    phase: MasterPhase = MasterPhase.AWAIT_REPORT
    #: ``slaveRequestOffset``: the first report; -1 until it arrives. Set once per connection.
    request_offset: int = -1
    #: ``slaveAckOffset``: the newest accepted report; what sync replication trusts.
    ack_offset: int = -1
    #: ``nextTransferFromWhere``: the offset of the next byte to send; -1 until chosen.
    next_transfer: int = -1
    #: Where this connection started serving (``choose_start``); -1 until chosen. The
    #: connection vouches only for bytes in ``[served_from, ack_offset)``: what it carried.
    served_from: int = -1
    #: A frame is handed to the IO layer and not yet written (``!lastWriteOver``).
    write_pending: bool = False
    #: Epoch mode: the slave's handshake asked for the last segment on a report of 0.
    from_last_file: bool = False


@attrs.frozen
class SlaveState:
    """The slave's HA client (``HAClient``'s fields), hashable for model checking."""

    phase: SlavePhase = SlavePhase.DISCONNECTED
    #: End of the log once every Append handed out is done (``dispatchPosition`` in log terms):
    #: where the next frame must start. 0 means the log is empty, and the offset check is off.
    expected: int = 0
    #: ``currentReportedOffset``: the last offset reported on this connection.
    reported: int = -1
    #: The header of the frame whose body is still arriving.
    receiving: tuple[int, int] | None = None
    #: Epoch mode: the epoch history of the slave's log (None in classic mode).
    epochs: EpochHistory | None = None


MasterStep: TypeAlias = tuple[MasterState, tuple[MasterAction, ...]]
SlaveStep: TypeAlias = tuple[SlaveState, tuple[SlaveAction, ...]]

# --- master rules ------------------------------------------------------------------------------


def choose_start(request: int, log: LogView, options: MasterOptions) -> int:
    """``nextTransferFromWhere`` for a request offset (``WriteSocketService.run``,
    docs/rocketmq-protocol.md §2.2).

    A slave reporting 0 has nothing; RocketMQ serves it from the start of the master's last
    segment (``max - max % segmentSize``); with ``sync_from_oldest`` we serve the oldest offset.
    """
    if request == 0:
        if options.sync_from_oldest:
            return log.min_offset
        return max(0, log.segment_start(log.max_offset))
    return request


def choose_epoch_start(request: int, log: LogView, from_last_file: bool) -> int:
    """Epoch mode's start (``AutoSwitchHAConnection.WriteSocketService``).

    See docs/rocketmq-protocol.md §7.3.

    A report of 0 is served from the oldest offset (a full copy, 5.x's default), or from the
    start of the last segment when the slave's handshake asked for ``syncFromLastFile``.
    """
    if request == 0:
        return max(0, log.segment_start(log.max_offset)) if from_last_file else log.min_offset
    return request


def _epochs_of(log: LogView) -> EpochHistory:
    if log.epochs is None:
        raise LocalProtocolError("epoch mode needs the master's epoch history in its LogView")
    return log.epochs


def _closed(
    state: MasterState,
    kind: CloseKind,
    reason: str,
    *,
    remote: bool = True,
    diverged_at: int | None = None,
    oldest: int | None = None,
) -> MasterStep:
    return attrs.evolve(state, phase=MasterPhase.CLOSED, write_pending=False), (
        Close(reason, remote, diverged_at, oldest, kind=kind),
    )


def _cut_back(offset: int) -> str:
    """What the operator does with a refused slave, trioha's or Java's."""
    return (
        f"Cut the slave back to {offset} (a trioha slave: `trioha slave --truncate-to-master`; "
        f"a Java slave, stopped: `trioha slave --store-dir <its store> --truncate-to {offset}`) "
        "or re-seed it"
    )


def _master_first_report(
    state: MasterState, event: ReportReceived, options: MasterOptions
) -> MasterStep:
    offset, log = event.offset, event.log
    for lost_from, lost_to in log.lost:
        if lost_from < offset <= lost_to:
            return _closed(
                state,
                CloseKind.DIVERGED,
                f"slave requests offset {offset}, inside [{lost_from}, {lost_to}): bytes this "
                "master may have sent before it crashed and lost them, or, promoted from a "
                "slave, bytes of the history it took over that it never had (its log was "
                f"recovered to {lost_from}); the slave's log after {lost_from} is a history the "
                f"master does not have. {_cut_back(lost_from)}",
                diverged_at=lost_from,
            )
    if offset > log.max_offset:
        # Nothing this master sent lies past its end, so the slave's history parts from its
        # own at the latest where this master's latest history begins: the newest lost range.
        at = max((lo for lo, _ in log.lost if lo < log.max_offset), default=log.max_offset)
        where = "" if at == log.max_offset else f" (from {at}, where its latest history begins)"
        return _closed(
            state,
            CloseKind.DIVERGED,
            f"slave requests offset {offset} but the master's log ends at {log.max_offset}: "
            "the slave holds data this master does not (diverged history or a wrong "
            f"master){where}. {_cut_back(at)}",
            diverged_at=at,
        )
    if options.epoch_mode:
        start = choose_epoch_start(offset, log, state.from_last_file)
        epochs = _epochs_of(log)
        if start < log.max_offset and epochs.find_by_offset(start) is None:
            first = epochs.entries[0].to_line() if epochs else "none"
            return _closed(
                state,
                CloseKind.PROTOCOL_ERROR,
                f"slave requests offset {offset}, which no epoch of the master holds (its "
                f"first epoch: {first})",
            )
    else:
        start = choose_start(offset, log, options)
    if start < log.min_offset:
        return _closed(
            state,
            CloseKind.DELETED,
            f"slave requests offset {offset}, which no longer exists on the master "
            f"(oldest offset {log.min_offset}); the slave cannot catch up and must be "
            "re-seeded (RocketMQ #3388)",
            oldest=log.min_offset,
        )
    new = attrs.evolve(
        state,
        phase=MasterPhase.TRANSFER,
        request_offset=offset,
        ack_offset=offset,
        next_transfer=start,
        served_from=start,
    )
    return new, (AckAdvanced(offset),)


def _master_handshake(
    state: MasterState, event: HandshakeReceived, options: MasterOptions
) -> MasterStep:
    log = event.log
    new = attrs.evolve(
        state, phase=MasterPhase.AWAIT_REPORT, from_last_file=event.sync_from_last_file
    )
    return new, (SendMasterHandshake(log.max_offset, _epochs_of(log)),)


def _master_early_report(
    state: MasterState, event: ReportReceived, options: MasterOptions
) -> MasterStep:
    return _closed(
        state,
        CloseKind.PROTOCOL_ERROR,
        f"slave reported offset {event.offset} before its handshake",
    )


def _master_extra_handshake(
    state: MasterState, event: HandshakeReceived, options: MasterOptions
) -> MasterStep:
    return _closed(
        state,
        CloseKind.PROTOCOL_ERROR,
        "slave sent a handshake on a connection already transferring",
    )


def _master_report(state: MasterState, event: ReportReceived, options: MasterOptions) -> MasterStep:
    offset = event.offset
    if offset > state.next_transfer:
        return _closed(
            state,
            CloseKind.PROTOCOL_ERROR,
            f"slave acks offset {offset}, beyond what was sent to it ({state.next_transfer}; "
            f"master's log ends at {event.log.max_offset}); the ack is not trusted "
            "(RocketMQ #3015)",
        )
    if offset < state.ack_offset:
        return _closed(
            state,
            CloseKind.PROTOCOL_ERROR,
            f"slave's report went backwards from {state.ack_offset} to {offset}",
        )
    if offset == state.ack_offset:
        return state, ()
    return attrs.evolve(state, ack_offset=offset), (AckAdvanced(offset),)


def _master_await_send(state: MasterState, event: SendReady, options: MasterOptions) -> MasterStep:
    # RocketMQ's writer sleeps until the first report; no heartbeat either.
    return state, ()


def _master_send(state: MasterState, event: SendReady, options: MasterOptions) -> MasterStep:
    if state.write_pending:
        raise LocalProtocolError("asked what to send while a frame is still being written")
    log, start = event.log, state.next_transfer
    if start < log.min_offset:
        return _closed(
            state,
            CloseKind.DELETED,
            f"offset {start} was deleted on the master while the slave still needed it "
            f"(oldest offset now {log.min_offset}); the slave must be re-seeded (RocketMQ #3388)",
            oldest=log.min_offset,
        )
    epoch = epoch_start = -1
    end = log.readable_end(start)
    if options.epoch_mode:
        found = _epochs_of(log).find_by_offset(start)
        if found is None:
            return _closed(
                state,
                CloseKind.PROTOCOL_ERROR,
                f"no epoch of the master holds offset {start}",
                remote=False,
            )
        index, entry = found
        epoch, epoch_start = entry.epoch, entry.start_offset
        # A frame never crosses the end of its epoch: the slave records each epoch's start
        # from the first frame of it.
        end = min(end, _epochs_of(log).end_of(index, log.max_offset))
    if start < log.max_offset:
        size = min(end - start, options.batch_size)
        new = attrs.evolve(state, next_transfer=start + size, write_pending=True)
        return new, (SendTransfer(start, size, epoch, epoch_start),)
    if event.heartbeat_due:
        return attrs.evolve(state, write_pending=True), (SendHeartbeat(start, epoch, epoch_start),)
    return state, ()


def _master_written(state: MasterState, event: FrameWritten, options: MasterOptions) -> MasterStep:
    if not state.write_pending:
        raise LocalProtocolError("a frame was reported written but none was handed out")
    return attrs.evolve(state, write_pending=False), ()


def _master_idle(state: MasterState, event: ReadIdle, options: MasterOptions) -> MasterStep:
    return _closed(
        state, CloseKind.TIMEOUT, "nothing read from the slave within the housekeeping interval"
    )


def _master_lost(state: MasterState, event: ConnectionLost, options: MasterOptions) -> MasterStep:
    return attrs.evolve(state, phase=MasterPhase.CLOSED, write_pending=False), ()


# --- slave rules -------------------------------------------------------------------------------


def _slave_connected(state: SlaveState, event: Connected) -> SlaveStep:
    if event.epochs is not None:
        new = SlaveState(phase=SlavePhase.HANDSHAKE, expected=event.log_max, epochs=event.epochs)
        return new, (SendSlaveHandshake(),)
    new = SlaveState(phase=SlavePhase.TRANSFER, expected=event.log_max, reported=event.log_max)
    return new, (SendReport(event.log_max),)


def _diverged(state: SlaveState, reason: str, at: int = 0) -> SlaveStep:
    return SlaveState(phase=SlavePhase.DISCONNECTED, expected=state.expected), (
        Close(reason, diverged_at=at, kind=CloseKind.DIVERGED),
    )


def _slave_master_handshake(state: SlaveState, event: MasterHandshakeReceived) -> SlaveStep:
    """``AutoSwitchHAClient.doTruncate``: find the consistent point, cut to it, report it."""
    local, end = state.epochs or EpochHistory(), state.expected
    if not local:
        if end:
            return _diverged(
                state,
                f"the slave's log ends at {end} but it has no epoch history, so nothing proves "
                "its bytes are the master's; re-seed it (or truncate it) before it replicates "
                "in epoch mode",
            )
        point = 0
    else:
        point = find_consistent_point(local, end, event.epochs, event.max_offset)
        if point < 0 and event.epochs and event.epochs.entries[0].start_offset == 0:
            # Every epoch the slave knows was lost on the master, whose history now starts
            # over at 0 (a master that lost everything since its first epoch): the shared
            # prefix is empty. RocketMQ refuses here and needs an operator; the cut is kept.
            point = 0
        if point < 0:
            return _diverged(
                state,
                f"no consistent point: the slave's epochs {_show_epochs(local)} (log end {end}) "
                f"share no epoch with the master's {_show_epochs(event.epochs)} (log end "
                f"{event.max_offset}); the slave must be re-seeded",
            )
    actions: tuple[SlaveAction, ...] = (SendReport(point),)
    if point < end:
        actions = (Truncate(point), *actions)
    new = SlaveState(
        phase=SlavePhase.TRANSFER,
        expected=point,
        reported=point,
        epochs=local.truncate_suffix(point),
    )
    return new, actions


def _show_epochs(history: EpochHistory) -> str:
    shown = " ".join(e.to_line() for e in history.entries[-4:])
    return ("... " if len(history) > 4 else "") + (shown or "(none)")


def _slave_frame_epoch(state: SlaveState, event: HeaderReceived) -> SlaveStep | None:
    """Epoch mode: check a frame's epoch against the slave's history; record a new epoch.

    None: the frame is in the slave's current epoch. Otherwise the step to take: a close
    (the frame contradicts the history the slave holds) or the new history with a
    :class:`RecordEpoch` to execute before the frame's bytes are appended.
    """
    epochs = state.epochs
    assert epochs is not None
    last = epochs.entries[-1] if epochs else None
    where = f"master's frame at {event.offset} is in epoch {event.epoch} from {event.epoch_start}"
    if last is not None and event.epoch == last.epoch:
        if event.epoch_start != last.start_offset:
            return _diverged(
                state,
                f"{where}, but the slave's epoch {last.to_line()} starts "
                "elsewhere: the histories differ",
                min(last.start_offset, event.epoch_start),
            )
        return None
    if last is not None and event.epoch < last.epoch:
        return _diverged(
            state,
            f"{where}, older than the slave's last epoch {last.to_line()}",
            min(last.start_offset, event.epoch_start),
        )
    if event.epoch_start > event.offset or (state.expected and event.epoch_start != event.offset):
        # The slave holds bytes before this frame that the master says belong to an epoch the
        # slave has never seen: they were written by another master.
        return _diverged(
            state,
            f"{where}, but the slave's log already ends at "
            f"{state.expected} in epoch {last.to_line() if last else '(none)'}",
            min(event.epoch_start, state.expected),
        )
    if last is not None and event.epoch_start <= last.start_offset:
        return _diverged(
            state, f"{where}, not after the slave's last epoch {last.to_line()}", event.epoch_start
        )
    new = attrs.evolve(state, epochs=epochs.append(event.epoch, event.epoch_start))
    return new, (RecordEpoch(event.epoch, event.epoch_start),)


def _slave_header(state: SlaveState, event: HeaderReceived) -> SlaveStep:
    if state.receiving is not None:
        raise LocalProtocolError("a header was fed while a body was still expected")
    if state.expected not in (0, event.offset):
        # HAClient.dispatchReadRequest: "master pushed offset not equal the max phy offset in
        # slave"; nothing of this frame is appended.
        # A master never does this to a healthy slave (it serves from the slave's report).
        # A heartbeat (no body) past the slave's end is the master's "deleted" signal
        # (``Close.oldest``): what the slave needs next is gone there. Otherwise the master's
        # divergence signal (``Close.diverged_at``) or a different master's history: either
        # way the logs are not one history.
        if event.size == 0 and event.offset > state.expected:
            return SlaveState(phase=SlavePhase.DISCONNECTED, expected=state.expected), (
                Close(
                    f"the master's log now begins at {event.offset}, past this slave's end "
                    f"{state.expected}: the bytes [{state.expected}, {event.offset}) it needs "
                    "next were deleted on the master (retention, RocketMQ #3388); nothing "
                    "appended",
                    oldest=event.offset,
                    kind=CloseKind.DELETED,
                ),
            )
        return SlaveState(phase=SlavePhase.DISCONNECTED, expected=state.expected), (
            Close(
                f"master pushed offset {event.offset} but the slave's log ends at "
                f"{state.expected}; nothing appended",
                diverged_at=event.offset,
                kind=CloseKind.DIVERGED,
            ),
        )
    recorded: tuple[SlaveAction, ...] = ()
    if state.epochs is not None:
        step = _slave_frame_epoch(state, event)
        if step is not None:
            state, recorded = step
            if state.phase is SlavePhase.DISCONNECTED:
                return state, recorded
    if event.size == 0:
        return state, recorded
    return attrs.evolve(state, receiving=(event.offset, event.size)), recorded


def _slave_body(state: SlaveState, event: BodyReceived) -> SlaveStep:
    if state.receiving is None:
        raise LocalProtocolError("a body was fed with no header before it")
    offset, size = state.receiving
    new = attrs.evolve(state, expected=offset + size, receiving=None)
    return new, (Append(offset, size),)


def _slave_confirmed(state: SlaveState, event: AppendConfirmed) -> SlaveStep:
    if event.offset > state.expected:
        raise LocalProtocolError(
            f"append confirmed up to {event.offset}, beyond what was handed out ({state.expected})"
        )
    if event.offset <= state.reported:
        return state, ()
    return attrs.evolve(state, reported=event.offset), (SendReport(event.offset),)


def _slave_heartbeat(state: SlaveState, event: HeartbeatDue) -> SlaveStep:
    return state, (SendReport(state.reported),)


def _slave_idle(state: SlaveState, event: ReadIdle) -> SlaveStep:
    return SlaveState(phase=SlavePhase.DISCONNECTED, expected=state.expected), (
        Close(
            "nothing read from the master within the housekeeping interval",
            kind=CloseKind.TIMEOUT,
        ),
    )


def _slave_lost(state: SlaveState, event: ConnectionLost) -> SlaveStep:
    return SlaveState(phase=SlavePhase.DISCONNECTED, expected=state.expected), ()


# --- the table ---------------------------------------------------------------------------------

StateT = TypeVar("StateT", MasterState, SlaveState)
ActionT = TypeVar("ActionT", MasterAction, SlaveAction)
PhaseT = TypeVar("PhaseT", MasterPhase, SlavePhase)


@attrs.frozen
class Rule(Generic[StateT, ActionT, PhaseT]):
    """One allowed (phase, event) pair: the function and the phases it can lead to.

    ``apply`` takes the state, the event (of the type the table keys it by) and, on the master
    side, :class:`MasterOptions`; the step functions check at run time that the phase it
    returns is one of ``targets``, so the drawn diagram cannot claim what the code does not do.
    """

    apply: Callable[..., tuple[StateT, tuple[ActionT, ...]]]
    targets: tuple[PhaseT, ...]


MasterRule: TypeAlias = Rule[MasterState, MasterAction, MasterPhase]
SlaveRule: TypeAlias = Rule[SlaveState, SlaveAction, SlavePhase]


_AWAIT, _XFER, _CLOSED = MasterPhase.AWAIT_REPORT, MasterPhase.TRANSFER, MasterPhase.CLOSED
_HS, _SHS = MasterPhase.HANDSHAKE, SlavePhase.HANDSHAKE
_DISC, _SXFER = SlavePhase.DISCONNECTED, SlavePhase.TRANSFER

MASTER_TABLE: dict[tuple[MasterPhase, type], MasterRule] = {
    (_HS, HandshakeReceived): Rule(_master_handshake, (_AWAIT,)),
    (_HS, ReportReceived): Rule(_master_early_report, (_CLOSED,)),
    (_HS, SendReady): Rule(_master_await_send, (_HS,)),
    (_HS, ReadIdle): Rule(_master_idle, (_CLOSED,)),
    (_HS, ConnectionLost): Rule(_master_lost, (_CLOSED,)),
    # AutoSwitchHAClient repeats its handshake when no answer came within 5 s: answer again.
    (_AWAIT, HandshakeReceived): Rule(_master_handshake, (_AWAIT,)),
    (_XFER, HandshakeReceived): Rule(_master_extra_handshake, (_CLOSED,)),
    (_AWAIT, ReportReceived): Rule(_master_first_report, (_XFER, _CLOSED)),
    (_AWAIT, SendReady): Rule(_master_await_send, (_AWAIT,)),
    (_AWAIT, ReadIdle): Rule(_master_idle, (_CLOSED,)),
    (_AWAIT, ConnectionLost): Rule(_master_lost, (_CLOSED,)),
    (_XFER, ReportReceived): Rule(_master_report, (_XFER, _CLOSED)),
    (_XFER, SendReady): Rule(_master_send, (_XFER, _CLOSED)),
    (_XFER, FrameWritten): Rule(_master_written, (_XFER,)),
    (_XFER, ReadIdle): Rule(_master_idle, (_CLOSED,)),
    (_XFER, ConnectionLost): Rule(_master_lost, (_CLOSED,)),
    (_CLOSED, ConnectionLost): Rule(_master_lost, (_CLOSED,)),
}

SLAVE_TABLE: dict[tuple[SlavePhase, type], SlaveRule] = {
    (_DISC, Connected): Rule(_slave_connected, (_SXFER, _SHS)),
    (_SHS, MasterHandshakeReceived): Rule(_slave_master_handshake, (_SXFER, _DISC)),
    (_SHS, HeartbeatDue): Rule(lambda s, e: (s, ()), (_SHS,)),
    # A flush confirming bytes held from before (with acks of flushed bytes): no report yet.
    (_SHS, AppendConfirmed): Rule(lambda s, e: (s, ()), (_SHS,)),
    (_SHS, ReadIdle): Rule(_slave_idle, (_DISC,)),
    (_SHS, ConnectionLost): Rule(_slave_lost, (_DISC,)),
    (_SXFER, HeaderReceived): Rule(_slave_header, (_SXFER, _DISC)),
    (_SXFER, BodyReceived): Rule(_slave_body, (_SXFER,)),
    (_SXFER, AppendConfirmed): Rule(_slave_confirmed, (_SXFER,)),
    (_SXFER, HeartbeatDue): Rule(_slave_heartbeat, (_SXFER,)),
    (_SXFER, ReadIdle): Rule(_slave_idle, (_DISC,)),
    (_SXFER, ConnectionLost): Rule(_slave_lost, (_DISC,)),
    (_DISC, ConnectionLost): Rule(_slave_lost, (_DISC,)),
    # Appends handed out before a close may still complete; they change nothing on the wire.
    (_DISC, AppendConfirmed): Rule(lambda s, e: (s, ()), (_DISC,)),
}


def master_step(state: MasterState, event: MasterEvent, options: MasterOptions) -> MasterStep:
    """Apply *event* to one master-side connection; return the new state and its actions."""
    rule = MASTER_TABLE.get((state.phase, type(event)))
    if rule is None:
        raise LocalProtocolError(
            f"master side cannot handle {type(event).__name__} in phase {state.phase.value}"
        )
    new, actions = rule.apply(state, event, options)
    if new.phase not in rule.targets:
        raise _wrong_target("master", state.phase, event, new.phase, rule.targets)
    return new, actions


def slave_step(state: SlaveState, event: SlaveEvent) -> SlaveStep:
    """Apply *event* to the slave's client; return the new state and its actions."""
    rule = SLAVE_TABLE.get((state.phase, type(event)))
    if rule is None:
        raise LocalProtocolError(
            f"slave side cannot handle {type(event).__name__} in phase {state.phase.value}"
        )
    new, actions = rule.apply(state, event)
    if new.phase not in rule.targets:
        raise _wrong_target("slave", state.phase, event, new.phase, rule.targets)
    return new, actions


def _wrong_target(
    side: str, phase: enum.Enum, event: object, got: enum.Enum, targets: tuple[enum.Enum, ...]
) -> AssertionError:
    """The table declared other phases than its rule reached: a bug in this file, never input."""
    declared = ", ".join(t.value for t in targets)
    return AssertionError(
        f"{side} rule for {type(event).__name__} in {phase.value} led to {got.value}, "
        f"but the table declares only {declared}"
    )


def transition_table_mermaid() -> str:
    """The two tables as a Mermaid state diagram (what ``docs/replication.md`` shows)."""
    lines = ["stateDiagram-v2"]
    for title, table in (("master", MASTER_TABLE), ("slave", SLAVE_TABLE)):
        lines.append(f"    state {title} {{")
        for (phase, event), rule in table.items():
            for target in rule.targets:
                lines.append(
                    f"        {title}_{phase.value} --> {title}_{target.value}: {event.__name__}"
                )
        lines.append("    }")
    return "\n".join(lines) + "\n"
