"""The file commit log's own duties (``CommitLog``, ``MappedFileQueue``): what reaches the disk
and when, the files it keeps aside, the log lines and errors an operator reads.

Recovery's cut points are tested in test_recovery.py and the behaviour every commit log shares
in test_commitlog_contract.py; this file pins what only the file-backed log does.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest

from trioha import StorageError, StoreLayoutError
from trioha.store import (
    FileCommitLog,
    HostAddress,
    NewMessage,
    PropertiesForm,
    RecoveryReport,
    SetAside,
    _commitlog,
)
from trioha.store._segment import fsync_directory, segment_name

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


@pytest.fixture
def data_syncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every descriptor the commit log ``fdatasync``s (a segment file's data), in order."""
    synced: list[int] = []
    real = os.fdatasync

    def recording(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", recording)
    return synced


def _log_over(directory: Path, end: int, segment_size: int = 1024) -> FileCommitLog:
    log = FileCommitLog.open(directory, segment_size=segment_size, clock_ms=FakeClock())
    while log.max_offset < end:
        log.append(NewMessage(topic="FooBar", body=b"b" * 100))
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
        log.append(NewMessage(topic="FooBar", body=b"b" * 100))
    assert len(list(directory.iterdir())) == 2
    log.flush()
    assert dir_syncs == [directory]  # the new name, not only the bytes in it
    log.close()


def test_an_aside_directory_is_created_with_its_parents(tmp_path: Path) -> None:
    aside = tmp_path / "kept" / "by" / "operator"
    log = FileCommitLog.open(tmp_path / "commitlog", segment_size=1024, aside_dir=aside)
    first = log.append(NewMessage(topic="FooBar", body=b"a" * 100))
    log.append(NewMessage(topic="FooBar", body=b"b" * 100))
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


# --- recovery: what an operator reads -------------------------------------------------


def _store_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "trioha.store"]


def test_recovery_reports_and_logs_every_file_it_cut_moved_or_deleted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "commitlog"
    log = _log_over(directory, 2100)
    offsets = [m.physical_offset for m in log.iter_messages()]
    log.close()
    seg1 = directory / f"{1024:020d}"
    seg2_bytes = (directory / f"{2048:020d}").read_bytes()
    data = bytearray(seg1.read_bytes())
    data[offsets[6] - 1024 + 100] ^= 0xFF  # inside record 6's body
    seg1.write_bytes(bytes(data))
    empty = directory / f"{3072:020d}"
    empty.write_bytes(bytes(1024))
    leftover = directory / f"{4096:020d}.creating"
    leftover.write_bytes(b"")
    caplog.set_level("INFO")
    log = FileCommitLog.open(directory, clean_shutdown=False)
    aside = tmp_path / "lost+found"
    bin_file = aside / f"{offsets[6]:020d}-crc-mismatch.bin"
    moved = aside / f"{2048:020d}-after-{offsets[6]}.segment"
    cut = len(data.rstrip(b"\0")) - (offsets[6] - 1024)
    total = cut + len(seg2_bytes.rstrip(b"\0"))
    assert bin_file.read_bytes() == bytes(data[offsets[6] - 1024 :]).rstrip(b"\0")
    assert log.recovery == RecoveryReport(
        clean_shutdown=False,
        min_offset=0,
        valid_end=offsets[6],
        messages=6,
        segments=2,
        crc_checked_from=0,
        cut_bytes=total,
        kept_aside=(bin_file, moved),
        reason="crc-mismatch",
        deleted_empty=(empty,),
    )
    log.close()
    stored = int.from_bytes(data[offsets[6] - 1024 + 8 : offsets[6] - 1024 + 12], "big")
    body = data[offsets[6] - 1024 + 88 : offsets[6] - 1024 + 188]
    detail = (
        f"body CRC {zlib.crc32(body) & 0x7FFFFFFF} != stored {stored} in the record at {offsets[6]}"
    )
    assert _store_lines(caplog) == [
        ("INFO", f"segment size 1024, from {directory / segment_name(0)}"),
        ("INFO", f"removing {leftover}, an empty file from an interrupted segment creation"),
        (
            "WARNING",
            f"commit log ends at {offsets[6]} ({detail}); {cut} bytes after it kept in {bin_file}",
        ),
        (
            "WARNING",
            f"commit log ends at {offsets[6]} ({detail}); later segment {segment_name(2048)} "
            f"moved to {moved}",
        ),
        ("INFO", f"deleted {empty}: past the end of the log and empty"),
        (
            "INFO",
            f"commit log {directory} recovered (after a crash): 6 messages in 2 segments, "
            f"[0, {offsets[6]}); {total} bytes kept aside (crc-mismatch)",
        ),
    ]
    assert not leftover.exists()


