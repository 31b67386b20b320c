"""``<root>/checkpoint``: the store's 4 KiB checkpoint file (``StoreCheckpoint``,
docs/rocketmq-protocol.md §4.5).

Big-endian longs: physicMsgTimestamp at 0, logicsMsgTimestamp at 8, indexMsgTimestamp at
16; 5.x adds masterFlushedOffset at 24 and confirmPhyOffset at 32. Bytes after those are
left as they are. Recovery here scans the whole log, so the checkpoint is written for
RocketMQ's sake (and for a ConsumeQueue later), not read to decide where to start.

RocketMQ maps the file; trioha writes it in place with ``pwrite`` (a full disk refuses a
write with ENOSPC, it cannot refuse a store through a mapping, which is a SIGBUS), into
4 KiB reserved with ``posix_fallocate`` when the file is made: later writes never need
space, so a clean stop records itself on a full disk.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Final

import attrs

from trioha._errors import StorageError

__all__ = ["CHECKPOINT_SIZE", "Checkpoint", "read_checkpoint", "write_checkpoint"]

CHECKPOINT_SIZE: Final = 4096
_LAYOUT = struct.Struct(">qqqqq")


@attrs.frozen
class Checkpoint:
    physic_msg_timestamp: int = 0
    logics_msg_timestamp: int = 0
    index_msg_timestamp: int = 0
    master_flushed_offset: int = 0
    confirm_phy_offset: int = 0

    @property
    def min_timestamp(self) -> int:
        """``StoreCheckpoint.getMinTimestamp``: where an abnormal recovery may start."""
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - 3000)

    def to_bytes(self) -> bytes:
        return _LAYOUT.pack(
            self.physic_msg_timestamp,
            self.logics_msg_timestamp,
            self.index_msg_timestamp,
            self.master_flushed_offset,
            self.confirm_phy_offset,
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> Checkpoint:
        data = data[: _LAYOUT.size].ljust(_LAYOUT.size, b"\0")
        return cls(*_LAYOUT.unpack(data))


def read_checkpoint(path: Path) -> Checkpoint:
    """The checkpoint at ``path``; all zeros when there is none yet."""
    try:
        return Checkpoint.from_bytes(path.read_bytes())
    except FileNotFoundError:
        return Checkpoint()
    except OSError as exc:
        raise StorageError(f"cannot read checkpoint {path}: {exc}") from None


def write_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    """Write the fields in place (the file is made 4 KiB) and fsync."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            if os.fstat(fd).st_size < CHECKPOINT_SIZE:
                os.posix_fallocate(fd, 0, CHECKPOINT_SIZE)
            os.pwrite(fd, checkpoint.to_bytes(), 0)
            os.fdatasync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise StorageError(f"cannot write checkpoint {path}: {exc}") from exc
