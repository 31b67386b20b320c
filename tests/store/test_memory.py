"""The in-memory commit log's own parts: what it keeps aside, and under which label."""

from __future__ import annotations

import pytest

from trioha.store import HostAddress, MemoryCommitLog, NewMessage, PropertiesForm, decode_message
from trioha.store._contract import SetAside
from trioha.store._segment import MIN_SEGMENT_SIZE


def test_a_truncation_keeps_exactly_the_cut_bytes_under_their_labels() -> None:
    log = MemoryCommitLog(segment_size=1024)
    offsets = [
        log.append(NewMessage(topic="FooBar", body=b"b" * 100)).physical_offset for _ in range(7)
    ]
    cut = offsets[3]
    tail_of_first = log.read(cut, 1024 - cut)
    second = log.read(1024, log.max_offset - 1024)
    log.truncate(cut)
    first_label = f"memory:{cut:020d}-truncated"
    second_label = "memory:00000000000000001024-truncated.segment"
    assert log.set_aside == [
        SetAside(cut, 1024 - cut, "truncated", first_label),
        SetAside(1024, len(second), "truncated", second_label),
    ]
    assert log.kept_bytes == {first_label: tail_of_first, second_label: second}


def test_the_constructor_takes_the_smallest_segment_and_its_options() -> None:
    host = HostAddress("10.0.0.7", 10911)
    log = MemoryCommitLog(
        segment_size=MIN_SEGMENT_SIZE, store_host=host, properties_form=PropertiesForm.V5
    )
    at = log.append(NewMessage(topic="T", body=b"x", properties={"KEYS": "k"})).physical_offset
    msg = decode_message(log.read(at, 1 << 20))
    assert msg.store_host == host
    assert msg.properties_form is PropertiesForm.V5
    with pytest.raises(ValueError, match=f"segment_size {MIN_SEGMENT_SIZE - 1} is below"):
        MemoryCommitLog(segment_size=MIN_SEGMENT_SIZE - 1)
