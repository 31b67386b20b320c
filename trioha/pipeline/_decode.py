"""Vectorised reading of commit log segments: framing, validation, fields, Arrow batches.

Theory of operation. Reading a byte range of a segment has three steps.

1. **Framing** (:func:`scan_range`). Records sit back to back, so where one starts is known
   only from the size of the one before: a tight loop follows the TOTALSIZE chain (the one
   per-record Python step, a few hundred nanoseconds each; where records repeat one size,
   the next positions are predicted at that stride and confirmed by one gather of their
   heads, which is exactly the chain, see :func:`_chain`). It stops at the end-of-file
   marker, at zeros, at anything that is not a plausible record, or once past the range.
   A range always begins at a *walk position*, one that following the chain from the
   segment's start reaches (:func:`align_starts`, run by the planner on the driver), and
   owns the walk positions inside it: whatever stops a run at a position inside the range
   is reported by that range, whatever is at its end by the next one. So every record is
   read and every region reported exactly once, however the log is cut into ranges, and
   nothing depends on what the bytes inside a message body look like.
2. **Validation** (vectorised). For all the records of a run at once, numpy gathers their
   headers and checks what ``CommitLog.checkMessageAndReturnSize`` checks: the
   magic code, that the body/topic/properties lengths add up to TOTALSIZE, plus that the
   stored physical offset is the record's own. The first record that fails ends the run; a
   scalar twin of the check (:func:`explain_record`) says why, the region is reported as a
   :class:`Problem`, and reading resumes at the next valid record after the damage
   (:func:`find_record`, the only place that looks for a record by its contents: after
   damage there is no chain left to follow).
3. **Decoding** (:func:`decode_batch`, vectorised). Fixed fields come from a structured
   numpy view of the gathered headers; bodies, topics and properties are cut out of the
   segment by Arrow's ``take`` over a zero-copy array whose value boundaries are the field
   boundaries; properties are split into a map with Arrow compute kernels; hosts are
   rendered once per distinct value. Out comes a ``pyarrow.RecordBatch`` in the schema the
   Spark data source declares.

The plain-Python reference is the store's codec (``trioha.store._message``); the tests check
that both agree field by field on the same logs.
"""

from __future__ import annotations

import contextlib
import ipaddress
import mmap
import os
import struct
import zlib
from collections.abc import Iterator, Sequence
from typing import Any, TypeAlias

import attrs
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from trioha.pipeline._format import (
    BLANK_MAGIC,
    COMPRESSION_NAMES,
    CRC_MASK,
    MESSAGE_MAGIC,
    MESSAGE_MAGIC_V2,
    MIN_RECORD_SIZE,
    NAME_VALUE_SEPARATOR,
    POS_BODY_CRC,
    POS_PHYSICAL_OFFSET,
    POS_SYSFLAG,
    PROPERTY_KEYS,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    SYSFLAG_COMPRESSED,
    SYSFLAG_COMPRESSION_MASK,
    SYSFLAG_COMPRESSION_SHIFT,
    Problem,
    ProblemKind,
)
from trioha.pipeline._layout import Segment

I64: TypeAlias = npt.NDArray[np.int64]
U8: TypeAlias = npt.NDArray[np.uint8]
Bools: TypeAlias = npt.NDArray[np.bool_]
Buffer: TypeAlias = mmap.mmap | bytes

_PREFIX = struct.Struct(">iI")  # TOTALSIZE, MAGICCODE
#: The first three bytes both message magics share: where resuming after damage looks.
_MAGIC_PREFIX = MESSAGE_MAGIC.to_bytes(4, "big")[:3]
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")

#: Spark's supported timestamp range in milliseconds (0001-01-01 to 9999-12-31 UTC).
_MIN_MILLIS = -62_135_596_800_000
_MAX_MILLIS = 253_402_300_799_999

# --- schemas -----------------------------------------------------------------------------

_TIMESTAMP = pa.timestamp("us", tz="UTC")

