"""The CommitLog contract, run against the file log and the in-memory log alike.

Each test names the RocketMQ behaviour it mirrors (docs/rocketmq-protocol.md §1.7, §4.1, §4.3,
§4.5).
"""

from __future__ import annotations

import random
import struct
import threading
from typing import Any

import pytest

from trioha import (
    CorruptLogError,
    MessageTooLargeError,
    NotAMessageBoundaryError,
    OffsetMismatchError,
    StorageError,
)
from trioha.store import (
    BLANK_MAGIC,
    MIN_SEGMENT_SIZE,
    DecodedBlank,
    HostAddress,
    MemoryCommitLog,
    NewMessage,
    StoredMessage,
    decode_record,
)
from trioha.store._logcore import LogCore

from .conftest import FakeClock, LogFactory

Log = LogCore[Any]
REC = 197  # an appended record: topic FooBar, 100-byte body, no properties


def fill(log: Log, n: int, *, body: bytes = b"b" * 100, topic: str = "FooBar") -> list[int]:
    return [
        log.append(NewMessage(topic=topic, body=body, queue_id=i % 2)).physical_offset
        for i in range(n)
    ]


def all_bytes(log: Log) -> bytes:
    out = bytearray()
    offset = log.min_offset
    while offset < log.max_offset:
        chunk = log.read(offset, 1 << 20)
        out += chunk
        offset += len(chunk)
    return bytes(out)


# --- empty log ------------------------------------------------------------------------


def test_an_empty_log(make_log: LogFactory) -> None:
    log = make_log()
    assert (log.min_offset, log.max_offset, log.flushed_offset) == (0, 0, 0)
    assert log.read(0, 100) == b""
    assert list(log.iter_messages()) == []
    assert log.next_queue_offset("t", 0) == 0
    assert log.flush() == 0


# --- append (DefaultAppendMessageCallback.doAppend) -----------------------------------


def test_append_assigns_offsets_queue_offsets_and_store_time(make_log: LogFactory) -> None:
    clock = FakeClock(1000)
    log = make_log(clock_ms=clock)
    a = log.append(NewMessage(topic="A", body=b"one", queue_id=3, properties={"TAGS": "x"}))
    b = log.append(NewMessage(topic="A", body=b"two", queue_id=3))
    c = log.append(NewMessage(topic="B", body=b"three", queue_id=3, store_timestamp=42))
    d = log.append(NewMessage(topic="A", body=b"four", queue_id=4))
    assert [r.physical_offset for r in (a, b, c, d)] == [
        0,
        a.end_offset,
        b.end_offset,
        c.end_offset,
    ]
    assert [r.queue_offset for r in (a, b, c, d)] == [0, 1, 0, 0]
    assert (a.store_timestamp, c.store_timestamp) == (1001, 42)
    assert log.max_offset == d.end_offset
    msgs = list(log.iter_messages())
    assert [m.body for m in msgs] == [b"one", b"two", b"three", b"four"]
    assert msgs[0].tags == "x"
    assert msgs[0].born_timestamp == 1001  # defaults to now
    assert msgs[0].store_host == log.store_host
    assert msgs[1].physical_offset == b.physical_offset
    assert a.msg_id == msgs[0].msg_id
    assert log.next_queue_offset("A", 3) == 2


def test_hosts_and_sysflag(make_log: LogFactory) -> None:
    log = make_log()
    born = HostAddress("2001:db8::7", 5555)
    r = log.append(NewMessage(topic="t", body=b"", born_host=born, sysflag=0x4))
    (m,) = log.iter_messages()
    assert (m.born_host, m.sysflag, m.total_size) == (born, 0x14, r.size)


def test_a_record_never_spans_two_segments(make_log: LogFactory) -> None:
    """doAppend: msgLen + 8 > remaining writes a blank of maxBlank bytes.

    docs/rocketmq-protocol.md §4.3.
    """
    log = make_log(segment_size=1024)
    offsets = fill(log, 12)  # 197-byte records: 5 per segment, 39 bytes left
    assert offsets[5] == 1024
    blank_at = offsets[4] + REC
    assert blank_at == 985
    raw = bytes(log.read(blank_at, 1024))
    assert len(raw) == 1024 - blank_at  # read stops at the segment end
    assert struct.unpack(">iI", raw[:8]) == (1024 - blank_at, BLANK_MAGIC)
    assert raw[8:] == bytes(len(raw) - 8)
    assert decode_record(raw) == DecodedBlank(0, 1024 - blank_at)
    assert [m.physical_offset for m in log.iter_messages()] == offsets