def test_a_record_running_past_its_segments_end_is_cut_as_torn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    master = _log_over(tmp_path / "m" / "commitlog", 1)
    record = bytes(master.read(0, master.max_offset))
    master.close()
    directory = tmp_path / "s" / "commitlog"
    slave = FileCommitLog.open(directory, segment_size=1024)
    at = 1024 - 100  # a log started where only 100 of the record's bytes fit
    slave.append_raw(at, record[:100])
    slave.close()
    caplog.set_level("INFO")
    log = FileCommitLog.open(directory)
    kept = tmp_path / "s" / "lost+found" / f"{at:020d}-torn-record.bin"
    assert log.recovery == RecoveryReport(
        clean_shutdown=True,
        min_offset=at,
        valid_end=at,
        messages=0,
        segments=1,
        crc_checked_from=0,
        cut_bytes=100,
        kept_aside=(kept,),
        reason="torn-record",
    )
    assert kept.read_bytes() == record[:100]
    assert _store_lines(caplog) == [
        ("INFO", f"segment size 1024, from {directory / segment_name(0)}"),
        (
            "WARNING",
            f"commit log ends at {at} (a record of {len(record)} bytes at {at} runs past the "
            f"segment end); 100 bytes after it kept in {kept}",
        ),
        (
            "INFO",
            f"commit log {directory} recovered (clean shutdown): 0 messages in 1 segments, "
            f"[{at}, {at}); 100 bytes kept aside (torn-record)",
        ),
    ]
    log.close()


def test_a_clean_recovery_logs_one_line_and_checks_the_last_three_segments(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "commitlog"
    _log_over(directory, 4100).close()
    caplog.set_level("INFO")
    log = FileCommitLog.open(directory, segment_size=1024)
    end = log.max_offset
    assert log.recovery == RecoveryReport(True, 0, end, 21, 5, 2048)
    assert _store_lines(caplog) == [
        (
            "INFO",
            f"commit log {directory} recovered (clean shutdown): 21 messages in 5 segments, "
            f"[0, {end})",
        )
    ]
    log.close()


def test_a_flush_with_standard_input_closed_syncs_and_closes_descriptor_0(
    tmp_path: Path, dir_syncs: list[Path], data_syncs: list[int]
) -> None:
    # A daemonised broker may run with fd 0 closed: the segment descriptor duplicated for the
    # fsync is then 0, and is synced and closed like any other.
    log = _log_over(tmp_path / "commitlog", 300)
    log.flush()
    log.append(NewMessage(topic="FooBar", body=b"c" * 100))
    dir_syncs.clear()
    data_syncs.clear()
    saved = os.dup(0)
    os.close(0)
    try:
        assert log.flush() == log.max_offset
        assert data_syncs == [0]
        with pytest.raises(OSError, match="Bad file descriptor"):
            os.fstat(0)  # closed again, not leaked
    finally:
        os.dup2(saved, 0)
        os.close(saved)
    assert dir_syncs == []
    log.close()


# --- the start marker -------------------------------------------------------------------


def test_a_start_marker_of_0_is_a_log_starting_at_its_first_byte(tmp_path: Path) -> None:
    directory = tmp_path / "commitlog"
    _log_over(directory, 300).close()
    marker = tmp_path / "commitlog.start"
    marker.write_text(" 0\n")
    with FileCommitLog.open(directory) as log:
        assert log.min_offset == 0
        assert log.recovery.messages == 2
    assert marker.exists()  # taken as it is, not ignored


def test_a_start_marker_at_the_first_segments_end_is_ignored_and_removed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "commitlog"
    _log_over(directory, 300).close()
    marker = tmp_path / "commitlog.start"
    marker.write_text("1024\n")
    caplog.set_level("INFO")
    with FileCommitLog.open(directory, segment_size=1024) as log:
        assert (log.min_offset, log.recovery.messages) == (0, 2)
    assert not marker.exists()
    assert _store_lines(caplog)[0] == (
        "INFO",
        f"ignoring {marker} (1024): not inside the first segment",
    )


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("-1024\n", "'-1024\\n'"),
        ("", "''"),
        ("1" * 30 + "x" * 30, repr("1" * 30 + "x" * 10)),  # the first 40 characters
    ],
)
def test_a_start_marker_not_holding_an_offset_is_a_layout_error_quoting_it(
    tmp_path: Path, text: str, shown: str
) -> None:
    directory = tmp_path / "commitlog"
    _log_over(directory, 300).close()
    marker = tmp_path / "commitlog.start"
    marker.write_text(text)
    with pytest.raises(StoreLayoutError) as caught:
        FileCommitLog.open(directory)
    assert str(caught.value) == f"{marker} should hold the log's start offset, found {shown}"
    assert marker.read_text() == text