#: What a messages batch looks like: ``to_arrow_schema`` of the data source's Spark schema
#: (a test holds the two together).
MESSAGE_ARROW_SCHEMA = pa.schema(
    [
        pa.field("physical_offset", pa.int64(), nullable=False),
        pa.field("size", pa.int32(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("queue_id", pa.int32(), nullable=False),
        pa.field("queue_offset", pa.int64(), nullable=False),
        pa.field("tags", pa.string()),
        pa.field("keys", pa.string()),
        pa.field("born_timestamp", _TIMESTAMP),
        pa.field("born_host", pa.string(), nullable=False),
        pa.field("store_timestamp", _TIMESTAMP),
        pa.field("store_host", pa.string(), nullable=False),
        pa.field("sysflag", pa.int32(), nullable=False),
        pa.field("flag", pa.int32(), nullable=False),
        pa.field("body_crc", pa.int32(), nullable=False),
        pa.field("reconsume_times", pa.int32(), nullable=False),
        pa.field("prepared_transaction_offset", pa.int64(), nullable=False),
        pa.field("magic_code", pa.int64(), nullable=False),
        pa.field("properties", pa.map_(pa.string(), pa.string()), nullable=False),
        pa.field("body", pa.binary(), nullable=False),
        pa.field("msg_id", pa.string(), nullable=False),
        pa.field("compressed", pa.bool_(), nullable=False),
        pa.field("compression", pa.string()),
    ]
)

PROBLEM_ARROW_SCHEMA = pa.schema(
    [
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("segment", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("length", pa.int64(), nullable=False),
        pa.field("detail", pa.string(), nullable=False),
    ]
)


# --- segment bytes -----------------------------------------------------------------------


@attrs.define
class SegmentData:
    """The readable bytes of one segment file: a buffer for ``find`` and a numpy view.

    *size* may be less than ``segment.length`` when the file shrank since planning.
    """

    segment: Segment
    data: Buffer
    array: U8
    size: int

    @classmethod
    def from_bytes(cls, segment: Segment, data: bytes) -> SegmentData:
        """In-memory bytes standing for the segment (tests, and the audit's pinpointing)."""
        return cls(segment, data, np.frombuffer(data, dtype=np.uint8), len(data))


@contextlib.contextmanager
def open_segment(segment: Segment) -> Iterator[SegmentData]:
    """Map *segment* read-only for the duration of the block (at most its planned length)."""
    with open(segment.path, "rb") as f:
        size = min(os.fstat(f.fileno()).st_size, segment.length)
        if size <= 0:
            yield SegmentData.from_bytes(segment, b"")
            return
        mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
        view = SegmentData(segment, mm, np.frombuffer(mm, dtype=np.uint8), size)
        try:
            yield view
        finally:
            view.array = np.empty(0, dtype=np.uint8)
            with contextlib.suppress(BufferError):
                # A caller still holding a view of the map keeps it open until collected.
                mm.close()


# --- vectorised layout ---------------------------------------------------------------------


def _head_dtype(born: int, store: int) -> np.dtype[Any]:
    """The record head, TOTALSIZE to the body length, for host address sizes (4 or 16)."""
    return np.dtype(
        [
            ("size", ">i4"),
            ("magic", ">u4"),
            ("body_crc", ">i4"),
            ("queue_id", ">i4"),
            ("flag", ">i4"),
            ("queue_offset", ">i8"),
            ("physical_offset", ">i8"),
            ("sysflag", ">i4"),
            ("born_timestamp", ">i8"),
            ("born_addr", "u1", (born,)),
            ("born_port", ">i4"),
            ("store_timestamp", ">i8"),
            ("store_addr", "u1", (store,)),
            ("store_port", ">i4"),
            ("reconsume_times", ">i4"),
            ("prepared_transaction_offset", ">i8"),
            ("body_len", ">i4"),
        ]
    )


#: The first 40 bytes, the same for every record: what validation reads at once.
_FIXED = np.dtype(
    {
        "names": ["size", "magic", "physical_offset", "sysflag"],
        "formats": [">i4", ">u4", ">i8", ">i4"],
        "offsets": [0, 4, POS_PHYSICAL_OFFSET, POS_SYSFLAG],
        "itemsize": POS_SYSFLAG + 4,
    }
)

# Indexed by (sysflag >> 4) & 3, like the store's _HEADS: bit 0 born host IPv6, bit 1 store.
_HEADS = tuple(_head_dtype(b, s) for b, s in ((4, 4), (16, 4), (4, 16), (16, 16)))
_HEAD_SIZES = np.array([d.itemsize for d in _HEADS], dtype=np.int64)  # 88, 100, 100, 112
_SCALAR_FIELDS = (
    "size",
    "magic",
    "body_crc",
    "queue_id",
    "flag",
    "queue_offset",
    "physical_offset",
    "sysflag",
    "born_timestamp",
    "born_port",
    "store_timestamp",
    "store_port",
    "reconsume_times",
    "prepared_transaction_offset",
    "body_len",
)


def _gather(arr: U8, pos: I64, width: int) -> U8:
    """``arr[pos[i] : pos[i] + width]`` for every i, as an (n, width) array.

    Rows of a zero-copy sliding window over the buffer, so numpy copies *width* bytes per
    position in one call. Positions are clipped into the buffer: an invalid record may
    point anywhere, and its garbage is discarded by the validity mask, never read out of
    bounds.
    """
    if arr.size < width:
        arr = np.concatenate([arr, np.zeros(width - arr.size, dtype=np.uint8)])
    windows = np.lib.stride_tricks.as_strided(
        arr, shape=(arr.size - width + 1, width), strides=(1, 1), writeable=False
    )
    out: U8 = windows[np.clip(pos, 0, arr.size - width)]
    return out


def _int(arr: U8, pos: I64, dtype: str) -> I64:
    """Big-endian integers of *dtype* (``>i4``, ``>u4``, ...) at every position."""
    width = np.dtype(dtype).itemsize
    return _gather(arr, pos, width).view(dtype)[:, 0].astype(np.int64)


@attrs.frozen
class Records:
    """Where the fields of n records are, and which are valid (positions relative to
    the segment): what validation learns and decoding reuses."""

    starts: I64
    size: I64
    magic: I64
    family: I64  # (sysflag >> 4) & 3: bit 0 born host IPv6, bit 1 store host IPv6
    body_pos: I64
    body_len: I64
    topic_pos: I64
    topic_len: I64
    props_pos: I64
    props_len: I64
    ok: Bools

    def __len__(self) -> int:
        return int(self.starts.size)

    def take(self, sel: slice) -> Records:
        return Records(*(getattr(self, f.name)[sel] for f in attrs.fields(Records)))

    @classmethod
    def concat(cls, parts: list[Records]) -> Records:
        if len(parts) == 1:
            return parts[0]
        if not parts:
            e = np.empty(0, dtype=np.int64)
            return cls(e, e, e, e, e, e, e, e, e, e, np.empty(0, dtype=np.bool_))
        return cls(
            *(np.concatenate([getattr(p, f.name) for p in parts]) for f in attrs.fields(cls))
        )


def _layout(sd: SegmentData, starts: I64) -> Records:
    """Check every record starting at *starts* (see :func:`explain_record`).

    Only the words the check needs are gathered (TOTALSIZE, magic, physical offset,
    sysflag and the three lengths), so validating a run costs a few small gathers.
    """
    arr = sd.array
    fixed = _gather(arr, starts, _FIXED.itemsize).view(_FIXED)[:, 0]
    size = fixed["size"].astype(np.int64)
    magic = fixed["magic"].astype(np.int64)
    physical = fixed["physical_offset"].astype(np.int64)
    family = (fixed["sysflag"].astype(np.int64) >> 4) & 3
    rec_end = starts + size
    v2 = magic == MESSAGE_MAGIC_V2
    tl_width = np.where(v2, 2, 1)
    hsize = _HEAD_SIZES[family]
    ok = (
        ((magic == MESSAGE_MAGIC) | v2)
        & (size >= MIN_RECORD_SIZE)
        & (size <= sd.size - starts)
        & (physical == sd.segment.start + starts)
        & (hsize <= size)
    )
    body_pos = starts + hsize
    body_len = _int(arr, body_pos - 4, ">i4")
    ok &= body_len >= 0
    body_end = body_pos + np.maximum(body_len, 0)
    ok &= body_end + tl_width <= rec_end
    topic_len = np.where(v2, _int(arr, body_end, ">i2"), _int(arr, body_end, "i1"))
    ok &= topic_len >= 0
    topic_pos = body_end + tl_width
    topic_end = topic_pos + np.maximum(topic_len, 0)
    ok &= topic_end + 2 <= rec_end
    props_len = _int(arr, topic_end, ">i2")
    ok &= props_len >= 0
    ok &= topic_end + 2 + props_len == rec_end
    return Records(
        starts,
        size,
        magic,
        family,
        body_pos,
        body_len,
        topic_pos,
        topic_len,
        topic_end + 2,
        props_len,
        ok,
    )


def _decode_head(sd: SegmentData, r: Records) -> dict[str, Any]:
    """The fixed fields of valid records, through a structured view of their heads."""
    arr = sd.array
    n = r.starts.size
    head: dict[str, Any] = {}
    born_addr = np.zeros((n, 16), dtype=np.uint8)
    store_addr = np.zeros((n, 16), dtype=np.uint8)
    families = [0] if not r.family.any() else np.unique(r.family).tolist()
    for fam in families:
        dt = _HEADS[fam]
        if len(families) == 1:
            sel: slice | Bools = slice(None)
            rows = _gather(arr, r.starts, dt.itemsize).view(dt)[:, 0]
        else:
            sel = r.family == fam
            rows = _gather(arr, r.starts[sel], dt.itemsize).view(dt)[:, 0]
        for name in _SCALAR_FIELDS:
            col = head.get(name)
            if col is None:
                col = head[name] = np.empty(n, dtype=np.int64)
            col[sel] = rows[name]
        b, s = rows["born_addr"], rows["store_addr"]
        born_addr[sel, : b.shape[1]] = b
        store_addr[sel, : s.shape[1]] = s
    head["born_addr"] = born_addr
    head["store_addr"] = store_addr
    return head


# --- scalar checks ------------------------------------------------------------------------


def explain_record(sd: SegmentData, pos: int) -> tuple[ProblemKind, str] | None:
    """Why the record at *pos* (relative) is not valid, or None if it is.

    The scalar twin of the vectorised check in ``_layout``; same conditions, same order.
    """
    data = sd.data
    left = sd.size - pos
    own = sd.segment.start + pos
    if left < 8:
        return ProblemKind.SIZE_MISMATCH, f"only {left} bytes left, too few for a record header"
    size, magic = _PREFIX.unpack_from(data, pos)
    if magic not in (MESSAGE_MAGIC, MESSAGE_MAGIC_V2):
        return ProblemKind.BAD_MAGIC, (
            f"magic code {magic:#010x} is neither a message's ({MESSAGE_MAGIC:#010x} or "
            f"{MESSAGE_MAGIC_V2:#010x}) nor the end-of-file marker's ({BLANK_MAGIC:#010x})"
        )
    if size < MIN_RECORD_SIZE:
        return ProblemKind.SIZE_MISMATCH, (
            f"total size {size} is below the smallest record ({MIN_RECORD_SIZE} bytes)"
        )
    if size > left:
        return ProblemKind.SIZE_MISMATCH, (
            f"total size {size} runs past the end of the file ({left} bytes left)"
        )
    stored = _I64.unpack_from(data, pos + POS_PHYSICAL_OFFSET)[0]
    if stored != own:
        return ProblemKind.OFFSET_MISMATCH, (
            f"stored physical offset {stored} is not the record's own offset {own}"
        )
    sysflag = _I32.unpack_from(data, pos + POS_SYSFLAG)[0]
    hsize = int(_HEAD_SIZES[(sysflag >> 4) & 3])
    end = pos + size
    if hsize > size:
        return ProblemKind.SIZE_MISMATCH, f"total size {size} is less than its header ({hsize})"
    body_len = _I32.unpack_from(data, pos + hsize - 4)[0]
    if body_len < 0:
        return ProblemKind.SIZE_MISMATCH, f"negative body length {body_len}"
    body_end = pos + hsize + body_len
    tl_width = 2 if magic == MESSAGE_MAGIC_V2 else 1
    if body_end + tl_width > end:
        return ProblemKind.SIZE_MISMATCH, (
            f"total size {size} is too short for the body length {body_len}"
        )
    topic_len = _I16.unpack_from(data, body_end)[0] if tl_width == 2 else _signed8(data, body_end)
    if topic_len < 0:
        return ProblemKind.SIZE_MISMATCH, f"negative topic length {topic_len}"
    topic_end = body_end + tl_width + topic_len
    if topic_end + 2 > end:
        return ProblemKind.SIZE_MISMATCH, (
            f"total size {size} is too short for the topic length {topic_len}"
        )
    props_len = _I16.unpack_from(data, topic_end)[0]
    if props_len < 0:
        return ProblemKind.SIZE_MISMATCH, f"negative properties length {props_len}"
    if topic_end + 2 + props_len != end:
        return ProblemKind.SIZE_MISMATCH, (
            f"total size {size}, but the fields add up to {topic_end + 2 + props_len - pos}"
        )
    return None


def _signed8(data: Buffer, pos: int) -> int:
    value = data[pos]
    return value - 256 if value > 127 else value


def find_record(sd: SegmentData, lo: int, hi: int) -> int | None:
    """The first position in ``[lo, hi)`` (relative) holding a valid record, or None.

    A candidate has a message magic code at +4 (found with ``find``, which runs at memory
    speed), and passes :func:`explain_record`, which includes "the stored physical offset
    is this very position": a body that merely contains the magic bytes never passes.
    """
    data = sd.data
    stop = min(hi + 4 + len(_MAGIC_PREFIX), sd.size)
    at = lo + 4
    while True:
        q = data.find(_MAGIC_PREFIX, at, stop)
        if q < 0 or q - 4 >= hi:
            return None
        if explain_record(sd, q - 4) is None:
            return q - 4
        at = q + 1


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
    unpack = _PREFIX.unpack_from
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
        heads = _gather(sd.array, guess, 8).view(">u4")
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


# --- framing ------------------------------------------------------------------------------


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
            run = _layout(sd, found)
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
        total, magic = _PREFIX.unpack_from(sd.data, pos)
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
            claimed = _PREFIX.unpack_from(sd.data, pos)[0] if left >= 8 else 0
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
        pos = int(starts[-1]) + _PREFIX.unpack_from(sd.data, int(starts[-1]))[0]
    if pos + 8 <= sd.size and _PREFIX.unpack_from(sd.data, pos)[1] == BLANK_MAGIC:
        pos = sd.size
    torn = next((p for p in problems if p.kind is ProblemKind.TORN_TAIL), None)
    return seg.start + pos, torn


# --- decoding -----------------------------------------------------------------------------


def _slices(buf: U8, starts: I64, ends: I64) -> pa.BinaryArray:
    """``buf[starts[i]:ends[i]]`` for every i as one binary array, in a single copy.

    The slices are in order and do not overlap, so ``starts[0], ends[0], starts[1], ...``
    are the value boundaries of a zero-copy array over *buf* whose even values are the
    slices; Arrow's ``take`` of those copies them out.
    """
    n = starts.size
    if n == 0:
        return pa.array([], type=pa.binary())
    base = int(starts[0])
    top = int(ends[-1])
    offsets = np.empty(2 * n, dtype=np.int32)
    offsets[0::2] = starts - base
    offsets[1::2] = ends - base
    pieces = pa.Array.from_buffers(
        pa.binary(), 2 * n - 1, [None, pa.py_buffer(offsets), pa.py_buffer(buf[base:top])]
    )
    taken: pa.BinaryArray = pieces.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int64)))
    return taken


