"""Replica audit: does each slave hold exactly the master's bytes?

Theory of operation. Classic HA replication copies the master's commit log byte for byte
(a slave appends whatever the master sends at its own end), so a healthy slave is a byte
prefix of its master, and every difference is a fault.

1. On the driver, each directory is listed (:func:`read_layout`) and its written end found
   as recovery finds it: after the last complete record of the last segment
   (``CommitLog.recoverNormally``; :func:`written_end`).
2. The offset ranges both the master and a slave hold are cut into chunks (1 MiB by
   default, also cut at every segment boundary), and Spark tasks compare each chunk of the
   slave with the master's bytes directly (both files mapped side by side, compared at
   memory speed), so an identical pair costs about what ``cmp`` costs.
3. Chunks that differ are merged into ranges. Only there are records decoded: the driver
   checks the framing and body CRC of every record overlapping them, in both replicas,
   finds the first differing byte, the master record that holds it and its field, and
   decodes that record from both sides so the report can show them side by side.
4. With ``verify_records`` a ``commitlog_problems`` scan of every replica, in Spark, also
   checks every record's framing and body CRC where the replicas agree: damage that was
   replicated (the master's own bit rot, say) is the same on both sides and leaves the
   verdict alone, so this is a check of the data, not of replication.

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
from trioha.pipeline._batches import decode_batch, record_sizes
from trioha.pipeline._decode import SegmentData, open_segment
from trioha.pipeline._format import Problem, ProblemKind
from trioha.pipeline._framing import scan_range, scan_records, written_end
from trioha.pipeline._layout import LogLayout, read_layout
from trioha.pipeline._plan import MIB
from trioha.pipeline._validation import crc_problems, explain_record, field_at
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
#: Each compare task reads about this much of each side (chunks of one segment file).
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
    torn: Problem | None = None
    #: Offsets already found to hold the master's bytes (by :func:`_inspect`).
    same: Ranges = attrs.field(factory=list)

    @property
    def present(self) -> Ranges:
        """The offsets this replica holds: its segments, cut at its written end."""
        lo = self.layout.min_offset
        return _merge((max(s.start, lo), min(s.end, self.end)) for s in self.layout.segments)

    def span(self) -> Ranges:
        lo = self.layout.min_offset
        return [(lo, self.end)] if self.layout.segments and lo < self.end else []


def _inspect(path: str, segment_size: int | None, master: _Replica | None = None) -> _Replica:
    """List *path* and find its written end by walking the record chain of its last segment.

    For a slave whose last segment lies where the master's does and holds the master's bytes
    up to the master's end, the walk up to there would retrace the master's step by step:
    it continues from the master's end instead, after one byte comparison (what makes an
    identical pair cost about a ``cmp``). That range is then known to be the master's and
    is not compared again.
    """
    layout = read_layout(path, segment_size=segment_size)
    if not layout.segments:
        return _Replica(layout, 0)
    last = layout.segments[-1]
    begin = max(layout.min_offset, last.start)
    same: Ranges = []
    if master is not None and master.layout.segments:
        mlast = master.layout.segments[-1]
        mbegin = max(master.layout.min_offset, mlast.start)
        if (
            mlast.start == last.start
            and mbegin == begin <= master.end <= min(last.end, mlast.end)
            and not any(
                _differing(mlast.path, mlast.start, last.path, last.start, [(begin, master.end)])
            )
        ):
            same = [(begin, master.end)] if begin < master.end else []
            begin = master.end
    with open_segment(last) as sd:
        end, torn = written_end(sd, begin)
    return _Replica(layout, end, torn, same)


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
class CompareTask:
    """Chunks of one segment file of a slave, compared with the master's by one Spark task."""

    replica: int
    master_path: str
    master_start: int
    path: str
    file_start: int
    chunks: tuple[tuple[int, int], ...]


def compare_task(task: CompareTask) -> Iterator[tuple[int, int, int]]:
    """``(replica, start, end)`` for each chunk of *task* whose bytes differ (in an executor)."""
    for s, e in _differing(
        task.master_path, task.master_start, task.path, task.file_start, task.chunks
    ):
        yield task.replica, s, e