# --- opening ------------------------------------------------------------------------------


def test_the_store_host_and_properties_form_given_to_open_are_what_appends_write(
    tmp_path: Path,
) -> None:
    host = HostAddress("10.0.0.5", 10911)
    directory = tmp_path / "commitlog"
    with FileCommitLog.open(
        directory, segment_size=1024, store_host=host, properties_form=PropertiesForm.V5
    ) as log:
        r = log.append(NewMessage(topic="FooBar", body=b"x", properties=(("TAGS", "a"),)))
        record = bytes(log.read(r.physical_offset, r.size))
        (stored,) = log.iter_messages()
    assert stored.store_host == host
    assert record.endswith(b"TAGS\x01a\x02")  # 5.x ends every pair with \x02


def test_a_leftover_holding_data_is_refused_by_name(tmp_path: Path) -> None:
    directory = tmp_path / "commitlog"
    _log_over(directory, 300).close()
    leftover = directory / f"{1024:020d}.creating"
    leftover.write_bytes(bytes(1000) + b"x" + bytes(23))
    with pytest.raises(StoreLayoutError) as caught:
        FileCommitLog.open(directory)
    assert (
        str(caught.value) == f"{leftover} is an unfinished segment file holding data; move it away"
    )
    assert leftover.stat().st_size == 1024


def test_an_open_whose_recovery_fails_closes_every_segment(tmp_path: Path) -> None:
    directory = tmp_path / "commitlog"
    log = _log_over(directory, 2100)
    log.append_raw(log.max_offset, b"\x00\x00\x00\x10garbage")  # to be cut on the next open
    log.close()
    (tmp_path / "file").write_text("")
    before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(StorageError, match=r"^cannot create .*file/lost\+found: "):
        FileCommitLog.open(directory, aside_dir=tmp_path / "file" / "lost+found")
    assert sorted(os.listdir("/proc/self/fd")) == before
    with FileCommitLog.open(directory) as again:  # nothing was cut meanwhile
        assert again.recovery.reason == "bad-magic"


def test_a_new_log_recovers_nothing(tmp_path: Path) -> None:
    with FileCommitLog.open(tmp_path / "commitlog", segment_size=1024) as log:
        assert log.recovery == RecoveryReport(True, 0, 0, 0, 0, 0)
    with FileCommitLog.open(tmp_path / "commitlog", clean_shutdown=False) as log:
        assert log.recovery == RecoveryReport(False, 0, 0, 0, 0, 0)


def test_opening_a_clean_log_syncs_its_segments_but_not_its_directory(
    tmp_path: Path, dir_syncs: list[Path], data_syncs: list[int]
) -> None:
    # Recovery changed no directory entry, so there is nothing to make durable there.
    directory = tmp_path / "commitlog"
    _log_over(directory, 1100).close()
    dir_syncs.clear()
    data_syncs.clear()
    log = FileCommitLog.open(directory)
    assert dir_syncs == []
    assert len(data_syncs) == 2
    log.close()


def test_one_replicated_byte_in_a_new_segment_is_synced_by_the_next_flush(
    tmp_path: Path, data_syncs: list[int]
) -> None:
    # The master may split its stream anywhere: a frame can put a single byte in a new file.
    master = _log_over(tmp_path / "m" / "commitlog", 1100)
    slave = FileCommitLog.open(tmp_path / "s" / "commitlog", segment_size=1024)
    slave.append_raw(0, master.read(0, 1024))
    slave.flush()
    data_syncs.clear()
    assert slave.append_raw(1024, master.read(1024, 1)) == 1025
    assert slave.flush() == 1025
    assert len(data_syncs) == 1  # the new segment's file
    slave.close()
    master.close()


