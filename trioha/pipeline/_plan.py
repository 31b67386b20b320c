"""Splitting a commit log into byte ranges, one Spark partition each.

Theory of operation. A partition is a list of byte ranges ``[begin, end)`` of segment files, about
*target* bytes in all: a segment larger than the target (RocketMQ's default is 1 GiB) is cut into
equal pieces of at most the target, and small segments are packed together. A record belongs to the
range in which it *starts*; its bytes may run past ``end`` and the reader follows them there. A
range that begins at a segment's start begins at a record (or at the end-of-file marker, or at
zeros). A range that begins inside a segment does not know where its first record is: the reader
scans forward for the first position ``p`` that holds a message magic code, a plausible total size,
and at byte 28 the physical offset ``segment start + p`` (a record stores its own offset,
docs/rocketmq-protocol.md §4.1). The previous range reads its last record up to exactly that
position, so every record is read once.

Pure Python: the planner runs on the Spark driver inside ``DataSourceReader.partitions``.
"""

from __future__ import annotations

import attrs

from trioha.pipeline._format import Problem
from trioha.pipeline._layout import LogLayout, Segment

MIB = 1 << 20
#: Partitions aim at this many bytes (the issue asks for about 64–128 MiB).
DEFAULT_PARTITION_BYTES = 128 * MIB


@attrs.frozen
class ScanRange:
    """Records that start at offsets in ``[begin, end)`` of *segment*.

    *last* says the segment is the log's last file, where zeros or a partial record mean
    "the written data ends here" rather than damage.
    """

    segment: Segment
    begin: int
    end: int
    last: bool

    def __attrs_post_init__(self) -> None:
        if not self.segment.start <= self.begin < self.end <= self.segment.end:
            raise ValueError(f"range [{self.begin}, {self.end}) is not inside {self.segment}")

    @property
    def at_segment_start(self) -> bool:
        return self.begin == self.segment.start

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@attrs.frozen
class ScanPartition:
    """What one Spark task reads: its ranges in offset order, plus problems found up front.

    *problems* carries the directory-level findings (holes, wrong file lengths) so that they
    appear once, in the first partition, in the ``problems`` output.
    """

    index: int
    ranges: tuple[ScanRange, ...]
    problems: tuple[Problem, ...] = ()

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.ranges)


def plan_partitions(
    layout: LogLayout,
    *,
    target_bytes: int = DEFAULT_PARTITION_BYTES,
    start_offset: int | None = None,
    end_offset: int | None = None,
) -> tuple[ScanPartition, ...]:
    """Cut *layout* into partitions of about *target_bytes*, limited to the offset range.

    Records starting in ``[start_offset, end_offset)`` are read; either bound may be None.
    Layout problems outside that range are left out.
    """
    if target_bytes <= 0:
        raise ValueError(f"target_bytes must be positive, got {target_bytes}")
    lo = max(0 if start_offset is None else start_offset, layout.min_offset)
    hi = layout.file_end if end_offset is None else end_offset
    pieces: list[ScanRange] = []
    for i, seg in enumerate(layout.segments):
        begin, end = max(seg.start, lo), min(seg.end, hi)
        if begin >= end:
            continue
        last = i == len(layout.segments) - 1
        count = -(-(end - begin) // target_bytes)  # ceiling division
        step = -(-(end - begin) // count)
        pieces.extend(
            ScanRange(seg, b, min(b + step, end), last) for b in range(begin, end, step)
        )

    groups: list[list[ScanRange]] = []
    size = 0
    for piece in pieces:
        if not groups or size + piece.nbytes > target_bytes:
            groups.append([])
            size = 0
        groups[-1].append(piece)
        size += piece.nbytes

    problems = tuple(
        p for p in layout.problems if p.offset < hi and p.offset + max(p.length, 1) > lo
    )
    if not groups and problems:
        groups.append([])
    return tuple(
        ScanPartition(i, tuple(g), problems if i == 0 else ()) for i, g in enumerate(groups)
    )
