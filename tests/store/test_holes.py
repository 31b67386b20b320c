"""Segments never read their holes through the mapping (``_segment``'s note on holes).

On a full tmpfs, reading a hole of a file through a shared mapping is a SIGBUS (see
``test_full_tmpfs``, which does it for real as root). Here a mapping that ends where a
segment's written part ends (:attr:`SegmentFile.backed`) stands in for it, anywhere: a read
past that end fails loudly instead of faulting, and everything the store reads must still
come out right, END_OF_FILE padding read as zeros.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest

from trioha.store import NewMessage, open_store
from trioha.store._segment import SegmentFile

SEG = 64 * 1024


@pytest.fixture
def written_part_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments whose mapping holds only their written part; views past it fail."""
    view = SegmentFile.view

    def buffer(self: SegmentFile) -> mmap.mmap | bytes:
        if self.backed == 0:
            return b""
        return mmap.mmap(self.fd, self.backed, mmap.MAP_SHARED, mmap.PROT_READ)

    def guarded_view(self: SegmentFile, pos: int, end: int) -> memoryview:
        assert end <= self.backed, f"{self.path.name}: [{pos}, {end}) read past {self.backed}"
        return view(self, pos, end)

    monkeypatch.setattr(SegmentFile, "buffer", buffer)
    monkeypatch.setattr(SegmentFile, "view", guarded_view)


def _build(root: Path) -> tuple[int, int, list[bytes]]:
    """A log with a segment closed by a blank, END_OF_FILE records over two more, and a last
    record ending on a page boundary; returns (end of the padding, end, bodies)."""
    with open_store(root, segment_size=SEG) as store:
        log = store.commitlog
        for i in range(70):
            log.append(NewMessage(topic="T", body=b"m%04d" % i * 200))
        padded_to = log.skip_past(log.max_offset + 2 * SEG)
        probe = log.append(NewMessage(topic="T", body=b""))
        log.append(NewMessage(topic="T", body=b"p" * (mmap.PAGESIZE - 2 * probe.size)))
        assert log.max_offset % mmap.PAGESIZE == 0
        return padded_to, log.max_offset, [m.body for m in log.iter_messages()]


@pytest.mark.parametrize("crash", [False, True])
def test_the_log_reads_walks_and_recovers_without_reading_a_hole(
    tmp_path: Path, written_part_only: None, crash: bool
) -> None:
    padded_to, end, bodies = _build(tmp_path)
    if crash:
        (tmp_path / "abort").touch()
    with open_store(tmp_path) as store:
        log = store.commitlog
        assert store.recovery.cut_bytes == 0 and store.recovery.reason is None
        assert log.max_offset == end
        segments = log._segments
        assert [s.backed for s in segments[1:4]] == [
            segments[1].backed,
            mmap.PAGESIZE,  # a blank record at 0, then a hole to the end
            mmap.PAGESIZE,
        ]
        assert segments[1].backed < SEG and segments[-1].backed == end % SEG
        # Read as an HA master sends it, padding included: zeros past each blank marker.
        data = bytearray()
        while len(data) < end:
            data += log.read(len(data), 10_000)
        assert len(data) == end
        assert not any(data[padded_to - SEG + mmap.PAGESIZE : padded_to])
        messages = list(log.iter_messages())
        assert [m.body for m in messages] == bodies
        assert log.last_record() == (messages[-1].physical_offset, messages[-1].store_timestamp)
        assert log.boundaries_around(padded_to - 100) == (padded_to - SEG, padded_to)
        # Cutting into padding zeroes only what was written (the hole reads as zeros).
        log.truncate(padded_to - SEG + 4)
        assert log.max_offset == padded_to - SEG + 4
    with open_store(tmp_path) as store:
        assert store.recovery.reason == "bad-magic"  # what is left of the blank marker
        assert store.commitlog.max_offset == padded_to - SEG


def test_a_torn_record_running_into_a_hole_is_cut_as_torn(
    tmp_path: Path, written_part_only: None
) -> None:
    """A record whose head was written but whose rest never was (a power cut between the
    pages of one write): recovery cuts it, and names it what it is."""
    with open_store(tmp_path, segment_size=SEG) as store:
        first = store.commitlog.append(NewMessage(topic="T", body=b"a"))
        torn = store.commitlog.append(NewMessage(topic="T", body=b"b" * 3 * mmap.PAGESIZE))
    segment = tmp_path / "commitlog" / f"{0:020d}"
    with segment.open("r+b") as f:  # punch the record's last page out: a hole again
        data = bytearray(f.read())
    page_end = -(-(torn.physical_offset + 8) // mmap.PAGESIZE) * mmap.PAGESIZE
    segment.unlink()
    with segment.open("wb") as f:
        f.truncate(SEG)
        f.write(data[:page_end])
    (tmp_path / "abort").touch()
    with open_store(tmp_path) as store:
        assert store.commitlog.max_offset == first.physical_offset + first.size
        assert store.recovery.reason == "torn-record"
