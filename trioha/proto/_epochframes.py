"""The messages of RocketMQ 5.x's AutoSwitch HA protocol (epoch mode), byte for byte.

Mirrors ``AutoSwitchHAClient`` and ``AutoSwitchHAConnection``. Every message starts with an
int32 *state*, the ordinal of ``HAConnectionState`` (``READY`` 0, ``HANDSHAKE`` 1,
``TRANSFER`` 2, ``SUSPEND`` 3, ``SHUTDOWN`` 4); all integers are big-endian.

Slave → master:

* handshake, 16 bytes: ``state=1 | int16 isSyncFromLastFile | int16 isAsyncLearner |
  int64 slaveBrokerId``;
* report, 12 bytes: ``state=2 | int64 slaveMaxOffset``.

Master → slave:

* handshake, a 20-byte header ``state=1 | int32 bodySize | int64 masterMaxPhyOffset |
  int32 lastEpoch`` then ``bodySize / 12`` entries ``int32 epoch | int64 startOffset``; a Java
  master's handshake buffer holds at most 1000 entries;
* transfer, a 36-byte header ``state=2 | int32 bodySize | int64 offset | int32 epoch |
  int64 epochStartOffset | int64 confirmOffset`` then the body; bodySize 0 is a heartbeat.
"""

from __future__ import annotations

import struct
from typing import Final

import attrs

from trioha._errors import RemoteProtocolError
from trioha.proto._epochs import EpochEntry, EpochError, EpochHistory
from trioha.proto._frames import Report, check_frame_bounds

#: ``HAConnectionState.HANDSHAKE.ordinal()`` and ``TRANSFER.ordinal()``.
STATE_HANDSHAKE: Final = 1
STATE_TRANSFER: Final = 2
_STATE_NAMES = {0: "READY", 1: "HANDSHAKE", 2: "TRANSFER", 3: "SUSPEND", 4: "SHUTDOWN"}

SLAVE_HANDSHAKE_SIZE: Final = 16  # AutoSwitchHAClient.HANDSHAKE_HEADER_SIZE
EPOCH_REPORT_SIZE: Final = 12  # AutoSwitchHAClient.TRANSFER_HEADER_SIZE
MASTER_HANDSHAKE_HEADER_SIZE: Final = 20  # AutoSwitchHAConnection.HANDSHAKE_HEADER_SIZE
EPOCH_ENTRY_SIZE: Final = 12
MAX_EPOCH_ENTRIES: Final = 1000  # the Java handshake buffer: 12000 bytes
EPOCH_TRANSFER_HEADER_SIZE: Final = 36  # AutoSwitchHAConnection.TRANSFER_HEADER_SIZE

_STATE = struct.Struct(">i")
_SLAVE_HANDSHAKE = struct.Struct(">ihhq")
_REPORT = struct.Struct(">iq")
_MASTER_HANDSHAKE = struct.Struct(">iiqi")
_ENTRY = struct.Struct(">iq")
_TRANSFER = struct.Struct(">iiqiqq")


def state_name(value: int) -> str:
    return _STATE_NAMES.get(value, f"unknown state {value}")


def peek_state(data: bytes | bytearray | memoryview) -> int:
    """The state field a message starts with (the caller has at least 4 bytes)."""
    (state,) = _STATE.unpack_from(data)
    return int(state)


def _expect_state(state: int, expected: int, what: str) -> None:
    if state != expected:
        raise RemoteProtocolError(
            f"{what} carries state {state} ({state_name(state)}); expected {expected} "
            f"({state_name(expected)})"
        )


def _flag(value: int, what: str) -> bool:
    if value not in (0, 1):
        raise RemoteProtocolError(f"slave handshake: {what} is {value}, not 0 or 1")
    return value == 1


@attrs.frozen
class SlaveHandshake:
    """``AutoSwitchHAClient.sendHandshakeHeader``."""

    sync_from_last_file: bool = False
    async_learner: bool = False
    broker_id: int = 1

    def to_bytes(self) -> bytes:
        return _SLAVE_HANDSHAKE.pack(
            STATE_HANDSHAKE,
            int(self.sync_from_last_file),
            int(self.async_learner),
            self.broker_id,
        )

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> SlaveHandshake:
        state, last_file, learner, broker_id = _SLAVE_HANDSHAKE.unpack(data)
        _expect_state(state, STATE_HANDSHAKE, "slave handshake")
        return cls(
            _flag(last_file, "isSyncFromLastFile"), _flag(learner, "isAsyncLearner"), broker_id
        )