def compare_tasks(tasks: Sequence[CompareTask]) -> Iterator[tuple[int, int, int]]:
    """:func:`compare_task` for each of *tasks*, in one Spark task."""
    for task in tasks:
        yield from compare_task(task)


def _pack(tasks: Sequence[CompareTask], slots: int) -> list[list[CompareTask]]:
    """*tasks* in at most *slots* consecutive groups of about equal bytes.

    A log of many segments makes a compare task per segment file; each Spark task has a
    fixed cost (scheduling, a Python worker's round trip) that an identical pair, compared
    at memory speed, feels: one group per slot pays it once per core instead.
    """
    if len(tasks) <= slots:
        return [[t] for t in tasks]
    sizes = [sum(e - s for s, e in t.chunks) for t in tasks]
    total = sum(sizes)
    groups: list[list[CompareTask]] = [[] for _ in range(max(1, slots))]
    before = 0
    for task, size in zip(tasks, sizes, strict=True):
        # the group whose share of the bytes holds the task's middle
        at = len(groups) * (2 * before + size) // (2 * total) if total else 0
        groups[min(at, len(groups) - 1)].append(task)
        before += size
    return [g for g in groups if g]


#: What :func:`_differing` reads of each file at a time.
_READ_BYTES = 8 * MIB


def _differing(
    master_path: str,
    master_start: int,
    path: str,
    file_start: int,
    chunks: Sequence[tuple[int, int]],
) -> Iterator[tuple[int, int]]:
    """The chunks (absolute offsets) whose bytes in *path* differ from *master_path*'s.

    Both files are read with ``preadv`` into two reused buffers and compared as 64-bit
    words: a fresh mapping of each file would cost a page fault per page, and comparing
    whole mapped files at once a temporary array as large as they are, which together made
    this several times slower than ``cmp``.
    """
    if not chunks:
        return
    size = min(max(e - s for s, e in chunks), _READ_BYTES)
    bufs = bytearray(size), bytearray(size)
    views = memoryview(bufs[0]), memoryview(bufs[1])
    ours, theirs = np.frombuffer(bufs[0], dtype=np.uint8), np.frombuffer(bufs[1], dtype=np.uint8)
    with open(master_path, "rb") as fm, open(path, "rb") as fs:
        for s, e in chunks:
            pos = s
            while pos < e:
                n = min(size, e - pos)
                got = (
                    os.preadv(fm.fileno(), [views[0][:n]], pos - master_start),
                    os.preadv(fs.fileno(), [views[1][:n]], pos - file_start),
                )
                if got != (n, n):
                    raise PipelineError(
                        f"{path}: read {got} of {n} bytes at offset {pos}; "
                        "the file changed during the audit"
                    )
                words = n - n % 8
                if not (
                    np.array_equal(ours[:words].view(np.uint64), theirs[:words].view(np.uint64))
                    and np.array_equal(ours[words:n], theirs[words:n])
                ):
                    yield s, e
                    break
                pos += n


def _tasks(
    replica: int, master: LogLayout, layout: LogLayout, chunks: list[tuple[int, int]]
) -> list[CompareTask]:
    tasks: list[CompareTask] = []
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for s, e in chunks:
        seg, mseg = layout.segment_at(s), master.segment_at(s)
        if seg is None or mseg is None:  # pragma: no cover - chunks lie where both hold data
            raise AssertionError(f"no segment holds offset {s}")
        groups.setdefault((seg.start, mseg.start), []).append((s, e))
    for (start, mstart), seg_chunks in sorted(groups.items()):
        seg, mseg = layout.segment_at(start), master.segment_at(mstart)
        assert seg is not None and mseg is not None
        group: list[tuple[int, int]] = []
        size = 0
        for c in seg_chunks:
            if group and size + (c[1] - c[0]) > TASK_BYTES:
                tasks.append(
                    CompareTask(replica, mseg.path, mseg.start, seg.path, seg.start, tuple(group))
                )
                group, size = [], 0
            group.append(c)
            size += c[1] - c[0]
        if group:
            tasks.append(
                CompareTask(replica, mseg.path, mseg.start, seg.path, seg.start, tuple(group))
            )
    return tasks


