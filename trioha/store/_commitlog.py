"""The file commit log: segments on disk and recovery on open (docs/rocketmq-protocol.md §4.5,
§4.6).

Recovery walks every record from the first segment (``CommitLog.recoverNormally`` /
``recoverAbnormally``, without a ConsumeQueue to lean on, so queue offsets are rebuilt on
the way) and stops at the first record ``checkMessageAndReturnSize`` would reject. Where it
stops is the end of the log:

- zeros there (the unwritten part of a preallocated file) is the normal end;
- anything else after that point - a torn or corrupt record, a slave's half-received last
  message, stray bytes, whole later segments - is taken out of the log but never thrown
  away: bytes of the segment that holds the end are copied to
  ``<aside_dir>/<offset>-<reason>.bin`` and zeroed in place (the file keeps its size), later
  segments are renamed to ``<aside_dir>/<name>-<reason>.segment``; each with a log line
  (logger ``trioha.store``). Segments beyond the end that hold only zeros are deleted.

CRC checks: after a crash every record's body CRC is checked; after a clean shutdown only the
last three segments', as ``recoverNormally`` does (``check_crc=False`` turns them off).

Differences from RocketMQ, on purpose:

- A last segment closed by a blank record stays full after recovery (RocketMQ sets its
  write position back to the marker, so a small message could later be written where a
  slave already holds the blank).
- A log that a slave started inside a segment (see ``append_raw``) remembers its start
  in ``<root>/commitlog.start``; RocketMQ has no such case because it writes such bytes at
  the file's start, misplacing them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Final

import attrs

from trioha._errors import StorageError, StoreLayoutError
from trioha.store._contract import (
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_STORE_HOST,
    SetAside,
    system_clock_ms,
)
from trioha.store._logcore import LogCore
from trioha.store._message import DecodedInvalid, HostAddress, PropertiesForm
from trioha.store._scan import QueueOffsets, RecordScan
from trioha.store._segment import (
    SegmentFile,
    ensure_directory,
    fsync_directory,
    last_nonzero_end,
    list_segments,
    segment_name,
)

__all__ = ["FileCommitLog", "RecoveryReport"]

log = logging.getLogger("trioha.store")

_NEVER: Final = 1 << 63
_RECOVER_NORMALLY_FILES: Final = 3  # recoverNormally starts at the third-to-last file
_COPY_CHUNK: Final = 1 << 20
#: ``<offset>-<reason>.bin`` or ``<segment name>-<reason>.segment``, maybe with a ``.<n>``.
_ASIDE_NAME: Final = re.compile(r"([0-9]{20})-[^/]*\.(?:bin|segment)(?:\.[0-9]+)?")


@attrs.frozen
class RecoveryReport:
    """What recovery found when the commit log was opened."""

    clean_shutdown: bool
    """No ``abort`` marker was left behind (as far as the opener knows)."""
    min_offset: int
    valid_end: int
    """The end of the valid data: the log's ``max_offset`` after opening."""
    messages: int
    segments: int
    crc_checked_from: int
    """Records in segments from this offset on had their body CRC checked."""
    cut_bytes: int = 0
    """Bytes of data (up to the last non-zero byte of each piece) taken out of the log."""
    kept_aside: tuple[Path, ...] = ()
    """Where the cut bytes and segments went."""
    reason: str | None = None
    """Why the data ended where it did, when that was not a clean end."""
    deleted_empty: tuple[Path, ...] = ()
    """Segments past the end that held only zeros, deleted."""
    earlier_aside: tuple[Path, ...] = ()
    """Files of the aside directory holding bytes from at or past ``valid_end`` that an
    earlier start (or a cut) took out of the log: where the bytes a refused start cut went,
    when the next start finds nothing left to cut. Oldest offset first."""


