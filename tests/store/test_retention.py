"""Retention's pure rules (``CleanCommitLogService``, ``deleteExpiredFileByTime``) and the store
pieces they drive: releasing segments, consume queue and index files below the log's start,
and a restart of a log whose first segment is not at offset 0."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trioha.store import (
    DELETE_FILES_BATCH_MAX,
    HOUR_MS,
    FileCommitLog,
    MemoryCommitLog,
    NewMessage,
    RetentionRun,
    SpaceCheck,
    decide_run,
    expired_count,
    is_time_to_delete,
    segment_count,
    space_to_delete,
)
from trioha.store._consumequeue import CQ_UNIT_SIZE, ConsumeQueue, ConsumeQueueStore

RATIOS = {"max_used": 0.75, "clean_forcibly": 0.85, "warning": 0.90}


# --- the hour ------------------------------------------------------------------------------
def test_the_hour_must_be_one_of_delete_when() -> None:
    assert is_time_to_delete((4,), 4)
    assert not is_time_to_delete((4,), 5)
    assert is_time_to_delete((4, 16), 16)
    assert not is_time_to_delete((), 4)


# --- the disk ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cl", "cq", "expected"),
    [
        (0.50, 0.50, SpaceCheck(False, False, "CL", 0.50)),
        (0.75, 0.50, SpaceCheck(False, False, "CL", 0.75)),  # at the ratio: not above it
        (0.76, 0.50, SpaceCheck(True, False, "CL", 0.76)),
        (0.86, 0.50, SpaceCheck(True, True, "CL", 0.86)),
        (0.91, 0.50, SpaceCheck(True, True, "CL", 0.91)),
        (-1.0, 0.50, SpaceCheck(True, False, "CL", -1.0)),  # unknown: delete (RocketMQ's -1)
        (0.50, 0.80, SpaceCheck(True, False, "CQ", 0.80)),  # the queues' partition next
        (0.50, 0.88, SpaceCheck(True, True, "CQ", 0.88)),
        # The commit log decides first; the queues' partition is then not looked at.
        (0.80, 0.95, SpaceCheck(True, False, "CL", 0.80)),
    ],
)
def test_space_to_delete_is_judged_commit_log_first(
    cl: float, cq: float, expected: SpaceCheck
) -> None:
    assert space_to_delete(cl, cq, **RATIOS) == expected


def test_a_run_deletes_for_the_hour_the_disk_or_a_manual_request_and_forcibly_only_if_enabled() -> (
    None
):
    calm = SpaceCheck(False, False, "CL", 0.5)
    pressed = SpaceCheck(True, True, "CL", 0.88)
    assert decide_run(time_up=False, space=calm, manual=False, clean_file_forcibly=True) is None
    assert decide_run(time_up=True, space=calm, manual=False, clean_file_forcibly=True) == (
        RetentionRun(time_up=True, space_full=False, manual=False, at_once=False)
    )
    assert decide_run(time_up=False, space=calm, manual=True, clean_file_forcibly=True) == (
        RetentionRun(time_up=False, space_full=False, manual=True, at_once=False)
    )
    forced = decide_run(time_up=False, space=pressed, manual=False, clean_file_forcibly=True)
    assert forced == RetentionRun(time_up=False, space_full=True, manual=False, at_once=True)
    assert forced.describe() == (
        "disk above diskMaxUsedSpaceRatio; deleting any age (disk above "
        "diskSpaceCleanForciblyRatio) files"
    )
    kept = decide_run(time_up=True, space=pressed, manual=False, clean_file_forcibly=False)
    assert kept is not None and not kept.at_once
    assert kept.describe() == "deleteWhen, disk above diskMaxUsedSpaceRatio; deleting expired files"


# --- which files ---------------------------------------------------------------------------
def test_expired_files_go_oldest_first_never_the_last_and_stop_at_the_first_kept() -> None:
    now = 100 * HOUR_MS
    reserved = 72 * HOUR_MS
    old, young = now - reserved, now - reserved + 1
    assert expired_count([old, old, old], now_ms=now, reserved_ms=reserved, at_once=False) == 2
    assert (
        expired_count([old, young, old, old], now_ms=now, reserved_ms=reserved, at_once=False) == 1
    )
    assert expired_count([young, old, old], now_ms=now, reserved_ms=reserved, at_once=False) == 0
    assert expired_count([old], now_ms=now, reserved_ms=reserved, at_once=True) == 0
    assert expired_count([], now_ms=now, reserved_ms=reserved, at_once=True) == 0
    # At once: whatever the age, still never the last.
    assert expired_count([young] * 4, now_ms=now, reserved_ms=reserved, at_once=True) == 3


def test_one_run_deletes_at_most_ten_files() -> None:
    times = [0] * 30
    assert expired_count(times, now_ms=HOUR_MS, reserved_ms=0, at_once=False) == 10
    assert DELETE_FILES_BATCH_MAX == 10
    assert expired_count(times, now_ms=HOUR_MS, reserved_ms=0, at_once=False, batch_max=3) == 3


def test_segment_count_counts_a_full_last_segment_as_the_last() -> None:
    assert segment_count(0, 0, 1024) == 0
    assert segment_count(0, 1, 1024) == 1
    assert segment_count(0, 1024, 1024) == 1
    assert segment_count(0, 1025, 1024) == 2
    assert segment_count(2048, 2100, 1024) == 1
    assert segment_count(2100, 4096, 1024) == 2


# --- segment times and release -------------------------------------------------------------
def _filled(log: MemoryCommitLog | FileCommitLog, end: int) -> None:
    while log.max_offset < end:
        log.append(NewMessage(topic="T", body=b"b" * 100))


def test_segment_times_are_when_each_segment_was_last_written() -> None:
    now = [1_000]
    log = MemoryCommitLog(segment_size=1024, mtime_ms=lambda: now[0])
    _filled(log, 1100)  # two segments at 1000
    now[0] = 5_000
    _filled(log, 1300)  # the second written again
    assert log.segment_times() == [1_000, 5_000]


def test_a_file_segments_time_is_its_mtime(tmp_path: Path) -> None:
    log = FileCommitLog.open(tmp_path / "commitlog", segment_size=1024)
    _filled(log, 1100)
    first = tmp_path / "commitlog" / f"{0:020d}"
    os.utime(first, ns=(3 * HOUR_MS * 1_000_000, 3 * HOUR_MS * 1_000_000))
    times = log.segment_times()
    assert times[0] == 3 * HOUR_MS and times[1] > times[0]
    log.close()


def test_released_segments_leave_the_log_at_once_and_their_files_on_destroy(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "commitlog"
    log = FileCommitLog.open(directory, segment_size=1024)
    _filled(log, 2100)
    released = log.release_segments_before(2048)
    assert released.starts == (0, 1024) and released.min_offset == 2048
    assert log.min_offset == 2048  # readers see the new start before any file goes
    assert len(list(directory.iterdir())) == 3
    released.destroy()
    assert sorted(p.name for p in directory.iterdir()) == [f"{2048:020d}"]
    released.destroy()  # once
    assert log.release_segments_before(1 << 40).starts == ()  # never the last one
    log.close()


def test_a_restart_after_deletion_recovers_a_log_not_starting_at_zero(tmp_path: Path) -> None:
    directory = tmp_path / "commitlog"
    log = FileCommitLog.open(directory, segment_size=1024)
    _filled(log, 2500)  # room left in the last segment for one more record
    end = log.max_offset
    assert log.delete_segments_before(2048) == 2
    record = log.read(2048, 64)
    log.close()
    again = FileCommitLog.open(directory, segment_size=1024)
    assert (again.min_offset, again.max_offset) == (2048, end)
    assert bytes(again.read(2048, 64)) == bytes(record)
    offset = again.append(NewMessage(topic="T", body=b"after")).physical_offset
    assert offset == end and again.max_offset > end
    again.close()


def test_a_restart_keeps_counting_queue_offsets_from_the_consume_queues(tmp_path: Path) -> None:
    directory = tmp_path / "commitlog"
    log = FileCommitLog.open(directory, segment_size=1024)
    _filled(log, 3000)
    log.delete_segments_before(2048)
    log.close()
    again = FileCommitLog.open(directory, segment_size=1024)
    # The log alone would start queue T/0 from the records it still holds.
    again.floor_queue_offsets({("T", 0): 30})
    assert again.append(NewMessage(topic="T", body=b"x")).queue_offset == 30
    again.floor_queue_offsets({("T", 0): 5})  # never lowered
    assert again.append(NewMessage(topic="T", body=b"y")).queue_offset == 31
    again.close()


# --- consume queue files -------------------------------------------------------------------
FILE = 5 * CQ_UNIT_SIZE


def _queue(directory: Path, units: int) -> ConsumeQueue:
    """Unit ``i`` points at 100 bytes at commit log offset ``100 * i``."""
    queue = ConsumeQueue(directory, "T", 0, FILE)
    for i in range(units):
        queue.put(i, 100 * i, 100, 0)
    return queue


def test_queue_files_wholly_below_the_log_start_go_and_the_min_offset_follows(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "q"
    queue = _queue(directory, 13)  # files of units 0-4, 5-9, 10-12
    assert queue.delete_expired(400) == 0  # unit 4's message starts at 400: still there
    assert queue.min_offset == 4 and len(list(directory.iterdir())) == 3
    # A file goes when its last unit's message starts below the log's start
    # (deleteExpiredFileByOffset), as RocketMQ judges it.
    assert queue.delete_expired(450) == 1
    assert sorted(p.name for p in directory.iterdir()) == [f"{FILE:020d}", f"{2 * FILE:020d}"]
    assert queue.min_offset == 5
    assert queue.delete_expired(720) == 0  # unit 9 at 900 keeps the second file
    assert queue.min_offset == 8
    assert queue.delete_expired(1 << 40) == 1  # never the last file
    assert queue.min_offset == 13 and queue.max_offset == 13
    queue.put(13, 1300, 100, 0)  # the queue goes on where it was
    assert queue.get(13) is not None and queue.read(13, 5) == [queue.get(13)]
    queue.close()


def test_a_queue_reloaded_after_deletion_starts_at_its_first_file(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, file_size=FILE)
    queue = store.find_or_create("T", 0)
    for i in range(12):
        queue.put(i, 100 * i, 100, 0)
    queue.delete_expired(1000)
    store.close()
    again = ConsumeQueueStore(tmp_path, file_size=FILE)
    again.load()
    reloaded = again.get("T", 0)
    assert reloaded is not None and reloaded.max_offset == 12
    assert reloaded.correct_min_offset(1000) == 10
    assert again.ends() == {("T", 0): 12}
    again.close()


def test_destroying_a_queue_removes_its_files_and_an_empty_topic_directory(
    tmp_path: Path,
) -> None:
    store = ConsumeQueueStore(tmp_path, file_size=FILE)
    for queue_id in (0, 1):
        store.find_or_create("T", queue_id).put(0, 100 * queue_id, 100, 0)
    store.flush()
    root = tmp_path / "consumequeue"
    assert store.destroy("T", 0)
    assert not store.destroy("T", 0)
    assert store.get("T", 0) is None and (root / "T").exists()
    assert store.destroy("T", 1)
    assert not (root / "T").exists()
    store.close()
