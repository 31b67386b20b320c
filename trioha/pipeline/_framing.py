"""Step 1 of reading a segment, framing: where each record starts.

Records sit back to back, so where one starts is known only from the size of the one before:
:func:`_chain` follows the TOTALSIZE chain (predicting runs of one size), :func:`scan_range`
and :func:`scan_records` walk a range, validating each run (:mod:`trioha.pipeline._validation`)
and stepping over damage, :func:`align_starts` gives the planner the walk positions where ranges
may begin, :func:`written_end` where a live log's data ends. The theory of operation is in
:mod:`trioha.pipeline._decode`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trioha.pipeline._decode import (
    I64,
    RECORD_PREFIX,
    Records,
    SegmentData,
    gather,
)
from trioha.pipeline._format import (
    BLANK_MAGIC,
    MESSAGE_MAGIC,
    MESSAGE_MAGIC_V2,
    MIN_RECORD_SIZE,
    Problem,
    ProblemKind,
)
from trioha.pipeline._validation import explain_record, find_record, record_layout

#: A run of this many records of one size makes :func:`_chain` predict the next ones.
_STREAK = 4
#: How many positions :func:`_chain` predicts at most in one step (it doubles up to this).
_AHEAD = 1 << 16


def _chain(sd: SegmentData, pos: int, hi: int) -> tuple[I64, int]:
    """Follow TOTALSIZE from *pos* while records look plausible and start before *hi*.

    Returns the positions followed and where the walk stopped. One hop per record in
    Python, except where records repeat one size (a producer sending same-sized messages):
    after a few such hops the next positions are predicted at that stride and confirmed
    together with one numpy gather of their heads. The chain steps from a record at p of
    size s to p + s, so the confirmed prefix (every record there of size s, with a message
    magic code, fitting in the file) is exactly what hopping would have followed; the walk
    goes on from the first position that is not, hop by hop. A failed prediction makes the
    next one wait for a longer run, so logs of varied sizes stay close to plain hopping.
    """
    data, size = sd.data, sd.size
    found: list[I64] = []
    starts: list[int] = []
    append = starts.append
    unpack = RECORD_PREFIX.unpack_from
    last_header = size - 8
    prev, streak, need, ahead = -1, 0, _STREAK, 16
    while pos < hi and pos <= last_header:
        total, magic = unpack(data, pos)
        if (magic != MESSAGE_MAGIC and magic != MESSAGE_MAGIC_V2) or not (  # noqa: PLR1714
            MIN_RECORD_SIZE <= total <= size - pos
        ):
            break
        append(pos)
        pos += total
        streak = streak + 1 if total == prev else 0
        prev = total
        if streak < need:
            continue
        count = min(ahead, (min(hi - 1, last_header) - pos) // total + 1)
        if count <= 0:
            continue
        guess = pos + total * np.arange(count, dtype=np.int64)
        heads = gather(sd.array, guess, 8).view(">u4")
        magics = heads[:, 1]
        ok = (
            (heads[:, 0] == total)
            & ((magics == MESSAGE_MAGIC) | (magics == MESSAGE_MAGIC_V2))
            & (guess + total <= size)
        )
        good = count if ok.all() else int(np.argmin(ok))
        if good:
            found.append(np.array(starts, dtype=np.int64))
            found.append(guess[:good])
            starts = []
            append = starts.append
            pos += total * good
        if good == count:
            ahead, need = min(2 * ahead, _AHEAD), _STREAK
        else:
            ahead, need, streak = 16, min(2 * need, 64), 0
    found.append(np.array(starts, dtype=np.int64))
    return (found[0] if len(found) == 1 else np.concatenate(found)), pos


def _data_end(sd: SegmentData, pos: int) -> int:
    """Just past the last non-zero byte in ``[pos, size)``; *pos* if they are all zero."""
    arr = sd.array
    step = 1 << 24
    hi = sd.size
    while hi > pos:
        lo = max(pos, hi - step)
        if not arr[lo:hi].any():  # the usual case, a preallocated file's zeros
            hi = lo
            continue
        # A copy: the file may be a live log whose tail changes under the map, and
        # flatnonzero counts, then collects, in two passes over its input.
        nz = np.flatnonzero(arr[lo:hi].copy())
        if nz.size:
            return lo + int(nz[-1]) + 1
        hi = lo
    return pos


def scan_range(sd: SegmentData, begin: int, end: int, last: bool) -> tuple[I64, list[Problem]]:
    """Starts (relative to the segment) of the valid records starting in ``[begin, end)``.

    *begin* and *end* are absolute offsets inside ``sd.segment``. Damaged regions that
    start in the range are returned as problems; see the module docstring.
    """
    records, problems = scan_records(sd, begin, end, last)
    return records.starts, problems


def scan_records(
    sd: SegmentData, begin: int, end: int, last: bool
) -> tuple[Records, list[Problem]]:
    """:func:`scan_range`, keeping the field positions validation found for decoding."""
    runs, problems, _, _ = _frame(sd, begin, end, last)
    return Records.concat(runs), problems


def _frame(
    sd: SegmentData, begin: int, end: int, last: bool
) -> tuple[list[Records], list[Problem], list[int], int | None]:
    """Walk the log from *begin*, a walk position, while positions are below *end*.

    Returns the runs of valid records, the problems, the positions where a run stopped at
    something that is not a valid record (each a walk position, where the damage handling
    starts), and the walk position reached at or past *end* (None: nothing more to read in
    the segment). A range ``[begin, end)`` owns exactly the walk positions inside it, so
    a run that stops exactly at *end* leaves what is there to the range beginning there.
    """
    seg = sd.segment
    lo, hi = begin - seg.start, end - seg.start
    problems: list[Problem] = []
    runs: list[Records] = []
    stops: list[int] = []
    pos: int | None = lo
    while pos is not None and pos < hi:
        found, stop = _chain(sd, pos, hi)
        if found.size:
            run = record_layout(sd, found)
            bad = np.flatnonzero(~run.ok)
            if bad.size:
                runs.append(run.take(slice(0, int(bad[0]))))
                stop = int(run.starts[bad[0]])
            else:
                runs.append(run)
        if stop < hi:
            stops.append(stop)
            pos = _after_run(sd, stop, last, problems)
        else:
            pos = stop
    return runs, problems, stops, pos


def align_starts(sd: SegmentData, base: int, cuts: Sequence[int], last: bool) -> list[int | None]:
    """For each offset in *cuts* (absolute, sorted), the first walk position at or after
    it, walking the segment from *base* (its start, or where its data starts); None when
    the segment holds nothing more to read there.

    A walk position is where a range may begin and read exactly what a reader coming from
    *base* would: a record start found by following TOTALSIZE from *base*, or the start of
    a damaged region the walk steps over. This is how the planner cuts a segment into
    ranges without ever guessing where a record starts from what its bytes look like: a
    message body may hold anything, including a copy of a valid record with its own
    offset.
    """
    if not cuts:
        return []
    seg = sd.segment
    runs, _, stops, after = _frame(sd, base, max(cuts) + 1, last)
    positions = np.sort(
        np.concatenate([*(r.starts for r in runs), np.array(stops, dtype=np.int64)])
    )
    out: list[int | None] = []
    for cut in cuts:
        i = int(np.searchsorted(positions, cut - seg.start, side="left"))
        if i < positions.size:
            out.append(seg.start + int(positions[i]))
        else:
            out.append(None if after is None else seg.start + after)
    return out


def _after_run(sd: SegmentData, pos: int, last: bool, problems: list[Problem]) -> int | None:
    """Deal with what stopped a run at *pos*: where to go on (None: segment done)."""
    seg = sd.segment
    left = sd.size - pos
    own = seg.start + pos
    if left <= 0:
        return None
    if left >= 8:
        total, magic = RECORD_PREFIX.unpack_from(sd.data, pos)
        if magic == BLANK_MAGIC:
            # CommitLog.doAppend: the marker's length field is what was left of the file.
            if total != seg.length - pos:
                problems.append(
                    Problem(
                        own,
                        seg.name,
                        ProblemKind.SIZE_MISMATCH,
                        left,
                        f"end-of-file marker says {total} bytes remain, but {seg.length - pos} do",
                    )
                )
            return None
        zeros = total == 0 and magic == 0
    else:
        zeros = not sd.array[pos : sd.size].any()
    nxt = find_record(sd, pos + 1, sd.size)
    if zeros:
        if nxt is None:
            if last:
                # The written data ends here (a preallocated file is zeros beyond it).
                tail = _data_end(sd, pos)
                if tail > pos:
                    problems.append(
                        Problem(
                            own,
                            seg.name,
                            ProblemKind.GAP,
                            tail - pos,
                            f"zeros at {own}, then {tail - pos} bytes of unreadable data up "
                            f"to {seg.start + tail}",
                        )
                    )
                return None
            problems.append(
                Problem(
                    own,
                    seg.name,
                    ProblemKind.GAP,
                    left,
                    f"zeros from {own} to the end of the segment, with no end-of-file "
                    "marker (RocketMQ's recovery would stop here)",
                )
            )
            return None
        problems.append(
            Problem(
                own,
                seg.name,
                ProblemKind.GAP,
                nxt - pos,
                f"{nxt - pos} bytes without a record (zeros at {own}) before the next "
                f"record at {seg.start + nxt}",
            )
        )
        return nxt
    why = explain_record(sd, pos)
    kind, detail = why if why is not None else (ProblemKind.SIZE_MISMATCH, "invalid record")
    if nxt is None:
        if last:
            claimed = RECORD_PREFIX.unpack_from(sd.data, pos)[0] if left >= 8 else 0
            # A truncated file: all its bytes are the partial record. A preallocated one:
            # the partial record ends at the last byte written (non-zero).
            tail = sd.size if claimed > left else max(_data_end(sd, pos), min(pos + 8, sd.size))
            problems.append(
                Problem(
                    own,
                    seg.name,
                    ProblemKind.TORN_TAIL,
                    tail - pos,
                    f"the log ends inside a record: {detail}; {tail - pos} bytes from {own} "
                    "to the end of the data",
                )
            )
            return None
        problems.append(
            Problem(
                own,
                seg.name,
                kind,
                left,
                f"{detail}; no readable record follows up to the end of the segment",
            )
        )
        return None
    problems.append(
        Problem(
            own,
            seg.name,
            kind,
            nxt - pos,
            f"{detail}; skipped {nxt - pos} bytes to the next record at {seg.start + nxt}",
        )
    )
    return nxt


def written_end(sd: SegmentData, begin: int | None = None) -> tuple[int, Problem | None]:
    """Where the written data of a log's last segment ends, as recovery would find it.

    The end of the last valid record (``CommitLog.recoverNormally``'s processOffset), or
    the end of the file after an end-of-file marker, whose padding replicates like data.
    The second value is the torn-tail problem if the data ends inside a record. *begin*
    (absolute) is where the data starts when not at the segment's start.
    """
    seg = sd.segment
    first = seg.start if begin is None else begin
    if sd.size <= first - seg.start:
        return first, None
    starts, problems = scan_range(sd, first, seg.start + sd.size, last=True)
    pos = first - seg.start
    if starts.size:
        pos = int(starts[-1]) + RECORD_PREFIX.unpack_from(sd.data, int(starts[-1]))[0]
    if pos + 8 <= sd.size and RECORD_PREFIX.unpack_from(sd.data, pos)[1] == BLANK_MAGIC:
        pos = sd.size
    torn = next((p for p in problems if p.kind is ProblemKind.TORN_TAIL), None)
    return seg.start + pos, torn
