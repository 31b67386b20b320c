"""Step 3 of reading a segment, decoding: sound records into an Arrow batch.

Fixed fields come from a structured numpy view of the gathered headers; bodies, topics and
properties are cut out of the segment by Arrow's ``take`` over a zero-copy array whose value
boundaries are the field boundaries; properties are split into a map with Arrow compute
kernels; hosts are rendered once per distinct value; compressed bodies are inflated on request.
Out comes a ``pyarrow.RecordBatch`` in the schema the Spark data source declares
(:data:`MESSAGE_ARROW_SCHEMA`). The theory of operation is in :mod:`trioha.pipeline._decode`.
"""

from __future__ import annotations

import ipaddress
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trioha.pipeline._decode import (
    HEADS,
    I64,
    SCALAR_FIELDS,
    U8,
    Bools,
    Records,
    SegmentData,
    gather,
)
from trioha.pipeline._format import (
    COMPRESSION_NAMES,
    NAME_VALUE_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    SYSFLAG_COMPRESSED,
    SYSFLAG_COMPRESSION_MASK,
    SYSFLAG_COMPRESSION_SHIFT,
)
from trioha.pipeline._validation import record_layout

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


# --- decoding -----------------------------------------------------------------------------


def _decode_head(sd: SegmentData, r: Records) -> dict[str, Any]:
    """The fixed fields of valid records, through a structured view of their heads."""
    arr = sd.array
    n = r.starts.size
    head: dict[str, Any] = {}
    born_addr = np.zeros((n, 16), dtype=np.uint8)
    store_addr = np.zeros((n, 16), dtype=np.uint8)
    families = [0] if not r.family.any() else np.unique(r.family).tolist()
    for fam in families:
        dt = HEADS[fam]
        if len(families) == 1:
            sel: slice | Bools = slice(None)
            rows = gather(arr, r.starts, dt.itemsize).view(dt)[:, 0]
        else:
            sel = r.family == fam
            rows = gather(arr, r.starts[sel], dt.itemsize).view(dt)[:, 0]
        for name in SCALAR_FIELDS:
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
    return decode_records(sd, record_layout(sd, starts), schema)


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


def record_sizes(sd: SegmentData, starts: I64) -> I64:
    """TOTALSIZE of each record at *starts*."""
    return gather(sd.array, starts, 4).view(">i4")[:, 0].astype(np.int64)


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