def test_a_full_segment_counts_as_full(make_log: LogFactory) -> None:
    log = make_log(segment_size=1024)
    fill(log, 5)
    end = log.max_offset
    log.append(NewMessage(topic="FooBar", body=b"b" * 100))
    assert log.max_offset == 1024 + REC
    assert end == 5 * REC
    assert len(log.read(end, 4096)) == 1024 - end


def test_append_batch_is_consecutive_and_in_one_segment(make_log: LogFactory) -> None:
    log = make_log(segment_size=1024)
    fill(log, 3)
    before = log.max_offset
    results = log.append_batch(
        [NewMessage(topic="FooBar", body=b"b" * 100, queue_id=0) for _ in range(3)]
    )
    # 3 records do not fit after 3 records: the batch moves to the next segment, whole.
    assert before == 3 * REC
    assert [r.physical_offset for r in results] == [1024, 1024 + REC, 1024 + 2 * REC]
    assert [r.queue_offset for r in results] == [2, 3, 4]
    mixed = log.append_batch([NewMessage(topic="X", body=b"1"), NewMessage(topic="X", body=b"2")])
    assert [r.queue_offset for r in mixed] == [0, 1]
    assert mixed[1].physical_offset == mixed[0].end_offset
    assert log.append_batch([]) == []


def test_a_batch_fails_whole(make_log: LogFactory) -> None:
    log = make_log(segment_size=1024, max_message_size=200)
    fill(log, 1)
    end = log.max_offset
    with pytest.raises(MessageTooLargeError, match="201 bytes, more than maxMessageSize 200"):
        log.append_batch(
            [NewMessage(topic="t", body=b"ok"), NewMessage(topic="t", body=b"x" * 201)]
        )
    with pytest.raises(MessageTooLargeError, match="batch of 6 messages of 1182 bytes"):
        log.append_batch([NewMessage(topic="FooBar", body=b"b" * 100) for _ in range(6)])
    with pytest.raises(ValueError, match="property"):
        log.append_batch([NewMessage(topic="t", body=b"", properties={"a\x01": "b"})])
    assert log.max_offset == end
    assert log.next_queue_offset("t", 0) == 0


def test_limits(make_log: LogFactory) -> None:
    log = make_log(segment_size=1024)
    with pytest.raises(MessageTooLargeError, match="message of 1116 bytes does not fit a segment"):
        log.append(NewMessage(topic="t", body=b"x" * 1024))
    with pytest.raises(MessageTooLargeError, match="properties are 32770 bytes"):
        log.append(NewMessage(topic="t", body=b"", properties={"k": "v" * 32768}))
    long_topic = log.append(NewMessage(topic="t" * 200, body=b""))  # V2 record
    assert next(log.iter_messages()).topic == "t" * 200
    assert long_topic.queue_offset == 0
    assert log.max_offset == long_topic.end_offset


# --- read (getData / selectMappedBuffer) ----------------------------------------------


def test_read_stays_inside_one_segment_and_the_written_bytes(make_log: LogFactory) -> None:
    log = make_log(segment_size=1024)
    fill(log, 8)
    assert len(log.read(0, 10_000)) == 1024
    assert len(log.read(1000, 10_000)) == 24
    assert len(log.read(1024, 10_000)) == log.max_offset - 1024
    assert len(log.read(1030, 5)) == 5
    assert log.read(log.max_offset, 10) == b""
    assert log.read(0, 0) == b""
    with pytest.raises(StorageError, match=r"offset 99999 is outside the commit log \[0, 1615\]"):
        log.read(99999, 1)
    with pytest.raises(ValueError, match="max_bytes"):
        log.read(0, -1)


def test_a_read_view_survives_later_appends(make_log: LogFactory) -> None:
    log = make_log(segment_size=1024)
    fill(log, 2)
    held = log.read(0, 378)
    snapshot = bytes(held)
    fill(log, 20)
    assert bytes(held) == snapshot