def test_a_segment_cut_short_by_a_crash_takes_the_later_ones_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, dir_syncs: list[Path]
) -> None:
    # The tail of segment 1 never reached the disk, segment 2 did: the log ends in segment 1,
    # and segment 2 goes aside whole; zeros in segment 1 are its normal end, nothing to keep.
    directory = tmp_path / "commitlog"
    log = _log_over(directory, 2100)
    offsets = [m.physical_offset for m in log.iter_messages()]
    log.close()
    seg1 = directory / segment_name(1024)
    keep = offsets[7] - 1024
    seg1.write_bytes(seg1.read_bytes()[:keep] + bytes(1024 - keep))
    dir_syncs.clear()
    caplog.set_level("INFO")
    log = FileCommitLog.open(directory, segment_size=1024, clean_shutdown=False)
    moved = tmp_path / "lost+found" / f"{segment_name(2048)}-after-{offsets[7]}.segment"
    report = log.recovery
    assert (report.valid_end, report.messages, report.segments) == (offsets[7], 7, 2)
    assert report.kept_aside == (moved,)
    assert report.reason == "bad-magic"
    assert dir_syncs == [tmp_path / "lost+found", directory]
    assert _store_lines(caplog)[0] == (
        "WARNING",
        f"commit log ends at {offsets[7]} (magic 0x00000000 at {offsets[7]}); later segment "
        f"{segment_name(2048)} moved to {moved}",
    )
    log.flush()
    assert dir_syncs == [tmp_path / "lost+found", directory]  # nothing new to sync
    log.close()


def test_an_empty_segment_past_the_end_is_deleted_durably(
    tmp_path: Path, dir_syncs: list[Path]
) -> None:
    directory = tmp_path / "commitlog"
    _log_over(directory, 300).close()
    empty = directory / segment_name(1024)
    empty.write_bytes(bytes(1024))
    dir_syncs.clear()
    log = FileCommitLog.open(directory, segment_size=1024)
    assert log.recovery.deleted_empty == (empty,)
    assert log.recovery.reason is None and log.recovery.kept_aside == ()
    assert not empty.exists()
    assert dir_syncs == [directory]
    log.close()


def test_an_unreadable_start_marker_is_named_with_the_cause(tmp_path: Path) -> None:
    (tmp_path / "commitlog").mkdir()
    marker = tmp_path / "commitlog.start"
    marker.mkdir()
    with pytest.raises(StoreLayoutError) as caught:
        FileCommitLog.open(tmp_path / "commitlog", segment_size=1024)
    assert str(caught.value) == f"cannot read {marker}: [Errno 21] Is a directory: '{marker}'"


def test_a_start_marker_given_to_open_is_the_one_written_and_read(tmp_path: Path) -> None:
    master = _log_over(tmp_path / "m" / "commitlog", 1100)
    offsets = [m.physical_offset for m in master.iter_messages()]
    marker = tmp_path / "state" / "start"
    marker.parent.mkdir()
    directory = tmp_path / "s" / "commitlog"
    slave = FileCommitLog.open(directory, segment_size=1024, start_marker=marker)
    slave.append_raw(offsets[2], master.read(offsets[2], 1024 - offsets[2]))
    slave.close()
    assert marker.read_text() == f"{offsets[2]}\n"
    assert not (tmp_path / "s" / "commitlog.start").exists()
    with FileCommitLog.open(directory, start_marker=marker) as again:
        assert (again.min_offset, again.recovery.messages) == (offsets[2], 3)
    master.close()


def test_a_missing_directory_is_created_unless_told_not_to(tmp_path: Path) -> None:
    directory = tmp_path / "store" / "commitlog"
    with pytest.raises(StoreLayoutError) as caught:
        FileCommitLog.open(directory, create=False)
    assert str(caught.value) == f"commit log directory {directory} does not exist"
    assert not (tmp_path / "store").exists()
    with FileCommitLog.open(directory) as log:
        assert log.segment_size == 1 << 30  # RocketMQ's default for a new log
    assert directory.is_dir()


def test_recovery_goes_on_past_an_empty_later_segment(tmp_path: Path) -> None:
    # Segment 1 lost its tail, segment 2 never reached the disk, segment 3 did.
    directory = tmp_path / "commitlog"
    log = _log_over(directory, 3100)
    offsets = [m.physical_offset for m in log.iter_messages()]
    log.close()
    seg1 = directory / segment_name(1024)
    keep = offsets[7] - 1024
    seg1.write_bytes(seg1.read_bytes()[:keep] + bytes(1024 - keep))
    empty = directory / segment_name(2048)
    empty.write_bytes(bytes(1024))
    log = FileCommitLog.open(directory, clean_shutdown=False)
    moved = tmp_path / "lost+found" / f"{segment_name(3072)}-after-{offsets[7]}.segment"
    assert log.recovery.deleted_empty == (empty,)
    assert log.recovery.kept_aside == (moved,)
    assert sorted(p.name for p in directory.iterdir()) == [segment_name(0), segment_name(1024)]
    log.close()
    with FileCommitLog.open(directory) as again:
        assert again.max_offset == offsets[7]
