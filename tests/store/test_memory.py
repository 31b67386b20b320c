"""The in-memory commit log's own parts: what it keeps aside, and under which label."""

from __future__ import annotations

from trioha.store import MemoryCommitLog
from trioha.store._contract import SetAside


def test_a_truncation_keeps_exactly_the_cut_bytes_under_their_labels() -> None:
    log = MemoryCommitLog(segment_size=1024)
    offsets = [log.append(topic="FooBar", body=b"b" * 100).physical_offset for _ in range(7)]
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
