"""Replica audit: does each slave hold exactly the master's bytes?

Theory of operation. Classic HA replication copies the master's commit log byte for byte
(docs/rocketmq-protocol.md §1.7, §11: a slave appends whatever the master sends at its own end), so
a healthy slave is a byte prefix of its master, and every difference is a fault.

1. On the driver, each directory is listed (:func:`read_layout`) and its written end found
   as recovery finds it: after the last complete record of the last segment
   (``CommitLog.recoverNormally``; :func:`written_end`).
2. The offset ranges both the master and a slave hold are cut into chunks (1 MiB by
   default, also cut at every segment boundary), and Spark tasks compute a SHA-256 of each
   chunk of each replica, reading the segment files where they lie.
3. Chunks whose digests differ are merged into ranges. For the first one the driver finds
   the first differing byte, the master record that holds it, and decodes that record from
   both replicas so the report can show them side by side.
4. A ``commitlog_problems`` scan of every replica, also in Spark, checks every record's
   framing and body CRC.

The verdict per slave: diverged, missing range (a hole inside the slave's span that the
master holds), ahead, behind by N bytes, or identical (:mod:`trioha.pipeline._verdict`).
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import attrs
import numpy as np

from trioha._errors import PipelineError
from trioha.pipeline._decode import (
    SegmentData,
    crc_problems,
    decode_batch,
    explain_record,
    field_at,
    open_segment,
    record_sizes,
    scan_range,
    written_end,
)
from trioha.pipeline._format import Problem, ProblemKind
from trioha.pipeline._layout import LogLayout, read_layout
from trioha.pipeline._plan import MIB
from trioha.pipeline._verdict import (
    AuditReport,
    Divergence,
    MessageSide,
    OffsetRange,
    ReplicaInfo,
    SlaveAudit,
    Verdict,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_CHUNK_BYTES = 1 * MIB
#: Each digest task reads about this much (several chunks of one segment file).
TASK_BYTES = 64 * MIB

Ranges = list[tuple[int, int]]


# --- range arithmetic (sorted, disjoint [start, end) pairs) -------------------------------


def _merge(ranges: Iterable[tuple[int, int]]) -> Ranges:
    out: Ranges = []
    for s, e in sorted(r for r in ranges if r[0] < r[1]):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _intersect(a: Ranges, b: Ranges) -> Ranges:
    out: Ranges = []
    i = j = 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _subtract(a: Ranges, b: Ranges) -> Ranges:
    out: Ranges = []
    for s, e in a:
        cur = s
        for bs, be in b:
            if be <= cur or bs >= e:
                continue
            if bs > cur:
                out.append((cur, bs))
            cur = max(cur, be)
        if cur < e:
            out.append((cur, e))
    return out


# --- replicas -----------------------------------------------------------------------------


@attrs.frozen
class _Replica:
    layout: LogLayout
    end: int

    @property
    def present(self) -> Ranges:
        """The offsets this replica holds: its segments, cut at its written end."""
        lo = self.layout.min_offset
        return _merge((max(s.start, lo), min(s.end, self.end)) for s in self.layout.segments)

    def span(self) -> Ranges:
        lo = self.layout.min_offset
        return [(lo, self.end)] if self.layout.segments and lo < self.end else []


def _inspect(path: str, segment_size: int | None) -> _Replica:
    layout = read_layout(path, segment_size=segment_size)
    if not layout.segments:
        return _Replica(layout, 0)
    with open_segment(layout.segments[-1]) as sd:
        end, _ = written_end(sd, max(layout.min_offset, sd.segment.start))
    return _Replica(layout, end)


def _chunks(ranges: Ranges, boundaries: Sequence[int], chunk: int) -> list[tuple[int, int]]:
    """Cut *ranges* at multiples of *chunk* and at every segment boundary."""
    out: list[tuple[int, int]] = []
    bounds = np.asarray(sorted(set(boundaries)), dtype=np.int64)
    for s, e in ranges:
        cuts = set(range((s // chunk + 1) * chunk, e, chunk))
        lo, hi = np.searchsorted(bounds, [s, e], side="right")
        cuts.update(int(b) for b in bounds[lo:hi] if s < b < e)
        points = [s, *sorted(cuts), e]
        out.extend(itertools.pairwise(points))
    return out


@attrs.frozen
class DigestTask:
    """Chunks of one segment file of one replica, hashed by one Spark task."""

    replica: int
    path: str
    file_start: int
    chunks: tuple[tuple[int, int], ...]


def digest_task(task: DigestTask) -> Iterator[tuple[int, int, int, bytes]]:
    """``(replica, start, end, sha256)`` for each chunk of *task* (runs in an executor)."""
    size = max(e - s for s, e in task.chunks)
    buf = bytearray(size)
    view = memoryview(buf)
    with open(task.path, "rb") as f:
        fd = f.fileno()
        for s, e in task.chunks:
            n = os.preadv(fd, [view[: e - s]], s - task.file_start)
            if n != e - s:
                raise PipelineError(
                    f"{task.path}: read {n} of {e - s} bytes at offset {s}; "
                    "the file changed during the audit"
                )
            yield task.replica, s, e, hashlib.sha256(view[:n]).digest()


def _tasks(replica: int, layout: LogLayout, chunks: list[tuple[int, int]]) -> list[DigestTask]:
    tasks: list[DigestTask] = []
    by_segment: dict[int, list[tuple[int, int]]] = {}
    for s, e in chunks:
        seg = layout.segment_at(s)
        if seg is None:  # pragma: no cover - chunks come from this layout's own ranges
            raise AssertionError(f"no segment holds offset {s}")
        by_segment.setdefault(seg.start, []).append((s, e))
    for start, seg_chunks in sorted(by_segment.items()):
        seg = layout.segment_at(start)
        assert seg is not None
        group: list[tuple[int, int]] = []
        size = 0
        for c in seg_chunks:
            if group and size + (c[1] - c[0]) > TASK_BYTES:
                tasks.append(DigestTask(replica, seg.path, seg.start, tuple(group)))
                group, size = [], 0
            group.append(c)
            size += c[1] - c[0]
        if group:
            tasks.append(DigestTask(replica, seg.path, seg.start, tuple(group)))
    return tasks


# --- pinpointing --------------------------------------------------------------------------


def _read(layout: LogLayout, start: int, end: int) -> bytes:
    seg = layout.segment_at(start)
    if seg is None:
        return b""
    with open(seg.path, "rb") as f:
        f.seek(start - seg.start)
        return f.read(min(end, seg.end) - start)


def _first_difference(master: LogLayout, slave: LogLayout, start: int, end: int) -> int:
    pos = start
    while pos < end:
        stop = min(end, pos + 4 * MIB)  # _read stops at a segment's end, too
        a = np.frombuffer(_read(master, pos, stop), dtype=np.uint8)
        b = np.frombuffer(_read(slave, pos, stop), dtype=np.uint8)
        n = min(a.size, b.size)
        diff = np.flatnonzero(a[:n] != b[:n])
        if diff.size:
            return pos + int(diff[0])
        if a.size != b.size or n == 0:
            return pos + n
        pos += n
    return start  # the digests differed, so this is not reached with stable files


def _side(sd: SegmentData, rel: int) -> MessageSide:
    why = explain_record(sd, rel)
    if why is not None:
        kind, detail = why
        return MessageSide(error=f"no valid record here ({kind.value}: {detail})")
    starts = np.array([rel], dtype=np.int64)
    row = decode_batch(sd, starts).to_pylist()[0]
    fields = tuple((name, _text(name, value)) for name, value in row.items())
    return MessageSide(fields=fields, crc_ok=not crc_problems(sd, starts))


def _text(name: str, value: object) -> str:
    if name == "body" and isinstance(value, bytes):
        digest = hashlib.sha256(value).hexdigest()[:16]
        return f"{len(value)} bytes, sha256 {digest}…, starts {value[:12].hex()}"
    if name == "properties" and isinstance(value, list):
        return "{" + ", ".join(f"{k}={v}" for k, v in value) + "}"
    if value is None:
        return "null"
    if name.endswith("_timestamp"):
        return str(value).replace("+00:00", "Z")
    return str(value)


def _divergence(
    master: LogLayout, slave: LogLayout, first_byte: int, master_last: bool
) -> Divergence:
    seg = master.segment_at(first_byte)
    assert seg is not None
    with open_segment(seg) as sd:
        starts, _ = scan_range(sd, seg.start, first_byte + 1, master_last)
        sizes = record_sizes(sd, starts)
        holding = np.flatnonzero(starts + sizes > first_byte - seg.start)
        if not holding.size:
            note = "the differing byte is not inside a valid record of the master"
            return Divergence(
                first_byte, first_byte, None, MessageSide(error=note), MessageSide(error=note), ()
            )
        rel = int(starts[holding[0]])
        master_side = _side(sd, rel)
        field = field_at(sd, rel, first_byte - seg.start)
    offset = seg.start + rel
    slave_seg = slave.segment_at(offset)
    if slave_seg is None:
        slave_side = MessageSide(error="the slave has no segment file at this offset")
    else:
        with open_segment(slave_seg) as sd:
            slave_side = _side(sd, offset - slave_seg.start)
    differing = tuple(
        name
        for name, value in master_side.fields
        if slave_side.fields and slave_side.get(name) != value
    )
    return Divergence(offset, first_byte, field, master_side, slave_side, differing)


# --- the audit ----------------------------------------------------------------------------


def _info(replica: _Replica, problems: Iterable[Problem]) -> ReplicaInfo:
    layout = replica.layout
    return ReplicaInfo(
        directory=layout.directory,
        segment_size=layout.segment_size,
        segments=len(layout.segments),
        min_offset=layout.min_offset,
        end_offset=replica.end,
        problems=tuple(sorted(problems, key=lambda p: p.offset)),
    )


def _problems(
    spark: SparkSession, paths: Sequence[str], segment_size: int | None
) -> list[list[Problem]]:
    """Every replica's damaged regions and bad CRCs, from one Spark job."""
    from pyspark.sql import functions as F

    frames = []
    for i, path in enumerate(paths):
        reader = spark.read.format("commitlog_problems")
        if segment_size is not None:
            reader = reader.option("segmentSize", str(segment_size))
        frames.append(reader.load(path).withColumn("replica", F.lit(i)))
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    found: list[list[Problem]] = [[] for _ in paths]
    for row in union.collect():
        found[row["replica"]].append(
            Problem(
                row["offset"],
                row["segment"],
                ProblemKind(row["kind"]),
                row["length"],
                row["detail"],
            )
        )
    return found