# --- append_raw (CommitLog.appendData, docs/rocketmq-protocol.md §1.7) ---------------------------


def test_replicating_through_read_and_append_raw_gives_identical_bytes(
    make_log: LogFactory,
) -> None:
    master = make_log(segment_size=1024)
    fill(master, 30)
    slave = make_log(segment_size=1024)
    rng = random.Random(7)
    offset = 0
    while offset < master.max_offset:
        chunk = master.read(offset, rng.randint(1, 700))
        offset = slave.append_raw(offset, chunk)
        assert offset == slave.max_offset
    assert all_bytes(slave) == all_bytes(master)
    assert list(slave.iter_messages()) == list(master.iter_messages())
    assert slave.next_queue_offset("FooBar", 0) == 15
    # A promoted slave continues the queues.
    assert slave.append(NewMessage(topic="FooBar", body=b"x", queue_id=1)).queue_offset == 15


def test_append_raw_elsewhere_than_the_end_is_refused(make_log: LogFactory) -> None:
    master = make_log()
    fill(master, 3)
    slave = make_log()
    slave.append_raw(0, master.read(0, 100))
    with pytest.raises(OffsetMismatchError, match="offered at offset 50, but the log ends at 100"):
        slave.append_raw(50, b"x")
    with pytest.raises(OffsetMismatchError, match="at offset 101, but the log ends at 100"):
        slave.append_raw(101, b"x")
    with pytest.raises(OffsetMismatchError, match="negative"):
        make_log().append_raw(-1, b"")
    assert slave.max_offset == 100


def test_append_raw_splits_at_segment_boundaries(make_log: LogFactory) -> None:
    master = make_log(segment_size=1024)
    fill(master, 20)
    data = all_bytes(master)
    slave = make_log(segment_size=1024)
    assert slave.append_raw(0, memoryview(data)) == master.max_offset
    assert all_bytes(slave) == data
    assert len(slave.read(0, 1 << 20)) == 1024


def test_an_empty_log_starts_where_the_first_bytes_say(make_log: LogFactory) -> None:
    master = make_log(segment_size=1024)
    offsets = fill(master, 20)
    start = offsets[7]  # inside the second segment
    slave = make_log(segment_size=1024)
    slave.append_raw(start, master.read(start, 1 << 20))
    assert (slave.min_offset, slave.max_offset) == (start, 2048)
    assert [m.physical_offset for m in slave.iter_messages()] == offsets[7:10]
    assert bytes(slave.read(start, 50)) == bytes(master.read(start, 50))
    with pytest.raises(StorageError, match="outside"):
        slave.read(1024, 10)
    assert slave.next_queue_offset("FooBar", 1) == 5


def test_a_heartbeat_creates_the_first_segment(make_log: LogFactory) -> None:
    slave = make_log(segment_size=1024)
    assert slave.append_raw(3000, b"") == 3000
    assert (slave.min_offset, slave.max_offset) == (3000, 3000)


def test_an_empty_log_starts_over_where_replicated_data_begins(make_log: LogFactory) -> None:
    # A slave cut back to nothing is served from the master's last segment (report 0).
    slave = make_log(segment_size=1024)
    slave.append_raw(0, b"")
    assert slave.append_raw(2048, b"abc") == 2051
    assert (slave.min_offset, bytes(slave.read(2048, 10))) == (2048, b"abc")
    with pytest.raises(OffsetMismatchError):  # a log holding data never moves
        slave.append_raw(0, b"x")


def test_a_partial_trailing_message_is_tolerated(make_log: LogFactory) -> None:
    master = make_log()
    offsets = fill(master, 3)
    slave = make_log()
    slave.append_raw(0, master.read(0, offsets[2] + 50))
    assert [m.physical_offset for m in slave.iter_messages()] == offsets[:2]
    assert slave.next_queue_offset("FooBar", 0) == 1
    slave.append_raw(offsets[2] + 50, master.read(offsets[2] + 50, 1000))
    assert [m.physical_offset for m in slave.iter_messages()] == offsets
    assert slave.next_queue_offset("FooBar", 0) == 2


