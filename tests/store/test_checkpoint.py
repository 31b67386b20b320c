"""``<root>/checkpoint`` (``StoreCheckpoint``): big-endian longs at fixed places."""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

from trioha.store import CHECKPOINT_SIZE, Checkpoint, read_checkpoint, write_checkpoint


def test_a_short_checkpoint_reads_the_missing_fields_as_zero(tmp_path: Path) -> None:
    # An older or torn file: the fields present are read where they are, the rest are 0.
    path = tmp_path / "checkpoint"
    head = struct.pack(">qq", 1_700_000_000_000, 1_700_000_000_500)
    path.write_bytes(head)
    assert read_checkpoint(path) == Checkpoint(1_700_000_000_000, 1_700_000_000_500, 0, 0, 0)
    path.write_bytes(head + b"\x00\x01")  # the first two bytes of indexMsgTimestamp
    assert read_checkpoint(path).index_msg_timestamp == 1 << 48


def test_a_new_checkpoint_is_4_kib_readable_by_all(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    umask = os.umask(0o022)
    try:
        write_checkpoint(path, Checkpoint(1, 2, 3, 4, 5))
    finally:
        os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert path.read_bytes() == struct.pack(">qqqqq", 1, 2, 3, 4, 5).ljust(CHECKPOINT_SIZE, b"\0")
