"""Segment files and directory listing (MappedFile, MappedFileQueue.load, offset2FileName)."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from trioha import StorageError, StoreLayoutError
from trioha.store import FileCommitLog, NewMessage
from trioha.store._scan import DROP_PAGES_EVERY
from trioha.store._segment import (
    DEFAULT_SEGMENT_SIZE,
    SegmentFile,
    SegmentListing,
    ensure_directory,
    last_nonzero_end,
    list_segments,
    parse_segment_name,
    segment_name,
)


def test_names_are_20_digit_offsets() -> None:
    assert segment_name(0) == "00000000000000000000"
    assert segment_name(1073741824) == "00000000001073741824"
    assert parse_segment_name("00000000001073741824") == 1073741824
    assert parse_segment_name("1073741824") is None
    assert parse_segment_name("0000000000107374182x") is None
    assert parse_segment_name("000000000010737418240") is None


def test_create_gives_a_full_size_sparse_file(tmp_path: Path) -> None:
    seg = SegmentFile.create(tmp_path, 1 << 20, 1 << 20)
    try:
        path = tmp_path / "00000000000001048576"
        assert seg.path == path
        assert path.stat().st_size == 1 << 20
        assert path.stat().st_blocks * 512 < 1 << 20  # not written out
        assert os.listdir(tmp_path) == [path.name]  # no ".creating" left behind
        with pytest.raises(StorageError, match="already exists"):
            SegmentFile.create(tmp_path, 1 << 20, 1 << 20)
        assert os.listdir(tmp_path) == [path.name]
    finally:
        seg.close()


def test_write_view_zero(tmp_path: Path) -> None:
    seg = SegmentFile.create(tmp_path, 0, 4096)
    seg.write(100, b"hello")
    seg.write(105, memoryview(b"--world--")[2:7])
    assert bytes(seg.view(100, 110)) == b"helloworld"
    assert bytes(seg.view(0, 4)) == bytes(4)
    assert seg.data_end(0) == 110
    assert seg.data_end(110) == 110
    seg.zero(103, 108)
    assert bytes(seg.view(100, 110)) == b"hel\0\0\0\0\0ld"
    seg.close()


def test_a_view_outlives_close_and_deletion(tmp_path: Path) -> None:
    seg = SegmentFile.create(tmp_path, 0, 4096)
    seg.write(0, b"kept")
    view = seg.view(0, 4)
    seg.close()
    seg.path.unlink()
    assert bytes(view) == b"kept"
    view.release()


def test_last_nonzero_end_skips_holes_and_spans_chunks(tmp_path: Path) -> None:
    path = tmp_path / "f"
    size = 3 << 20
    with open(path, "wb") as f:
        f.truncate(size)
        f.seek((5 << 19) - 1)  # 2.5 MiB - 1: the last byte of the third half-MiB
        f.write(b"\x07")
        f.seek(10)
        f.write(b"\x01")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert last_nonzero_end(fd, 0, size) == 5 << 19
        assert last_nonzero_end(fd, 0, 11) == 11
        assert last_nonzero_end(fd, 11, 1 << 20) == 11
        assert last_nonzero_end(fd, 0, 10) == 0
        assert last_nonzero_end(fd, 1 << 20, (5 << 19) - 1) == 1 << 20  # the 7 is past the end
    finally:
        os.close(fd)


def test_last_nonzero_end_without_seek_data_reads_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Some filesystems refuse SEEK_DATA (EINVAL): the whole range is then read as data.
    path = tmp_path / "f"
    with open(path, "wb") as f:
        f.truncate(3 << 20)
        f.seek((3 << 20) - 5)
        f.write(b"\x07")
    real = os.lseek

    def no_seek_data(fd: int, pos: int, how: int) -> int:
        if how in (os.SEEK_DATA, os.SEEK_HOLE):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, pos, how)

    monkeypatch.setattr(os, "lseek", no_seek_data)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert last_nonzero_end(fd, 0, 3 << 20) == (3 << 20) - 4
        assert last_nonzero_end(fd, 0, 1 << 20) == 0
    finally:
        os.close(fd)


def test_listing(tmp_path: Path) -> None:
    assert list_segments(tmp_path, None).segment_size == DEFAULT_SEGMENT_SIZE
    for start in (2048, 3072):
        (tmp_path / segment_name(start)).write_bytes(bytes(1024))
    listing = list_segments(tmp_path, None)
    assert (listing.segment_size, listing.starts) == (1024, (2048, 3072))
    with pytest.raises(StoreLayoutError, match="segment size 100 is below the minimum"):
        list_segments(tmp_path, 100)


def test_an_unreadable_directory_is_a_layout_error(tmp_path: Path) -> None:
    with pytest.raises(StoreLayoutError, match="cannot list commit log directory"):
        list_segments(tmp_path / "missing", None)


def _rss_file_kib() -> int | None:
    """This process's file-backed resident memory (Linux), or None."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1])
    return None


