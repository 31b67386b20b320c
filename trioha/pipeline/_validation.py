"""Step 2 of reading a segment, validation: which records are sound, and why one is not.

:func:`record_layout` checks every record of a run at once (numpy gathers their headers) as
``CommitLog.checkMessageAndReturnSize`` does: the magic code, that the body/topic/properties
lengths add up to TOTALSIZE, plus that the stored physical offset is the record's own.
:func:`explain_record` is its scalar twin, saying why one record fails; :func:`find_record`
looks for the next sound record after damage (the only place that looks for a record by its
contents); :func:`crc_problems` checks bodies against their stored CRC. The theory of
operation is in :mod:`trioha.pipeline._decode`.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from trioha.pipeline._decode import (
    FIXED,
    HEAD_SIZES,
    HEADS,
    I64,
    RECORD_PREFIX,
    Buffer,
    Records,
    SegmentData,
    gather,
    gather_int,
)
from trioha.pipeline._format import (
    BLANK_MAGIC,
    CRC_MASK,
    MESSAGE_MAGIC,
    MESSAGE_MAGIC_V2,
    MIN_RECORD_SIZE,
    POS_BODY_CRC,
    POS_PHYSICAL_OFFSET,
    POS_SYSFLAG,
    Problem,
    ProblemKind,
)

#: The first three bytes both message magics share: where resuming after damage looks.
_MAGIC_PREFIX = MESSAGE_MAGIC.to_bytes(4, "big")[:3]
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")


def record_layout(sd: SegmentData, starts: I64) -> Records:
    """Check every record starting at *starts* (see :func:`explain_record`).

    Only the words the check needs are gathered (TOTALSIZE, magic, physical offset,
    sysflag and the three lengths), so validating a run costs a few small gathers.
    """
    arr = sd.array
    fixed = gather(arr, starts, FIXED.itemsize).view(FIXED)[:, 0]
    size = fixed["size"].astype(np.int64)
    magic = fixed["magic"].astype(np.int64)
    physical = fixed["physical_offset"].astype(np.int64)
    family = (fixed["sysflag"].astype(np.int64) >> 4) & 3
    rec_end = starts + size
    v2 = magic == MESSAGE_MAGIC_V2
    tl_width = np.where(v2, 2, 1)
    hsize = HEAD_SIZES[family]
    ok = (
        ((magic == MESSAGE_MAGIC) | v2)
        & (size >= MIN_RECORD_SIZE)
        & (size <= sd.size - starts)
        & (physical == sd.segment.start + starts)
        & (hsize <= size)
    )
    body_pos = starts + hsize
    body_len = gather_int(arr, body_pos - 4, ">i4")
    ok &= body_len >= 0
    body_end = body_pos + np.maximum(body_len, 0)
    ok &= body_end + tl_width <= rec_end
    topic_len = np.where(v2, gather_int(arr, body_end, ">i2"), gather_int(arr, body_end, "i1"))
    ok &= topic_len >= 0
    topic_pos = body_end + tl_width
    topic_end = topic_pos + np.maximum(topic_len, 0)
    ok &= topic_end + 2 <= rec_end
    props_len = gather_int(arr, topic_end, ">i2")
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


def explain_record(sd: SegmentData, pos: int) -> tuple[ProblemKind, str] | None:
    """Why the record at *pos* (relative) is not valid, or None if it is.

    The scalar twin of the vectorised check in ``record_layout``; same conditions, same order.
    """
    data = sd.data
    left = sd.size - pos
    own = sd.segment.start + pos
    if left < 8:
        return ProblemKind.SIZE_MISMATCH, f"only {left} bytes left, too few for a record header"
    size, magic = RECORD_PREFIX.unpack_from(data, pos)
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
    hsize = int(HEAD_SIZES[(sysflag >> 4) & 3])
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


def crc_problems(sd: SegmentData, starts: I64) -> list[Problem]:
    """Records whose body does not match the stored CRC (``UtilAll.crc32``, masked)."""
    if starts.size == 0:
        return []
    r = record_layout(sd, starts)
    stored = gather_int(sd.array, starts + POS_BODY_CRC, ">i4").tolist()
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
    r = record_layout(sd, np.array([start], dtype=np.int64))
    k = pos - start
    head = HEADS[int(r.family[0])]
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
