"""The slave side of HA replication, from bytes and clock readings to actions.

Mirrors ``HAService.HAClient`` (docs/rocketmq-protocol.md §1.6, §2.3) without any IO. One
:class:`SlaveConnection` lives exactly as long as one TCP connection, so no partial frame or
buffered byte can survive a reconnect (RocketMQ's ``closeMaster`` resets its buffers for the same
reason).
"""

from __future__ import annotations

from trioha._errors import ProtocolError
from trioha.proto._buffer import ReceiveBuffer
from trioha.proto._close import CloseKind
from trioha.proto._epochframes import (
    EPOCH_TRANSFER_HEADER_SIZE,
    MASTER_HANDSHAKE_HEADER_SIZE,
    EpochTransferHeader,
    MasterHandshakeHeader,
    SlaveHandshake,
    encode_epoch_report,
)
from trioha.proto._epochs import EpochHistory
from trioha.proto._frames import HEADER_SIZE, MAX_BODY_SIZE, TransferHeader, encode_report
from trioha.proto._state import (
    Append,
    AppendConfirmed,
    BodyReceived,
    Close,
    Connected,
    ConnectionLost,
    HeaderReceived,
    HeartbeatDue,
    MasterHandshakeReceived,
    ReadIdle,
    SendReport,
    SendSlaveHandshake,
    SlaveAction,
    SlaveEvent,
    SlavePhase,
    SlaveState,
    slave_step,
)
from trioha.proto._timing import Timing


