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
    java_string_hash,
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
    with pytest.raises(StoreLayoutError, match="is 40 bytes, expected 100"):
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
    assert queue.get(1) is None  # not on disk: readers see only what is there
    assert [u.commitlog_offset for u in queue.read(0, 10)] == [0]
    assert queue.read(1, 10) == []
    with caplog.at_level("ERROR"):
        queue.close()
    assert "consume queue T/0 closed with 1 units unwritten" in caplog.text
    monkeypatch.undo()
    again = ConsumeQueueStore(tmp_path, file_size=FILE)
    again.load()
    reloaded = again.get("T", 0)
    assert reloaded is not None and reloaded.max_offset == 1  # dispatched again on restart
    again.close()
