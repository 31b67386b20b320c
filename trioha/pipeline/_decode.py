"""Vectorised reading of commit log segments: the segment's bytes and its records' layout.

Theory of operation. Reading a byte range of a segment has three steps, a module each.

1. **Framing** (:mod:`trioha.pipeline._framing`, :func:`scan_range`). Records sit back to back,
   so where one starts is known only from the size of the one before: a tight loop follows the
   TOTALSIZE chain (the one per-record Python step, a few hundred nanoseconds each; where
   records repeat one size, the next positions are predicted at that stride and confirmed by one
   gather of their heads, which is exactly the chain, see :func:`_chain`). It stops at the
   end-of-file marker, at zeros, at anything that is not a plausible record, or once past the range.
   A range always begins at a *walk position*, one that following the chain from the segment's
   start reaches (:func:`align_starts`, run by the planner on the driver), and owns the walk
   positions inside it: whatever stops a run at a position inside the range is reported by that
   range, whatever is at its end by the next one. So every record is read and every region
   reported exactly once, however the log is cut into ranges, and nothing depends on what the
   bytes inside a message body look like.
2. **Validation** (:mod:`trioha.pipeline._validation`, vectorised: :func:`record_layout`). For
   all the records of a run at once, numpy gathers their headers and checks what
   ``CommitLog.checkMessageAndReturnSize`` checks: the magic code, that the
   body/topic/properties lengths add up to TOTALSIZE, plus that the stored physical offset is
   the record's own. The first record that fails ends the run; a scalar twin of the check
   (:func:`explain_record`) says why, the region is reported as a :class:`Problem`, and reading
   resumes at the next valid record after the damage (:func:`find_record`, the only place that
   looks for a record by its contents: after damage there is no chain left to follow).
3. **Decoding** (:mod:`trioha.pipeline._batches`, :func:`decode_batch`, vectorised). Fixed
   fields come from a structured numpy view of the gathered headers; bodies, topics and
   properties are cut out of the segment by Arrow's ``take`` over a zero-copy array whose value
   boundaries are the field boundaries; properties are split into a map with Arrow compute
   kernels; hosts are rendered once per distinct value. Out comes a ``pyarrow.RecordBatch`` in
   the schema the Spark data source declares.

This module holds what the three steps share: a segment's bytes (:class:`SegmentData`, a
read-only map of the file), the record head's layout as numpy dtypes, gathering words at many
positions at once, and :class:`Records`, where validation found each record's fields, which
decoding reuses.

The plain-Python reference is the store's codec (``trioha.store._message``); the tests check
that both agree field by field on the same logs.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from collections.abc import Iterator
from typing import Any, TypeAlias

import attrs
import numpy as np
import numpy.typing as npt

from trioha.pipeline._format import (
    POS_PHYSICAL_OFFSET,
    POS_SYSFLAG,
)
from trioha.pipeline._layout import Segment
from trioha.store import backed_end

I64: TypeAlias = npt.NDArray[np.int64]
U8: TypeAlias = npt.NDArray[np.uint8]
Bools: TypeAlias = npt.NDArray[np.bool_]
Buffer: TypeAlias = mmap.mmap | bytes

RECORD_PREFIX = struct.Struct(">iI")  # TOTALSIZE, MAGICCODE


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


#: Filesystems where a read fault on a hole of a mapped file allocates a page: on a full one
#: it is a SIGBUS (the store's ``_segment`` module has the story).
_ALLOCATING_READS = frozenset({"tmpfs"})
#: Filesystem type by device number, from ``/proc/self/mountinfo`` (None: unknown).
_FS_TYPES: dict[int, str | None] = {}


def _filesystem_type(fd: int) -> str | None:
    """The type of the filesystem holding *fd* (``tmpfs``, ``ext4``, ...), None if unknown."""
    dev = os.fstat(fd).st_dev
    if dev in _FS_TYPES:
        return _FS_TYPES[dev]
    found = None
    want = f"{os.major(dev)}:{os.minor(dev)}"
    with (
        contextlib.suppress(OSError),
        open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as mounts,
    ):
        for line in mounts:  # id parent major:minor root point options ... - type ...
            fields = line.split()
            if len(fields) > 3 and fields[2] == want and "-" in fields:
                found = fields[fields.index("-") + 1]
                break
    _FS_TYPES[dev] = found
    return found


def _map(fd: int, size: int) -> mmap.mmap:
    """The file's first *size* bytes, read-only: its mapping, or, where reading a hole
    through a mapping may fault (tmpfs), a copy of the written part in anonymous memory,
    whose holes read as zeros without a fault."""
    if _filesystem_type(fd) in _ALLOCATING_READS:
        written = backed_end(fd, size)
        if written < size:
            mm = mmap.mmap(-1, size)
            with memoryview(mm) as view:
                done = 0
                while done < written:
                    n = os.preadv(fd, [view[done:written]], done)
                    if n <= 0:
                        break  # shrank meanwhile: zeros past it, as a reader of holes sees
                    done += n
            return mm
    return mmap.mmap(fd, size, access=mmap.ACCESS_READ)


@contextlib.contextmanager
def open_segment(segment: Segment) -> Iterator[SegmentData]:
    """Map *segment* read-only for the duration of the block (at most its planned length)."""
    with open(segment.path, "rb") as f:
        size = min(os.fstat(f.fileno()).st_size, segment.length)
        if size <= 0:
            yield SegmentData.from_bytes(segment, b"")
            return
        mm = _map(f.fileno(), size)
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
FIXED = np.dtype(
    {
        "names": ["size", "magic", "physical_offset", "sysflag"],
        "formats": [">i4", ">u4", ">i8", ">i4"],
        "offsets": [0, 4, POS_PHYSICAL_OFFSET, POS_SYSFLAG],
        "itemsize": POS_SYSFLAG + 4,
    }
)

# Indexed by (sysflag >> 4) & 3, like the store's HEADS: bit 0 born host IPv6, bit 1 store.
HEADS = tuple(_head_dtype(b, s) for b, s in ((4, 4), (16, 4), (4, 16), (16, 16)))
HEAD_SIZES = np.array([d.itemsize for d in HEADS], dtype=np.int64)  # 88, 100, 100, 112
SCALAR_FIELDS = (
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


def gather(arr: U8, pos: I64, width: int) -> U8:
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


def gather_int(arr: U8, pos: I64, dtype: str) -> I64:
    """Big-endian integers of *dtype* (``>i4``, ``>u4``, ...) at every position."""
    width = np.dtype(dtype).itemsize
    return gather(arr, pos, width).view(dtype)[:, 0].astype(np.int64)


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