def _utf8(arr: pa.BinaryArray) -> pa.StringArray:
    """The values as UTF-8 strings; malformed bytes are replaced, as the store decodes."""
    strings: pa.StringArray = arr.view(pa.string())
    try:
        strings.validate(full=True)
    except pa.ArrowInvalid:
        raw: list[bytes] = arr.to_pylist()
        return pa.array([b.decode("utf-8", "replace") for b in raw], type=pa.string())
    return strings


def _properties(props: pa.StringArray) -> tuple[pa.MapArray, pa.StringArray, pa.StringArray]:
    """``MessageDecoder.string2messageProperties`` for every record, as a map column, and
    the ``TAGS`` and ``KEYS`` values (null when absent).

    Pairs are split at ``\\x02``, then at the first ``\\x01``; a pair with an empty key or
    value is skipped and a later duplicate key wins, as in Java's ``HashMap``.
    """
    n = len(props)
    parts = pc.split_pattern(props, PROPERTY_SEPARATOR)
    flat: pa.StringArray = parts.flatten()
    parent = pc.list_parent_indices(parts).to_numpy(zero_copy_only=False).astype(np.int64)
    sep = pc.find_substring(flat, NAME_VALUE_SEPARATOR).to_numpy(zero_copy_only=False)
    bounds = np.frombuffer(flat.buffers()[1], dtype=np.int32)[
        flat.offset : flat.offset + len(flat) + 1
    ].astype(np.int64)
    length = bounds[1:] - bounds[:-1]
    keep = (sep > 0) & (sep < length - 1)
    keep_idx = np.arange(len(flat)) if keep.all() else np.flatnonzero(keep)
    starts = bounds[:-1][keep_idx]
    cuts = starts + sep[keep_idx]
    ends = bounds[1:][keep_idx]
    rec = parent[keep_idx]
    data_buf = flat.buffers()[2]
    data = np.empty(0, np.uint8) if data_buf is None else np.frombuffer(data_buf, dtype=np.uint8)
    keys = _slices(data, starts, cuts).view(pa.string())
    values = _slices(data, cuts + 1, ends).view(pa.string())
    if len(keys) > 1:
        codes = pc.dictionary_encode(keys).indices.to_numpy(zero_copy_only=False)
        combined = rec * (int(codes.max()) + 1) + codes
        if _has_duplicates(combined):
            # Keep the last pair of each (record, key): sort stably, take each group's end.
            order = np.argsort(combined, kind="stable")
            ordered = combined[order]
            last = np.ones(ordered.size, dtype=np.bool_)
            last[:-1] = ordered[1:] != ordered[:-1]
            chosen = np.sort(order[last])
            keys, values, rec = keys.take(chosen), values.take(chosen), rec[chosen]
    counts = np.bincount(rec, minlength=n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    result: pa.MapArray = pa.MapArray.from_arrays(pa.array(offsets), keys, values)
    return (
        result,
        _lookup(keys, values, rec, n, PROPERTY_TAGS),
        _lookup(keys, values, rec, n, PROPERTY_KEYS),
    )


def _has_duplicates(values: I64) -> bool:
    """Whether any value repeats (counting when the range is small, sorting otherwise)."""
    top = int(values.max()) + 1
    if top <= 8 * values.size + 1024:
        return bool(np.bincount(values, minlength=top).max() > 1)
    return bool(np.unique(values).size != values.size)


def _lookup(
    keys: pa.StringArray, values: pa.StringArray, rec: I64, n: int, name: str
) -> pa.StringArray:
    """The value of property *name* per record (keys are unique per record by now)."""
    hits = np.flatnonzero(pc.equal(keys, name).to_numpy(zero_copy_only=False))
    index = np.zeros(n, dtype=np.int64)
    index[rec[hits]] = hits
    missing = np.ones(n, dtype=np.bool_)
    missing[rec[hits]] = False
    found: pa.StringArray = values.take(pa.array(index, mask=missing))
    return found


def _hosts(addr: U8, port: I64, v6: Bools) -> pa.StringArray:
    """``ip:port`` (``[ip]:port`` for IPv6) per record, rendered once per distinct host."""
    n = port.size
    labels = np.empty(n, dtype=np.int64)
    texts: list[str] = []
    v4 = ~v6
    if v4.any():
        a4 = np.ascontiguousarray(addr[v4, :4]).view(">u4")[:, 0].astype(np.uint64)
        key = (a4 << np.uint64(32)) | (port[v4].astype(np.uint64) & np.uint64(0xFFFFFFFF))
        if (key == key[0]).all():  # the common case: one producer, one broker
            uniq, inverse = key[:1], np.zeros(key.size, dtype=np.int64)
        else:
            uniq, inverse = np.unique(key, return_inverse=True)
        labels[v4] = inverse.ravel()
        for k in uniq.tolist():
            p = k & 0xFFFFFFFF
            texts.append(f"{ipaddress.IPv4Address(k >> 32)}:{p - (1 << 32) if p >> 31 else p}")
    if v6.any():
        seen: dict[tuple[bytes, int], int] = {}
        idx = np.flatnonzero(v6)
        for i, raw, p in zip(idx.tolist(), addr[v6].tolist(), port[v6].tolist(), strict=True):
            k6 = (bytes(raw), p)
            label = seen.get(k6)
            if label is None:
                label = seen[k6] = len(texts)
                texts.append(f"[{ipaddress.IPv6Address(k6[0])}]:{p}")
            labels[i] = label
    table: pa.StringArray = pa.array(texts, type=pa.string()).take(pa.array(labels))
    return table


def _timestamps(millis: I64) -> pa.TimestampArray:
    """Milliseconds as Spark timestamps (microseconds, UTC); null outside Spark's range."""
    valid = (millis >= _MIN_MILLIS) & (millis <= _MAX_MILLIS)
    micros = np.where(valid, millis, 0) * 1000
    return pa.array(micros, type=_TIMESTAMP, mask=None if valid.all() else ~valid)


def _msg_ids(addr: U8, port: I64, physical: I64, v6: Bools) -> pa.StringArray:
    """``MessageDecoder.createMessageId`` per record: upper-case hex of the store host's
    address (4 or 16 bytes), its port (int32) and the physical offset (int64).

    Built as one character matrix (56 columns, IPv4 rows use the first 32) and cut into
    strings by their widths, so a batch costs a few numpy operations, not a loop.
    """
    n = port.size
    raw = np.zeros((n, 28), dtype=np.uint8)
    tail = np.concatenate(
        [
            port.astype(">i4").view(np.uint8).reshape(n, 4),
            physical.astype(">i8").view(np.uint8).reshape(n, 8),
        ],
        axis=1,
    )
    v4 = ~v6
    raw[v4, :4] = addr[v4, :4]
    raw[v4, 4:16] = tail[v4]
    raw[v6, :16] = addr[v6]
    raw[v6, 16:] = tail[v6]
    chars = np.empty((n, 56), dtype=np.uint8)
    chars[:, 0::2] = _HEX[raw >> 4]
    chars[:, 1::2] = _HEX[raw & 15]
    width = np.where(v6, 56, 32)
    # Row-major boolean selection keeps the rows in order, each cut to its width.
    data = chars[np.arange(56) < width[:, None]] if v6.any() else chars[:, :32].reshape(-1)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(width, out=offsets[1:])
    ids: pa.StringArray = pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(data))]
    )
    return ids


