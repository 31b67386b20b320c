"""Frame codec and receive buffers, each fed whole, one byte at a time and with trailing data."""

from __future__ import annotations

import sys

import pytest

from trioha import LocalProtocolError, RemoteProtocolError
from trioha.proto import (
    HEADER_SIZE,
    MAX_BODY_SIZE,
    Append,
    ReceiveBuffer,
    Report,
    ReportWords,
    SlaveConnection,
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


# --- the boundaries, each from both sides -----------------------------------------------------


def test_the_largest_body_a_java_slave_takes_is_accepted_and_one_more_byte_is_not() -> None:
    # HAClient's read buffer (READ_MAX_BUFFER_SIZE, 4 MiB) holds the header too.
    assert MAX_BODY_SIZE == 4 * 1024 * 1024 - 12
    assert HEADER_SIZE == 12
    assert TransferHeader.from_bytes(encode_header(0, MAX_BODY_SIZE), max_body=MAX_BODY_SIZE) == (
        TransferHeader(0, MAX_BODY_SIZE)
    )
    with pytest.raises(RemoteProtocolError, match=f"limit is {MAX_BODY_SIZE}"):
        TransferHeader.from_bytes(encode_header(0, MAX_BODY_SIZE + 1), max_body=MAX_BODY_SIZE)
    # A caller's own limit is honoured exactly too.
    assert TransferHeader.from_bytes(encode_header(9, 100), max_body=100).size == 100
    with pytest.raises(RemoteProtocolError, match="101 bytes at offset 9"):
        TransferHeader.from_bytes(encode_header(9, 101), max_body=100)


def test_offsets_at_the_int64_edge() -> None:
    top = (1 << 63) - 1
    assert TransferHeader.from_bytes(encode_header(top, 0), max_body=1).offset == top
    assert TransferHeader.from_bytes(encode_header(top - 10, 10), max_body=10).end == top
    beyond = r"ending beyond the largest offset a log can have$"
    with pytest.raises(RemoteProtocolError, match=beyond):
        TransferHeader.from_bytes(encode_header(top - 10, 11), max_body=11)
    assert TransferHeader(top - 10, 10).to_bytes() == encode_header(top - 10, 10)
    assert TransferHeader(5, 0).to_bytes() == (5).to_bytes(8, "big") + bytes(4)
    assert TransferHeader.from_bytes(encode_header(0, 0), max_body=0).is_heartbeat
    assert not TransferHeader(0, 1).is_heartbeat
    with pytest.raises(RemoteProtocolError, match="negative offset -1"):
        TransferHeader.from_bytes(b"\xff" * 8 + encode_header(0, 0)[8:], max_body=1)
    assert Report.from_bytes(encode_report(top)) == Report(top)
    assert Report(0).offset == 0
    with pytest.raises(LocalProtocolError, match="non-negative int64"):
        Report(top + 1)


@pytest.mark.parametrize("size", [0, 1, 11, 12, 13, 4095, 4096, 65536])
def test_a_frame_of_any_size_arrives_whole_fed_three_ways(size: int) -> None:
    """Whole, one byte at a time, and with the next frame's header behind it."""
    body = bytes(i % 251 for i in range(size))
    frame = encode_header(0, size) + body
    follow = encode_header(size, 0)
    for pieces in (
        [frame],
        [frame[i : i + 1] for i in range(len(frame))] if size <= 4096 else [frame],
        [frame + follow],
    ):
        slave = SlaveConnection(log_max=0, now=0.0, max_body=65536)
        appends = []
        for piece in pieces:
            appends += [a for a in slave.receive_data(piece, now=0.0) if isinstance(a, Append)]
        if size:
            assert [(a.offset, a.size, a.data) for a in appends] == [(0, size, body)]
        else:
            assert appends == []
        assert not slave.closed
        assert slave.buffered == 0


def test_header_round_trips_and_knows_its_end() -> None:
    header = TransferHeader(4096, 300)
    assert header.to_bytes() == encode_header(4096, 300)
    assert TransferHeader.from_bytes(header.to_bytes(), max_body=MAX_BODY_SIZE) == header
    assert header.end == 4396
    assert not header.is_heartbeat


class _Chunk(bytes):
    """A received chunk that can be told apart from a copy (``is``)."""


def test_receive_buffer_hands_back_a_whole_chunk_without_copying() -> None:
    # A body that arrived as exactly one read is that read's bytes, not a copy of them.
    buf = ReceiveBuffer()
    first, second = _Chunk(b"abcdef"), _Chunk(b"ghij")
    buf.feed(first)
    buf.feed(second)
    assert buf.peek(6) == b"abcdef"
    assert buf.take(6) is first
    assert buf.take(4) is second
    assert len(buf) == 0
    buf.feed(_Chunk(b"xyz"))
    assert buf.take(2) == b"xy"
    assert type(buf.take(1)) is bytes  # a part of a chunk is a copy
    assert len(buf) == 0


def test_receive_buffer_keeps_no_consumed_chunk() -> None:
    # Nothing received stays pinned once consumed, even when a read ends exactly at a chunk end.
    buf = ReceiveBuffer()
    chunk = _Chunk(b"x" * 64)
    alone = sys.getrefcount(chunk)
    buf.feed(chunk)
    buf.feed(b"tail")
    assert sys.getrefcount(chunk) == alone + 1
    buf.skip(64)
    assert sys.getrefcount(chunk) == alone
    assert buf.take(4) == b"tail"


def test_receive_buffer_copies_what_the_caller_may_reuse() -> None:
    buf = ReceiveBuffer()
    scratch = bytearray(b"12345678")
    buf.feed(scratch)
    buf.feed(memoryview(scratch)[:2])
    scratch[:] = b"--------"
    assert buf.take(10) == b"1234567812"
    assert type(buf.peek(0)) is bytes


def test_receive_buffer_after_clear_reads_from_the_next_byte_fed() -> None:
    buf = ReceiveBuffer()
    buf.feed(b"0123456789")
    assert buf.take(3) == b"012"
    buf.clear()
    assert len(buf) == 0
    buf.feed(b"abcdef")
    assert buf.peek(2) == b"ab"
    assert buf.take(6) == b"abcdef"