def _records_in(replica: _Replica, ranges: Ranges) -> list[Problem]:
    """Framing and CRC problems of *replica*'s records overlapping *ranges* (on the driver).

    Each segment concerned is walked from where its data begins up to the end of the last
    range in it, so the records found are the ones a reader of the whole log finds.
    """
    layout = replica.layout
    found: list[Problem] = []
    by_segment: dict[int, Ranges] = {}
    for s, e in ranges:
        seg = layout.segment_at(s)
        if seg is not None:
            by_segment.setdefault(seg.start, []).append((s, min(e, seg.end)))
    for start, wanted in sorted(by_segment.items()):
        seg = layout.segment_at(start)
        assert seg is not None
        base = max(seg.start, layout.min_offset)
        last = seg is layout.segments[-1]
        with open_segment(seg) as sd:
            hi = min(max(e for _, e in wanted), seg.start + sd.size)
            if hi <= base:
                continue
            records, problems = scan_records(sd, base, hi, last)
            ends = records.starts + record_sizes(sd, records.starts)
            hit = np.zeros(records.starts.size, dtype=np.bool_)
            for s, e in wanted:
                hit |= (seg.start + records.starts < e) & (seg.start + ends > s)
            found.extend(crc_problems(sd, records.starts[hit]))
        found.extend(
            p
            for p in problems
            if p.kind is not ProblemKind.TORN_TAIL
            and any(p.offset < e and p.offset + max(p.length, 1) > s for s, e in wanted)
        )
    return found


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
    verify_records: bool = False,
) -> AuditReport:
    """Compare *master* with each of *slaves* (store roots or commitlog directories).

    Records are decoded only where the replicas differ, unless *verify_records* asks for
    the framing and CRC of every record of every replica to be checked too.
    """
    if not slaves:
        raise PipelineError("an audit needs at least one slave directory")
    if chunk_bytes <= 0:
        raise PipelineError(f"chunk size must be positive, got {chunk_bytes}")
    m = _inspect(master, segment_size)
    replicas = [m, *(_inspect(p, segment_size, m) for p in slaves)]
    boundaries = [b for r in replicas for s in r.layout.segments for b in (s.start, s.end)]

    overlaps: list[Ranges] = [_intersect(m.present, r.present) for r in replicas[1:]]
    slave_chunks = [
        _chunks(_subtract(o, r.same), boundaries, chunk_bytes)
        for o, r in zip(overlaps, replicas[1:], strict=True)
    ]
    tasks: list[CompareTask] = []
    for i, chunks in enumerate(slave_chunks, start=1):
        tasks += _tasks(i, m.layout, replicas[i].layout, chunks)
    differing: set[tuple[int, int, int]] = set()
    if tasks:
        sc = spark.sparkContext
        compared = sum(e - s for t in tasks for s, e in t.chunks)
        sc.setJobDescription(f"trioha audit: compare {compared} bytes of the replicas")
        groups = _pack(tasks, sc.defaultParallelism)
        differing = set(sc.parallelize(groups, len(groups)).flatMap(compare_tasks).collect())
    bads = [
        _merge((s, e) for s, e in slave_chunks[i - 1] if (i, s, e) in differing)
        for i in range(1, len(replicas))
    ]
    problems: list[list[Problem]] = [
        [*r.layout.problems, *([r.torn] if r.torn is not None else [])] for r in replicas
    ]
    if verify_records:
        spark.sparkContext.setJobDescription("trioha audit: framing and CRC of every record")
        problems = _problems(spark, [r.layout.directory for r in replicas], segment_size)
    else:
        checked = _merge(r for bad in bads for r in bad)
        problems[0].extend(_records_in(m, checked))
        for i, bad in enumerate(bads, start=1):
            problems[i].extend(_records_in(replicas[i], bad))

    results: list[SlaveAudit] = []
    for i, slave in enumerate(replicas[1:], start=1):
        bad = bads[i - 1]
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