def audit_replicas(
    spark: SparkSession,
    master: str,
    slaves: Sequence[str],
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    segment_size: int | None = None,
) -> AuditReport:
    """Compare *master* with each of *slaves* (store roots or commitlog directories)."""
    if not slaves:
        raise PipelineError("an audit needs at least one slave directory")
    if chunk_bytes <= 0:
        raise PipelineError(f"chunk size must be positive, got {chunk_bytes}")
    replicas = [_inspect(p, segment_size) for p in (master, *slaves)]
    m = replicas[0]
    boundaries = [b for r in replicas for s in r.layout.segments for b in (s.start, s.end)]

    overlaps: list[Ranges] = [_intersect(m.present, r.present) for r in replicas[1:]]
    slave_chunks = [_chunks(o, boundaries, chunk_bytes) for o in overlaps]
    # The master hashes every chunk some slave hashes; slaves' chunks differ only where
    # their overlaps end.
    master_chunks = sorted({c for chunks in slave_chunks for c in chunks})
    tasks = _tasks(0, m.layout, master_chunks)
    for i, chunks in enumerate(slave_chunks, start=1):
        tasks += _tasks(i, replicas[i].layout, chunks)
    digests: dict[tuple[int, int, int], bytes] = {}
    if tasks:
        sc = spark.sparkContext
        sc.setJobDescription("trioha audit: chunk checksums")
        rows = sc.parallelize(tasks, len(tasks)).flatMap(digest_task).collect()
        digests = {(r, s, e): d for r, s, e, d in rows}
    spark.sparkContext.setJobDescription("trioha audit: framing and CRC of every record")
    problems = _problems(spark, [r.layout.directory for r in replicas], segment_size)

    results: list[SlaveAudit] = []
    for i, slave in enumerate(replicas[1:], start=1):
        bad = _merge(
            (s, e) for s, e in slave_chunks[i - 1] if digests[(i, s, e)] != digests[(0, s, e)]
        )
        missing = _subtract(_intersect(m.present, slave.span()), slave.present)
        notes: list[str] = []
        extra = _subtract(_intersect(slave.present, m.span()), m.present)
        notes.extend(
            f"the master has no data at {OffsetRange(s, e)}, the slave does" for s, e in extra
        )
        if (
            m.layout.segments
            and slave.layout.segments
            and slave.layout.min_offset > m.layout.min_offset
        ):
            notes.append(
                f"the slave starts at {slave.layout.min_offset}, the master at "
                f"{m.layout.min_offset} (normal for a slave that joined later)"
            )
        if slave.layout.segment_size != m.layout.segment_size and slave.layout.segments:
            notes.append(
                f"segment sizes differ: master {m.layout.segment_size}, "
                f"slave {slave.layout.segment_size}"
            )
        divergence = None
        if bad:
            first = _first_difference(m.layout, slave.layout, bad[0][0], bad[0][1])
            divergence = _divergence(m.layout, slave.layout, first, _is_last(m, first))
        behind = m.end - slave.end
        if divergence is not None:
            verdict = Verdict.DIVERGED
        elif missing:
            verdict = Verdict.MISSING
        elif behind < 0:
            verdict = Verdict.AHEAD
        elif behind > 0:
            verdict = Verdict.BEHIND
        else:
            verdict = Verdict.IDENTICAL
        results.append(
            SlaveAudit(
                replica=_info(slave, problems[i]),
                verdict=verdict,
                behind_bytes=behind,
                compared=tuple(OffsetRange(s, e) for s, e in overlaps[i - 1]),
                missing=tuple(OffsetRange(s, e) for s, e in missing),
                bad_ranges=tuple(OffsetRange(s, e) for s, e in bad),
                divergence=divergence,
                notes=tuple(notes),
            )
        )
    return AuditReport(_info(m, problems[0]), tuple(results), chunk_bytes)


def _is_last(replica: _Replica, offset: int) -> bool:
    segs = replica.layout.segments
    return bool(segs) and segs[-1].start <= offset
