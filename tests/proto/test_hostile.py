"""Garbage, truncated and oversized input fed to both ends of the sans-IO protocol.

The only acceptable outcomes are progress or a clean :class:`~trioha.proto.Close` of that one
connection: never another exception, never a buffer that grows past one frame, never a change
to the log other than an append at exactly its end. Each stream is also fed three ways (all at
once, one byte at a time, cut anywhere) and must give the same result every way, and the result
must equal a reference reading written here from the spec (§1.3, §1.4, §1.6), not from the code.
"""

from __future__ import annotations

import struct

import attrs
import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from trioha.proto import (
    HEADER_SIZE,
    REPORT_SIZE,
    AckAdvanced,
    Append,
    Close,
    LogView,
    MasterConnection,
    MasterOptions,
    SendHeartbeat,
    SendReport,
    SendTransfer,
    SlaveConnection,
    encode_report,
)
from trioha.store import MemoryCommitLog
from trioha.testing import log_bytes, pending_report_bytes
from trioha.testing.strategies import hostile_frame_streams, report_words, split_anywhere

INT64_MAX = 2**63 - 1
#: Small enough that oversized frames are cheap to build, large enough for real bodies.
MAX_BODY = 300

# --- the slave side: master→slave frames ------------------------------------------------------


@attrs.frozen
class SlaveOutcome:
    """What the slave did with a stream: the appends, its reports, whether it closed.

    Reports are compared loosely (:func:`check_same`): an append in the same read as the Close
    that follows it is never reported, because the connection is going away (the next
    connection's first report covers it), so how the stream was cut decides that one report.
    """

    appends: tuple[tuple[int, bytes], ...]
    reports: tuple[int, ...]
    closed: bool


def check_same(actual: SlaveOutcome, expected: SlaveOutcome) -> None:
    assert actual.appends == expected.appends
    assert actual.closed == expected.closed
    assert set(actual.reports) <= set(expected.reports)
    assert list(actual.reports) == sorted(set(actual.reports)), "reports went backwards or repeat"
    assert actual.reports[0] == expected.reports[0], "the first report is the log's end"
    if not expected.closed:
        assert actual.reports == expected.reports


def reference_slave(stream: bytes, *, log_max: int, max_body: int) -> SlaveOutcome:
    """How an honest slave reads *stream* (docs/rocketmq-protocol.md §1.3, §1.6), written without
    the code under test.

    Frames are taken one at a time; a header with a negative offset, a size outside
    ``[0, max_body]``, an end beyond int64, or an offset other than the log's end (checked unless
    the log is empty) ends the connection with nothing of that frame appended. A body is appended
    only when complete, and each append is reported once the store holds it.
    """
    pos, end = 0, log_max
    appends: list[tuple[int, bytes]] = []
    reports = [log_max]
    while len(stream) - pos >= HEADER_SIZE:
        offset, size = struct.unpack_from(">qi", stream, pos)
        if offset < 0 or not 0 <= size <= max_body or offset + size > INT64_MAX:
            return SlaveOutcome(tuple(appends), tuple(reports), closed=True)
        if end not in (0, offset):
            return SlaveOutcome(tuple(appends), tuple(reports), closed=True)
        if len(stream) - pos - HEADER_SIZE < size:
            break
        pos += HEADER_SIZE
        if size:
            appends.append((offset, stream[pos : pos + size]))
            end = offset + size
            reports.append(end)
        pos += size
    return SlaveOutcome(tuple(appends), tuple(reports), closed=False)


def drive_slave(chunks: list[bytes], *, log_max: int, max_body: int) -> SlaveOutcome:
    """Feed *chunks* to a real :class:`SlaveConnection`, doing what the Trio client does."""
    conn = SlaveConnection(log_max=log_max, now=0.0, max_body=max_body)
    # The real store: its append_raw refuses anything but exactly the end (or starts a log).
    log = MemoryCommitLog(segment_size=4096)
    if log_max:
        log.append_raw(log_max, b"")
    log_end = log_max
    appends: list[tuple[int, bytes]] = []
    reports: list[int] = []
    closed = False

    def send(actions: tuple[object, ...] | list[object]) -> None:
        nonlocal closed
        for action in actions:
            if isinstance(action, SendReport):
                assert not closed, "a report after the connection closed"
                encode_report(action.offset)  # what the writer does; must not raise
                reports.append(action.offset)
            elif isinstance(action, Close):
                assert not closed, "closed twice"
                closed = True
            else:
                pytest.fail(f"unexpected action {action!r}")

    send(conn.initial_actions())
    for chunk in chunks:
        actions = conn.receive_data(chunk, now=0.0)
        if closed:
            assert actions == [], "actions after Close"
        for action in actions:
            if isinstance(action, Append):
                assert not closed
                assert len(action.data) == action.size > 0
                assert log_end in (0, action.offset), (
                    f"append at {action.offset} but the log ends at {log_end}"
                )
                appends.append((action.offset, action.data))
                log_end = log.append_raw(action.offset, action.data)
                send(conn.appended(log_end, now=0.0))
            else:
                send((action,))
        # Never more than one frame's worth of bytes waits in the buffer.
        assert conn.buffered <= HEADER_SIZE + max_body
        assert conn.buffered < max(HEADER_SIZE, max_body)
        if conn.closed:
            assert conn.buffered == 0
    conn.connection_lost()
    assert conn.buffered == 0
    assert conn.receive_data(b"\x00" * HEADER_SIZE, now=1.0) == []
    # The log holds exactly the valid appends, nothing else.
    if appends:
        start = appends[0][0]
        assert log.min_offset == (start if not log_max else min(start, log_max))
        assert log_bytes(log, start) == b"".join(data for _offset, data in appends)
    else:
        assert log.max_offset == log_max
    return SlaveOutcome(tuple(appends), tuple(reports), closed)


