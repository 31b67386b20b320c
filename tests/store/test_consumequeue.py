"""Consume queue files (ConsumeQueue): units, files, recovery, truncation."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from trioha import StoreLayoutError
from trioha.store._consumequeue import (
    CQ_UNIT_SIZE,
    DEFAULT_CQ_FILE_SIZE,
    ConsumeQueue,
    ConsumeQueueStore,
    CQUnit,
    extension_weights,
    java_string_hash,
    java_string_hash_extend,
    tags_code,
)

FILE = 5 * CQ_UNIT_SIZE  # five units per file keeps file rolling visible


def test_java_string_hash_matches_java() -> None:
    # Values of "...".hashCode() in Java.
    assert java_string_hash("") == 0
    assert java_string_hash("TagA") == 2598919
    assert java_string_hash("hello world") == 1794106052
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert java_string_hash("日本") == 0x65E5 * 31 + 0x672C
    assert java_string_hash("\U0001f600") == 0xD83D * 31 + 0xDE00  # UTF-16 code units
    assert tags_code(None) == 0


@pytest.mark.parametrize(
    ("prefix", "data"),
    [("", b""), ("TopicA", b"key-1"), ("polygene", b"lubricants"), ("K", b"k" * 1500)],
)
def test_extending_a_hash_is_hashing_the_whole_string(prefix: str, data: bytes) -> None:
    """What the message index does: the hash of ``topic#key`` from the hash of ``topic#``."""
    whole = java_string_hash(prefix + data.decode("ascii")) & 0xFFFFFFFF
    assert java_string_hash_extend(java_string_hash(prefix) & 0xFFFFFFFF, data) == whole
    assert java_string_hash_extend(java_string_hash(prefix) & 0xFFFFFFFF, data) == whole  # cached


def test_extension_weights_are_powers_of_31_mod_2_to_the_32() -> None:
    power, weights = extension_weights(9)
    assert power == 31**9 % 2**32 == 4098453791
    assert weights == tuple(31**e % 2**32 for e in range(8, -1, -1))
    assert extension_weights(2000)[0] == pow(31, 2000, 2**32)  # beyond what is cached


def test_default_file_size_is_rocketmq_s() -> None:
    assert DEFAULT_CQ_FILE_SIZE == 6_000_000


def test_units_layout_and_file_names(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, file_size=FILE)
    queue = store.find_or_create("T", 3)
    for i in range(7):
        assert queue.put(i, 1000 + 100 * i, 100, tags_code("TagA"))
    assert queue.get(6) == CQUnit(1600, 100, 2598919)  # a read sees units not yet written
    queue.write_pending()  # the reput service does this after every batch
    files = sorted(p.name for p in (tmp_path / "consumequeue" / "T" / "3").iterdir())
    assert files == [f"{0:020d}", f"{FILE:020d}"]
    assert all(os.path.getsize(tmp_path / "consumequeue/T/3" / f) == FILE for f in files)
    raw = (tmp_path / "consumequeue/T/3" / files[1]).read_bytes()
    assert struct.unpack(">qiq", raw[:20]) == (1500, 100, 2598919)
    assert queue.max_offset == 7
    assert queue.get(6) == CQUnit(1600, 100, 2598919)
    assert queue.get(7) is None
    assert [u.commitlog_offset for u in queue.read(3, 10)] == [1300, 1400]  # stops at a file
    assert queue.max_physical_offset == 1700


def test_units_are_gathered_and_written_in_one_go(tmp_path: Path) -> None:
    queue = ConsumeQueueStore(tmp_path, file_size=FILE).find_or_create("T", 0)
    for i in range(5):
        queue.put(i, 100 * i, 100, 0)
    assert not (tmp_path / "consumequeue" / "T" / "0").exists()  # nothing written yet
    assert queue.dirty_handles()  # what a flush syncs is written first
    path = tmp_path / "consumequeue" / "T" / "0" / f"{0:020d}"
    raw = path.read_bytes()
    assert [struct.unpack_from(">qiq", raw, 20 * i)[0] for i in range(5)] == [0, 100, 200, 300, 400]
    # However many units one batch holds, what is gathered stays bounded.
    big = ConsumeQueueStore(tmp_path / "big").find_or_create("T", 0)
    for i in range(20_000):
        big.put(i, 100 * i, 100, 0)
        assert len(big._pending) <= 64 * 1024
    big.close()  # writes what is pending
    again = ConsumeQueueStore(tmp_path / "big")
    again.load()
    reopened = again.get("T", 0)
    assert reopened is not None and reopened.max_offset == 20_000