_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)


def compression_of(sysflag: int) -> str | None:
    """The algorithm a record's body is compressed with, None when it is not compressed."""
    if not sysflag & SYSFLAG_COMPRESSED:
        return None
    code = (sysflag >> SYSFLAG_COMPRESSION_SHIFT) & SYSFLAG_COMPRESSION_MASK
    return COMPRESSION_NAMES.get(code, f"unknown({code})")


def decompress(body: bytes, algorithm: str) -> bytes:
    """The body as the producer sent it, before compression.

    zlib is RocketMQ's ``UtilAll.uncompress`` (a zlib stream, as ``Deflater`` writes), LZ4
    the frame format of ``Lz4Compressor``, Zstandard standard frames (``ZstdCompressor``,
    read by zstd-jni's ``ZstdInputStream``: frames back to back, each of them whole).
    Raises ``ValueError`` when the bytes do not decompress, or for an unknown algorithm.
    """
    if algorithm == "zlib":
        try:
            return zlib.decompress(body)
        except zlib.error as exc:
            raise ValueError(f"not a zlib stream: {exc}") from None
    if algorithm == "lz4":
        try:
            import lz4.frame
        except ImportError:
            raise ValueError("an LZ4 body needs the lz4 package (in the spark extra)") from None
        try:
            out: bytes = lz4.frame.decompress(body)
        except RuntimeError as exc:
            raise ValueError(f"not an LZ4 frame: {exc}") from None
        return out
    if algorithm == "zstd":
        try:
            import zstandard
        except ImportError:
            raise ValueError(
                "a Zstandard body needs the zstandard package (in the spark extra)"
            ) from None
        try:
            return _zstd_frames(zstandard.ZstdDecompressor(), body)
        except zstandard.ZstdError as exc:
            raise ValueError(f"not a Zstandard frame: {exc}") from None
    raise ValueError(f"unknown compression {algorithm}")