class FileCommitLog(LogCore[SegmentFile]):
    """RocketMQ's commit log on disk; open one with :meth:`open`."""

    def __init__(
        self,
        directory: Path,
        *,
        segment_size: int,
        aside_dir: Path,
        start_marker: Path,
        store_host: HostAddress = DEFAULT_STORE_HOST,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        properties_form: PropertiesForm = PropertiesForm.V4_9,
        clock_ms: Callable[[], int] = system_clock_ms,
    ) -> None:
        super().__init__(
            segment_size=segment_size,
            store_host=store_host,
            max_message_size=max_message_size,
            properties_form=properties_form,
            clock_ms=clock_ms,
        )
        self.directory = directory
        self.aside_dir = aside_dir
        self.start_marker = start_marker
        self.recovery = RecoveryReport(True, 0, 0, 0, 0, 0)
        self._dir_dirty = False

    def __repr__(self) -> str:
        return f"<FileCommitLog {self.directory} [{self.min_offset}, {self.max_offset})>"

    # --- opening --------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        segment_size: int | None = None,
        create: bool = True,
        clean_shutdown: bool = True,
        check_crc: bool = True,
        aside_dir: Path | None = None,
        start_marker: Path | None = None,
        store_host: HostAddress = DEFAULT_STORE_HOST,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        properties_form: PropertiesForm = PropertiesForm.V4_9,
        clock_ms: Callable[[], int] = system_clock_ms,
        progress: Callable[[int, int], None] | None = None,
    ) -> FileCommitLog:
        """Open (or create) the commit log in ``directory`` and recover it.

        ``progress`` is told ``(segments scanned, segments to scan)`` as recovery goes.

        ``segment_size=None`` takes the size of the files present (1 GiB for a new log).
        Cut bytes go to ``aside_dir`` (default ``<parent>/lost+found``); the start marker
        is ``<parent>/<name>.start``. A directory not laid out as RocketMQ lays it out is a
        :class:`StoreLayoutError` and is left untouched.
        """
        path = Path(directory)
        ensure_directory(path, create=create, what="commit log directory")
        listing = list_segments(path, segment_size)
        size = listing.segment_size
        # Check the whole layout (leftovers, start marker) before changing anything.
        for leftover in listing.leftovers:
            if _file_has_data(leftover):
                raise StoreLayoutError(
                    f"{leftover} is an unfinished segment file holding data; move it away"
                )
        marker = start_marker or path.parent / f"{path.name}.start"
        start = _read_start_marker(marker)
        for leftover in listing.leftovers:
            log.info("removing %s, an empty file from an interrupted segment creation", leftover)
            leftover.unlink()
        self = cls(
            path,
            segment_size=size,
            aside_dir=aside_dir or path.parent / "lost+found",
            start_marker=marker,
            store_host=store_host,
            max_message_size=max_message_size,
            properties_form=properties_form,
            clock_ms=clock_ms,
        )
        try:
            for s in listing.starts:
                self._segments.append(SegmentFile.open(path / segment_name(s), s, size))
            self.recovery = self._recover(
                start, clean_shutdown=clean_shutdown, check_crc=check_crc, progress=progress
            )
        except BaseException:
            for seg in self._segments:
                seg.close()
            raise
        return self

    def _recover(
        self,
        start: int | None,
        *,
        clean_shutdown: bool,
        check_crc: bool,
        progress: Callable[[int, int], None] | None = None,
    ) -> RecoveryReport:
        segs = self._segments
        size = self._segment_size
        if not segs:
            if start is not None:
                self._record_start(None)
            earlier = self._earlier_aside(0, [])
            return RecoveryReport(clean_shutdown, 0, 0, 0, 0, 0, earlier_aside=earlier)
        for seg in segs:
            seg.wrote = seg.flushed = size
        first = segs[0]
        if start is not None:
            if first.start <= start < first.start + size:
                first.data_start = start - first.start
            else:
                log.info("ignoring %s (%d): not inside the first segment", self.start_marker, start)
                self._record_start(None)
        begin = first.start + first.data_start
        if not check_crc:
            crc_from = _NEVER
        elif clean_shutdown:
            crc_from = segs[max(0, len(segs) - _RECOVER_NORMALLY_FILES)].start
        else:
            crc_from = first.start
        queues = QueueOffsets(begin)
        scan = RecordScan(segs, begin, size, check_crc_from=crc_from, on_segment=progress)
        messages = queues.count(scan)
        self._queues = queues
        problem = scan.problem
        kept: list[Path] = []
        deleted: list[Path] = []
        cut = 0
        reason: str | None = None
        if problem is not None:
            valid_end = problem.offset
            k = self._segment_at(valid_end)
            seg = segs[k]
            pos = valid_end - seg.start
            extent = seg.data_end(pos)
            if isinstance(problem, DecodedInvalid):
                tag, detail = problem.reason.value, problem.detail
            else:
                tag = "torn-record"
                detail = (
                    f"a record of {problem.needed} bytes at {problem.offset} runs past the "
                    "segment end"
                )
            if extent > pos:
                reason = tag
                aside = self._keep_aside(seg, pos, extent, tag)
                kept.append(Path(aside.where))
                cut += aside.size
                log.warning(
                    "commit log ends at %d (%s); %d bytes after it kept in %s",
                    valid_end,
                    detail,
                    aside.size,
                    aside.where,
                )
                seg.zero(pos, extent)
                seg.sync()
            for later in segs[k + 1 :]:
                if later.data_end(0) == 0:
                    later.close()
                    later.path.unlink()
                    self._dir_dirty = True
                    deleted.append(later.path)
                    log.info("deleted %s: past the end of the log and empty", later.path)
                    continue
                reason = reason or tag
                aside = self._move_aside(later, f"after-{valid_end}")
                kept.append(Path(aside.where))
                cut += aside.size
                log.warning(
                    "commit log ends at %d (%s); later segment %s moved to %s",
                    valid_end,
                    detail,
                    later.path.name,
                    aside.where,
                )
            del segs[k + 1 :]
            seg.wrote = seg.flushed = pos
        for seg in segs:
            seg.sync()
        if self._dir_dirty:
            fsync_directory(self.directory)
            self._dir_dirty = False
        self._flushed = self.max_offset
        report = RecoveryReport(
            clean_shutdown=clean_shutdown,
            min_offset=self.min_offset,
            valid_end=self.max_offset,
            messages=messages,
            segments=len(segs),
            crc_checked_from=crc_from,
            cut_bytes=cut,
            kept_aside=tuple(kept),
            reason=reason,
            deleted_empty=tuple(deleted),
            earlier_aside=self._earlier_aside(self.max_offset, kept),
        )
        log.info(
            "commit log %s recovered (%s): %d messages in %d segments, [%d, %d)%s",
            self.directory,
            "clean shutdown" if clean_shutdown else "after a crash",
            messages,
            len(segs),
            report.min_offset,
            report.valid_end,
            f"; {cut} bytes kept aside ({reason})" if reason else "",
        )
        return report

    def _earlier_aside(self, end: int, now: list[Path]) -> tuple[Path, ...]:
        """What the aside directory holds from at or past ``end`` besides ``now`` (its file
        names begin with the offset of their first byte, see :meth:`_keep_aside` and
        :meth:`_move_aside`)."""
        try:
            names = os.listdir(self.aside_dir)
        except OSError:
            return ()
        found = []
        for name in names:
            match = _ASIDE_NAME.fullmatch(name)
            path = self.aside_dir / name
            if match is not None and int(match.group(1)) >= end and path not in now:
                found.append((int(match.group(1)), name, path))
        return tuple(path for _, _, path in sorted(found))

    # --- storage hooks --------------------------------------------------------------------

    def _create_segment(self, start: int) -> SegmentFile:
        seg = SegmentFile.create(self.directory, start, self._segment_size)
        self._dir_dirty = True
        return seg

    def _aside_path(self, name: str) -> Path:
        try:
            self.aside_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create {self.aside_dir}: {exc}") from None
        path = self.aside_dir / name
        n = 0
        while path.exists():
            n += 1
            path = self.aside_dir / f"{name}.{n}"
        return path

    def _keep_aside(self, seg: SegmentFile, pos: int, end: int, reason: str) -> SetAside:
        path = self._aside_path(f"{segment_name(seg.start + pos)}-{reason}.bin")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                at = pos
                while at < end:
                    chunk = os.pread(seg.fd, min(_COPY_CHUNK, end - at), at)
                    if not chunk:
                        break
                    os.write(fd, chunk)
                    at += len(chunk)
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_directory(self.aside_dir)
        except OSError as exc:
            raise StorageError(
                f"cannot keep bytes [{seg.start + pos}, {seg.start + end}) aside in {path}: {exc}"
            ) from None
        return SetAside(seg.start + pos, end - pos, reason, str(path))

    def _move_aside(self, seg: SegmentFile, reason: str) -> SetAside:
        extent = seg.data_end(0)
        path = self._aside_path(f"{seg.path.name}-{reason}.segment")
        seg.close()
        try:
            os.rename(seg.path, path)
            fsync_directory(self.aside_dir)
        except OSError as exc:
            raise StorageError(f"cannot move {seg.path} aside to {path}: {exc}") from None
        self._dir_dirty = True
        return SetAside(seg.start, extent, reason, str(path))

    def _delete(self, seg: SegmentFile) -> None:
        seg.close()
        try:
            seg.path.unlink()
        except FileNotFoundError:
            log.warning("commit log file %s was already gone when deleted", seg.path)
        except OSError as exc:
            raise StorageError(f"cannot delete {seg.path}: {exc}") from None
        with self._lock:  # retention deletes from a worker thread; a flush reads the flag
            self._dir_dirty = True

    def _record_start(self, offset: int | None) -> None:
        marker = self.start_marker
        try:
            if offset is None:
                if marker.exists():
                    marker.unlink()
                    fsync_directory(marker.parent)
                return
            temp = marker.with_name(marker.name + ".tmp")
            temp.write_text(f"{offset}\n")
            with open(temp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(temp, marker)
            fsync_directory(marker.parent)
        except OSError as exc:
            raise StorageError(f"cannot update {marker}: {exc}") from None

    def _sync_handles(self, segments: list[SegmentFile]) -> list[int]:
        handles = [os.dup(seg.fd) for seg in segments]
        if self._dir_dirty:
            self._dir_dirty = False
            handles.append(-1)  # the directory
        return handles

    def _sync(self, handles: list[int]) -> None:
        try:
            for fd in handles:
                if fd < 0:
                    fsync_directory(self.directory)
                else:
                    os.fdatasync(fd)
        except OSError as exc:
            raise StorageError(f"fsync of the commit log {self.directory} failed: {exc}") from exc
        finally:
            for fd in handles:
                if fd >= 0:
                    os.close(fd)

    def _after_truncate(self, seg: SegmentFile) -> None:
        seg.sync()


def _file_has_data(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise StoreLayoutError(f"cannot open {path}: {exc}") from None
    try:
        return last_nonzero_end(fd, 0, os.fstat(fd).st_size) > 0
    finally:
        os.close(fd)


def _read_start_marker(marker: Path) -> int | None:
    try:
        text = marker.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreLayoutError(f"cannot read {marker}: {exc}") from None
    with contextlib.suppress(ValueError):
        value = int(text.strip())
        if value >= 0:
            return value
    raise StoreLayoutError(f"{marker} should hold the log's start offset, found {text[:40]!r}")
