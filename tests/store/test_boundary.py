"""Message boundaries of a commit log: where a replica may be cut (``_boundary``)."""

from __future__ import annotations

from typing import Any

import pytest

from trioha import NotAMessageBoundaryError
from trioha.store import NewMessage
from trioha.store._logcore import LogCore

from .conftest import LogFactory

Log = LogCore[Any]


def fill(log: Log, n: int) -> list[int]:
    return [
        log.append(NewMessage(topic="FooBar", body=b"b" * 100)).physical_offset for _ in range(n)
    ]


def test_one_byte_into_a_segment_is_inside_its_first_record(make_log: LogFactory) -> None:
    log = make_log(segment_size=1024)
    offsets = fill(log, 7)  # five records fill the first segment
    assert offsets[5] == 1024
    assert log.boundaries_around(1) == (0, offsets[1])
    assert log.boundaries_around(1025) == (1024, offsets[6])
    with pytest.raises(NotAMessageBoundaryError, match="boundaries are 1024 and "):
        log.truncate_to_boundary(1025)


def test_the_first_offset_of_a_log_started_inside_a_segment_is_a_boundary(
    make_log: LogFactory,
) -> None:
    master = make_log(segment_size=1024)
    offsets = fill(master, 9)
    slave = make_log(segment_size=1024)
    slave.append_raw(offsets[6], master.read(offsets[6], 1 << 20))  # one segment, from inside
    assert slave.min_offset == offsets[6]
    assert slave.boundaries_around(offsets[6]) == (offsets[6], offsets[6])
    assert slave.boundaries_around(offsets[6] + 1) == (offsets[6], offsets[7])


def test_a_record_with_a_damaged_body_is_still_walked_over(make_log: LogFactory) -> None:
    # CRCs are recovery's business; a cut needs record lengths only.
    master = make_log(segment_size=4096)
    offsets = fill(master, 4)
    data = bytearray(master.read(0, 1 << 20))
    data[offsets[1] + 100] ^= 0xFF  # a body byte of the second record
    slave = make_log(segment_size=4096)
    slave.append_raw(0, data)
    assert slave.boundaries_around(offsets[2] + 10) == (offsets[2], offsets[3])
    slave.truncate_to_boundary(offsets[2])
    assert slave.max_offset == offsets[2]