def _zstd_frames(decompressor: Any, body: bytes) -> bytes:
    """The content of the Zstandard frames of *body*, back to back, as ``ZstdInputStream``
    reads them. A frame that stops before its end is an error: a stream reader would hand
    back what it had decoded so far, a shorter body (or none) passed off as the one sent."""
    out = []
    rest = body
    while rest:
        frame = decompressor.decompressobj()
        out.append(frame.decompress(rest))
        if not frame.eof:
            raise ValueError("not a Zstandard frame: it is truncated (no end of frame)")
        rest = frame.unused_data
    return b"".join(out)


def _bodies(
    body: pa.BinaryArray, sysflag: I64, decompress_bodies: bool
) -> tuple[pa.BinaryArray, pa.BooleanArray, pa.StringArray]:
    """The body, compressed and compression columns.

    ``compression`` names the algorithm of a body stored compressed (null otherwise).
    ``compressed`` says whether the ``body`` column holds compressed bytes: with
    *decompress_bodies* it is false for every body that decompressed, and stays true (with
    the stored bytes) for one that does not.
    """
    flagged = (sysflag & SYSFLAG_COMPRESSED) != 0
    n = sysflag.size
    if not flagged.any():
        return body, pa.array(np.zeros(n, dtype=np.bool_)), pa.nulls(n, pa.string())
    codes = (sysflag >> SYSFLAG_COMPRESSION_SHIFT) & SYSFLAG_COMPRESSION_MASK
    names = [COMPRESSION_NAMES.get(c, f"unknown({c})") for c in range(8)]
    compression: pa.StringArray = pa.array(names, pa.string()).take(pa.array(codes, mask=~flagged))
    still = flagged.copy()
    if decompress_bodies:
        rows = np.flatnonzero(flagged)
        raw: list[bytes] = body.take(pa.array(rows)).to_pylist()
        plain: list[bytes | None] = [None] * n
        for i, data, algorithm in zip(
            rows.tolist(), raw, compression.take(pa.array(rows)).to_pylist(), strict=True
        ):
            try:
                plain[i] = decompress(data, algorithm)
                still[i] = False
            except ValueError:
                pass  # left as stored; the compressed column says so
        if not still.all():
            body = pc.if_else(pa.array(~still & flagged), pa.array(plain, pa.binary()), body)
    return body, pa.array(still), compression


