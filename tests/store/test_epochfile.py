"""``epochFileCheckpoint`` on disk: temp file, ``.bak``, fallback on damage."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from trioha._errors import StorageError
from trioha.proto import EpochError
from trioha.proto._epochs import entries_of
from trioha.store import EPOCH_FILE_NAME, EpochFile


def test_write_read_and_backup(tmp_path: Path) -> None:
    path = tmp_path / EPOCH_FILE_NAME
    f = EpochFile.open(path)
    assert not f.history
    assert f.begin_epoch(0) == 1
    f.append(2, 4096)
    assert EpochFile.open(path).history == entries_of([(1, 0), (2, 4096)])
    assert f.backup_path.read_text().endswith("1-0\n")  # the previous version
    assert not path.with_name(EPOCH_FILE_NAME + ".tmp").exists()
    with pytest.raises(EpochError):
        f.append(2, 5000)
    assert EpochFile.open(path).history == entries_of([(1, 0), (2, 4096)])


def test_damaged_file_falls_back_to_backup(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / EPOCH_FILE_NAME
    f = EpochFile.open(path)
    f.begin_epoch(0)
    f.begin_epoch(100)
    path.write_text("2\n1\n1-0\n2-1")  # a torn write with a wrong CRC
    assert EpochFile.open(path).history == entries_of([(1, 0)])
    assert "does not match" in caplog.text
    path.unlink()
    assert EpochFile.open(path).history == entries_of([(1, 0)])


def test_both_damaged_is_a_named_storage_error(tmp_path: Path) -> None:
    path = tmp_path / EPOCH_FILE_NAME
    path.write_text("garbage\n")
    path.with_name(EPOCH_FILE_NAME + ".bak").write_text("1\n0\nnope\n")
    with pytest.raises(StorageError, match=r"epochFileCheckpoint.bak.*nope"):
        EpochFile.open(path)


def test_a_damaged_file_without_backup_is_an_error_not_an_empty_history(tmp_path: Path) -> None:
    path = tmp_path / EPOCH_FILE_NAME
    path.write_text("1\n0\nnope\n")
    with pytest.raises(StorageError, match=r"nope.*no backup .*\.bak.*remove it"):
        EpochFile.open(path)
    assert path.read_text() == "1\n0\nnope\n"  # left as it was, for the operator


def test_truncate_suffix_persists(tmp_path: Path) -> None:
    path = tmp_path / EPOCH_FILE_NAME
    f = EpochFile.open(path)
    for start in (0, 100, 200):
        f.begin_epoch(start)
    f.truncate_suffix(150)
    assert EpochFile.open(path).history == entries_of([(1, 0), (2, 100)])


def test_a_failed_write_keeps_the_file_and_the_history_unchanged(tmp_path: Path) -> None:
    path = tmp_path / EPOCH_FILE_NAME
    f = EpochFile.open(path)
    f.begin_epoch(0)
    before = path.read_text()
    path.with_name(EPOCH_FILE_NAME + ".tmp").mkdir()  # the temporary file cannot be created
    with pytest.raises(StorageError, match=r"cannot write epoch file .*epochFileCheckpoint"):
        f.append(2, 100)
    assert f.history == entries_of([(1, 0)])
    assert path.read_text() == before


def test_an_unreadable_epoch_file_and_backup_is_a_named_error(tmp_path: Path) -> None:
    path = tmp_path / EPOCH_FILE_NAME
    path.write_text("garbage\n")
    backup = path.with_name(EPOCH_FILE_NAME + ".bak")
    backup.mkdir()
    with pytest.raises(StorageError, match=r"cannot read epoch file .*epochFileCheckpoint.bak"):
        EpochFile.open(path)
    backup.rmdir()
    backup.write_bytes(b"\xff\xfe1\n")
    with pytest.raises(StorageError, match=r"cannot read epoch file .*\.bak.*utf-8"):
        EpochFile.open(path)


def test_a_blank_epoch_file_is_an_empty_history(tmp_path: Path) -> None:
    path = tmp_path / EPOCH_FILE_NAME
    path.write_text(" \n\n")
    assert not EpochFile.open(path).history


def test_the_refusal_and_the_fallback_say_what_to_do_and_where(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / EPOCH_FILE_NAME
    backup = path.with_name(EPOCH_FILE_NAME + ".bak")
    path.write_text("1\n0\nnope\n")
    with pytest.raises(StorageError) as refused:
        EpochFile.open(path)
    assert str(refused.value).endswith(
        f", and there is no backup {backup}: restore the file, or remove it"
        " to start from an empty epoch history"
    )
    backup.write_text("")
    with caplog.at_level(logging.WARNING, logger="trioha.store"):
        assert not EpochFile.open(path).history
    (message,) = caplog.messages
    assert str(path) in message
    assert message.endswith(f"; reading the backup {backup}")


@pytest.mark.parametrize(
    ("log_start", "log_end", "expected", "epoch"),
    [
        (0, 4096, [(1, 0), (2, 4096)], 2),  # data written before epochs were kept
        (1024, 4096, [(1, 1024), (2, 4096)], 2),  # the log starts past 0
        (4096, 4096, [(1, 4096)], 1),  # an empty log: one epoch, from its end
        (None, 4096, [(1, 4096)], 1),
    ],
)
def test_a_first_epoch_covers_data_written_before_epochs_were_kept(
    tmp_path: Path,
    log_start: int | None,
    log_end: int,
    expected: list[tuple[int, int]],
    epoch: int,
) -> None:
    path = tmp_path / EPOCH_FILE_NAME
    f = EpochFile.open(path)
    assert f.begin_epoch(log_end, log_start) == epoch
    assert EpochFile.open(path).history == entries_of(expected)
    # A store with a history already: the log's start changes nothing.
    assert f.begin_epoch(8192, 0) == epoch + 1
    assert EpochFile.open(path).history == entries_of([*expected, (epoch + 1, 8192)])


def test_a_stale_temporary_file_is_replaced_whole_and_files_are_readable_by_all(
    tmp_path: Path,
) -> None:
    path = tmp_path / EPOCH_FILE_NAME
    path.with_name(EPOCH_FILE_NAME + ".tmp").write_text("x" * 500)  # left by a crash
    umask = os.umask(0o022)
    try:
        f = EpochFile.open(path)
        f.begin_epoch(0)
        assert EpochFile.open(path).history == entries_of([(1, 0)])
        f.begin_epoch(100)
    finally:
        os.umask(umask)
    assert EpochFile.open(path).history == entries_of([(1, 0), (2, 100)])
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE(f.backup_path.stat().st_mode) == 0o644