def test_repeated_unit_is_skipped(tmp_path: Path) -> None:
    queue = ConsumeQueueStore(tmp_path, file_size=FILE).find_or_create("T", 0)
    assert queue.put(0, 0, 10, 0)
    assert not queue.put(0, 0, 10, 0)
    assert queue.max_offset == 1


def test_recovery_finds_the_end_and_min(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, file_size=FILE)
    late = store.find_or_create("T", 1)
    late.put(7, 500, 50, 0)  # a queue that starts at offset 7: pre-blank before it
    late.put(8, 550, 50, 0)
    early = store.find_or_create("U", 0)
    for i in range(3):
        early.put(i, 10 * i, 10, 0)
    store.close()
    again = ConsumeQueueStore(tmp_path, file_size=FILE)
    again.load()
    t1 = again.get("T", 1)
    assert t1 is not None
    assert (t1.min_offset, t1.max_offset, t1.max_physical_offset) == (7, 9, 600)
    assert repr(t1) == "<ConsumeQueue T/1 [7, 9)>"
    assert [p.name for p in sorted((tmp_path / "consumequeue/T/1").iterdir())] == [f"{FILE:020d}"]
    u0 = again.get("U", 0)
    assert u0 is not None
    assert (u0.min_offset, u0.max_offset) == (0, 3)
    assert again.max_physical_offset() == 600


def test_truncate_dirty_drops_units_past_the_commit_log(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, file_size=FILE)
    queue = store.find_or_create("T", 0)
    for i in range(8):
        queue.put(i, 100 * i, 100, 0)
    assert store.truncate_dirty(450) == 4  # units ending at 500..800 point past 450
    assert queue.max_offset == 4
    assert queue.max_physical_offset == 400
    assert [p.name for p in sorted((tmp_path / "consumequeue/T/0").iterdir())] == [f"{0:020d}"]
    store.close()
    again = ConsumeQueueStore(tmp_path, file_size=FILE)
    again.load()
    reloaded = again.get("T", 0)
    assert reloaded is not None
    assert reloaded.max_offset == 4
    assert reloaded.put(4, 400, 100, 0)  # and building continues from there


def test_wrong_file_size_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "consumequeue" / "T" / "0"
    directory.mkdir(parents=True)
    (directory / f"{0:020d}").write_bytes(bytes(40))
    store = ConsumeQueueStore(tmp_path, file_size=FILE)
    with pytest.raises(
        StoreLayoutError, match=r"is 40 bytes, expected 100 \(mappedFileSizeConsumeQueue\)$"
    ):
        store.load()


def test_gap_in_the_middle_is_filled_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    queue = ConsumeQueue(tmp_path / "q", "T", 0, FILE)
    queue.put(0, 0, 10, 0)
    queue.put(3, 30, 10, 0)
    assert "unit 3 arrives at end 1" in caplog.text
    assert queue.get(1) is not None
    assert queue.get(1).is_blank  # type: ignore[union-attr]
    assert queue.max_offset == 4


def test_a_file_size_that_is_not_whole_units_is_refused(tmp_path: Path) -> None:
    for size in (0, -20, 30):
        with pytest.raises(ValueError, match=f"file size {size} is not a multiple of 20"):
            ConsumeQueue(tmp_path, "T", 0, size)


def test_a_queue_without_a_directory_loads_empty(tmp_path: Path) -> None:
    queue = ConsumeQueue(tmp_path / "absent", "T", 0, FILE)
    queue.load()
    assert (queue.min_offset, queue.max_offset, queue.max_physical_offset) == (0, 0, -1)
    assert queue.get(0) is None and queue.read(0, 5) == []


def test_a_file_that_does_not_follow_the_one_before_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "consumequeue" / "T" / "0"
    directory.mkdir(parents=True)
    (directory / f"{0:020d}").write_bytes(bytes(FILE))
    (directory / f"{2 * FILE:020d}").write_bytes(bytes(FILE))
    with pytest.raises(StoreLayoutError, match=f"{2 * FILE:020d} does not follow {0:020d}"):
        ConsumeQueueStore(tmp_path, file_size=FILE).load()


