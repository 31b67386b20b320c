"""The two messages of RocketMQ's classic HA protocol (docs/rocketmq-protocol.md §1.2, §1.3).

Slave → master: an 8-byte big-endian signed offset (``HAClient.reportSlaveMaxOffset``).
Master → slave: a 12-byte header, 8-byte offset and 4-byte size, then ``size`` bytes of commit
log (``HAConnection.WriteSocketService``); size 0 is a heartbeat.
"""

from __future__ import annotations

import struct

import attrs

from trioha._errors import LocalProtocolError, RemoteProtocolError

REPORT_SIZE = 8
HEADER_SIZE = 12

#: The largest body a frame may announce before we refuse it. A RocketMQ slave cannot take a frame
#: larger than its 4 MiB read buffer minus the header (docs/rocketmq-protocol.md §1.6), so no honest
#: master
#: sends one; anything larger is garbage or hostile and must not make us allocate it.
MAX_BODY_SIZE = 4 * 1024 * 1024 - HEADER_SIZE

_REPORT = struct.Struct(">q")
_HEADER = struct.Struct(">qi")

INT64_MAX = (1 << 63) - 1


@attrs.frozen
class Report:
    """The slave's max offset: its request offset the first time, an ack afterwards."""

    offset: int = attrs.field()

    @offset.validator
    def _check(self, _attribute: object, value: int) -> None:
        if not 0 <= value <= INT64_MAX:
            raise LocalProtocolError(f"a report offset must be a non-negative int64, got {value}")

    def to_bytes(self) -> bytes:
        return _REPORT.pack(self.offset)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> Report:
        (offset,) = _REPORT.unpack(data)
        if offset < 0:
            raise RemoteProtocolError(f"slave reported a negative offset {offset}")
        return cls(offset)


@attrs.frozen
class TransferHeader:
    """The master's frame header: where the body starts in the commit log, and its length."""

    offset: int
    size: int

    @property
    def is_heartbeat(self) -> bool:
        return self.size == 0

    @property
    def end(self) -> int:
        return self.offset + self.size

    def to_bytes(self) -> bytes:
        return _HEADER.pack(self.offset, self.size)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview, *, max_body: int) -> TransferHeader:
        offset, size = _HEADER.unpack(data)
        check_frame_bounds(offset, size, max_body)
        return cls(offset, size)


def check_frame_bounds(offset: int, size: int, max_body: int) -> None:
    """Refuse a frame header whose offset or size no honest master sends (both protocols)."""
    if offset < 0:
        raise RemoteProtocolError(f"master sent a frame at negative offset {offset}")
    if size < 0 or size > max_body:
        raise RemoteProtocolError(
            f"master sent a frame of {size} bytes at offset {offset}; "
            f"the limit is {max_body} (a RocketMQ slave's receive buffer)"
        )
    if offset + size > INT64_MAX:
        raise RemoteProtocolError(
            f"master sent a frame of {size} bytes at offset {offset}, ending beyond the "
            "largest offset a log can have"
        )


def encode_report(offset: int) -> bytes:
    """The 8 bytes a slave sends to report *offset*."""
    return _REPORT.pack(offset)


def encode_header(offset: int, size: int) -> bytes:
    """The 12-byte header of a transfer (or, with size 0, a heartbeat) at *offset*."""
    return _HEADER.pack(offset, size)
