"""A store directory laid out as RocketMQ lays it out (``DefaultMessageStore``,
docs/rocketmq-protocol.md §4.5).

::

    <root>/lock          one process per store (flock, and a POSIX lock as Java's tryLock)
    <root>/abort         exists while the store is open; left behind by a crash
    <root>/checkpoint    4 KiB StoreCheckpoint
    <root>/commitlog/    20-digit segment files
    <root>/config/       metadata (topics.json, ...), for later
    <root>/lost+found/   bytes recovery or truncate took out of the log (trioha's own)
    <root>/commitlog.start  only for a log a slave started inside a segment (trioha's own)
    <root>/haSentOffset  a master's sent and flushed marks (trioha's own, ``_sent``)
    <root>/haDiverged    a slave its master refused, until cut back (trioha's own)
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from trioha._errors import StorageError, StoreLayoutError, StoreLockedError
from trioha.store._checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from trioha.store._commitlog import FileCommitLog, RecoveryReport
from trioha.store._contract import (
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_STORE_HOST,
    FlushDiskType,
    FlushPolicy,
    system_clock_ms,
)
from trioha.store._message import HostAddress, PropertiesForm
from trioha.store._segment import ensure_directory, fsync_directory

__all__ = ["Store", "open_store"]

log = logging.getLogger("trioha.store")

# Store lock files held by this process, by (device, inode). A POSIX lock belongs to the
# process and is dropped when *any* descriptor of the file is closed, so a second opener in
# the same process must be refused before it opens the lock file at all.
_held: set[tuple[int, int]] = set()
_held_guard = threading.Lock()


class _StoreLock:
    """``DefaultMessageStore``'s ``lock`` file: exclusive for as long as the store is open."""

    def __init__(self, path: Path) -> None:
        with _held_guard:
            # stat, not open: closing a descriptor of a file we hold would drop our lock.
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(path)
                if (st.st_dev, st.st_ino) in _held:
                    raise StoreLockedError(f"{path} is locked: the store is already open here")
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise StoreLayoutError(f"cannot open lock file {path}: {exc}") from None
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
            except OSError:
                os.close(fd)
                raise StoreLockedError(
                    f"{path} is locked by another process: the store is in use"
                ) from None
            _held.add(key)
        self.path = path
        self._fd = fd
        self._key = key

    def release(self) -> None:
        if self._fd < 0:
            return
        with _held_guard:
            _held.discard(self._key)
            os.close(self._fd)  # releases both locks
            self._fd = -1