def test_an_empty_file_left_past_the_end_by_a_crash_is_removed(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, file_size=FILE)
    queue = store.find_or_create("T", 0)
    for i in range(5):  # exactly one full file
        queue.put(i, 100 * i, 100, 0)
    store.close()
    directory = tmp_path / "consumequeue" / "T" / "0"
    (directory / f"{FILE:020d}").write_bytes(bytes(FILE))  # created, nothing written
    (directory / f"{2 * FILE:020d}").write_bytes(bytes(FILE))
    again = ConsumeQueueStore(tmp_path, file_size=FILE)
    again.load()
    reloaded = again.get("T", 0)
    assert reloaded is not None and reloaded.max_offset == 5
    assert sorted(p.name for p in directory.iterdir()) == [f"{0:020d}"]
    assert reloaded.put(5, 500, 100, 0)  # the next file is made again when needed
    reloaded.write_pending()
    assert reloaded.read(5, 1) == [CQUnit(500, 100, 0)]
    again.close()


def test_the_store_skips_what_is_not_a_queue_directory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "consumequeue"
    (root / "T" / "notanumber").mkdir(parents=True)
    (root / "T" / "7").write_text("a file")
    (root / "stray").write_text("a file")
    store = ConsumeQueueStore(tmp_path, file_size=FILE)
    store.load()
    assert list(store) == []
    assert "notanumber: not a consume queue directory" in caplog.text
    assert "7: not a consume queue directory" in caplog.text


def test_removing_a_topic_closes_and_deletes_its_queues(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, file_size=FILE)
    for queue_id in (2, 0):
        store.find_or_create("T", queue_id).put(0, 0, 10, 0)
    store.find_or_create("U", 1).put(0, 10, 10, 0)
    store.flush()
    assert store.queue_ids("T") == [0, 2]
    assert {(q.topic, q.queue_id) for q in store} == {("T", 0), ("T", 2), ("U", 1)}
    assert store.remove_topic("T") == 2
    assert store.queue_ids("T") == [] and store.get("T", 0) is None
    assert not (tmp_path / "consumequeue" / "T").exists()
    assert store.remove_topic("T") == 0
    assert store.queue_ids("U") == [1]
    store.close()


def test_units_the_disk_refuses_stay_pending_unread_and_are_never_half_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = ConsumeQueueStore(tmp_path, file_size=FILE)
    queue = store.find_or_create("T", 0)
    queue.put(0, 0, 100, 0)
    queue.write_pending()
    queue.put(1, 100, 100, 0)

    def full(fd: int, data: object, pos: int) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    assert queue.max_offset == 2
    with caplog.at_level("DEBUG", logger="trioha.store.consumequeue"):
        assert queue.get(1) is None  # not on disk: readers see only what is there
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        (
            "DEBUG",
            "consume queue T/0: pending units not written: [Errno 28] No space left on device",
        )
    ]
    assert [u.commitlog_offset for u in queue.read(0, 10)] == [0]
    assert queue.read(1, 10) == []
    with caplog.at_level("ERROR"):
        queue.close()
    assert caplog.records[-1].getMessage() == (
        "consume queue T/0 closed with 1 units unwritten: [Errno 28] No space left on device"
    )
    monkeypatch.undo()
    again = ConsumeQueueStore(tmp_path, file_size=FILE)
    again.load()
    reloaded = again.get("T", 0)
    assert reloaded is not None and reloaded.max_offset == 1  # dispatched again on restart
    again.close()


def filled(directory: Path, units: int, *, queue_id: int = 0) -> ConsumeQueue:
    """A queue of topic T whose unit ``i`` points at 100 bytes at commit log offset ``100 * i``."""
    queue = ConsumeQueue(directory, "T", queue_id, FILE)
    for i in range(units):
        queue.put(i, 100 * i, 100, 0)
    return queue


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_an_empty_queue_directory_loads_as_an_empty_queue(tmp_path: Path) -> None:
    directory = tmp_path / "consumequeue" / "T" / "0"
    directory.mkdir(parents=True)
    (directory / "README").write_text("not a queue file")
    store = ConsumeQueueStore(tmp_path, file_size=FILE)
    store.load()
    queue = store.get("T", 0)
    assert queue is not None
    assert (queue.min_offset, queue.max_offset, queue.max_physical_offset) == (0, 0, -1)
    assert queue.put(0, 700, 10, 0)
    assert queue.get(0) == CQUnit(700, 10, 0)
    store.close()


