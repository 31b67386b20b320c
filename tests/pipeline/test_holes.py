"""On tmpfs, segments with holes are read from a copy of their written part, not mapped.

A full tmpfs makes a read of a hole through a mapping a SIGBUS (``tests/store/
test_full_tmpfs.py`` shows it for real, as root). Here the filesystem type is what decides:
told a segment lies on tmpfs, the reader copies its written part into anonymous memory, and
everything read from it must be what the mapped file reads, the holes as zeros.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.pipeline.conftest import MISSING, SKIP_REASON

if MISSING:  # only when the extra is not installed at all; a broken install fails
    pytest.skip(SKIP_REASON, allow_module_level=True)

from tests.pipeline.conftest import Log
from tests.pipeline.test_decode import rows
from trioha import store
from trioha.pipeline import _decode
from trioha.pipeline._layout import read_layout


def test_the_filesystem_type_comes_from_the_mount_table(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        found = _decode._filesystem_type(fd)
    finally:
        os.close(fd)
    mounts = Path("/proc/self/mountinfo").read_text().split()
    assert found is not None and found in mounts


def test_segments_on_tmpfs_read_the_same_from_a_copy(
    varied_log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    mapped = rows(varied_log.root)
    copied: list[int] = []
    preadv = os.preadv

    def counting_preadv(fd: int, buffers: list[memoryview], offset: int) -> int:
        copied.append(offset)
        return preadv(fd, buffers, offset)

    monkeypatch.setattr(_decode, "_filesystem_type", lambda fd: "tmpfs")
    monkeypatch.setattr(os, "preadv", counting_preadv)
    assert rows(varied_log.root) == mapped
    assert 0 in copied  # the segments were copied, not mapped


def test_a_copy_holds_the_file_and_zeros_where_it_has_holes(
    varied_log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_decode, "_filesystem_type", lambda fd: "tmpfs")
    last = read_layout(varied_log.root).segments[-1]
    with open(last.path, "rb") as f:
        data = f.read()
        fd = f.fileno()
        assert store.backed_end(fd, len(data)) < len(data)  # its unwritten tail is a hole
        copy = _decode._map(fd, len(data))
        assert bytes(copy) == data
        copy[0] = copy[0]  # anonymous memory (a read-only mapping of the file refuses this)
        copy.close()
