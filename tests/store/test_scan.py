"""The record walk shared by recovery, reput, HA serving and queue counting (``RecordScan``):
what it tells a caller besides the records, progress per segment and pages given back."""

from __future__ import annotations

from pathlib import Path

import pytest

import trioha.store._scan as scan_module
from trioha.store import FileCommitLog, MemoryCommitLog, NewMessage
from trioha.store._contract import SegmentLike
from trioha.store._scan import PageBudget, QueueOffsets, RecordScan

SEG = 4096


def test_recovery_reports_its_progress_once_per_segment(tmp_path: Path) -> None:
    with FileCommitLog.open(tmp_path / "commitlog", segment_size=SEG) as log:
        while len(log._segments) < 3:
            log.append(NewMessage(topic="FooBar", body=b"x" * 300))
    seen: list[tuple[int, int]] = []
    with FileCommitLog.open(
        tmp_path / "commitlog", segment_size=SEG, progress=lambda done, of: seen.append((done, of))
    ):
        pass
    assert seen == [(1, 3), (2, 3), (3, 3)]


class _Recording(PageBudget):
    def __init__(self) -> None:
        super().__init__()
        self.notes: list[tuple[int, int]] = []

    def note(self, segment: SegmentLike, nbytes: int) -> None:
        self.notes.append((segment.start, nbytes))


def test_a_long_walk_gives_back_what_it_read_in_steps_of_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = MemoryCommitLog(segment_size=SEG)
    for _ in range(40):
        log.append(NewMessage(topic="FooBar", body=b"x" * 200))
    record = log.read(0, SEG)[:4]
    size = int.from_bytes(record, "big")  # every record is the same size
    monkeypatch.setattr(scan_module, "DROP_PAGES_EVERY", 3 * size)
    budget = _Recording()
    segments = log._segments
    walked = RecordScan(segments, 0, SEG, check_crc_from=0, pages=budget)
    assert sum(1 for _ in walked) == 40
    assert walked.problem is None and walked.end == log.max_offset  # it reached the end
    for seg in segments:
        notes = [n for start, n in budget.notes if start == seg.start]
        # Every byte of the segment counted once: a note each time three records were read,
        # and the rest when the segment ends.
        assert sum(notes) == seg.wrote
        assert all(n == 3 * size for n in notes[:-1]) and notes[-1] <= 3 * size


def test_counting_nothing_new_keeps_the_last_store_timestamp() -> None:
    log = MemoryCommitLog(segment_size=SEG)
    log.append(NewMessage(topic="FooBar", body=b"x"))
    queues = QueueOffsets(log.max_offset)
    queues.last_store_timestamp = 1234
    walked = RecordScan(log._segments, log.max_offset, SEG, check_crc_from=0)
    assert queues.count(walked) == 0
    assert queues.last_store_timestamp == 1234 and queues.cursor == log.max_offset


def test_a_walk_stopped_by_a_torn_record_says_where_and_still_accounts_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = MemoryCommitLog(segment_size=SEG)
    for _ in range(46):  # four segments, the last holding several records before the torn one
        log.append(NewMessage(topic="FooBar", body=b"x" * 200))
    size = int.from_bytes(log.read(0, 4), "big")
    good_end = log.max_offset
    log.append_raw(good_end, bytes(log.read(0, size))[: size // 2])  # a slave mid-record
    monkeypatch.setattr(scan_module, "DROP_PAGES_EVERY", 3 * size)
    budget = _Recording()
    progress: list[tuple[int, int]] = []
    segments = log._segments
    walked = RecordScan(
        segments,
        segments[1].start,  # as a reader resuming mid-log does: progress counts from there
        SEG,
        check_crc_from=0,
        pages=budget,
        on_segment=lambda done, of: progress.append((done, of)),
    )
    assert sum(1 for _ in walked) == 46 - segments[1].start // size
    assert walked.end == good_end
    assert walked.problem is not None and walked.problem.offset == good_end
    n = len(segments) - 1
    assert n == 3
    assert progress == [(1, n), (2, n), (3, n)]  # the torn tail ends the walk: done
    last = segments[-1]
    notes = [nbytes for start, nbytes in budget.notes if start == last.start]
    assert len(notes) > 2 and sum(notes) == good_end - last.start
    assert all(nbytes == 3 * size for nbytes in notes[:-1])


class _Segment:
    def __init__(self) -> None:
        self.start = 0
        self.drops = 0

    def drop_pages(self) -> None:
        self.drops += 1


def test_pages_are_given_back_each_time_the_budget_is_spent_exactly() -> None:
    budget, seg = PageBudget(), _Segment()
    budget.note(seg, scan_module.DROP_PAGES_EVERY - 1)  # type: ignore[arg-type]
    assert seg.drops == 0
    budget.note(seg, 1)  # type: ignore[arg-type]
    assert seg.drops == 1
    budget.note(seg, scan_module.DROP_PAGES_EVERY - 1)  # type: ignore[arg-type]
    assert seg.drops == 1  # the count started again from zero
    budget.note(seg, 1)  # type: ignore[arg-type]
    assert seg.drops == 2


def test_a_log_with_nothing_stored_has_no_store_timestamp() -> None:
    assert MemoryCommitLog(segment_size=SEG).last_store_timestamp == 0


def test_a_walk_left_early_ends_where_the_record_it_stopped_at_begins() -> None:
    # A caller that stops at a record (rolling queue offsets back stops at the first one not
    # counted) reads where that record begins: everything before it was walked.
    log = MemoryCommitLog(segment_size=SEG)
    for _ in range(10):
        log.append(NewMessage(topic="FooBar", body=b"x" * 200))
    size = int.from_bytes(log.read(0, 4), "big")
    walked = RecordScan(log._segments, 0, SEG, check_crc_from=0)
    for n, (_buf, pos, base, _layout) in enumerate(walked, 1):
        assert base + pos == (n - 1) * size
        if n == 5:
            break
    assert walked.end == 4 * size and walked.problem is None