def test_units_are_read_from_the_first_and_never_beyond_what_is_asked(tmp_path: Path) -> None:
    queue = ConsumeQueue(tmp_path / "q", "T", 0, FILE)
    for i in range(4):
        queue.put(i, 100 * i, 100, i)
    assert queue.get(0) == CQUnit(0, 100, 0)
    assert queue.get(-1) is None and queue.get(4) is None
    assert queue.read(0, 2) == [CQUnit(0, 100, 0), CQUnit(100, 100, 1)]
    assert queue.read(0, 0) == [] and queue.read(0, -1) == []
    assert queue.read(4, 5) == [] and queue.read(-1, 5) == []
    queue.close()


def test_a_queue_that_starts_late_has_no_units_before_its_first_file(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    queue = ConsumeQueue(directory, "T", 0, FILE)
    queue.put(7, 500, 50, 0)  # the second file; units 5 and 6 are pre-blanks
    assert (queue.min_offset, queue.max_offset) == (7, 8)
    for before in (0, 2, 4):
        assert queue.get(before) is None
        assert queue.read(before, 5) == []
    assert queue.get(5) is not None and queue.get(5).is_blank  # type: ignore[union-attr]
    assert queue.read(7, 5) == [CQUnit(500, 50, 0)]
    assert names(directory) == [f"{FILE:020d}"]
    queue.close()


def test_a_flush_syncs_each_written_file_once(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, file_size=FILE)
    assert store.max_physical_offset() == -1  # no queue, no unit
    t = store.find_or_create("T", 0)
    u = store.find_or_create("U", 0)
    for i in range(6):  # two files of T
        t.put(i, 100 * i, 100, 0)
    u.put(0, 50, 10, 0)
    handles = store.dirty_handles()
    assert len(handles) == 3 and len(set(handles)) == 3
    assert store.dirty_handles() == []  # nothing written since
    t.put(6, 600, 100, 0)
    assert store.dirty_handles() == [handles[1]]  # T's second file only
    assert store.max_physical_offset() == 700
    store.close()


def test_truncate_dirty_keeps_a_unit_ending_exactly_at_the_commit_log_end(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    queue = filled(tmp_path / "q", 4, queue_id=2)
    with caplog.at_level("INFO", logger="trioha.store.consumequeue"):
        assert queue.truncate_dirty(400) == 0  # the last unit ends at 400: it stays
        assert queue.truncate_dirty(399) == 1
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "consume queue T/2 truncated by 1 units to end before commit log offset 399")
    ]
    assert (queue.min_offset, queue.max_offset, queue.max_physical_offset) == (0, 3, 300)
    queue.close()


