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
from trioha.store._message import (
    BLANK_MAGIC,
    MESSAGE_MAGIC,
    MESSAGE_MAGIC_V2,
    DecodedBlank,
    DecodedIncomplete,
    ReadableBuffer,
    RecordLayout,
    parse_before_hole,
)

__all__ = ["boundaries_around", "check_boundary", "last_record"]


class _Segment(Protocol):
    start: int
    wrote: int
    data_start: int
    backed: int

    def buffer(self) -> ReadableBuffer: ...


#: Where a record's PHYSICALOFFSET field ends (it starts at 28).
_PHYSICAL_END = 36
_MAGICS = tuple(m.to_bytes(4, "big") for m in (MESSAGE_MAGIC, MESSAGE_MAGIC_V2, BLANK_MAGIC))
#: How many places that look like a record's magic :func:`last_record` examines at most.
LAST_RECORD_CANDIDATES = 4096


def last_record(segments: Sequence[_Segment], segment_size: int) -> tuple[int, int] | None:
    """``(offset, store timestamp)`` of the last complete message of the written data, or
    None when there is none (or it cannot be told cheaply).

    A slave appends whatever bytes the master sends, cut anywhere, so its log may end in
    the middle of a record, and walking the record chain from a segment's start to its end
    costs a step per record. This looks backwards from the end instead: every message
    record holds its own PHYSICALOFFSET, so a place that holds a magic code, parses as a
    whole record (every length consistent with TOTALSIZE) and names its own offset is a
    record, and it is the last complete one when it ends exactly where the data ends, or
    where the next record (the partial one being received, or the blank that closes the
    segment) begins. Bytes inside a body that merely look like a magic code fail these
    checks and are passed over; after :data:`LAST_RECORD_CANDIDATES` of them the answer is
    None rather than a long search. Records never cross a segment end, so only the last
    segment, and the one before it when the last holds no complete record, are looked at.
    (A body made to hold a whole record stamped with the very offset it will be stored at
    could pass for one while it is being received: the answer is for a lag figure, never
    for cutting or reading the log.)
    """
    budget = LAST_RECORD_CANDIDATES
    for seg in reversed(segments[-2:]):
        buf = seg.buffer()
        lo = seg.data_start if seg is segments[0] else 0
        end = seg.wrote
        backed = seg.backed  # past it a hole: zeros, never read through the buffer
        target = end  # the record sought ends here, where the next one begins
        hi = min(end, backed)
        while budget > 0:
            at = _rfind_magic(buf, lo + 4, hi)
            if at < 0:
                break
            budget -= 1
            pos = at - 4
            hi = at + 3  # next: the occurrences before this one
            r = parse_before_hole(buf, pos, end, backed, False, seg.start)
            if type(r) is RecordLayout:
                stop = pos + r.fields[0]
                if r.fields[6] == seg.start + pos and (
                    stop == target or (target == end and 0 < end - stop < _PHYSICAL_END)
                ):
                    return seg.start + pos, int(r.fields[11])
            elif type(r) is DecodedBlank:
                if target == end and pos + r.remaining == segment_size:
                    target = pos
            elif (
                type(r) is DecodedIncomplete
                and target == end
                and pos + _PHYSICAL_END <= min(end, backed)
                and int.from_bytes(buf[pos + 28 : pos + _PHYSICAL_END], "big") == seg.start + pos
            ):
                target = pos  # the record being received: the one sought ends here
        if budget <= 0:
            return None
    return None


def _rfind_magic(buf: ReadableBuffer, lo: int, hi: int) -> int:
    """The last place in ``buf[lo:hi]`` holding one of the magic codes, or -1. Looked for
    in windows growing from *hi* backwards, so that the cost is what lies between *hi*
    and the place found, not the whole segment."""
    window = 1 << 16
    while hi - lo >= 4:
        start = max(lo, hi - window)
        at = max(buf.rfind(magic, start, hi) for magic in _MAGICS)  # type: ignore[union-attr]
        if at >= 0 or start == lo:
            return at
        hi = start + 3  # a code may straddle the window's start
        window *= 2
    return -1


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
        r = parse_before_hole(buf, at, wrote, seg.backed, False, seg.start)
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