def decode_batch(
    sd: SegmentData, starts: I64, schema: pa.Schema = MESSAGE_ARROW_SCHEMA
) -> pa.RecordBatch:
    """The messages at *starts* (valid records, from :func:`scan_range`) as a batch."""
    return decode_records(sd, _layout(sd, starts), schema)


def decode_records(
    sd: SegmentData,
    r: Records,
    schema: pa.Schema = MESSAGE_ARROW_SCHEMA,
    *,
    decompress_bodies: bool = False,
) -> pa.RecordBatch:
    """The messages of *r* (valid records, from :func:`scan_records`) as a batch."""
    starts = r.starts
    h = _decode_head(sd, r)
    arr = sd.array
    topics = _utf8(_slices(arr, r.topic_pos, r.topic_pos + r.topic_len))
    props, tags, keys = _properties(_utf8(_slices(arr, r.props_pos, r.props_pos + r.props_len)))
    physical = sd.segment.start + starts
    store_v6 = (r.family & 2) == 2
    body, compressed, compression = _bodies(
        _slices(arr, r.body_pos, r.body_pos + r.body_len), h["sysflag"], decompress_bodies
    )
    columns: dict[str, pa.Array] = {
        "physical_offset": pa.array(physical, type=pa.int64()),
        "size": pa.array(h["size"].astype(np.int32)),
        "topic": topics,
        "queue_id": pa.array(h["queue_id"].astype(np.int32)),
        "queue_offset": pa.array(h["queue_offset"]),
        "tags": tags,
        "keys": keys,
        "born_timestamp": _timestamps(h["born_timestamp"]),
        "born_host": _hosts(h["born_addr"], h["born_port"], (r.family & 1) == 1),
        "store_timestamp": _timestamps(h["store_timestamp"]),
        "store_host": _hosts(h["store_addr"], h["store_port"], store_v6),
        "sysflag": pa.array(h["sysflag"].astype(np.int32)),
        "flag": pa.array(h["flag"].astype(np.int32)),
        "body_crc": pa.array(h["body_crc"].astype(np.int32)),
        "reconsume_times": pa.array(h["reconsume_times"].astype(np.int32)),
        "prepared_transaction_offset": pa.array(h["prepared_transaction_offset"]),
        "magic_code": pa.array(h["magic"].astype(np.int64)),
        "properties": props,
        "body": body,
        "msg_id": _msg_ids(h["store_addr"], h["store_port"], physical, store_v6),
        "compressed": compressed,
        "compression": compression,
    }
    return pa.RecordBatch.from_arrays([columns[name] for name in schema.names], schema=schema)