def test_dropped_pages_still_read_the_same_bytes(tmp_path: Path) -> None:
    seg = SegmentFile.create(tmp_path, 0, 1 << 20)
    data = os.urandom(300_000)
    seg.write(0, data)
    view = seg.view(0, len(data))
    assert bytes(view) == data
    seg.drop_pages()
    assert bytes(view) == data  # a shared file mapping refaults from the page cache
    seg.drop_pages(4097, 200_000)  # unaligned start: rounded down to a page
    assert bytes(seg.view(0, len(data))) == data
    del view
    seg.close()
    seg.drop_pages()  # closed: nothing to drop, no error


def _mapping_of(seg: SegmentFile) -> tuple[int, int] | None:
    """The address range of the segment's mapping in this process (Linux), or None."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == str(seg.path) and int(fields[2], 16) == 0:
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            return lo, hi
    return None


def _mapped_pages(seg: SegmentFile) -> set[int]:
    """The pages of the segment that this process has mapped in (``present`` in pagemap):
    what ``MADV_DONTNEED`` takes away and what counts in RSS."""
    where = _mapping_of(seg)
    if where is None:
        return set()
    lo, hi = where
    page = mmap.PAGESIZE
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(lo // page * 8)
        raw = f.read((hi - lo) // page * 8)
    return {i for i, (entry,) in enumerate(struct.iter_unpack("Q", raw)) if entry >> 63}


@pytest.fixture
def paged_segment(tmp_path: Path) -> Iterator[tuple[SegmentFile, bytes]]:
    """A 64-page segment full of data, every page of it read through the mapping."""
    if not os.access("/proc/self/pagemap", os.R_OK) or not hasattr(mmap, "MADV_DONTNEED"):
        pytest.skip("needs Linux's /proc/self/pagemap and MADV_DONTNEED")
    seg = SegmentFile.create(tmp_path, 0, 64 * mmap.PAGESIZE)
    data = os.urandom(seg.size)
    seg.write(0, data)
    assert bytes(seg.view(0, seg.size)) == data
    if _mapped_pages(seg) != set(range(64)):
        seg.close()
        pytest.skip("pagemap does not show this process's mapped pages")
    yield seg, data
    seg.close()


def test_drop_pages_unmaps_exactly_the_pages_of_the_range(
    paged_segment: tuple[SegmentFile, bytes],
) -> None:
    seg, data = paged_segment
    page = mmap.PAGESIZE
    seg.drop_pages(page + 1, 5 * page)  # a start inside page 1 takes all of page 1
    assert _mapped_pages(seg) == set(range(64)) - {1, 2, 3, 4}
    seg.drop_pages(40 * page, 40 * page + 1)  # one byte: its whole page
    assert _mapped_pages(seg) == set(range(64)) - {1, 2, 3, 4, 40}
    seg.drop_pages(50 * page, 50 * page)  # an empty range
    seg.drop_pages(64 * page, 65 * page)  # past the file's end: nothing there, no error
    assert _mapped_pages(seg) == set(range(64)) - {1, 2, 3, 4, 40}
    seg.drop_pages(60 * page)  # to the end of the file
    assert _mapped_pages(seg) == set(range(60)) - {1, 2, 3, 4, 40}
    assert bytes(seg.view(0, seg.size)) == data  # read back from the page cache
    assert _mapped_pages(seg) == set(range(64))
    seg.drop_pages()
    assert _mapped_pages(seg) == set()


def test_pages_locked_in_memory_stay_mapped_and_dropping_them_is_no_error(
    paged_segment: tuple[SegmentFile, bytes],
) -> None:
    # MADV_DONTNEED refuses locked pages (EINVAL); a reader's page budget must not fail on it.
    seg, data = paged_segment
    where = _mapping_of(seg)
    assert where is not None
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    address, length = ctypes.c_void_p(where[0]), ctypes.c_size_t(where[1] - where[0])
    if libc.mlock(address, length) != 0:
        pytest.skip(f"mlock refused: {os.strerror(ctypes.get_errno())}")
    try:
        seg.drop_pages()
        assert _mapped_pages(seg) == set(range(64))
    finally:
        libc.munlock(address, length)
    assert bytes(seg.view(0, seg.size)) == data
    seg.drop_pages()
    assert _mapped_pages(seg) == set()


def test_streaming_a_log_through_read_keeps_rss_flat(tmp_path: Path) -> None:
    if _rss_file_kib() is None:
        pytest.skip("needs /proc/self/status")
    log = FileCommitLog.open(tmp_path / "commitlog", segment_size=16 << 20)
    body = os.urandom(60_000)
    while log.max_offset < 96 << 20:
        log.append(NewMessage(topic="Pages", body=body))
    before = _rss_file_kib()
    assert before is not None
    offset, peak = log.min_offset, before
    while offset < log.max_offset:
        chunk = log.read(offset, 1 << 20)
        assert sum(memoryview(chunk).cast("B")[::4096]) >= 0  # touch every page
        offset += len(chunk)
        peak = max(peak, _rss_file_kib() or 0)
    messages = sum(1 for _ in log.iter_messages())
    peak = max(peak, _rss_file_kib() or 0)
    log.close()
    assert messages > 1000
    # 96 MiB read twice; what stays mapped is bounded by DROP_PAGES_EVERY, not the log.
    assert DROP_PAGES_EVERY <= 16 << 20
    assert (peak - before) * 1024 < 48 << 20


def test_a_write_failing_part_way_zeroes_what_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seg = SegmentFile.create(tmp_path, 0, 4096)
    try:
        seg.write(0, b"kept")
        real = os.pwrite
        calls: list[int] = []

        def short_then_full(fd: int, data: memoryview, pos: int) -> int:
            calls.append(pos)
            if len(calls) == 1:
                return real(fd, data[:3], pos)  # a short write, as pwrite may do
            if len(calls) == 2:
                raise OSError(28, "No space left on device")
            return real(fd, data, pos)

        monkeypatch.setattr(os, "pwrite", short_then_full)
        with pytest.raises(StorageError, match=r"write of 6 bytes at 4 .* failed after 3: .*space"):
            seg.write(4, b"abcdef")
        monkeypatch.undo()
        # The three bytes that did land past the log's end are zero again: no torn record.
        assert bytes(seg.view(0, 10)) == b"kept" + bytes(6)
        assert calls == [4, 7, 4]
    finally:
        seg.close()


def test_a_segment_that_cannot_be_created_or_opened_is_named(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match=r"cannot create commit log file .*creating"):
        SegmentFile.create(tmp_path / "missing", 0, 4096)
    with pytest.raises(StoreLayoutError, match=r"cannot open commit log file .*0{20}"):
        SegmentFile.open(tmp_path / segment_name(0), 0, 4096)


def test_a_directory_that_cannot_be_created_is_a_layout_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(StoreLayoutError, match=r"cannot create commit log .*file/commitlog"):
        ensure_directory(tmp_path / "file" / "commitlog", create=True, what="commit log")
    with pytest.raises(StoreLayoutError, match=r"commit log .* does not exist"):
        ensure_directory(tmp_path / "absent", create=False, what="commit log")


def test_a_new_segment_is_read_write_for_its_owner_and_readable_by_others(tmp_path: Path) -> None:
    # RocketMQ's files are rw-r--r-- under the usual umask; never executable.
    old = os.umask(0o022)
    try:
        seg = SegmentFile.create(tmp_path, 0, 4096)
    finally:
        os.umask(old)
    try:
        assert (tmp_path / segment_name(0)).stat().st_mode & 0o777 == 0o644
    finally:
        seg.close()


def test_a_half_created_file_left_by_a_crash_is_started_over(tmp_path: Path) -> None:
    # A crash between creating the file and giving it its final name leaves "<name>.creating".
    (tmp_path / f"{segment_name(0)}.creating").write_bytes(b"\xee" * 8192)
    seg = SegmentFile.create(tmp_path, 0, 4096)
    try:
        assert (tmp_path / segment_name(0)).read_bytes() == bytes(4096)
        assert not (tmp_path / f"{segment_name(0)}.creating").exists()
    finally:
        seg.close()


def test_closing_a_segment_twice_closes_its_file_once(tmp_path: Path) -> None:
    seg = SegmentFile.create(tmp_path, 0, 4096)
    assert bytes(seg.view(0, 4)) == bytes(4)  # mapped and viewed, as a reader leaves it
    fd = seg.fd
    seg.close()
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd)
    assert seg.fd < 0  # it holds no descriptor any more: a second close touches nothing
    seg.close()


def test_short_writes_are_continued_where_they_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seg = SegmentFile.create(tmp_path, 0, 4096)
    try:
        real = os.pwrite
        calls: list[int] = []

        def three_at_a_time(fd: int, data: memoryview, pos: int) -> int:
            calls.append(pos)
            assert len(calls) < 100, "the write does not advance"
            return real(fd, data[:3], pos)

        monkeypatch.setattr(os, "pwrite", three_at_a_time)
        seg.write(10, b"abcdefgh")
        monkeypatch.undo()
        assert bytes(seg.view(10, 18)) == b"abcdefgh"
        assert calls == [10, 13, 16]
    finally:
        seg.close()


def test_views_are_read_only(tmp_path: Path) -> None:
    # Readers get the log's bytes without a copy; none of them may change a byte of it.
    seg = SegmentFile.create(tmp_path, 0, 4096)
    try:
        seg.write(0, b"kept")
        view = seg.view(0, 4)
        assert view.readonly
        with pytest.raises(TypeError, match="read-only"):
            view[0] = 0
        assert seg.mapping()[:4] == b"kept"
        view.release()
    finally:
        seg.close()


def test_a_segment_holding_descriptor_0_closes_it(tmp_path: Path) -> None:
    # A daemonised broker may run with fd 0 closed: a segment can then get descriptor 0.
    saved = os.dup(0)
    os.close(0)
    try:
        seg = SegmentFile.create(tmp_path, 0, 4096)
        assert seg.fd == 0
        seg.write(0, b"kept")
        seg.close()
        with pytest.raises(OSError, match="Bad file descriptor"):
            os.fstat(0)
        assert seg.fd < 0
    finally:
        os.dup2(saved, 0)
        os.close(saved)
    assert (tmp_path / segment_name(0)).read_bytes()[:4] == b"kept"


def test_a_symlink_named_like_a_segment_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(bytes(1024))
    directory = tmp_path / "commitlog"
    directory.mkdir()
    link = directory / segment_name(0)
    link.symlink_to(target)
    with pytest.raises(StoreLayoutError) as caught:
        list_segments(directory, 1024)
    assert str(caught.value) == (
        f"unexpected non-regular entry {link} in the commit log directory: segment files are "
        "named by their start offset in 20 digits"
    )


def test_a_creation_that_fails_reports_its_cause_even_if_the_cleanup_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, size: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def refuse(path: object, *args: object, **kwargs: object) -> None:
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "ftruncate", full)
    monkeypatch.setattr(os, "unlink", refuse)
    open_fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(StorageError) as caught:
        SegmentFile.create(tmp_path, 1024, 1024)
    monkeypatch.undo()
    assert str(caught.value) == (
        f"cannot create commit log file {tmp_path / segment_name(1024)}: "
        "[Errno 28] No space left on device"
    )
    assert len(os.listdir("/proc/self/fd")) == open_fds
    assert os.listdir(tmp_path) == [f"{segment_name(1024)}.creating"]  # could not be removed


def test_an_entry_that_cannot_be_stated_while_listing_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / segment_name(0)).write_bytes(bytes(1024))
    real = os.scandir

    class Vanished:
        """A directory entry removed between the listing and its stat."""

        def __init__(self, entry: os.DirEntry[str]) -> None:
            self.name, self.path = entry.name, entry.path

        def is_file(self, *, follow_symlinks: bool = True) -> bool:
            return True

        def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory")

    def listing(path: Path) -> list[Vanished]:
        with real(path) as entries:
            return [Vanished(e) for e in entries]

    monkeypatch.setattr(os, "scandir", listing)
    with pytest.raises(StoreLayoutError) as caught:
        list_segments(tmp_path, 1024)
    assert str(caught.value) == (
        f"cannot stat {tmp_path / segment_name(0)}: [Errno 2] No such file or directory"
    )


def test_a_segment_size_taken_from_too_small_files_names_the_file(tmp_path: Path) -> None:
    (tmp_path / segment_name(0)).write_bytes(bytes(100))
    with pytest.raises(StoreLayoutError) as caught:
        list_segments(tmp_path, None)
    assert str(caught.value) == (
        f"segment size 100 (the size of {tmp_path / segment_name(0)}) is below the minimum 256"
    )
    with pytest.raises(StoreLayoutError) as caught:
        list_segments(tmp_path, 255)
    assert str(caught.value) == "segment size 255 is below the minimum 256"
    (tmp_path / "empty").mkdir()
    assert list_segments(tmp_path / "empty", 256) == SegmentListing(256, (), ())


def test_a_segment_size_taken_from_the_files_is_logged_with_the_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / segment_name(4096)).write_bytes(bytes(4096))
    caplog.set_level("INFO")
    assert list_segments(tmp_path, None) == SegmentListing(4096, (4096,), ())
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("trioha.store", "INFO", f"segment size 4096, from {tmp_path / segment_name(4096)}")
    ]
    caplog.clear()
    list_segments(tmp_path, 4096)  # given: nothing to say
    assert caplog.records == []


def _layout_error(call: Callable[[], object]) -> str:
    with pytest.raises(StoreLayoutError) as caught:
        call()
    return str(caught.value)


def test_every_layout_error_names_the_file_and_what_was_expected(tmp_path: Path) -> None:
    d = tmp_path
    for start in (0, 1024):
        (d / segment_name(start)).write_bytes(bytes(1024))
    (d / segment_name(2048)).write_bytes(bytes(1000))
    assert _layout_error(lambda: list_segments(d, 1024)) == (
        f"{d / segment_name(2048)} is 1000 bytes; every commit log file must be exactly 1024"
    )
    (d / segment_name(2048)).unlink()
    (d / segment_name(3072)).write_bytes(bytes(1024))
    assert _layout_error(lambda: list_segments(d, 1024)) == (
        f"gap in the commit log: {d / segment_name(3072)} follows {segment_name(1024)}; "
        f"expected {segment_name(2048)}"
    )
    (d / segment_name(3072)).unlink()
    (d / segment_name(2000)).write_bytes(bytes(1024))
    assert _layout_error(lambda: list_segments(d, 1024)) == (
        f"{d / segment_name(2000)} starts at 2000, not a multiple of the segment size 1024"
    )
    (d / segment_name(2000)).unlink()
    (d / "notes.txt").write_text("hi")
    assert _layout_error(lambda: list_segments(d, 1024)) == (
        f"unexpected file {d / 'notes.txt'} in the commit log directory: segment files are "
        "named by their start offset in 20 digits"
    )
    (d / "notes.txt").unlink()
    assert list_segments(d, 1024) == SegmentListing(1024, (0, 1024), ())


def test_directory_and_file_errors_say_what_and_where(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    assert _layout_error(lambda: list_segments(missing, None)) == (
        f"cannot list commit log directory {missing}: [Errno 2] No such file or directory: "
        f"'{missing}'"
    )
    assert _layout_error(lambda: ensure_directory(missing, create=False, what="store")) == (
        f"store {missing} does not exist"
    )
    (tmp_path / "file").write_text("")
    assert _layout_error(lambda: ensure_directory(tmp_path / "file", create=True, what="x")) == (
        f"x {tmp_path / 'file'} is not a directory"
    )
    below = tmp_path / "file" / "commitlog"
    assert _layout_error(lambda: ensure_directory(below, create=True, what="commit log")) == (
        f"cannot create commit log {below}: [Errno 20] Not a directory: '{below}'"
    )
    ensure_directory(tmp_path / "a" / "b", create=True, what="commit log")
    assert (tmp_path / "a" / "b").is_dir()
    assert _layout_error(lambda: SegmentFile.open(missing, 0, 1024)) == (
        f"cannot open commit log file {missing}: [Errno 2] No such file or directory: '{missing}'"
    )
    with pytest.raises(StorageError) as caught:
        SegmentFile.create(missing, 0, 1024)
    creating = missing / f"{segment_name(0)}.creating"
    assert str(caught.value) == (
        f"cannot create commit log file {creating}: [Errno 2] No such file or directory: "
        f"'{creating}'"
    )
    SegmentFile.create(tmp_path, 0, 1024).close()
    with pytest.raises(StorageError) as caught:
        SegmentFile.create(tmp_path, 0, 1024)
    assert str(caught.value) == f"commit log file {tmp_path / segment_name(0)} already exists"


def test_a_write_whose_zeroing_fails_too_still_reports_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seg = SegmentFile.create(tmp_path, 1024, 4096)
    try:
        real = os.pwrite
        calls: list[int] = []

        def short_then_broken(fd: int, data: memoryview, pos: int) -> int:
            calls.append(pos)
            if len(calls) == 1:
                return real(fd, data[:3], pos)
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "pwrite", short_then_broken)
        with pytest.raises(StorageError) as caught:
            seg.write(4, b"abcdef")
        monkeypatch.undo()
        assert str(caught.value) == (
            f"write of 6 bytes at 1028 to {seg.path} failed after 3: [Errno 5] Input/output error"
        )
        assert calls == [4, 7, 4]  # the zeroing was tried
    finally:
        seg.close()