def test_garbage_inside_the_log_is_a_corrupt_log_error(make_log: LogFactory) -> None:
    log = make_log()
    log.append_raw(0, b"\x00\x00\x00\x64" + b"\xab" * 200)
    with pytest.raises(CorruptLogError, match=r"record at 0 is not valid \(bad-magic"):
        list(log.iter_messages())
    with pytest.raises(StorageError, match="outside"):
        log.iter_messages(10_000)


# --- flush ----------------------------------------------------------------------------


def test_flush_moves_the_flushed_offset(make_log: LogFactory) -> None:
    log = make_log()
    fill(log, 5)
    assert log.flushed_offset == 0
    assert log.flush() == log.max_offset == log.flushed_offset


def test_flush_from_another_thread_while_appending(make_log: LogFactory) -> None:
    log = make_log(segment_size=4096)
    stop = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def flusher() -> None:
        try:
            while not stop.is_set():
                seen.append(log.flush())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=flusher)
    thread.start()
    try:
        fill(log, 300)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not errors
    assert seen == sorted(seen)
    assert all(s <= log.max_offset for s in seen)
    assert log.flush() == log.max_offset


# --- truncate (truncateDirtyFiles) ----------------------------------------------------


def test_truncate_drops_the_tail_keeps_it_aside_and_rolls_back_queues(
    make_log: LogFactory,
) -> None:
    log = make_log(segment_size=1024)
    offsets = fill(log, 14)
    before = all_bytes(log)
    log.flush()
    log.truncate(offsets[6])
    assert log.max_offset == offsets[6]
    assert log.flushed_offset == offsets[6]
    assert [m.physical_offset for m in log.iter_messages()] == offsets[:6]
    assert log.next_queue_offset("FooBar", 0) == 3
    assert log.next_queue_offset("FooBar", 1) == 3
    assert [(s.offset, s.reason) for s in log.set_aside] == [
        (offsets[6], "truncated"),
        (2048, "truncated"),
    ]
    again = log.append(NewMessage(topic="FooBar", body=b"b" * 100, queue_id=0))
    assert (again.physical_offset, again.queue_offset) == (offsets[6], 3)
    assert all_bytes(log)[: offsets[6]] == before[: offsets[6]]


def test_truncate_at_the_end_does_nothing_and_outside_is_an_error(make_log: LogFactory) -> None:
    log = make_log()
    fill(log, 3)
    log.truncate(log.max_offset)
    assert log.set_aside == []
    with pytest.raises(StorageError, match="outside"):
        log.truncate(log.max_offset + 1)


def test_truncate_to_the_start_empties_the_log(make_log: LogFactory) -> None:
    log = make_log()
    fill(log, 3)
    log.truncate(0)
    assert (log.min_offset, log.max_offset) == (0, 0)
    assert list(log.iter_messages()) == []
    assert log.next_queue_offset("FooBar", 0) == 0


# --- truncate_to_boundary (truncateDirtyFiles at a consistent point) ------------------


def test_truncate_to_boundary_cuts_at_a_record_and_keeps_the_tail_aside(
    make_log: LogFactory,
) -> None:
    log = make_log(segment_size=1024)
    offsets = fill(log, 12)
    before = all_bytes(log)
    kept = log.truncate_to_boundary(offsets[3])
    assert log.max_offset == offsets[3]
    assert [(k.offset, k.reason) for k in kept] == [
        (offsets[3], "truncated"),
        (1024, "truncated"),
        (2048, "truncated"),
    ]
    assert kept == log.set_aside
    assert all_bytes(log) == before[: offsets[3]]
    assert log.next_queue_offset("FooBar", 1) == 1