class SlaveConnection:
    """One connection of the slave's HA client to its master; sans-IO.

    Created when the TCP connection opens, with the end of the local log. Its first action is
    the report of that offset: the slave asks at once (RocketMQ's client waits a heartbeat
    interval first; docs/rocketmq-protocol.md §1.2).

    With *epochs* (the slave's epoch history) it speaks the AutoSwitch protocol
    (``AutoSwitchHAClient``): its first action is the handshake (*handshake* says what it
    carries), then it reads the master's handshake, and frames have 36-byte headers.

    With *master_epoch* (automatic failover: the epoch etcd names the master at) a master
    whose handshake shows another last epoch is refused before anything is cut or appended:
    it is not, or no longer, the master etcd names (docs/failover.md, "Epochs").
    """

    def __init__(
        self,
        *,
        log_max: int,
        now: float,
        timing: Timing | None = None,
        max_body: int = MAX_BODY_SIZE,
        peer: str = "?",
        epochs: EpochHistory | None = None,
        handshake: SlaveHandshake | None = None,
        master_epoch: int = 0,
    ) -> None:
        self.epoch_mode = epochs is not None
        self.master_epoch = master_epoch
        self.handshake = handshake or SlaveHandshake()
        #: Epoch mode: the master's confirm offset from the newest frame header (-1: none).
        self.confirm_offset = -1
        #: Epoch mode: the master's max offset from its handshake (-1: not yet received).
        self.master_max_offset = -1
        self._header_size = EPOCH_TRANSFER_HEADER_SIZE if self.epoch_mode else HEADER_SIZE
        self._master_handshake: MasterHandshakeHeader | None = None
        self.timing = timing or Timing()
        self.max_body = max_body
        self.peer = peer
        self.last_read = now
        self.last_write = now
        self.bytes_received = 0
        self._buffer = ReceiveBuffer()
        self.state, first = slave_step(SlaveState(), Connected(log_max, epochs))
        self._initial: tuple[SlaveAction, ...] = first

    # --- queries ----------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self.state.phase is SlavePhase.DISCONNECTED

    @property
    def read_deadline(self) -> float:
        return self.last_read + self.timing.housekeeping

    @property
    def heartbeat_deadline(self) -> float:
        return self.last_write + self.timing.heartbeat

    @property
    def buffered(self) -> int:
        """Bytes received and not yet turned into actions (at most one frame's worth)."""
        return len(self._buffer)

    # --- inputs -----------------------------------------------------------------------------
    def initial_actions(self) -> tuple[SlaveAction, ...]:
        """The report to send right after connecting (returned once)."""
        first, self._initial = self._initial, ()
        return first

    def receive_data(
        self, data: bytes | bytearray | memoryview, *, now: float
    ) -> list[SlaveAction]:
        """Bytes read from the master; returns Appends (with their bodies) and maybe a Close."""
        if self.closed:
            return []
        if data:
            self.last_read = now
            self.bytes_received += len(data)
            self._buffer.feed(data)
        actions: list[SlaveAction] = []
        buf = self._buffer
        while not self.closed:
            receiving = self.state.receiving
            if self.state.phase is SlavePhase.HANDSHAKE:
                if not self._read_handshake(actions):
                    break
            elif receiving is None:
                size = self._header_size
                if len(buf) < size:
                    break
                try:
                    event = self._parse_header(buf.peek(size))
                except ProtocolError as exc:
                    actions.append(self._close(str(exc)))
                    break
                buf.skip(size)
                actions.extend(self._step(event))
            else:
                size = receiving[1]
                if len(buf) < size:
                    break
                body = buf.take(size)
                actions.extend(
                    Append(a.offset, a.size, body) if isinstance(a, Append) else a
                    for a in self._step(BodyReceived())
                )
        return actions

    def _parse_header(self, data: bytes) -> HeaderReceived:
        if not self.epoch_mode:
            header = TransferHeader.from_bytes(data, max_body=self.max_body)
            return HeaderReceived(header.offset, header.size)
        epoch_header = EpochTransferHeader.from_bytes(data, max_body=self.max_body)
        self.confirm_offset = epoch_header.confirm_offset
        return HeaderReceived(
            epoch_header.offset, epoch_header.size, epoch_header.epoch, epoch_header.epoch_start
        )

    def _read_handshake(self, actions: list[SlaveAction]) -> bool:
        """Consume the master's handshake if it is complete; False to wait for more bytes."""
        buf = self._buffer
        try:
            if self._master_handshake is None:
                if len(buf) < MASTER_HANDSHAKE_HEADER_SIZE:
                    return False
                self._master_handshake = MasterHandshakeHeader.from_bytes(
                    buf.take(MASTER_HANDSHAKE_HEADER_SIZE)
                )
            head = self._master_handshake
            if len(buf) < head.body_size:
                return False
            epochs = head.entries_from_bytes(buf.take(head.body_size))
        except ProtocolError as exc:
            actions.append(self._close(str(exc)))
            return False
        self.master_max_offset = head.max_offset
        if self.master_epoch and epochs.last_epoch != self.master_epoch:
            actions.append(
                self._close(
                    f"refused master {self.peer}: its last epoch is {epochs.last_epoch}, not "
                    f"{self.master_epoch} as the master etcd names"
                )
            )
            return False
        actions.extend(self._step(MasterHandshakeReceived(head.max_offset, epochs)))
        return True

    def encode(self, action: SendReport | SendSlaveHandshake) -> bytes:
        """The bytes of a report (8 classic, 12 epoch mode) or of the handshake."""
        if isinstance(action, SendSlaveHandshake):
            return self.handshake.to_bytes()
        if self.epoch_mode:
            return encode_epoch_report(action.offset)
        return encode_report(action.offset)

    def appended(self, offset: int, *, now: float) -> tuple[SlaveAction, ...]:
        """The store holds the log up to *offset*; returns the report to send, if any."""
        return self._step(AppendConfirmed(offset))

    def report_written(self, *, now: float) -> None:
        self.last_write = now

    def tick(self, *, now: float) -> tuple[SlaveAction, ...]:
        """Heartbeat and housekeeping: a report to repeat, or a Close for a silent master."""
        if self.closed:
            return ()
        if now >= self.read_deadline:
            return self._step(ReadIdle())
        if now >= self.heartbeat_deadline:
            return self._step(HeartbeatDue())
        return ()

    def connection_lost(self) -> None:
        self._buffer.clear()
        self._step(ConnectionLost())

    # --- helpers ----------------------------------------------------------------------------
    def _close(self, reason: str) -> Close:
        self._buffer.clear()
        self.state = SlaveState(phase=SlavePhase.DISCONNECTED, expected=self.state.expected)
        return Close(reason, kind=CloseKind.PROTOCOL_ERROR)

    def _step(self, event: SlaveEvent) -> tuple[SlaveAction, ...]:
        self.state, actions = slave_step(self.state, event)
        if self.closed:
            self._buffer.clear()
        return actions