slave_log_ends = st.sampled_from([0, 0, 4096, 12345])


@given(data=st.data(), log_max=slave_log_ends)
@example(data=None, log_max=0).via("regression: a frame whose end overflows int64")
def test_slave_hostile_frames_three_ways(data: st.DataObject | None, log_max: int) -> None:
    if data is None:
        # An empty slave accepts a frame at any offset; one ending past int64 would make its
        # next report unencodable (struct.error in the writer) unless refused.
        stream = struct.pack(">qi", INT64_MAX - 5, 10) + bytes(10)
        chunks = [stream]
    else:
        stream = data.draw(hostile_frame_streams(log_max=log_max, max_body=MAX_BODY))
        chunks = data.draw(split_anywhere(stream))
    expected = reference_slave(stream, log_max=log_max, max_body=MAX_BODY)
    event(f"slave closes: {expected.closed}; appends: {min(len(expected.appends), 3)}+")
    check_same(drive_slave(chunks, log_max=log_max, max_body=MAX_BODY), expected)
    check_same(drive_slave([stream], log_max=log_max, max_body=MAX_BODY), expected)
    one_by_one = [stream[i : i + 1] for i in range(len(stream))]
    check_same(drive_slave(one_by_one, log_max=log_max, max_body=MAX_BODY), expected)


@given(stream=st.binary(max_size=2000), log_max=slave_log_ends, data=st.data())
def test_slave_pure_garbage(stream: bytes, log_max: int, data: st.DataObject) -> None:
    chunks = data.draw(split_anywhere(stream))
    expected = reference_slave(stream, log_max=log_max, max_body=MAX_BODY)
    check_same(drive_slave(chunks, log_max=log_max, max_body=MAX_BODY), expected)


@given(size=st.integers(MAX_BODY + 1, 2**31 - 1), log_max=slave_log_ends)
@example(size=MAX_BODY + 1, log_max=0).via(
    "regression: closing on a bad header cleared a buffer still viewed (BufferError)"
)
def test_slave_refuses_oversized_frame_without_buffering_it(size: int, log_max: int) -> None:
    """A header announcing a huge body closes at once; nothing waits for the body."""
    conn = SlaveConnection(log_max=log_max, now=0.0, max_body=MAX_BODY)
    conn.initial_actions()
    actions = conn.receive_data(struct.pack(">qi", log_max, size) + bytes(64), now=0.0)
    assert [type(a) for a in actions] == [Close]
    assert conn.closed
    assert conn.buffered == 0


# --- the master side: slave→master reports ----------------------------------------------------

SEGMENT = 1024


@attrs.frozen
class ReportOp:
    """Bytes arriving in one read."""

    data: bytes


@attrs.frozen
class SendOp:
    """The writer asks what to send and writes it completely."""


@st.composite
def master_ops(draw: st.DrawFn, max_offset: int) -> list[ReportOp | SendOp]:
    if draw(st.booleans()):
        # Honest-looking: a request, then acks going up (the sends decide if they are valid).
        offsets = sorted(draw(st.lists(st.integers(0, max_offset), min_size=1, max_size=8)))
        words = [o.to_bytes(8, "big") for o in offsets]
        if draw(st.booleans()):
            words.insert(draw(st.integers(0, len(words))), draw(report_words(max_offset)))
    else:
        words = draw(st.lists(report_words(max_offset), min_size=1, max_size=12))
    stream = b"".join(words)
    if draw(st.booleans()):
        stream += draw(st.binary(max_size=REPORT_SIZE - 1))  # a trailing partial report
    chunks = draw(split_anywhere(stream))
    ops: list[ReportOp | SendOp] = []
    for chunk in chunks:
        ops.append(ReportOp(chunk))
        ops.extend(SendOp() for _ in range(draw(st.integers(0, 6))))
    return ops