def encode_epoch_report(offset: int) -> bytes:
    """The 12 bytes of a slave's TRANSFER report (``reportSlaveMaxOffset``)."""
    return _REPORT.pack(STATE_TRANSFER, offset)


def decode_epoch_report(data: bytes | bytearray | memoryview) -> int:
    """The offset of a 12-byte report: the state field, then the classic 8-byte report."""
    _expect_state(peek_state(data), STATE_TRANSFER, "slave report")
    return Report.from_bytes(bytes(data)[4:EPOCH_REPORT_SIZE]).offset


@attrs.frozen
class MasterHandshakeHeader:
    """The 20 bytes before the epoch entries of the master's handshake."""

    body_size: int
    max_offset: int
    last_epoch: int

    @property
    def entry_count(self) -> int:
        return self.body_size // EPOCH_ENTRY_SIZE

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> MasterHandshakeHeader:
        state, body_size, max_offset, last_epoch = _MASTER_HANDSHAKE.unpack(data)
        _expect_state(state, STATE_HANDSHAKE, "master handshake")
        if body_size < 0 or body_size % EPOCH_ENTRY_SIZE:
            raise RemoteProtocolError(
                f"master handshake announces {body_size} bytes of epoch entries, not a "
                f"multiple of {EPOCH_ENTRY_SIZE}"
            )
        if body_size > MAX_EPOCH_ENTRIES * EPOCH_ENTRY_SIZE:
            raise RemoteProtocolError(
                f"master handshake announces {body_size // EPOCH_ENTRY_SIZE} epoch entries; "
                f"at most {MAX_EPOCH_ENTRIES} fit a RocketMQ handshake"
            )
        if max_offset < 0:
            raise RemoteProtocolError(f"master handshake: negative max offset {max_offset}")
        return cls(body_size, max_offset, last_epoch)

    def entries_from_bytes(self, data: bytes | bytearray | memoryview) -> EpochHistory:
        """The entries that follow this header, checked: epochs and starts increase, every
        start within the master's log, and the last epoch equal to the header's."""
        entries = [
            EpochEntry(*_ENTRY.unpack_from(data, i * EPOCH_ENTRY_SIZE))
            for i in range(self.entry_count)
        ]
        try:
            history = EpochHistory(entries)
        except EpochError as exc:
            raise RemoteProtocolError(f"master handshake: {exc}") from None
        if history and history.last_epoch != self.last_epoch:
            raise RemoteProtocolError(
                f"master handshake: last epoch {self.last_epoch} but its entries end with "
                f"epoch {history.last_epoch}"
            )
        if history and history.entries[-1].start_offset > self.max_offset:
            raise RemoteProtocolError(
                f"master handshake: epoch {history.last_epoch} starts at "
                f"{history.entries[-1].start_offset}, beyond the master's max offset "
                f"{self.max_offset}"
            )
        return history


def encode_master_handshake(max_offset: int, history: EpochHistory) -> bytes:
    """``buildHandshakeBuffer``: header and entries (the newest 1000 if there are more)."""
    entries = history.entries[-MAX_EPOCH_ENTRIES:]
    head = _MASTER_HANDSHAKE.pack(
        STATE_HANDSHAKE, len(entries) * EPOCH_ENTRY_SIZE, max_offset, history.last_epoch
    )
    return head + b"".join(_ENTRY.pack(e.epoch, e.start_offset) for e in entries)


@attrs.frozen
class EpochTransferHeader:
    """The master's 36-byte transfer header (``buildTransferHeaderBuffer``)."""

    offset: int
    size: int
    epoch: int
    epoch_start: int
    confirm_offset: int

    @property
    def end(self) -> int:
        return self.offset + self.size

    def to_bytes(self) -> bytes:
        return _TRANSFER.pack(
            STATE_TRANSFER,
            self.size,
            self.offset,
            self.epoch,
            self.epoch_start,
            self.confirm_offset,
        )

    @classmethod
    def from_bytes(
        cls, data: bytes | bytearray | memoryview, *, max_body: int
    ) -> EpochTransferHeader:
        state, size, offset, epoch, epoch_start, confirm = _TRANSFER.unpack(data)
        _expect_state(state, STATE_TRANSFER, "master frame")
        check_frame_bounds(offset, size, max_body)
        if epoch_start < 0 or epoch_start > offset:
            raise RemoteProtocolError(
                f"master sent a frame at {offset} in epoch {epoch} starting at {epoch_start}: "
                "an epoch cannot start after the bytes it holds"
            )
        return cls(offset, size, epoch, epoch_start, confirm)
