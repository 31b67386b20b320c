"""The master side of one HA connection, from bytes and clock readings to actions.

Mirrors ``HAConnection`` (its ``ReadSocketService`` and ``WriteSocketService``) without any IO:
the Trio layer feeds what it read and asks what to write; this object keeps the read buffer and
the two timestamps, turns them into events for :func:`trioha.proto._state.master_step`, and
returns the actions to execute in order.
"""

from __future__ import annotations

import attrs

from trioha._errors import ProtocolError
from trioha.proto._buffer import ReceiveBuffer, ReportWords
from trioha.proto._close import CloseKind
from trioha.proto._epochframes import (
    EPOCH_REPORT_SIZE,
    SLAVE_HANDSHAKE_SIZE,
    STATE_HANDSHAKE,
    STATE_TRANSFER,
    EpochTransferHeader,
    SlaveHandshake,
    decode_epoch_report,
    encode_master_handshake,
    peek_state,
    state_name,
)
from trioha.proto._frames import Report, encode_header
from trioha.proto._state import (
    Close,
    ConnectionLost,
    FrameWritten,
    HandshakeReceived,
    LogView,
    MasterAction,
    MasterEvent,
    MasterOptions,
    MasterPhase,
    MasterState,
    ReadIdle,
    ReportReceived,
    SendHeartbeat,
    SendMasterHandshake,
    SendReady,
    SendTransfer,
    master_step,
)
from trioha.proto._timing import Timing


