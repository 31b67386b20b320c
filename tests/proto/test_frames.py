"""Frame codec and receive buffers, each fed whole, one byte at a time and with trailing data."""

from __future__ import annotations

import pytest

from trioha import LocalProtocolError, RemoteProtocolError
from trioha.proto import (
    HEADER_SIZE,
    MAX_BODY_SIZE,
    Report,
    ReportWords,
    TransferHeader,
    encode_header,
    encode_report,
)


def test_report_is_eight_big_endian_bytes() -> None:
    # HAClient.reportSlaveMaxOffset: ByteBuffer.putLong, default big-endian
    # (docs/rocketmq-protocol.md §1.2).
    assert encode_report(0x0102030405060708) == bytes(range(1, 9))
    assert Report.from_bytes(bytes(range(1, 9))) == Report(0x0102030405060708)
    assert Report(1 << 40).to_bytes() == encode_report(1 << 40)


def test_negative_report_is_the_peers_fault() -> None:
    with pytest.raises(RemoteProtocolError, match="negative"):
        Report.from_bytes(b"\xff" * 8)
    with pytest.raises(LocalProtocolError):
        Report(-1)


def test_header_is_offset_then_size() -> None:
    # HAConnection.WriteSocketService: putLong(thisOffset), putInt(size) (docs/rocketmq-protocol.md
    # §1.3).
    raw = encode_header(1 << 33, 32768)
    assert len(raw) == HEADER_SIZE
    assert raw == (1 << 33).to_bytes(8, "big") + (32768).to_bytes(4, "big")
    header = TransferHeader.from_bytes(raw, max_body=MAX_BODY_SIZE)
    assert header == TransferHeader(1 << 33, 32768)
    assert header.end == (1 << 33) + 32768
    assert TransferHeader.from_bytes(encode_header(5, 0), max_body=1).is_heartbeat


@pytest.mark.parametrize("size", [-1, MAX_BODY_SIZE + 1, 0x7FFFFFFF])
def test_hostile_sizes_are_refused_before_allocating(size: int) -> None:
    raw = (7).to_bytes(8, "big") + size.to_bytes(4, "big", signed=True)
    with pytest.raises(RemoteProtocolError, match=f"{size} bytes at offset 7"):
        TransferHeader.from_bytes(raw, max_body=MAX_BODY_SIZE)


def test_only_the_last_complete_word_of_a_read_counts() -> None:
    # HAConnection.ReadSocketService.processReadEvent (docs/rocketmq-protocol.md §1.4).
    words = ReportWords()
    burst = encode_report(10) + encode_report(20) + encode_report(30)[:5]
    assert words.feed(burst) == encode_report(20)
    assert words.pending == 5
    assert words.feed(encode_report(30)[5:]) == encode_report(30)
    assert words.pending == 0


def test_reports_fed_one_byte_at_a_time() -> None:
    words = ReportWords()
    raw = encode_report(1234567)
    results = [words.feed(raw[i : i + 1]) for i in range(len(raw))]
    assert results[:-1] == [None] * 7
    assert results[-1] == raw


def test_partial_word_and_trailing_data_keep_alignment() -> None:
    words = ReportWords()
    stream = b"".join(encode_report(i) for i in range(1, 6))
    got = [words.feed(stream[:3]), words.feed(stream[3:21]), words.feed(stream[21:])]
    assert got == [None, encode_report(2), encode_report(5)]


def test_header_round_trips_and_knows_its_end() -> None:
    header = TransferHeader(4096, 300)
    assert header.to_bytes() == encode_header(4096, 300)
    assert TransferHeader.from_bytes(header.to_bytes(), max_body=MAX_BODY_SIZE) == header
    assert header.end == 4396
    assert not header.is_heartbeat