def reference_master(
    ops: list[ReportOp | SendOp], log: LogView, options: MasterOptions
) -> tuple[list[object], int]:
    """The master's reading of reports (docs/rocketmq-protocol.md §1.4, §2.2 and trioha's stricter
    ack rules).

    Only the newest complete 8-byte word of each read counts. The first is the request offset:
    beyond the log's end, or (0 meaning the last segment's start, or the oldest offset with
    ``sync_from_oldest``) before the oldest offset, it closes. Later words are acks: beyond
    what was sent, or backwards, they close; the same value again is ignored. Returns the
    actions (Close compared by type) and the end of what was sent.
    """
    actions: list[object] = []
    stream = b"".join(op.data for op in ops if isinstance(op, ReportOp))
    received = 0
    request = ack = sent = -1
    for op in ops:
        if isinstance(op, SendOp):
            if request >= 0 and sent < log.max_offset:
                size = min(log.readable_end(sent) - sent, options.batch_size)
                actions.append(SendTransfer(sent, size))
                sent += size
            continue
        words_before = received // REPORT_SIZE
        received += len(op.data)
        words = received // REPORT_SIZE
        if words == words_before:
            continue
        (value,) = struct.unpack_from(">q", stream, (words - 1) * REPORT_SIZE)
        if value < 0:
            actions.append(Close)
            break
        if request < 0:
            if value > log.max_offset:
                actions.append(Close)
                break
            if value == 0:
                start = (
                    log.min_offset
                    if options.sync_from_oldest
                    else log.max_offset - log.max_offset % log.segment_size
                )
            else:
                start = value
            if start < log.min_offset:
                actions.append(Close)
                break
            request = ack = value
            sent = start
            actions.append(AckAdvanced(value))
        elif value > sent or value < ack:
            actions.append(Close)
            break
        elif value > ack:
            ack = value
            actions.append(AckAdvanced(value))
    return actions, sent


def drive_master(
    ops: list[ReportOp | SendOp], log: LogView, options: MasterOptions
) -> list[object]:
    conn = MasterConnection(now=0.0, options=options)
    actions: list[object] = []
    for op in ops:
        if conn.closed:
            # A closed connection ignores late bytes and sends nothing.
            if isinstance(op, ReportOp):
                assert conn.receive_data(op.data, now=0.0, log=log) == ()
            else:
                assert conn.next_send(now=0.0, log=log) is None
            continue
        if isinstance(op, SendOp):
            send = conn.next_send(now=0.0, log=log)
            if send is None:
                continue
            assert isinstance(send, SendTransfer), send
            actions.append(send)
            conn.frame_written(now=0.0)
            continue
        for action in conn.receive_data(op.data, now=0.0, log=log):
            actions.append(Close if isinstance(action, Close) else action)
            if isinstance(action, AckAdvanced):
                assert action.offset <= log.max_offset
        assert pending_report_bytes(conn) < REPORT_SIZE
    return actions


log_views = st.builds(
    lambda segs, first, tail: LogView(first * SEGMENT, (first + segs) * SEGMENT + tail, SEGMENT),
    st.integers(0, 3),
    st.integers(0, 2),
    st.integers(0, SEGMENT - 1),
)
master_options = st.builds(
    MasterOptions, batch_size=st.sampled_from([1, 100, 4096]), sync_from_oldest=st.booleans()
)


@given(data=st.data(), log=log_views, options=master_options)
def test_master_hostile_reports(data: st.DataObject, log: LogView, options: MasterOptions) -> None:
    ops = data.draw(master_ops(log.max_offset))
    expected, _sent = reference_master(ops, log, options)
    actual = drive_master(ops, log, options)
    event(f"master closes: {Close in actual}")
    assert actual == expected


@given(stream=st.binary(max_size=200), log=log_views, data=st.data())
def test_master_pure_garbage(stream: bytes, log: LogView, data: st.DataObject) -> None:
    ops: list[ReportOp | SendOp] = [ReportOp(c) for c in data.draw(split_anywhere(stream))]
    options = MasterOptions()
    assert drive_master(ops, log, options) == reference_master(ops, log, options)[0]


def test_master_heartbeat_only_after_first_report() -> None:
    """RocketMQ's writer sends nothing, not even a heartbeat, before the first report."""
    log = LogView(0, 100, SEGMENT)
    conn = MasterConnection(now=0.0)
    assert conn.next_send(now=1e6, log=log) is None
    conn.receive_data(encode_report(100), now=1e6, log=log)
    assert isinstance(conn.next_send(now=2e6, log=log), SendHeartbeat)