def crc_problems(sd: SegmentData, starts: I64) -> list[Problem]:
    """Records whose body does not match the stored CRC (``UtilAll.crc32``, masked)."""
    if starts.size == 0:
        return []
    r = _layout(sd, starts)
    stored = _int(sd.array, starts + POS_BODY_CRC, ">i4").tolist()
    problems: list[Problem] = []
    with memoryview(sd.data) as mv:
        for pos, b, n, want in zip(
            starts.tolist(), r.body_pos.tolist(), r.body_len.tolist(), stored, strict=True
        ):
            got = zlib.crc32(mv[b : b + n]) & CRC_MASK
            if got != want:
                problems.append(
                    Problem(
                        sd.segment.start + pos,
                        sd.segment.name,
                        ProblemKind.CRC_MISMATCH,
                        n,
                        f"body CRC {got} over its {n} bytes differs from the stored {want}",
                    )
                )
    return problems


_FIELD_NAMES = {
    "size": "size",
    "magic": "magic_code",
    "born_addr": "born_host",
    "born_port": "born_host",
    "store_addr": "store_host",
    "store_port": "store_host",
    "body_len": "body length",
}


def field_at(sd: SegmentData, start: int, pos: int) -> str:
    """The field of the (valid) record at *start* that holds byte *pos* (both relative)."""
    r = _layout(sd, np.array([start], dtype=np.int64))
    k = pos - start
    head = _HEADS[int(r.family[0])]
    assert head.names is not None and head.fields is not None
    for name in head.names:
        dtype, at = head.fields[name][:2]
        if at <= k < at + dtype.itemsize:
            return _FIELD_NAMES.get(name, name)
    rel = pos
    if rel < r.body_pos[0] + r.body_len[0]:
        return "body"
    if rel < r.topic_pos[0]:
        return "topic length"
    if rel < r.topic_pos[0] + r.topic_len[0]:
        return "topic"
    if rel < r.props_pos[0]:
        return "properties length"
    return "properties"


def record_sizes(sd: SegmentData, starts: I64) -> I64:
    """TOTALSIZE of each record at *starts*."""
    return _gather(sd.array, starts, 4).view(">i4")[:, 0].astype(np.int64)


def chunks(sizes: I64, *, max_rows: int, max_bytes: int) -> Iterator[slice]:
    """Split records into consecutive slices of at most *max_rows* and about *max_bytes*."""
    n = sizes.size
    if n == 0:
        return
    ends = np.cumsum(sizes)
    i = 0
    while i < n:
        base = int(ends[i - 1]) if i else 0
        j = int(np.searchsorted(ends, base + max_bytes, side="right"))
        j = min(max(j, i + 1), i + max_rows, n)
        yield slice(i, j)
        i = j