class Store:
    """An open store: its commit log, what recovery found, and its marker files."""

    def __init__(
        self,
        root: Path,
        commitlog: FileCommitLog,
        lock: _StoreLock,
        *,
        flush_policy: FlushPolicy,
        checkpoint: Checkpoint,
    ) -> None:
        self.root = root
        self.commitlog = commitlog
        self.flush_policy = flush_policy
        self.checkpoint = checkpoint
        self._lock = lock
        self._flush_guard = threading.Lock()
        self._closed = False

    @property
    def recovery(self) -> RecoveryReport:
        return self.commitlog.recovery

    @property
    def flush_disk_type(self) -> FlushDiskType:
        return self.flush_policy.flush_disk_type

    @property
    def checkpoint_path(self) -> Path:
        return self.root / "checkpoint"

    @property
    def abort_path(self) -> Path:
        return self.root / "abort"

    @property
    def config_dir(self) -> Path:
        return self.root / "config"

    def __repr__(self) -> str:
        return f"<Store {self.root} {self.commitlog!r}>"

    def flush(self) -> int:
        """Flush the commit log and record its last flushed message time in the checkpoint.

        Safe from a worker thread while the owner thread appends; returns the flushed offset.
        """
        with self._flush_guard:
            stamp = self.commitlog.last_store_timestamp  # every message up to here is flushed
            flushed = self.commitlog.flush()
            if stamp > self.checkpoint.physic_msg_timestamp:
                self._write_checkpoint(stamp)
            return flushed

    def _write_checkpoint(self, stamp: int) -> None:
        cp = Checkpoint(
            physic_msg_timestamp=max(stamp, self.checkpoint.physic_msg_timestamp),
            logics_msg_timestamp=self.checkpoint.logics_msg_timestamp,
            index_msg_timestamp=self.checkpoint.index_msg_timestamp,
            master_flushed_offset=self.checkpoint.master_flushed_offset,
            confirm_phy_offset=self.checkpoint.confirm_phy_offset,
        )
        write_checkpoint(self.checkpoint_path, cp)
        self.checkpoint = cp

    def close(self) -> None:
        """Flush, write the checkpoint, remove ``abort`` (a clean stop), release the lock."""
        if self._closed:
            return
        try:
            with self._flush_guard:
                stamp = self.commitlog.last_store_timestamp
                self.commitlog.close()
                self._write_checkpoint(stamp)
            self.abort_path.unlink(missing_ok=True)
            fsync_directory(self.root)
            self._closed = True
        finally:
            self._lock.release()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def open_store(
    root: str | os.PathLike[str],
    *,
    segment_size: int | None = None,
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH,
    flush_interval_ms: int = 500,
    create: bool = True,
    check_crc: bool = True,
    store_host: HostAddress = DEFAULT_STORE_HOST,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    properties_form: PropertiesForm = PropertiesForm.V4_9,
    clock_ms: Callable[[], int] = system_clock_ms,
    commitlog_dir: str | os.PathLike[str] | None = None,
    recovery_progress: Callable[[int, int], None] | None = None,
) -> Store:
    """Open (or create) the store at ``root``: lock it, recover the commit log, mark it open.

    ``segment_size=None`` uses the size of the segment files found, so a directory written
    with any ``mappedFileSizeCommitLog`` opens (1 GiB for a new store). A second opener gets
    :class:`StoreLockedError`; a directory not laid out as RocketMQ's gets
    :class:`StoreLayoutError` and is not changed. ``commitlog_dir`` puts the commit log
    elsewhere than ``<root>/commitlog`` (``storePathCommitLog``, e.g. a disk of its own).
    ``recovery_progress`` is told ``(segments scanned, segments to scan)`` during recovery
    (called on this thread; :class:`trioha._progress.Progress` turns it into lines or a bar).

    Raises:
        StoreLockedError: another opener holds ``<root>/lock``.
        StoreLayoutError: a segment of the wrong size, a gap between segments, a stray name.
        StorageError: the directory cannot be created, read or written (the OS error chained).
    """
    path = Path(root)
    ensure_directory(path, create=create, what="store root")
    lock = _StoreLock(path / "lock")
    try:
        abort = path / "abort"
        clean = not abort.exists()
        if not clean:
            log.warning("%s exists: the store was not shut down cleanly; full recovery", abort)
        commitlog = FileCommitLog.open(
            Path(commitlog_dir) if commitlog_dir is not None else path / "commitlog",
            segment_size=segment_size,
            create=create,
            clean_shutdown=clean,
            check_crc=check_crc,
            aside_dir=path / "lost+found",
            start_marker=path / "commitlog.start",
            store_host=store_host,
            max_message_size=max_message_size,
            properties_form=properties_form,
            progress=recovery_progress,
            clock_ms=clock_ms,
        )
        try:
            checkpoint = read_checkpoint(path / "checkpoint")
            # StoreCheckpoint maps its 4 KiB at start, creating or extending the file: its
            # space is then taken while there is some, and a clean stop can record itself on
            # a full disk. Written in place, a whole file's bytes stay as they were.
            write_checkpoint(path / "checkpoint", checkpoint)
            (path / "config").mkdir(exist_ok=True)
            abort.touch()
            fsync_directory(path)
        except OSError as exc:
            commitlog.close()
            raise StorageError(f"cannot prepare store {path}: {exc}") from None
        except BaseException:
            commitlog.close()
            raise
    except BaseException:
        with contextlib.suppress(OSError):
            lock.release()
        raise
    policy = FlushPolicy(flush_disk_type, flush_interval_ms)
    return Store(path, commitlog, lock, flush_policy=policy, checkpoint=checkpoint)