@pytest.mark.parametrize("inside", [1, 8, REC // 2, REC - 1])
def test_truncate_inside_a_record_is_refused_naming_the_nearest_boundaries(
    make_log: LogFactory, inside: int
) -> None:
    log = make_log(segment_size=1024)
    offsets = fill(log, 8)
    before = all_bytes(log)
    cut = offsets[6] + inside
    refused = f"at {cut}: it is not a message boundary"
    with pytest.raises(NotAMessageBoundaryError, match=refused) as e:
        log.truncate_to_boundary(cut)
    assert (e.value.offset, e.value.before, e.value.after) == (cut, offsets[6], offsets[7])
    assert str(offsets[6]) in str(e.value)
    assert str(offsets[7]) in str(e.value)
    assert all_bytes(log) == before  # nothing changed
    assert log.set_aside == []
    assert log.boundaries_around(cut) == (offsets[6], offsets[7])
    assert log.boundaries_around(offsets[6]) == (offsets[6], offsets[6])


def test_boundaries_around_a_blank_record_and_segment_ends(make_log: LogFactory) -> None:
    """The END_OF_FILE marker's start and the segment's end are boundaries; its padding is not."""
    log = make_log(segment_size=1024)
    fill(log, 8)
    blank_at = 5 * REC
    assert log.boundaries_around(blank_at) == (blank_at, blank_at)
    assert log.boundaries_around(1000) == (blank_at, 1024)
    assert log.boundaries_around(1024) == (1024, 1024)
    assert log.boundaries_around(0) == (0, 0)
    assert log.boundaries_around(log.max_offset) == (log.max_offset, log.max_offset)
    with pytest.raises(NotAMessageBoundaryError, match=f"boundaries are {blank_at} and 1024"):
        log.truncate_to_boundary(1000)
    log.truncate_to_boundary(1024)
    assert log.max_offset == 1024
    log.truncate_to_boundary(blank_at)
    assert log.max_offset == blank_at
    assert (
        log.append(NewMessage(topic="FooBar", body=b"")).physical_offset == 1024
    )  # a new marker first
    assert decode_record(bytes(log.read(blank_at, 1024))) == DecodedBlank(0, 1024 - blank_at)


def test_a_partly_received_last_record_has_no_boundary_after_it(make_log: LogFactory) -> None:
    master = make_log(segment_size=1024)
    offsets = fill(master, 4)
    slave = make_log(segment_size=1024)
    slave.append_raw(0, master.read(0, offsets[3] + 50))
    assert slave.boundaries_around(offsets[3] + 20) == (offsets[3], None)
    with pytest.raises(NotAMessageBoundaryError, match=f"before it is {offsets[3]} "):
        slave.truncate_to_boundary(offsets[3] + 20)
    slave.truncate_to_boundary(slave.max_offset)  # its end: nothing to cut
    assert slave.set_aside == []
    slave.truncate_to_boundary(offsets[3])
    assert slave.max_offset == offsets[3]


def test_a_log_started_inside_a_segment_counts_from_its_first_record(
    make_log: LogFactory,
) -> None:
    master = make_log(segment_size=1024)
    offsets = fill(master, 9)
    slave = make_log(segment_size=1024)
    slave.append_raw(offsets[6], master.read(offsets[6], 1 << 20))
    assert slave.boundaries_around(offsets[7] + 3) == (offsets[7], offsets[8])
    slave.truncate_to_boundary(offsets[7])
    assert slave.max_offset == offsets[7]
    with pytest.raises(StorageError, match="outside"):
        slave.truncate_to_boundary(offsets[5])


def test_damage_before_the_offset_leaves_no_boundary_after_it(make_log: LogFactory) -> None:
    master = make_log(segment_size=1024)
    offsets = fill(master, 4)
    data = bytearray(master.read(0, 1 << 20))
    data[offsets[1] + 4 : offsets[1] + 8] = b"\xde\xad\xbe\xef"  # a bad magic
    slave = make_log(segment_size=1024)
    slave.append_raw(0, data)
    assert slave.boundaries_around(offsets[2] + 1) == (offsets[1], None)
    with pytest.raises(NotAMessageBoundaryError):
        slave.truncate_to_boundary(offsets[3])
    slave.truncate_to_boundary(offsets[1])
    assert slave.max_offset == offsets[1]


# --- skip_past (a new history that never reuses a lost one's offsets) ----------------


def test_skip_past_closes_segments_with_end_of_file_records(make_log: LogFactory) -> None:
    log = make_log(segment_size=1024)
    offsets = fill(log, 3)
    end = log.max_offset
    assert log.skip_past(1500) == 2048  # the first segment boundary beyond 1500
    assert decode_record(bytes(log.read(end, 1024))) == DecodedBlank(0, 1024 - end)
    assert decode_record(bytes(log.read(1024, 1024))) == DecodedBlank(0, 1024)
    after = log.append(NewMessage(topic="FooBar", body=b"b" * 100, queue_id=0))
    assert (after.physical_offset, after.queue_offset) == (2048, 2)
    assert [m.physical_offset for m in log.iter_messages()] == [*offsets, 2048]
    assert log.boundaries_around(1500) == (1024, 2048)
    assert log.skip_past(100) == log.max_offset  # already beyond: nothing to do


def test_skip_past_a_segment_boundary_goes_one_segment_further(make_log: LogFactory) -> None:
    log = make_log(segment_size=1024)
    assert log.skip_past(1024) == 2048  # an empty log too: its first record starts at 2048
    assert log.append(NewMessage(topic="t", body=b"x")).physical_offset == 2048
    assert [m.physical_offset for m in log.iter_messages()] == [2048]


# --- delete_segments_before (retention) -----------------------------------------------


def test_delete_segments_before(make_log: LogFactory) -> None:
    log = make_log(segment_size=1024)
    offsets = fill(log, 22)  # five segments
    assert log.delete_segments_before(2047) == 1
    assert log.min_offset == 1024
    assert log.delete_segments_before(1 << 40) == 3  # never the last segment
    assert log.min_offset == 4096
    assert [m.physical_offset for m in log.iter_messages()] == offsets[20:]
    with pytest.raises(StorageError, match="outside"):
        log.read(0, 10)
    assert log.append(NewMessage(topic="FooBar", body=b"", queue_id=0)).queue_offset == 11


# --- close ----------------------------------------------------------------------------


def test_close_is_final_and_idempotent(make_log: LogFactory) -> None:
    log = make_log()
    fill(log, 2)
    end = log.max_offset
    log.close()
    log.close()
    assert log.closed
    assert log.max_offset == end
    assert log.flushed_offset == end
    with pytest.raises(StorageError, match="closed"):
        log.append(NewMessage(topic="t", body=b""))
    with pytest.raises(StorageError, match="closed"):
        log.read(0, 1)


def test_iteration_gives_stored_messages(make_log: LogFactory) -> None:
    log = make_log()
    r = log.append(
        NewMessage(topic="T", body=b"payload", properties=[("KEYS", "a b"), ("TAGS", "t")])
    )
    (m,) = log.iter_messages()
    assert isinstance(m, StoredMessage)
    assert (m.keys, m.tags, m.end_offset, m.queue_offset) == ("a b", "t", r.end_offset, 0)
    assert list(log.iter_messages(r.end_offset)) == []


def test_a_new_message_takes_hosts_as_pairs_and_properties_as_a_mapping(
    make_log: LogFactory,
) -> None:
    # NewMessage keeps its fields as given (a send builds one per message); the log's
    # prepare makes them a record's, which is where they are checked.
    log = make_log()
    log.append(
        NewMessage(
            "T",
            bytearray(b"abc"),
            born_host=("10.0.0.2", 5000),
            store_host=HostAddress("10.0.0.1", 10911),
            properties={"KEYS": "7"},
        )
    )
    (message,) = log.iter_messages()
    assert message.born_host == HostAddress("10.0.0.2", 5000)
    assert message.store_host == HostAddress("10.0.0.1", 10911)
    assert message.body == b"abc" and type(message.body) is bytes
    assert message.properties == (("KEYS", "7"),)
    with pytest.raises(ValueError, match="not an IPv4 or IPv6 address"):
        log.append(NewMessage("T", b"", born_host=("localhost", 1)))
    assert log.max_offset == message.end_offset


def test_a_memory_log_refuses_a_segment_below_the_minimum() -> None:
    with pytest.raises(ValueError, match=f"segment_size 100 is below {MIN_SEGMENT_SIZE}"):
        MemoryCommitLog(segment_size=100)


def test_an_empty_logs_only_boundary_is_its_end(make_log: LogFactory) -> None:
    log = make_log(segment_size=1024)
    assert log.boundaries_around(0) == (0, 0)
    assert log.truncate_to_boundary(0) == []