def test_truncate_dirty_inside_a_later_file_zeroes_there_and_drops_the_files_after(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "consumequeue" / "T" / "0"
    store = ConsumeQueueStore(tmp_path, file_size=FILE)
    queue = store.find_or_create("T", 0)
    for i in range(12):  # files at 0, FILE and 2 * FILE
        queue.put(i, 100 * i, 100, 0)
    queue.dirty_handles()
    second = queue._files[1].fd
    assert queue.truncate_dirty(700) == 5  # units 7..11
    assert names(directory) == [f"{0:020d}", f"{FILE:020d}"]
    assert (queue.max_offset, queue.max_physical_offset) == (7, 700)
    assert queue.dirty_handles() == [second]  # the zeroed units reach the disk on a flush
    assert (directory / f"{FILE:020d}").read_bytes()[40:] == bytes(60)
    store.close()
    again = ConsumeQueueStore(tmp_path, file_size=FILE)
    again.load()
    reloaded = again.get("T", 0)
    assert reloaded is not None
    assert (reloaded.min_offset, reloaded.max_offset, reloaded.max_physical_offset) == (0, 7, 700)
    again.close()


def test_truncate_dirty_to_a_file_boundary_drops_the_file_that_starts_there(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "q"
    queue = filled(directory, 7)
    assert queue.truncate_dirty(500) == 2
    assert names(directory) == [f"{0:020d}"]
    assert queue.max_offset == 5
    queue.close()


def test_truncate_dirty_of_every_unit_keeps_the_first_file_for_new_units(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    queue = filled(directory, 7)
    assert queue.truncate_dirty(0) == 7
    assert (queue.min_offset, queue.max_offset, queue.max_physical_offset) == (0, 0, -1)
    assert names(directory) == [f"{0:020d}"]
    assert queue.put(0, 0, 50, 0)
    assert queue.read(0, 5) == [CQUnit(0, 50, 0)]
    queue.close()


def test_truncate_dirty_stops_at_a_late_queues_pre_blanks(tmp_path: Path) -> None:
    queue = ConsumeQueue(tmp_path / "q", "T", 0, FILE)
    queue.put(7, 500, 50, 0)
    queue.put(8, 550, 50, 0)
    assert queue.truncate_dirty(500) == 2
    assert (queue.min_offset, queue.max_offset, queue.max_physical_offset) == (7, 7, -1)
    assert queue.get(6) is not None and queue.get(6).is_blank  # type: ignore[union-attr]
    assert queue.put(7, 500, 40, 0)
    queue.close()


def test_truncate_dirty_of_a_queue_starting_at_its_file_stops_at_the_file_start(
    tmp_path: Path,
) -> None:
    queue = ConsumeQueue(tmp_path / "q", "T", 0, FILE)
    queue.put(5, 500, 50, 0)  # no pre-blank: the unit opens its file
    queue.put(6, 550, 50, 0)
    assert queue.truncate_dirty(0) == 2
    assert (queue.min_offset, queue.max_offset, queue.max_physical_offset) == (5, 5, -1)
    queue.close()


def test_a_queue_file_already_gone_when_truncation_drops_it_is_no_error(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    queue = filled(directory, 7)
    queue.write_pending()
    (directory / f"{FILE:020d}").unlink()  # removed by hand while the queue is open
    assert queue.truncate_dirty(300) == 4
    assert names(directory) == [f"{0:020d}"]
    assert queue.max_offset == 3
    queue.close()


def test_a_reloaded_queue_keeps_writing_into_its_last_file(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, file_size=FILE)
    queue = store.find_or_create("T", 1)
    assert store.find_or_create("T", 1) is queue  # one queue object per topic and id
    for i in range(3):
        queue.put(i, 100 * i, 100, 0)
    store.close()
    again = ConsumeQueueStore(tmp_path, file_size=FILE)
    again.load()
    reloaded = again.get("T", 1)
    assert reloaded is not None
    assert (reloaded.topic, reloaded.queue_id) == ("T", 1)
    assert again.dirty_handles() == []  # opening a file writes nothing
    assert reloaded.put(3, 300, 100, 0)
    reloaded.write_pending()  # into the file opened by load: it must be writable
    assert again.dirty_handles() == [reloaded._files[0].fd]
    again.close()
    third = ConsumeQueueStore(tmp_path, file_size=FILE)
    third.load()
    assert [u.commitlog_offset for u in third.get("T", 1).read(0, 5)] == [0, 100, 200, 300]  # type: ignore[union-attr]
    third.close()


def test_queue_files_are_created_readable_by_all_writable_by_the_broker(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        queue = ConsumeQueue(tmp_path / "q", "T", 0, FILE)
        queue.put(0, 0, 10, 0)
        queue.write_pending()
    finally:
        os.umask(old)
    assert (tmp_path / "q" / f"{0:020d}").stat().st_mode & 0o777 == 0o644
    queue.close()


def test_units_gathered_across_a_file_end_are_split_there(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    queue = filled(directory, 3)
    queue.write_pending()
    for i in range(3, 12):  # one batch from the middle of the first file into the third
        queue.put(i, 100 * i, 100, 0)
    queue.write_pending()
    assert [os.path.getsize(directory / name) for name in names(directory)] == [FILE] * 3
    assert [u.commitlog_offset for u in queue.read(5, 10)] == [500, 600, 700, 800, 900]
    queue.close()


def test_a_late_queue_over_several_files_reads_each_from_its_own_file(tmp_path: Path) -> None:
    queue = ConsumeQueue(tmp_path / "q", "T", 0, FILE)
    for i in range(5, 20):  # files at FILE, 2 * FILE and 3 * FILE
        queue.put(i, 100 * i, 100, 0)
    assert [u.commitlog_offset for u in queue.read(10, 10)] == [1000, 1100, 1200, 1300, 1400]
    assert queue.get(12) == CQUnit(1200, 100, 0)
    queue.close()


def test_a_gap_fill_marks_every_file_it_wrote_for_the_next_flush(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    queue = ConsumeQueue(tmp_path / "q", "T", 4, FILE)
    queue.put(0, 0, 10, 0)
    queue.write_pending()
    queue.put(1, 10, 10, 0)  # the next unit after a write: no gap, no line
    assert queue.dirty_handles() == [queue._files[0].fd]
    assert caplog.records == []
    queue.put(12, 120, 10, 0)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        (
            "ERROR",
            "consume queue T/4: unit 12 arrives at end 2; the gap is filled with blanks",
        )
    ]
    assert queue.dirty_handles() == [f.fd for f in queue._files]  # blanks in all three files
    assert [queue.get(i).is_blank for i in range(2, 12)] == [True] * 10  # type: ignore[union-attr]
    queue.close()


def test_a_unit_after_a_queue_truncated_to_nothing_leaves_a_logged_gap(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    queue = filled(tmp_path / "q", 3)
    queue.truncate_dirty(0)
    caplog.clear()
    queue.put(3, 300, 100, 0)
    assert "consume queue T/0: unit 3 arrives at end 0" in caplog.text
    assert queue.max_offset == 4
    assert queue.get(0).is_blank  # type: ignore[union-attr]
    queue.close()


def test_a_queue_whose_only_file_is_empty_keeps_it(tmp_path: Path) -> None:
    directory = tmp_path / "consumequeue" / "T" / "0"
    directory.mkdir(parents=True)
    (directory / f"{0:020d}").write_bytes(bytes(FILE))  # a crash right after creating it
    store = ConsumeQueueStore(tmp_path, file_size=FILE)
    store.load()
    queue = store.get("T", 0)
    assert queue is not None
    assert (queue.min_offset, queue.max_offset) == (0, 0)
    assert names(directory) == [f"{0:020d}"]
    assert queue.put(0, 0, 10, 0)
    store.close()


def test_empty_files_after_a_partly_filled_one_are_removed_on_load(tmp_path: Path) -> None:
    directory = tmp_path / "consumequeue" / "T" / "0"
    store = ConsumeQueueStore(tmp_path, file_size=FILE)
    queue = store.find_or_create("T", 0)
    for i in range(7):  # the second file holds two units
        queue.put(i, 100 * i, 100, 0)
    store.close()
    (directory / f"{2 * FILE:020d}").write_bytes(bytes(FILE))
    again = ConsumeQueueStore(tmp_path, file_size=FILE)
    again.load()
    assert names(directory) == [f"{0:020d}", f"{FILE:020d}"]
    assert again.get("T", 0).max_offset == 7  # type: ignore[union-attr]
    again.close()


def test_a_stray_file_in_the_consume_queue_directory_does_not_hide_the_topics(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "consumequeue"
    (root / "T" / "x").mkdir(parents=True)
    (root / "README").write_text("sorts before T")
    store = ConsumeQueueStore(tmp_path, file_size=FILE)
    store.find_or_create("T", 0).put(0, 0, 10, 0)
    store.close()
    again = ConsumeQueueStore(tmp_path, file_size=FILE)
    again.load()
    assert again.queue_ids("T") == [0]
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", f"ignoring {root / 'T' / 'x'}: not a consume queue directory")
    ]
    again.close()


def test_recovery_counts_every_unit_with_a_positive_size(tmp_path: Path) -> None:
    """``ConsumeQueue.recover`` stops at ``size <= 0`` only: the smallest size is a unit too."""
    store = ConsumeQueueStore(tmp_path, file_size=FILE)
    queue = store.find_or_create("T", 0)
    queue.put(0, 0, 1, 0)
    queue.put(1, 1, 1, 0)
    store.close()
    again = ConsumeQueueStore(tmp_path, file_size=FILE)
    again.load()
    reloaded = again.get("T", 0)
    assert reloaded is not None
    assert (reloaded.max_offset, reloaded.max_physical_offset) == (2, 2)
    again.close()
