"""One commit log file and the rules for a directory of them (``MappedFile``, ``MappedFileQueue``).

A segment is a file of exactly ``segment_size`` bytes named by the physical offset of its first byte
as 20 zero-padded digits (docs/rocketmq-protocol.md §4.5, ``UtilAll.offset2FileName``). It is
created sparse with ``ftruncate`` (RocketMQ maps a file of that size; the unwritten part reads as
zeros, which is how recovery finds the end of data).

Writes go through ``os.pwrite``; reads through a read-only shared ``mmap`` of the whole file,
so :meth:`SegmentFile.view` slices cost no copy. On Linux the page cache is shared, so bytes
written with ``pwrite`` are visible through the mapping at once.

Resident memory: pages touched through the mapping count in the process's RSS until unmapped,
so a reader streaming a whole log would grow RSS to the log's size although the kernel may drop
those pages at any time. :meth:`SegmentFile.drop_pages` (``MADV_DONTNEED``) gives them back: the
bytes stay in the page cache, and a view still in use faults them back in, never seeing zeros
(a shared file mapping, unlike an anonymous one). :class:`~trioha.store._logcore.LogCore` calls it
every few MiB read.

Lifetime of views: a ``memoryview`` handed out keeps the mapping alive even after the segment
is closed, deleted or moved aside (the mapping is only unmapped when the last view goes).
Files are never shrunk, so holding a view can never fault; bytes under a view only change
when that range is truncated (they become zeros).

Holes: the parts of a sparse file never written (the END_OF_FILE padding after a blank
marker, the rest of the last segment) are never read through the mapping. Reading a hole
through a shared mapping makes tmpfs allocate a page, and on a full tmpfs that fault is a
SIGBUS that kills the process. :attr:`SegmentFile.backed` is where the written part ends
(rounded up to a page); readers stop there and know that what follows reads as zeros
(:meth:`~trioha.store._logcore.LogCore.read`, and ``parse_before_hole`` for record walks).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import attrs

from trioha._errors import StorageError, StoreLayoutError

__all__ = [
    "DEFAULT_SEGMENT_SIZE",
    "MIN_SEGMENT_SIZE",
    "SegmentFile",
    "SegmentListing",
    "list_segments",
    "parse_segment_name",
    "segment_name",
]

log = logging.getLogger("trioha.store")

_MADV_DONTNEED: Final[int | None] = getattr(mmap, "MADV_DONTNEED", None)

DEFAULT_SEGMENT_SIZE: Final = 1 << 30
"""``mappedFileSizeCommitLog``: 1 GiB."""
MIN_SEGMENT_SIZE: Final = 256
"""Small enough for tests, large enough for a blank marker and a small record."""

_NAME = re.compile(r"[0-9]{20}")
_CREATING = re.compile(r"([0-9]{20})\.creating")
_CHUNK: Final = 1 << 20
_ZEROS: Final = bytes(_CHUNK)


def segment_name(start: int) -> str:
    """``UtilAll.offset2FileName``: the offset as 20 zero-padded decimal digits."""
    return f"{start:020d}"


def parse_segment_name(name: str) -> int | None:
    """The start offset a segment file name stands for, or None if it is not one."""
    return int(name) if _NAME.fullmatch(name) else None


@attrs.frozen
class SegmentListing:
    """What a commit log directory holds, checked but not yet opened."""

    segment_size: int
    starts: tuple[int, ...]
    leftovers: tuple[Path, ...]  # "<name>.creating" files of an interrupted segment creation


def ensure_directory(path: Path, *, create: bool, what: str) -> None:
    """Check that *path* is a directory, creating it if allowed; *what* names it in errors."""
    if not path.exists():
        if not create:
            raise StoreLayoutError(f"{what} {path} does not exist")
        try:
            path.mkdir(parents=True)
        except OSError as exc:
            raise StoreLayoutError(f"cannot create {what} {path}: {exc}") from None
    elif not path.is_dir():
        raise StoreLayoutError(f"{what} {path} is not a directory")


def list_segments(directory: Path, segment_size: int | None) -> SegmentListing:
    """Check a commit log directory's layout without changing anything.

    Mirrors ``MappedFileQueue.load``/``checkSelf``: every file must be exactly the segment
    size (RocketMQ refuses to start otherwise) and consecutive files must differ by exactly
    that size. ``segment_size=None`` takes the size of the files found (a directory written
    with another ``mappedFileSizeCommitLog`` opens as it is), or the 1 GiB default.
    Anything unexpected is a :class:`StoreLayoutError` naming the file; nothing is touched.
    """
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError as exc:
        raise StoreLayoutError(f"cannot list commit log directory {directory}: {exc}") from None
    files: list[tuple[int, Path, int]] = []
    leftovers: list[Path] = []
    for entry in entries:
        path = Path(entry.path)
        try:
            is_file = entry.is_file(follow_symlinks=False)
            size = entry.stat(follow_symlinks=False).st_size if is_file else -1
        except OSError as exc:
            raise StoreLayoutError(f"cannot stat {path}: {exc}") from None
        start = parse_segment_name(entry.name)
        if start is not None and is_file:
            files.append((start, path, size))
        elif _CREATING.fullmatch(entry.name) and is_file:
            leftovers.append(path)
        else:
            kind = "file" if is_file else "non-regular entry"
            raise StoreLayoutError(
                f"unexpected {kind} {path} in the commit log directory: segment files are "
                "named by their start offset in 20 digits"
            )
    where = ""
    if segment_size is None:
        segment_size = files[0][2] if files else DEFAULT_SEGMENT_SIZE
        if files:
            where = f" (the size of {files[0][1]})"
            log.info("segment size %d, from %s", segment_size, files[0][1])
    if segment_size < MIN_SEGMENT_SIZE:
        raise StoreLayoutError(
            f"segment size {segment_size}{where} is below the minimum {MIN_SEGMENT_SIZE}"
        )
    previous: int | None = None
    for start, path, size in files:
        if size != segment_size:
            raise StoreLayoutError(
                f"{path} is {size} bytes; every commit log file must be exactly {segment_size}"
            )
        if start % segment_size:
            raise StoreLayoutError(
                f"{path} starts at {start}, not a multiple of the segment size {segment_size}"
            )
        if previous is not None and start != previous + segment_size:
            raise StoreLayoutError(
                f"gap in the commit log: {path} follows {segment_name(previous)}; "
                f"expected {segment_name(previous + segment_size)}"
            )
        previous = start
    return SegmentListing(segment_size, tuple(f[0] for f in files), tuple(leftovers))


def fsync_directory(directory: Path) -> None:
    """Make a created, renamed or removed directory entry durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def data_regions(fd: int, start: int, end: int) -> Iterator[tuple[int, int]]:
    """The ranges of [start, end) that may hold data (holes of a sparse file skipped)."""
    pos = start
    while pos < end:
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data after pos
                return
            yield pos, end  # no SEEK_DATA support: treat everything as data
            return
        if data >= end:
            return
        hole = os.lseek(fd, data, os.SEEK_HOLE)
        yield data, min(hole, end)
        pos = hole


