"""Splitting a commit log into byte ranges, one Spark partition each.

Theory of operation. A partition is a list of byte ranges ``[begin, end)`` of segment files,
about *target* bytes in all: a segment larger than the target (RocketMQ's default is 1 GiB)
is cut into about equal pieces of at most the target, and small segments are packed
together. A record belongs to the range in which it *starts*; its bytes may run past ``end``
and the reader follows them there.

Every range begins exactly at a record start (or at the damaged region, end-of-file marker
or zeros the record chain runs into): after cutting a segment arithmetically, the planner
follows the TOTALSIZE chain from the segment's start to each cut and moves the cut to the
first position the chain reaches at or after it (:func:`trioha.pipeline._framing.align_starts`).
That costs one hop per record on the driver, reading only record heads (fewer where
records repeat one size: :func:`trioha.pipeline._framing._chain`), and it never
depends on what a message body contains: a body may hold a perfect copy of a record, own
offset included, and still is read as one body. ``startOffset`` is moved the same way.

The arithmetic is pure Python; aligning the cuts needs numpy (the ``spark`` extra), which
the driver of a Spark job has. The planner runs inside ``DataSourceReader.partitions``.
"""

from __future__ import annotations

import attrs

from trioha._errors import PipelineError
from trioha.pipeline._format import Problem
from trioha.pipeline._layout import LogLayout, Segment

MIB = 1 << 20
#: Partitions aim at this many bytes: big enough that a task's fixed cost is small beside its
#: scan, small enough that a few cores share a log evenly (docs/pipeline.md, "Speed").
DEFAULT_PARTITION_BYTES = 128 * MIB


@attrs.frozen
class ScanRange:
    """Records that start at offsets in ``[begin, end)`` of *segment*.

    *begin* is a walk position (see the module docstring): the reader starts following
    the record chain there.

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
    exact: bool = True,
) -> tuple[ScanPartition, ...]:
    """Cut *layout* into partitions of about *target_bytes*, limited to the offset range.

    Records starting in ``[start_offset, end_offset)`` are read; either bound may be None.
    Layout problems outside that range are left out. *exact* (the default) moves every cut
    to a record start by reading the segments; ``exact=False`` only does the arithmetic
    (for tests of it, on layouts that have no files).
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
        cuts: list[int | None] = list(range(begin, end, step))
        if exact:
            base = max(seg.start, layout.min_offset)
            cuts = _align(seg, base, [c for c in cuts if c is not None], last)
        starts = sorted({c for c in cuts if c is not None and c < end})
        pieces.extend(
            ScanRange(seg, b, e, last) for b, e in zip(starts, [*starts[1:], end], strict=False)
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


def _align(seg: Segment, base: int, cuts: list[int], last: bool) -> list[int | None]:
    from trioha.pipeline._decode import open_segment
    from trioha.pipeline._framing import align_starts

    try:
        with open_segment(seg) as sd:
            return align_starts(sd, base, cuts, last)
    except OSError as exc:
        raise PipelineError(f"cannot read segment {seg.path} while planning: {exc}") from exc
