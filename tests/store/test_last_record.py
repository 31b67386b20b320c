"""The last complete message of a log, found backwards from its end (a slave's seconds behind)."""

from __future__ import annotations

from typing import Any

import pytest

from trioha.store import _boundary
from trioha.store._logcore import LogCore
from trioha.store._message import BLANK_MAGIC, MESSAGE_MAGIC, MESSAGE_MAGIC_V2

from .conftest import LogFactory

Log = LogCore[Any]
MAGICS = b"".join(m.to_bytes(4, "big") for m in (MESSAGE_MAGIC, MESSAGE_MAGIC_V2, BLANK_MAGIC))


def put(log: Log, stamps: list[int], *, body: bytes = b"b" * 100) -> list[int]:
    return [
        log.append(topic="FooBar", body=body, store_timestamp=stamp).physical_offset
        for stamp in stamps
    ]


def test_an_empty_log_has_none(make_log: LogFactory) -> None:
    log = make_log(segment_size=1024)
    assert log.last_record() is None
    log.append_raw(0, b"")  # a heartbeat creates the first segment
    assert log.last_record() is None


def test_the_last_message_of_a_master(make_log: LogFactory) -> None:
    log = make_log(segment_size=1024)
    offsets = put(log, [1000 + i for i in range(3)])
    assert log.last_record() == (offsets[2], 1002)


@pytest.mark.parametrize("into", [1, 8, 30, 36, 60, 150])
def test_a_slave_mid_record_has_the_one_before_the_record_being_received(
    make_log: LogFactory, into: int
) -> None:
    master = make_log(segment_size=4096)
    offsets = put(master, [5000 + i for i in range(6)])
    slave = make_log(segment_size=4096)
    slave.append_raw(0, master.read(0, offsets[5] + into))
    assert slave.last_record() == (offsets[4], 5004)
    slave.append_raw(slave.max_offset, master.read(slave.max_offset, 1 << 20))
    assert slave.last_record() == (offsets[5], 5005)


def test_a_slave_that_started_inside_a_segment(make_log: LogFactory) -> None:
    master = make_log(segment_size=4096)
    offsets = put(master, [7000 + i for i in range(8)])
    slave = make_log(segment_size=4096)
    slave.append_raw(offsets[6], master.read(offsets[6], offsets[7] - offsets[6] + 10))
    assert slave.last_record() == (offsets[6], 7006)
    slave = make_log(segment_size=4096)
    slave.append_raw(offsets[7], master.read(offsets[7], 20))  # no whole record yet
    assert slave.last_record() is None


def test_across_a_segment_closed_by_a_blank_record(make_log: LogFactory) -> None:
    master = make_log(segment_size=1024)
    offsets = put(master, [100 + i for i in range(6)])  # five fit in the first segment
    assert offsets[5] == 1024
    slave = make_log(segment_size=1024)
    slave.append_raw(0, master.read(0, 1024))  # up to the segment end, the blank included
    assert slave.last_record() == (offsets[4], 104)
    slave.append_raw(1024, master.read(1024, 40))  # the next segment holds part of a record
    assert slave.last_record() == (offsets[4], 104)
    slave.append_raw(1064, master.read(1064, 1 << 20))
    assert slave.last_record() == (offsets[5], 105)


def test_bodies_full_of_magic_codes_are_passed_over(make_log: LogFactory) -> None:
    master = make_log(segment_size=1 << 16)
    offsets = put(master, [1, 2], body=MAGICS * 50)
    slave = make_log(segment_size=1 << 16)
    slave.append_raw(0, master.read(0, offsets[1] + 400))  # mid-way through the second body
    assert slave.last_record() == (offsets[0], 1)
    assert master.last_record() == (offsets[1], 2)


def test_too_many_look_alikes_give_no_answer_rather_than_a_long_search(
    make_log: LogFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    master = make_log(segment_size=1 << 16)
    offsets = put(master, [1, 2], body=MAGICS * 50)
    monkeypatch.setattr(_boundary, "LAST_RECORD_CANDIDATES", 20)
    slave = make_log(segment_size=1 << 16)
    slave.append_raw(0, master.read(0, offsets[1] + 400))
    assert slave.last_record() is None


def test_a_log_ending_in_damage_has_none(make_log: LogFactory) -> None:
    master = make_log(segment_size=4096)
    offsets = put(master, [1, 2, 3])
    data = bytearray(master.read(0, 1 << 20))
    data[offsets[2] + 4 : offsets[2] + 8] = b"\xde\xad\xbe\xef"  # the last record's magic
    slave = make_log(segment_size=4096)
    slave.append_raw(0, data)
    # Nothing names the end of the second record as a record start: no answer, not a guess.
    assert slave.last_record() is None
