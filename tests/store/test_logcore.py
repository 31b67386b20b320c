"""LogCore's placement rules as a caller sees them, on the file log and the in-memory log alike.

``test_commitlog_contract.py`` holds the contract every commit log keeps; this file pins what
``LogCore`` adds on top: the send path's prepared messages (``prepare``), the lines an operator
reads when the log starts over or closes its segments, and segment ends reached by replicated
bytes rather than by appends (docs/rocketmq-protocol.md §4.3).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

from trioha import CorruptLogError, MessageTooLargeError
from trioha.store import (
    DecodedBlank,
    FileCommitLog,
    HostAddress,
    MemoryCommitLog,
    NewMessage,
    PropertiesForm,
    decode_record,
)
from trioha.store._logcore import LogCore

from .conftest import FakeClock, LogFactory

Log = LogCore[Any]
OVERHEAD = 97  # a record's bytes besides its body, for topic FooBar and no properties
REC = 100 + OVERHEAD  # what fill() appends


def fill(log: Log, n: int, *, body: bytes = b"b" * 100) -> list[int]:
    return [
        log.append(NewMessage(topic="FooBar", body=body, queue_id=i % 2)).physical_offset
        for i in range(n)
    ]


# --- prepare (the send path's messages) ------------------------------------------------


def test_a_prepared_message_is_stored_with_its_request_fields_and_the_logs_host_and_form(
    make_log: LogFactory,
) -> None:
    clock = FakeClock(5000)
    host = HostAddress("10.0.0.9", 10911)
    log = make_log(clock_ms=clock, store_host=host, properties_form=PropertiesForm.V5)
    client = HostAddress("10.0.0.2", 40000)
    sent = NewMessage(
        topic="Orders",
        body=b"payload",
        queue_id=5,
        flag=7,
        sysflag=0x8,  # TRANSACTION_COMMIT_TYPE
        born_timestamp=123,
        born_host=client,
        reconsume_times=2,
        properties={"KEYS": "k1", "TAGS": "paid"},
    )
    anonymous = NewMessage(
        topic="Orders",
        body=b"",
        queue_id=5,
        flag=0,
        sysflag=0,
        born_timestamp=124,
        born_host=None,
        reconsume_times=0,
        properties={},
    )
    results = log.append_batch([sent, anonymous])
    assert [(r.queue_offset, r.store_timestamp) for r in results] == [(0, 5001), (1, 5001)]
    first, second = log.iter_messages()
    assert (first.topic, first.body, first.queue_id, first.flag, first.sysflag) == (
        "Orders",
        b"payload",
        5,
        7,
        0x8,
    )
    assert (first.born_timestamp, first.born_host, first.reconsume_times) == (123, client, 2)
    assert (first.store_host, first.store_timestamp, first.queue_offset) == (host, 5001, 0)
    assert (first.keys, first.tags, first.properties_form) == ("k1", "paid", PropertiesForm.V5)
    # Without a born host (a request that carries none) the broker's own address stands in.
    assert (second.born_host, second.store_host, second.born_timestamp) == (host, host, 124)
    assert second.queue_offset == 1


def test_a_prepared_message_over_the_logs_size_limit_is_refused_before_anything_is_written(
    make_log: LogFactory,
) -> None:
    log = make_log(max_message_size=300)
    fields: dict[str, Any] = {
        "topic": "T",
        "queue_id": 0,
        "flag": 0,
        "sysflag": 0,
        "born_timestamp": 1,
        "born_host": None,
        "reconsume_times": 0,
        "properties": {},
    }
    log.prepare(NewMessage(body=b"x" * 300, **fields), 0)
    with pytest.raises(MessageTooLargeError, match="301 bytes, more than maxMessageSize 300"):
        log.prepare(NewMessage(body=b"x" * 301, **fields), 0)
    with pytest.raises(MessageTooLargeError, match="301 bytes, more than maxMessageSize 300"):
        log.append(NewMessage(topic="T", body=b"x" * 301))
    assert log.max_offset == 0


def test_an_append_with_only_a_topic_and_body_stores_rocketmqs_defaults(
    make_log: LogFactory,
) -> None:
    log = make_log(properties_form=PropertiesForm.V5)
    log.append(NewMessage(topic="T", body=b"x", properties={"TAGS": "a"}))
    (m,) = log.iter_messages()
    assert (m.queue_id, m.flag, m.sysflag, m.reconsume_times) == (0, 0, 0, 0)
    assert m.prepared_transaction_offset == 0
    assert m.properties_form is PropertiesForm.V5  # the log's form, as for prepared messages


def test_a_message_fits_a_segment_only_with_room_for_the_end_marker(
    make_log: LogFactory,
) -> None:
    log = make_log(segment_size=1024)
    refused = (
        "message of 1020 bytes does not fit a segment of 1024 bytes "
        r"\(a segment keeps 8 bytes for its end marker\)"
    )
    with pytest.raises(MessageTooLargeError, match=refused):
        log.append(NewMessage(topic="FooBar", body=b"x" * (1020 - OVERHEAD)))
    assert (
        log.append(NewMessage(topic="FooBar", body=b"x" * (1016 - OVERHEAD))).physical_offset == 0
    )
    assert log.max_offset == 1016


def test_a_message_moves_on_when_it_would_leave_less_than_a_marker(make_log: LogFactory) -> None:
    log = make_log(segment_size=1024)
    log.append(
        NewMessage(topic="FooBar", body=b"x" * (1024 - REC - 4 - OVERHEAD))
    )  # REC + 4 bytes left
    assert log.append(NewMessage(topic="FooBar", body=b"b" * 100)).physical_offset == 1024
    assert decode_record(bytes(log.read(1024 - REC - 4, 1024))) == DecodedBlank(0, REC + 4)


def test_a_message_after_exactly_a_markers_room_closes_the_segment_with_it(
    make_log: LogFactory,
) -> None:
    log = make_log(segment_size=1024)
    log.append(NewMessage(topic="FooBar", body=b"x" * (1016 - OVERHEAD)))
    assert log.append(NewMessage(topic="FooBar", body=b"")).physical_offset == 1024
    assert decode_record(bytes(log.read(1016, 8))) == DecodedBlank(0, 8)


def test_a_promoted_slave_closes_a_segment_too_short_for_a_marker_without_writing(
    make_log: LogFactory,
) -> None:
    master = make_log(segment_size=1024)
    fill(master, 6)  # five records and the blank record closing the segment at 985
    slave = make_log(segment_size=1024)
    slave.append_raw(0, master.read(0, 1020))  # all but the last 4 bytes of the blank record
    assert slave.append(NewMessage(topic="FooBar", body=b"b" * 100)).physical_offset == 1024
    assert bytes(slave.read(985, 1024)) == bytes(master.read(985, 1024))


def test_a_batch_keeps_the_store_time_each_message_brings(make_log: LogFactory) -> None:
    log = make_log(clock_ms=FakeClock(1000))
    results = log.append_batch(
        [NewMessage(topic="T", body=b"", store_timestamp=42), NewMessage(topic="T", body=b"")]
    )
    assert [r.store_timestamp for r in results] == [42, 1001]
    assert [m.store_timestamp for m in log.iter_messages()] == [42, 1001]


def test_a_batch_stores_every_field_each_new_message_brings(make_log: LogFactory) -> None:
    log = make_log(clock_ms=FakeClock(1000))
    assert log.closed is False
    log.append(NewMessage(topic="Other", body=b"before"))  # the batch starts past 0
    client = HostAddress("10.0.0.2", 40000)
    results = log.append_batch(
        [
            NewMessage(
                topic="T",
                body=b"x",
                queue_id=3,
                flag=5,
                sysflag=0x8,
                born_timestamp=77,
                born_host=client,
                reconsume_times=2,
                prepared_transaction_offset=1234,
                properties={"TAGS": "a"},
                properties_form=PropertiesForm.V5,
            ),
            NewMessage(topic="T", body=b"y", queue_id=3, properties={"TAGS": "b"}),
        ]
    )
    _, first, second = log.iter_messages()
    assert [(r.topic, r.queue_id) for r in results] == [("T", 3), ("T", 3)]
    assert [first.physical_offset, second.physical_offset] == [r.physical_offset for r in results]
    assert (first.queue_id, first.flag, first.sysflag, first.born_timestamp) == (3, 5, 0x8, 77)
    assert (first.born_host, first.reconsume_times, first.prepared_transaction_offset) == (
        client,
        2,
        1234,
    )
    assert first.properties_form is PropertiesForm.V5  # the message's own form wins
    assert second.properties_form is PropertiesForm.V4_9  # else the log's
    assert (second.queue_offset, second.born_timestamp) == (1, 1002)
    log.append(NewMessage(topic="T", body=b"z", born_timestamp=5))
    assert [m.born_timestamp for m in log.iter_messages()][-1] == 5


# --- replicated bytes (append_raw) -----------------------------------------------------


def test_an_empty_log_starting_over_says_where_from_and_where_to(
    make_log: LogFactory, caplog: pytest.LogCaptureFixture
) -> None:
    slave = make_log(segment_size=1024)
    slave.append_raw(1024, b"")
    with caplog.at_level(logging.INFO, logger="trioha.store"):
        slave.append_raw(3072, b"abc")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "empty commit log at 1024 starts over at 3072 for replicated data")
    ]
    assert (slave.min_offset, slave.max_offset) == (3072, 3075)


def test_a_record_partly_received_at_the_start_of_a_segment_ends_iteration_quietly(
    make_log: LogFactory,
) -> None:
    master = make_log(segment_size=1024)
    offsets = fill(master, 7)  # five records, a blank, then the sixth opens segment 1024
    assert offsets[5] == 1024
    slave = make_log(segment_size=1024)
    slave.append_raw(0, master.read(0, 1024))
    slave.append_raw(1024, master.read(1024, 50))  # the first 50 bytes of the record at 1024
    assert [m.physical_offset for m in slave.iter_messages()] == offsets[:5]
    assert slave.next_queue_offset("FooBar", 1) == 2


def test_replicated_bytes_that_cross_a_segment_end_mid_segment_are_split_there(
    make_log: LogFactory,
) -> None:
    master = make_log(segment_size=1024)
    fill(master, 9)
    data = bytes(master.read(0, 1024)) + bytes(master.read(1024, 1024))
    slave = make_log(segment_size=1024)
    slave.append_raw(0, data[:500])
    assert slave.append_raw(500, data[500:]) == master.max_offset
    assert len(slave.read(500, 1 << 20)) == 524  # the first segment ends at 1024
    assert bytes(slave.read(1024, 1 << 20)) == bytes(master.read(1024, 1 << 20))
    assert list(slave.iter_messages()) == list(master.iter_messages())


# --- cutting back -----------------------------------------------------------------------


def test_each_cut_to_a_boundary_returns_only_what_it_set_aside(make_log: LogFactory) -> None:
    log = make_log(segment_size=1024)
    offsets = fill(log, 9)
    first = log.truncate_to_boundary(offsets[7])
    second = log.truncate_to_boundary(offsets[6])
    assert [(s.offset, s.reason) for s in first] == [(offsets[7], "truncated")]
    assert [(s.offset, s.reason) for s in second] == [(offsets[6], "truncated")]
    assert log.set_aside == [*first, *second]
    assert log.truncate_to_boundary(log.max_offset) == []


def test_retention_says_how_many_segments_went_and_where_the_log_now_starts(
    make_log: LogFactory, caplog: pytest.LogCaptureFixture
) -> None:
    log = make_log(segment_size=1024)
    fill(log, 16)  # four segments
    with caplog.at_level(logging.INFO, logger="trioha.store"):
        assert log.delete_segments_before(2100) == 2
        assert log.delete_segments_before(2100) == 0  # nothing more: no second line
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "deleted 2 commit log segment(s) [0, 2048); the log now starts at 2048")
    ]


def test_a_truncate_says_where_it_cut_and_where_the_log_ended(
    make_log: LogFactory, caplog: pytest.LogCaptureFixture
) -> None:
    log = make_log(segment_size=1024)
    offsets = fill(log, 7)
    with caplog.at_level(logging.INFO, logger="trioha.store"):
        log.truncate(offsets[2])
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", f"commit log truncated at {offsets[2]} (was up to {offsets[6] + REC})")
    ]


def test_a_cut_inside_a_record_recounts_the_queues_from_the_start(make_log: LogFactory) -> None:
    log = make_log(segment_size=1024)
    offsets = [
        log.append(NewMessage(topic="FooBar", body=b"b" * 100)).physical_offset for _ in range(4)
    ]
    log.truncate(offsets[2] + 10)  # what is left ends with 10 bytes of a record
    assert log.next_queue_offset("FooBar", 0) == 2
    log.truncate(5)  # inside the first record: no message is left
    assert log.last_store_timestamp == 0
    assert log.next_queue_offset("FooBar", 0) == 0


def test_a_cut_below_replicated_bytes_not_counted_yet_rolls_the_queues_back(
    make_log: LogFactory,
) -> None:
    master = make_log(segment_size=1024)
    offsets = [
        master.append(NewMessage(topic="FooBar", body=b"b" * 100)).physical_offset for _ in range(8)
    ]
    slave = make_log(segment_size=1024)
    slave.append_raw(0, master.read(0, offsets[4]))
    assert slave.next_queue_offset("FooBar", 0) == 4  # counts up to offsets[4]
    slave.append_raw(offsets[4], master.read(offsets[4], offsets[7] - offsets[4]))  # uncounted
    slave.truncate(offsets[2])
    assert slave.next_queue_offset("FooBar", 0) == 2
    assert slave.append(NewMessage(topic="FooBar", body=b"x")).queue_offset == 2


def damaged_log(directory: Path, bad: list[int]) -> tuple[FileCommitLog, list[int]]:
    """Eight messages of one queue, those at ``bad`` with a body that no longer matches its
    CRC, reopened without CRC checks (RocketMQ's ``checkCRCOnRecover=false``): recovery
    counts every one."""
    log = FileCommitLog.open(directory, segment_size=4096, clock_ms=FakeClock())
    offsets = [
        log.append(NewMessage(topic="T", body=b"body-%d" % i)).physical_offset for i in range(8)
    ]
    log.close()
    segment = directory / f"{0:020d}"
    data = bytearray(segment.read_bytes())
    for i in bad:
        at = data.index(b"body-%d" % i)
        data[at] = ord("B")
    segment.write_bytes(data)
    log = FileCommitLog.open(directory, check_crc=False, clock_ms=FakeClock())
    assert log.next_queue_offset("T", 0) == 8
    return log, offsets


def test_a_cut_rolls_queue_offsets_back_without_recounting_what_recovery_counted(
    tmp_path: Path,
) -> None:
    log, offsets = damaged_log(tmp_path / "a" / "commitlog", bad=[1, 5])
    log.truncate(offsets[4])  # the cut holds a damaged body too
    assert log.next_queue_offset("T", 0) == 4
    assert log.append(NewMessage(topic="T", body=b"again")).queue_offset == 4
    log.close()
    log, offsets = damaged_log(tmp_path / "b" / "commitlog", bad=[1])
    whole = bytes(log.read(offsets[7], 1 << 20))
    log.truncate(offsets[7])
    log.append_raw(offsets[7], whole[:30])  # a replicated record, partly received
    log.truncate(offsets[3])
    assert log.next_queue_offset("T", 0) == 3
    log.close()


def test_a_record_running_past_the_end_of_a_closed_segment_is_corrupt(
    make_log: LogFactory,
) -> None:
    """Only the last segment may end in a record still being received."""
    master = make_log(segment_size=1024)
    fill(master, 7)
    data = bytearray(bytes(master.read(0, 1024)) + bytes(master.read(1024, 1024)))
    data[985:1024] = data[0:39]  # the blank replaced by the start of a 197-byte record
    slave = make_log(segment_size=1024)
    slave.append_raw(0, data)
    message = r"record at 985 is not valid \(a record of 197 bytes runs past the written end\)"
    with pytest.raises(CorruptLogError, match=message):
        list(slave.iter_messages())


def test_iteration_checks_the_crc_of_the_first_segment_too(make_log: LogFactory) -> None:
    master = make_log(segment_size=1024)
    fill(master, 2)
    data = bytearray(master.read(0, 1024))
    data[data.index(b"b" * 100)] = ord("c")  # a body byte of the first record
    slave = make_log(segment_size=1024)
    slave.append_raw(0, data)
    with pytest.raises(CorruptLogError, match=r"record at 0 is not valid \(crc-mismatch: body CRC"):
        list(slave.iter_messages())


def test_a_flush_syncs_only_segments_written_since_the_last_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = FileCommitLog.open(tmp_path / "commitlog", segment_size=1024, clock_ms=FakeClock())
    fill(log, 8)  # two segments
    synced: list[int] = []
    real = os.fdatasync

    def counting(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting)
    log.flush()
    assert len(synced) == 2
    synced.clear()
    assert log.flush() == log.max_offset
    assert synced == []  # nothing written since
    fill(log, 1)
    log.flush()
    assert len(synced) == 1  # the second segment only
    log.close()


def test_queue_offsets_stop_at_a_replicated_record_with_a_bad_crc_and_say_so(
    make_log: LogFactory, caplog: pytest.LogCaptureFixture
) -> None:
    master = make_log(segment_size=1024)
    offsets = fill(master, 4)
    data = bytearray(master.read(0, 1024))
    data[offsets[1] + data[offsets[1] :].index(b"b" * 100)] = ord("c")  # record 1's body
    slave = make_log(segment_size=1024)
    slave.append_raw(0, data)
    with caplog.at_level(logging.INFO, logger="trioha.store"):
        assert slave.next_queue_offset("FooBar", 0) == 1  # record 0 only
        assert slave.next_queue_offset("FooBar", 1) == 0
    (record,) = caplog.records  # counted once: the damage is not rescanned on every call
    assert record.levelname == "WARNING"
    assert record.getMessage().startswith(
        f"queue offsets are counted up to {offsets[1]} only: DecodedInvalid("
    )
    assert "crc-mismatch" in record.getMessage()


def test_the_last_store_timestamp_is_the_last_appended_messages(make_log: LogFactory) -> None:
    log = make_log(clock_ms=FakeClock(1000))
    log.append(NewMessage(topic="T", body=b"", store_timestamp=42))
    assert log.last_store_timestamp == 42
    log.append_batch([NewMessage(topic="T", body=b""), NewMessage(topic="T", body=b"")])
    assert log.last_store_timestamp == 1002  # one clock reading for the batch


def test_a_read_of_one_byte_gives_one_byte(make_log: LogFactory) -> None:
    log = make_log()
    fill(log, 1)
    assert bytes(log.read(0, 1)) == bytes(log.read(0, 4))[:1] != b""
    assert len(log.read(10, 1)) == 1


class RacingLog(MemoryCommitLog):
    """A memory log whose flush is overtaken by a truncate while it syncs (in a worker
    thread in a broker; here at a fixed point, so the interleaving is exact)."""

    cut_during_sync: int | None = None

    def _sync(self, handles: list[Any]) -> None:
        cut, self.cut_during_sync = self.cut_during_sync, None
        if cut is not None:
            self.truncate(cut)


def test_a_flush_overtaken_by_a_second_truncate_claims_nothing_it_synced() -> None:
    log = RacingLog(segment_size=4096, clock_ms=FakeClock())
    offsets = fill(log, 6)
    log.truncate(offsets[5])  # an earlier cut: the flush starts after it
    log.cut_during_sync = offsets[3]
    assert log.flush() == 0  # its bytes may be gone: it claims nothing
    assert log.flushed_offset == 0 and log.max_offset == offsets[3]
    assert log.flush() == offsets[3]


# --- skip_past (closing segments with END_OF_FILE records) -------------------------------


def test_skip_past_says_where_new_data_starts_and_only_when_it_closed_something(
    make_log: LogFactory, caplog: pytest.LogCaptureFixture
) -> None:
    log = make_log(segment_size=1024)
    fill(log, 2)
    with caplog.at_level(logging.INFO, logger="trioha.store"):
        assert log.skip_past(1500) == 2048
        assert log.skip_past(1500) == 2048  # the log already ends at that boundary
        assert log.skip_past(2047) == 2048
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "commit log closed with end-of-file records up to 2048: new data starts there")
    ]


def test_skip_past_closes_a_segment_with_exactly_room_for_the_marker(
    make_log: LogFactory,
) -> None:
    log = make_log(segment_size=1024)
    log.append(
        NewMessage(topic="FooBar", body=b"b" * (1016 - OVERHEAD))
    )  # 8 bytes left: the marker's size
    assert log.max_offset == 1016
    assert log.skip_past(0) == 1024
    assert decode_record(bytes(log.read(1016, 8))) == DecodedBlank(0, 8)
    assert log.append(NewMessage(topic="FooBar", body=b"x")).physical_offset == 1024


def test_skip_past_leaves_a_tail_too_short_for_a_marker_as_it_was(make_log: LogFactory) -> None:
    """A slave that received all but the last 4 bytes of a segment (mid-way through the
    master's blank record) closes it without writing: an 8-byte marker does not fit."""
    master = make_log(segment_size=1024)
    offsets = fill(master, 6)
    blank_at = offsets[4] + REC
    assert blank_at == 985
    slave = make_log(segment_size=1024)
    slave.append_raw(0, master.read(0, 1020))
    assert slave.skip_past(1020) == 1024
    assert bytes(slave.read(blank_at, 1024)) == bytes(master.read(blank_at, 1024))
    assert (
        slave.append(NewMessage(topic="FooBar", body=b"b" * 100, queue_id=1)).physical_offset
        == 1024
    )
    assert [m.physical_offset for m in slave.iter_messages()] == offsets
