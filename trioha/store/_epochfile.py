"""``<root>/epochFileCheckpoint``: a store's epoch history on disk (RocketMQ 5.x).

The text format is ``CheckpointFile``'s (:func:`trioha.proto._epochs.format_epoch_file`). It is
written as ``MixAll.string2File`` writes: the new content goes to ``<file>.tmp`` (fsynced),
the previous content is kept as ``<file>.bak``, then the temp file is renamed over the file.
A read that finds the file missing, empty or damaged falls back to ``.bak``
(``CheckpointFile.read``), and says so at WARNING.

Where RocketMQ's ``CheckpointFile.read`` returns an empty list when the file is damaged and
no backup exists, this is a :class:`StorageError`: an empty history on a store that holds data
would make the broker start a first epoch of its own and judge its peers' logs against a
history it no longer has. The operator decides (restore the file, or remove it to start
from an empty history), as for any other damaged store file.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from trioha._errors import StorageError
from trioha.proto import EpochError, EpochHistory, format_epoch_file, parse_epoch_file
from trioha.store._segment import fsync_directory

__all__ = ["EPOCH_FILE_NAME", "EpochFile"]

log = logging.getLogger("trioha.store")

#: ``MessageStoreConfig.storePathEpochFile``'s default name under the store root.
EPOCH_FILE_NAME = "epochFileCheckpoint"


class EpochFile:
    """The epoch history of one store, kept in memory and written through on every change."""

    def __init__(self, path: Path, history: EpochHistory) -> None:
        self.path = path
        self.history = history

    @property
    def backup_path(self) -> Path:
        return self.path.with_name(self.path.name + ".bak")

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> EpochFile:
        """Read the history at *path* (falling back to ``.bak``); empty when neither exists.

        :class:`StorageError` when the file is damaged and no backup exists, or both are.
        """
        path = Path(path)
        backup = path.with_name(path.name + ".bak")
        try:
            history = _read(path)
        except StorageError as exc:
            if not backup.exists():
                raise StorageError(
                    f"{exc}, and there is no backup {backup}: restore the file, or remove it"
                    " to start from an empty epoch history"
                ) from None
            log.warning("%s; reading the backup %s", exc, backup)
            history = _read(backup)
        else:
            if not history and backup.exists():
                history = _read(backup)
        return cls(path, history)

    def replace(self, history: EpochHistory) -> None:
        """Make *history* the stored one (durable when this returns)."""
        if history == self.history:
            return
        text = format_epoch_file(history.entries)
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            _write_synced(tmp, text)
            if self.path.exists():
                _write_synced(self.backup_path, self.path.read_text())
            os.replace(tmp, self.path)
            fsync_directory(self.path.parent)
        except OSError as exc:
            raise StorageError(f"cannot write epoch file {self.path}: {exc}") from None
        self.history = history

    def append(self, epoch: int, start_offset: int) -> None:
        """``appendEntry``; :class:`EpochError` if the epoch or the start does not increase."""
        self.replace(self.history.append(epoch, start_offset))

    def truncate_suffix(self, offset: int) -> None:
        """``truncateSuffixByOffset``: forget epochs starting at or after *offset*."""
        self.replace(self.history.truncate_suffix(offset))

    def begin_epoch(
        self, log_end: int, log_start: int | None = None, *, epoch: int | None = None
    ) -> int:
        """Open a new epoch at *log_end* (this store starts as master); returns its number.

        A log that holds data but no history yet (written before epochs were kept) gets a
        first epoch from *log_start* for that data, so that a new slave can be served it.
        With failover, etcd hands out *epoch*, and an epoch file never goes backwards
        (:class:`~trioha.proto.EpochError` when it is not above every recorded one).
        """
        history = self.history
        if not history and log_start is not None and log_start < log_end:
            history = history.append(1, log_start)
        self.replace(history.begin_epoch(log_end, epoch))
        return self.history.last_epoch


def _read(path: Path) -> EpochHistory:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return EpochHistory()
    except (OSError, UnicodeDecodeError) as exc:
        raise StorageError(f"cannot read epoch file {path}: {exc}") from None
    if not text.strip():
        return EpochHistory()
    try:
        return parse_epoch_file(text, where=str(path))
    except EpochError as exc:
        raise StorageError(str(exc)) from None


def _write_synced(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        data = text.encode()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
