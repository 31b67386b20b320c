"""The file commit log's own duties (``CommitLog``, ``MappedFileQueue``): what reaches the disk
and when, the files it keeps aside, the log lines and errors an operator reads.

Recovery's cut points are tested in test_recovery.py and the behaviour every commit log shares
in test_commitlog_contract.py; this file pins what only the file-backed log does.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trioha import StorageError, StoreLayoutError
from trioha.store import FileCommitLog, SetAside, _commitlog
from trioha.store._segment import fsync_directory

from .conftest import FakeClock


@pytest.fixture
def dir_syncs(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every directory the commit log makes durable (``fsync`` of the directory), in order."""
    synced: list[Path] = []
    real = fsync_directory

    def recording(directory: Path) -> None:
        synced.append(Path(directory))
        real(directory)

    monkeypatch.setattr(_commitlog, "fsync_directory", recording)
    return synced


def _log_over(directory: Path, end: int, segment_size: int = 1024) -> FileCommitLog:
    log = FileCommitLog.open(directory, segment_size=segment_size, clock_ms=FakeClock())
    while log.max_offset < end:
        log.append(topic="FooBar", body=b"b" * 100)
    return log


def test_segments_deleted_by_retention_are_made_durable_by_the_next_flush(
    tmp_path: Path, dir_syncs: list[Path]
) -> None:
    directory = tmp_path / "commitlog"
    log = _log_over(directory, 2100)
    log.flush()
    dir_syncs.clear()
    assert log.delete_segments_before(2048) == 2
    assert sorted(p.name for p in directory.iterdir()) == [f"{2048:020d}"]
    assert dir_syncs == []  # deleting only marks the directory
    log.flush()
    assert dir_syncs == [directory]
    log.flush()
    assert dir_syncs == [directory]  # once: nothing changed since
    log.close()


def test_a_segment_that_cannot_be_deleted_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "commitlog"
    log = _log_over(directory, 1100)

    def refuse(path: object, *args: object, **kwargs: object) -> None:
        raise OSError(13, "Permission denied")

    monkeypatch.setattr(os, "unlink", refuse)
    with pytest.raises(
        StorageError, match=rf"^cannot delete {directory}/{0:020d}: \[Errno 13\] Permission denied$"
    ):
        log.delete_segments_before(1024)
    monkeypatch.undo()
    log.close()


def test_a_truncate_makes_its_moves_durable_and_reports_what_each_file_holds(
    tmp_path: Path, dir_syncs: list[Path]
) -> None:
    directory = tmp_path / "commitlog"
    log = _log_over(directory, 2100)
    first = next(iter(log.iter_messages()))
    log.flush()
    second, third = bytes(log.read(1024, 1024)), bytes(log.read(2048, 1024))
    dir_syncs.clear()
    log.truncate(first.end_offset)
    aside = tmp_path / "lost+found"
    bin_file = aside / f"{first.end_offset:020d}-truncated.bin"
    moved = [aside / f"{s:020d}-truncated.segment" for s in (1024, 2048)]
    assert log.set_aside == [
        SetAside(first.end_offset, 1024 - first.end_offset, "truncated", str(bin_file)),
        # A moved segment counts its data up to its last non-zero byte.
        SetAside(1024, len(second.rstrip(b"\0")), "truncated", str(moved[0])),
        SetAside(2048, len(third.rstrip(b"\0")), "truncated", str(moved[1])),
    ]
    assert moved[0].read_bytes() == second
    assert moved[1].read_bytes()[: len(third)] == third
    # The copies are durable before anything changes in place; the log's own directory
    # (two entries gone) with the next flush.
    assert dir_syncs == [aside, aside, aside]
    log.flush()
    assert dir_syncs == [aside, aside, aside, directory]
    log.close()


def test_a_segment_left_empty_by_a_full_disk_is_set_aside_as_holding_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    master = _log_over(tmp_path / "m" / "commitlog", 1100)
    slave = FileCommitLog.open(tmp_path / "s" / "commitlog", segment_size=1024)
    slave.append_raw(0, master.read(0, 1024))

    def full(*args: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(StorageError, match="No space left on device"):
        slave.append_raw(1024, master.read(1024, 1024))  # the next segment's file is made
    monkeypatch.undo()
    assert slave.max_offset == 1024
    assert (tmp_path / "s" / "commitlog" / f"{1024:020d}").exists()
    boundary = next(iter(master.iter_messages())).end_offset
    slave.truncate(boundary)
    empty = tmp_path / "s" / "lost+found" / f"{1024:020d}-truncated.segment"
    assert slave.set_aside[-1] == SetAside(1024, 0, "truncated", str(empty))
    assert empty.read_bytes() == bytes(1024)
    slave.close()
    master.close()


def test_a_new_segment_file_is_made_durable_by_the_next_flush(
    tmp_path: Path, dir_syncs: list[Path]
) -> None:
    directory = tmp_path / "commitlog"
    log = _log_over(directory, 900)
    assert len(list(directory.iterdir())) == 1
    log.flush()
    dir_syncs.clear()
    while log.max_offset < 1024:
        log.append(topic="FooBar", body=b"b" * 100)
    assert len(list(directory.iterdir())) == 2
    log.flush()
    assert dir_syncs == [directory]  # the new name, not only the bytes in it
    log.close()


def test_an_aside_directory_is_created_with_its_parents(tmp_path: Path) -> None:
    aside = tmp_path / "kept" / "by" / "operator"
    log = FileCommitLog.open(tmp_path / "commitlog", segment_size=1024, aside_dir=aside)
    first = log.append(topic="FooBar", body=b"a" * 100)
    log.append(topic="FooBar", body=b"b" * 100)
    log.truncate(first.end_offset)
    assert [p.name for p in aside.iterdir()] == [f"{first.end_offset:020d}-truncated.bin"]
    log.close()


def test_a_leftover_segment_file_that_cannot_be_read_is_a_layout_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "commitlog"
    directory.mkdir()
    leftover = directory / f"{0:020d}.creating"
    leftover.write_bytes(bytes(1024))
    real = os.open

    def refuse_leftovers(path: str | os.PathLike[str], flags: int, *args: int) -> int:
        if str(path).endswith(".creating"):
            raise OSError(13, "Permission denied")
        return real(path, flags, *args)

    monkeypatch.setattr(os, "open", refuse_leftovers)
    with pytest.raises(
        StoreLayoutError, match=rf"^cannot open {leftover}: \[Errno 13\] Permission denied$"
    ):
        FileCommitLog.open(directory, segment_size=1024)
    monkeypatch.undo()
    assert leftover.read_bytes() == bytes(1024)  # left as it was


def test_cuts_at_one_offset_are_kept_under_numbered_names_readable_by_others(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "commitlog"
    old = os.umask(0o022)
    try:
        for round_ in range(3):
            log = FileCommitLog.open(directory, segment_size=1024)
            log.append_raw(log.max_offset, b"\x00\x00\x00\x10garbage" + bytes([1 + round_]))
            log.close()
            FileCommitLog.open(directory).close()
    finally:
        os.umask(old)
    aside = tmp_path / "lost+found"
    name = f"{0:020d}-bad-magic.bin"
    assert sorted(p.name for p in aside.iterdir()) == [name, f"{name}.1", f"{name}.2"]
    for n, suffix in enumerate(["", ".1", ".2"]):
        kept = aside / f"{name}{suffix}"
        assert kept.read_bytes() == b"\x00\x00\x00\x10garbage" + bytes([1 + n])
        assert kept.stat().st_mode & 0o777 == 0o644  # as the segments: rw-r--r--