def page_up(offset: int, size: int) -> int:
    """``offset`` rounded up to a whole page, at most ``size``."""
    return min(size, -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE)


def backed_end(fd: int, size: int) -> int:
    """Where the written part of a file ends: the end of its last data region (holes are
    found with ``SEEK_HOLE``), rounded up to a page; ``size`` where holes cannot be told."""
    backed = 0
    for _, end in data_regions(fd, 0, size):
        backed = end
    return page_up(backed, size)


def last_nonzero_end(fd: int, start: int, end: int) -> int:
    """The offset just after the last non-zero byte in [start, end), or ``start`` if none."""
    for lo, hi in reversed(list(data_regions(fd, start, end))):
        chunk_hi = hi
        while chunk_hi > lo:
            chunk_lo = max(lo, chunk_hi - _CHUNK)
            chunk = os.pread(fd, chunk_hi - chunk_lo, chunk_lo)
            if chunk != _ZEROS[: len(chunk)]:
                return chunk_lo + len(chunk.rstrip(b"\0"))
            chunk_hi = chunk_lo
    return start


class SegmentFile:
    """One open commit log file: its bookkeeping and its IO (``DefaultMappedFile``).

    ``wrote`` is RocketMQ's wrotePosition (bytes of the file that hold log data, counting a
    closing blank record's whole padding); ``flushed`` is the position known durable;
    ``data_start`` is where data begins (0, except in the first file of a log that a slave
    started at an offset inside a file); ``backed`` is where the written part of the file
    ends, a page boundary: bytes from there on are a hole, zeros never to be read through
    the mapping (see the module note on holes).
    """

    __slots__ = (
        "_mm",
        "_view",
        "backed",
        "data_start",
        "fd",
        "flushed",
        "path",
        "size",
        "start",
        "wrote",
    )

    def __init__(self, path: Path, fd: int, start: int, size: int) -> None:
        self.path = path
        self.fd = fd
        self.start = start
        self.size = size
        self.wrote = 0
        self.flushed = 0
        self.data_start = 0
        self.backed = 0
        self._mm: mmap.mmap | None = None
        self._view: memoryview | None = None

    def __repr__(self) -> str:
        return f"<SegmentFile {self.path.name} wrote={self.wrote} flushed={self.flushed}>"

    @classmethod
    def create(cls, directory: Path, start: int, size: int) -> SegmentFile:
        """A new zero-filled (sparse) file, given its final name only once it has its size."""
        path = directory / segment_name(start)
        temp = directory / f"{path.name}.creating"
        try:
            fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StorageError(f"cannot create commit log file {temp}: {exc}") from exc
        try:
            os.ftruncate(fd, size)
            if path.exists():
                raise StorageError(f"commit log file {path} already exists")
            os.rename(temp, path)
        except BaseException as exc:
            os.close(fd)
            with contextlib.suppress(OSError):
                temp.unlink()
            if isinstance(exc, OSError):
                raise StorageError(f"cannot create commit log file {path}: {exc}") from exc
            raise
        return cls(path, fd, start, size)

    @classmethod
    def open(cls, path: Path, start: int, size: int) -> SegmentFile:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            raise StoreLayoutError(f"cannot open commit log file {path}: {exc}") from None
        seg = cls(path, fd, start, size)
        try:
            seg.backed = backed_end(fd, size)
        except OSError as exc:
            os.close(fd)
            raise StoreLayoutError(f"cannot read commit log file {path}: {exc}") from None
        return seg

    # --- IO -----------------------------------------------------------------------------

    def write(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        """Write all of ``data`` at ``pos`` (``pwrite`` may write less; loop until done)."""
        view = memoryview(data)
        total = view.nbytes
        done = 0
        try:
            while done < total:
                done += os.pwrite(self.fd, view[done:], pos + done)
                if pos + done > self.backed:
                    self.backed = page_up(pos + done, self.size)
        except OSError as exc:
            if done:
                # The part written lies past the log's end and would read as a torn record
                # after a restart: zero it (those pages are allocated, so a full disk allows).
                with contextlib.suppress(OSError):
                    os.pwrite(self.fd, bytes(done), pos)
            raise StorageError(
                f"write of {total} bytes at {self.start + pos} to {self.path} failed "
                f"after {done}: {exc}"
            ) from exc

    def mapping(self) -> mmap.mmap:
        """The whole file, mapped read-only (created on first use)."""
        if self._mm is None:
            self._mm = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ)
            self._view = memoryview(self._mm)
        return self._mm

    def buffer(self) -> mmap.mmap:
        """The mapping, for scanning records in place."""
        return self.mapping()

    def view(self, pos: int, end: int) -> memoryview:
        """Bytes [pos, end) of the file without copying (see the module note on lifetime)."""
        if self._view is None:
            self.mapping()
        assert self._view is not None
        return self._view[pos:end]

    def drop_pages(self, pos: int = 0, end: int | None = None) -> None:
        """Unmap the pages of [pos, end) from this process; reading them again refaults them.

        The data is untouched (see the module note on resident memory).
        """
        mm = self._mm
        if mm is None or _MADV_DONTNEED is None:
            return
        start = pos - pos % mmap.PAGESIZE
        length = (self.size if end is None else end) - start
        if length > 0:
            # ValueError: closed by another thread (a truncate) in between; nothing to drop.
            with contextlib.suppress(ValueError, OSError):
                mm.madvise(_MADV_DONTNEED, start, length)

    def zero(self, pos: int, end: int) -> None:
        """Overwrite [pos, end) with zeros (never shrink: a mapped view must not fault)."""
        while pos < end:
            n = min(end - pos, _CHUNK)
            self.write(pos, _ZEROS[:n] if n < _CHUNK else _ZEROS)
            pos += n

    def data_end(self, pos: int) -> int:
        """Just after the last non-zero byte at or after ``pos`` (``pos`` if all zeros)."""
        return last_nonzero_end(self.fd, pos, self.size)

    def sync(self) -> None:
        os.fdatasync(self.fd)

    @property
    def modified_ms(self) -> int:
        """The file's mtime in ms (``File.lastModified``): a ``pwrite`` moves it."""
        try:
            return os.fstat(self.fd).st_mtime_ns // 1_000_000
        except OSError as exc:
            raise StorageError(f"cannot stat commit log file {self.path}: {exc}") from exc

    def close(self) -> None:
        """Close the file; a mapping still referenced by a caller's view stays until released."""
        if self._view is not None:
            with contextlib.suppress(BufferError):
                self._view.release()
            self._view = None
        if self._mm is not None:
            # BufferError: a caller still holds a view. The mmap object then lives until the
            # last view is released, and unmaps itself.
            with contextlib.suppress(BufferError):
                self._mm.close()
            self._mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
