"""Message boundaries: where a commit log may be cut without splitting a record.

RocketMQ cuts a replica back with ``CommitLog.truncateDirtyFiles`` (the 5.x AutoSwitch slave
does it at the consistent point its ``findConsistentPoint`` computes) and only ever at an
offset its master reported as a message end. A cut anywhere else would leave half a record
at the end of the log; the next append (replicated or local) would then splice a new
history onto it, which is exactly the silent corruption a replica must never suffer. So the
safe truncation refuses any offset that is not a boundary, and says which boundaries are
nearest so that an operator can pick one.

A boundary is the start of the log, the start of any record (message or blank end-of-file
marker), the end of a segment, or the log's written end. Finding out needs a walk of the
records of the one segment that holds the offset, from the segment's first record; CRCs
are not checked (recovery already did).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from trioha._errors import NotAMessageBoundaryError
from trioha.store._message import DecodedBlank, ReadableBuffer, RecordLayout, parse_record

__all__ = ["boundaries_around", "check_boundary"]


class _Segment(Protocol):
    start: int
    wrote: int
    data_start: int

    def buffer(self) -> ReadableBuffer: ...


def boundaries_around(
    segments: Sequence[_Segment], segment_size: int, offset: int
) -> tuple[int, int | None]:
    """The nearest boundaries ``before <= offset <= after`` (equal when ``offset`` is one).

    ``after`` is ``None`` when no boundary follows ``offset`` in the written data: the bytes
    from ``before`` on are not a readable record (a half-received last message, or damage).
    ``offset`` must lie inside the written range of ``segments``.
    """
    if not segments:
        return offset, offset
    last = segments[-1]
    end = last.start + last.wrote
    seg = segments[0]
    for s in segments:
        if s.start <= offset:
            seg = s
    pos = offset - seg.start
    if offset >= end or pos == 0 or (pos == seg.data_start and seg is segments[0]):
        return offset, offset
    buf = seg.buffer()
    wrote = seg.wrote
    at = seg.data_start if seg is segments[0] else 0
    while at < wrote:
        if at == pos:
            return offset, offset
        r = parse_record(buf, at, wrote, False, seg.start)
        if type(r) is RecordLayout:
            step = r.fields[0]
            if at + step > pos:
                return seg.start + at, seg.start + at + step
            at += step
        elif type(r) is DecodedBlank:
            # The marker's start and the segment's end; the padding between is no boundary.
            return seg.start + at, seg.start + segment_size
        else:
            return seg.start + at, None
    return seg.start + at, None  # not reached: ``pos`` lies inside the written bytes


def check_boundary(segments: Sequence[_Segment], segment_size: int, offset: int) -> None:
    """Raise :class:`NotAMessageBoundaryError` unless ``offset`` is a boundary."""
    before, after = boundaries_around(segments, segment_size, offset)
    if before == offset:
        return
    nearest = (
        f"the nearest boundaries are {before} and {after}"
        if after is not None
        else f"the nearest boundary before it is {before} (no readable record follows it)"
    )
    raise NotAMessageBoundaryError(
        f"refusing to truncate the commit log at {offset}: it is not a message boundary "
        f"({nearest}); a cut inside a record would splice two histories",
        offset=offset,
        before=before,
        after=after,
    )
