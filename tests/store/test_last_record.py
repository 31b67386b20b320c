"""The last complete message of a log, found backwards from its end (a slave's seconds behind)."""

from __future__ import annotations

from typing import Any

import pytest

from trioha.store import NewMessage, _boundary
from trioha.store._logcore import LogCore
from trioha.store._message import BLANK_MAGIC, MESSAGE_MAGIC, MESSAGE_MAGIC_V2

from .conftest import LogFactory

Log = LogCore[Any]
MAGICS = b"".join(m.to_bytes(4, "big") for m in (MESSAGE_MAGIC, MESSAGE_MAGIC_V2, BLANK_MAGIC))


def put(log: Log, stamps: list[int], *, body: bytes = b"b" * 100) -> list[int]:
    return [
        log.append(NewMessage(topic="FooBar", body=body, store_timestamp=stamp)).physical_offset
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


def test_a_last_record_with_a_damaged_body_still_gives_its_time(make_log: LogFactory) -> None:
    # CRCs are recovery's business: the answer is for a lag figure, not for reading the log.
    master = make_log(segment_size=4096)
    offsets = put(master, [1, 2, 3])
    data = bytearray(master.read(0, 1 << 20))
    data[offsets[2] + 100] ^= 0xFF  # a body byte of the last record
    slave = make_log(segment_size=4096)
    slave.append_raw(0, data)
    assert slave.last_record() == (offsets[2], 3)


def test_the_next_record_is_trusted_only_once_its_offset_field_has_arrived(
    make_log: LogFactory,
) -> None:
    # Fewer than 36 bytes of the next record: it cannot be checked yet, and the one before
    # counts as the last. From 36 bytes on it must name its own offset, or nothing counts.
    master = make_log(segment_size=4096)
    offsets = put(master, [1, 2, 3])
    data = bytearray(master.read(0, 1 << 20))
    data[offsets[2] + 4 : offsets[2] + 8] = b"\xde\xad\xbe\xef"  # the third record's magic
    for into, expected in ((35, (offsets[1], 2)), (36, None)):
        slave = make_log(segment_size=4096)
        slave.append_raw(0, data[: offsets[2] + into])
        assert slave.last_record() == expected, into


@pytest.mark.parametrize("into", [4 + 65538, 150_000])
def test_a_slave_inside_a_message_larger_than_the_search_window(
    make_log: LogFactory, into: int
) -> None:
    # The search looks back 64 KiB first, then twice as far, and so on; 4 + 65538 bytes into
    # the record its magic code straddles the first window's start.
    master = make_log(segment_size=1 << 20)
    offsets = put(master, [0], body=b"x" * 300_000)  # the windows never reach back to 0
    offsets += put(master, [1], body=b"x" * 100)
    offsets += put(master, [2], body=b"x" * 200_000)
    slave = make_log(segment_size=1 << 20)
    slave.append_raw(0, master.read(0, offsets[2] + into))
    assert slave.last_record() == (offsets[1], 1)
    slave.append_raw(slave.max_offset, master.read(slave.max_offset, 1 << 20))
    assert slave.last_record() == (offsets[2], 2)


def test_a_body_holding_what_looks_like_the_head_of_a_long_record_is_passed_over(
    make_log: LogFactory,
) -> None:
    fake_head = (1 << 20).to_bytes(4, "big") + MESSAGE_MAGIC.to_bytes(4, "big")
    log = make_log(segment_size=4096)
    offsets = put(log, [1, 2], body=b"y" * 50 + fake_head + b"z" * 40)
    assert log.last_record() == (offsets[1], 2)


def test_the_search_examines_exactly_its_budget_of_candidates(
    make_log: LogFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    master = make_log(segment_size=1 << 16)
    offsets = put(master, [1, 2], body=MAGICS * 50)
    slave = make_log(segment_size=1 << 16)
    slave.append_raw(0, master.read(0, offsets[1] + 400))
    # From the end back: the 78 codes of the second body that arrived whole, that record's
    # own code, the 150 codes of the first body, then the first record's code: 230.
    monkeypatch.setattr(_boundary, "LAST_RECORD_CANDIDATES", 230)
    assert slave.last_record() == (offsets[0], 1)
    monkeypatch.setattr(_boundary, "LAST_RECORD_CANDIDATES", 229)
    assert slave.last_record() is None