class MasterConnection:
    """One slave as the master sees it; sans-IO.

    With ``options.epoch_mode`` it speaks the AutoSwitch protocol: it starts in HANDSHAKE,
    reads the slave's 16-byte handshake and 12-byte reports (``AutoSwitchHAConnection``'s
    ``ReadSocketService``), and its frames carry 36-byte headers (:meth:`header`).
    """

    def __init__(
        self,
        *,
        now: float,
        options: MasterOptions | None = None,
        timing: Timing | None = None,
        peer: str = "?",
    ) -> None:
        self.options = options or MasterOptions()
        self.timing = timing or Timing()
        self.peer = peer
        self.state = MasterState(
            phase=MasterPhase.HANDSHAKE if self.options.epoch_mode else MasterPhase.AWAIT_REPORT
        )
        self.last_read = now
        self.last_write = now
        self.bytes_received = 0
        self._words = ReportWords()
        self._buffer = ReceiveBuffer()
        #: Epoch mode: the slave's handshake, once received.
        self.handshake: SlaveHandshake | None = None

    # --- queries ----------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self.state.phase is MasterPhase.CLOSED

    @property
    def read_deadline(self) -> float:
        """When the connection is dropped if nothing more is read (housekeeping).

        RocketMQ drops strictly *after* the interval; a deadline is reached *at* it, which on a
        millisecond clock is the same thing and keeps a mock clock from spinning.
        """
        return self.last_read + self.timing.housekeeping

    @property
    def heartbeat_deadline(self) -> float:
        """From this moment an idle writer sends a heartbeat."""
        return self.last_write + self.timing.heartbeat

    # --- inputs -----------------------------------------------------------------------------
    def receive_data(
        self, data: bytes | bytearray | memoryview, *, now: float, log: LogView
    ) -> tuple[MasterAction, ...]:
        """Bytes read from the slave. Only the newest complete report of this read counts."""
        if self.closed:
            return ()
        if data:
            self.last_read = now
            self.bytes_received += len(data)
        if self.options.epoch_mode:
            return self._receive_epoch(data, log)
        word = self._words.feed(data)
        if word is None:
            return ()
        try:
            report = Report.from_bytes(word)
        except ProtocolError as exc:
            return self._close(str(exc))
        return self._step(ReportReceived(report.offset, log))

    def _receive_epoch(
        self, data: bytes | bytearray | memoryview, log: LogView
    ) -> tuple[MasterAction, ...]:
        """Every complete handshake or report, in order; any other state field closes."""
        buf = self._buffer
        buf.feed(data)
        actions: list[MasterAction] = []
        while not self.closed and len(buf) >= 4:
            state = peek_state(buf.peek(4))
            try:
                if state == STATE_HANDSHAKE:
                    if len(buf) < SLAVE_HANDSHAKE_SIZE:
                        break
                    handshake = SlaveHandshake.from_bytes(buf.take(SLAVE_HANDSHAKE_SIZE))
                    self.handshake = handshake
                    event: MasterEvent = HandshakeReceived(log, handshake.sync_from_last_file)
                elif state == STATE_TRANSFER:
                    if len(buf) < EPOCH_REPORT_SIZE:
                        break
                    event = ReportReceived(decode_epoch_report(buf.take(EPOCH_REPORT_SIZE)), log)
                else:
                    actions.extend(
                        self._close(
                            f"slave sent a message with state field {state} ({state_name(state)}); "
                            "only HANDSHAKE (1) and TRANSFER (2) are valid"
                        )
                    )
                    break
            except ProtocolError as exc:
                actions.extend(self._close(str(exc)))
                break
            actions.extend(self._step(event))
        if self.closed:
            buf.clear()
        return tuple(actions)

    def header(self, action: SendTransfer | SendHeartbeat, *, confirm_offset: int = -1) -> bytes:
        """The header bytes of a frame: 12 in classic mode, 36 in epoch mode.

        *confirm_offset* is the master's confirm offset (epoch mode); with static roles every
        written byte is confirmed (``getConfirmOffset`` without a SyncStateSet), so the net
        layer passes the log's max offset.
        """
        if not self.options.epoch_mode:
            return frame_header(action)
        size = action.size if isinstance(action, SendTransfer) else 0
        return EpochTransferHeader(
            action.offset, size, action.epoch, action.epoch_start, confirm_offset
        ).to_bytes()

    @staticmethod
    def handshake_bytes(action: SendMasterHandshake) -> bytes:
        """The master's handshake: 20-byte header and its epoch entries."""
        return encode_master_handshake(action.max_offset, action.epochs)

    def next_send(self, *, now: float, log: LogView) -> SendTransfer | SendHeartbeat | Close | None:
        """What the writer should send now, a Close, or None to wait.

        None means: wait for the log to grow, a report to arrive, or ``heartbeat_deadline``.
        """
        if self.closed or self.state.write_pending:
            return None
        due = now >= self.heartbeat_deadline
        for action in self._step(SendReady(log, heartbeat_due=due)):
            if isinstance(action, SendTransfer | SendHeartbeat | Close):
                return action
        return None

    def frame_written(self, *, now: float) -> None:
        """The frame returned by ``next_send`` is fully written."""
        self.last_write = now
        if not self.closed:
            self._step(FrameWritten())

    def tick(self, *, now: float) -> tuple[MasterAction, ...]:
        """Check housekeeping; returns a Close if the slave has been silent too long."""
        if not self.closed and now >= self.read_deadline:
            return self._step(ReadIdle())
        return ()

    def connection_lost(self) -> None:
        self._words.clear()
        self._buffer.clear()
        self._step(ConnectionLost())

    # --- helpers ----------------------------------------------------------------------------
    def _close(self, reason: str) -> tuple[MasterAction, ...]:
        self.state = attrs.evolve(self.state, phase=MasterPhase.CLOSED, write_pending=False)
        return (Close(reason, kind=CloseKind.PROTOCOL_ERROR),)

    def _step(self, event: MasterEvent) -> tuple[MasterAction, ...]:
        self.state, actions = master_step(self.state, event, self.options)
        return actions


def frame_header(action: SendTransfer | SendHeartbeat) -> bytes:
    """The 12 header bytes for a transfer or heartbeat action."""
    if isinstance(action, SendHeartbeat):
        return encode_header(action.offset, 0)
    return encode_header(action.offset, action.size)
