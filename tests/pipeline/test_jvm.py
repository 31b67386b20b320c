"""The JVM engine against the Python engine: the same rows, column for column.

Every log here is read twice in the one test session, ``engine="python"`` and
``engine="jvm"``, and the collected rows compared field by field (map entries in order),
sorted by offset. The logs cover what the Python decoder's own tests cover: several
segments, V2 records and IPv6 hosts, odd and invalid properties, stale bytes after an
end-of-file marker, damaged, torn and missing regions, compressed bodies, bodies holding
copies of records, offset options. Without a JDK the engine cannot be built and these
skip, saying so; the fallback tests run either way.
"""

from __future__ import annotations

import logging
import random
import struct
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.pipeline.conftest import MISSING, SKIP_REASON, Log

if MISSING:
    pytest.skip(SKIP_REASON, allow_module_level=True)

from tests.pipeline._logs import SEGMENT, copy_log, segments, write_log
from trioha._errors import PipelineError
from trioha.pipeline import _jvm
from trioha.pipeline._options import Engine, ReadOptions
from trioha.store import NewMessage

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark

NO_JDK = _jvm.find_javac() is None


@pytest.fixture(scope="module")
def jvm(spark: SparkSession) -> SparkSession:
    """The shared session, which must have the engine when a JDK is there to build it."""
    if NO_JDK:
        pytest.skip("no javac: the JVM engine cannot be built here (reads use Python)")
    assert _jvm.jvm_loaded(spark), _jvm.ensure_jar()
    return spark


def collect(df: DataFrame) -> list[tuple[Any, ...]]:
    """Every row as a tuple, map entries as an ordered list, sorted by offset; timestamps
    as microseconds (Python's datetime stops short of Spark's year 1 in some zones)."""
    from pyspark.sql import functions as F

    micros = [
        F.unix_micros(F.col(f.name)).alias(f.name)
        if f.dataType.typeName() == "timestamp"
        else F.col(f.name)
        for f in df.schema.fields
    ]
    rows = []
    for row in df.select(*micros).collect():
        rows.append(
            tuple(list(v.items()) if isinstance(v, dict) else v for v in row)  # map order too
        )
    return sorted(rows, key=lambda r: r[0])


def same(spark: SparkSession, root: Path, **options: object) -> list[tuple[Any, ...]]:
    """Read *root* with both engines and check they agree; returns the rows."""
    py = _jvm.read_commitlog(spark, str(root), engine="python", **options)
    jv = _jvm.read_commitlog(spark, str(root), engine="jvm", **options)
    assert jv.schema == py.schema
    expected, got = collect(py), collect(jv)
    assert len(got) == len(expected)
    names = py.schema.names
    diffs = [
        f"at offset {want[0]}: "
        + repr({n: (a, b) for n, a, b in zip(names, want, have, strict=True) if a != b})
        for want, have in zip(expected, got, strict=True)
        if want != have
    ]
    if diffs:
        shown = "\n".join(d[:600] for d in diffs[:8])
        pytest.fail(f"{len(diffs)} row(s) differ (python, jvm):\n{shown}")
    return expected


def patch(root: Path, offset: int, data: bytes) -> None:
    seg = segments(root)[offset // SEGMENT]
    with seg.open("r+b") as f:
        f.seek(offset % SEGMENT)
        f.write(data)


# --- an encoder of its own, for what the store would never write ---------------------------


def raw_record(
    phys: int,
    *,
    topic: bytes,
    body: bytes,
    props: bytes,
    born: tuple[bytes, int],
    store: tuple[bytes, int],
    sysflag: int = 0,
    v2: bool = False,
    born_ts: int = 1_700_000_000_000,
    store_ts: int = 1_700_000_000_001,
    queue_id: int = 1,
    queue_offset: int = 5,
) -> bytes:
    """One record laid out as ``CommitLog.MessageExtEncoder.encode`` does, from raw parts."""
    sysflag |= (0x10 if len(born[0]) == 16 else 0) | (0x20 if len(store[0]) == 16 else 0)
    head = struct.pack(">iiiqqiq", zlib.crc32(body) & 0x7FFFFFFF, queue_id, 3, queue_offset,
                       phys, sysflag, born_ts)  # fmt: skip
    tail = (
        born[0]
        + struct.pack(">iq", born[1], store_ts)
        + store[0]
        + struct.pack(">iiqi", store[1], 2, 77, len(body))
        + body
        + (struct.pack(">h", len(topic)) if v2 else struct.pack(">b", len(topic)))
        + topic
        + struct.pack(">h", len(props))
        + props
    )
    size = 8 + len(head) + len(tail)
    magic = 0xDAA320AB if v2 else 0xDAA320A7
    return struct.pack(">iI", size, magic) + head + tail


def write_raw(root: Path, records: list[dict[str, Any]], *, segment: int = SEGMENT) -> None:
    """Records back to back in segments closed by an end-of-file marker, the rest of each
    file filled with stale non-zero bytes (a reused file), not zeros."""
    rng = random.Random(5)
    directory = root / "commitlog"
    directory.mkdir(parents=True)
    start, data = 0, bytearray()

    def close(final: bool) -> None:
        nonlocal start, data
        if not final:
            left = segment - len(data)
            data += struct.pack(">iI", left, 0xCBD43194)
            data += rng.randbytes(segment - len(data))
        (directory / f"{start:020d}").write_bytes(bytes(data) + bytes(segment - len(data)))
        start += segment
        data = bytearray()

    for fields in records:
        rec = raw_record(start + len(data), **fields)
        if len(data) + len(rec) + 8 > segment:
            close(final=False)
            rec = raw_record(start, **fields)
        data += rec
    close(final=True)


V4 = (bytes([10, 0, 0, 1]), 10911)
V4_HIGH_PORT = (bytes([192, 168, 255, 254]), -2)  # a port stored as 0xFFFFFFFE
V6S = [
    (bytes(16), 1),
    (bytes.fromhex("00010000000000020000000000000003"), 2),  # ties: the first run
    (bytes.fromhex("00010000000200000000000000030004"), 3),
    (bytes.fromhex("00000000000000000000ffff01020304"), 4),  # IPv4-mapped
    (bytes.fromhex("20010db8000000010000000000000000"), 5),
    (bytes.fromhex("fe800000000000000000000000000001"), 6),
    (bytes.fromhex("0001000200030004000500060007abcd"), 7),
]
ODD_PROPS = [
    b"",
    b"TAGS\x01a\x02KEYS\x01k1 k2\x02",
    b"\x02\x02TAGS\x01\x02\x01v\x02x\x01\x02KEYS\x01only",  # empty names and values skipped
    b"a\x01b\x01c\x02a\x01second\x02b\x01x",  # value holds \x01; duplicate a: last wins
    b"TAGS\x01one\x02TAGS\x01two\x02KEYS\x01k\x02TAGS\x01three",
    b"noseparator\x02k\x01\xff\xfe bad utf8 \xe4\xb8\x02\xed\xa0\x80\x01v",
    b"\xf0\x9f\x98\x80\x01emoji \xe2\x9c\x93\x02\xc3\x01x\x02\xf4\x90\x80\x80\x01y",
    "schlüssel\x01wert ✓".encode(),
]
TOPICS = [b"t", b"\xff\xfeinvalid", "主题".encode(), b"x" * 127, b"v2-" + b"y" * 200, b""]


def odd_records(count: int) -> list[dict[str, Any]]:
    rng = random.Random(9)
    out = []
    for i in range(count):
        topic = TOPICS[i % len(TOPICS)]
        out.append(
            {
                "topic": topic,
                "body": rng.randbytes(rng.choice((0, 1, 40, 700))),
                "props": ODD_PROPS[i % len(ODD_PROPS)],
                "born": V6S[i % len(V6S)] if i % 3 == 0 else V4,
                "store": V6S[(i + 2) % len(V6S)] if i % 4 == 0 else V4_HIGH_PORT,
                "v2": len(topic) > 127 or i % 5 == 0,
                "born_ts": (-(1 << 62), 0, 253_402_300_800_000, 1_700_000_000_000)[i % 4],
                "store_ts": (1, -62_135_596_800_001, -62_135_596_800_000)[i % 3],
                "queue_id": i % 7,
                "queue_offset": i,
                "sysflag": (0x1 | 0x700, 0x4, 0x0)[i % 3],
            }
        )
    return out


# --- the same rows ------------------------------------------------------------------------


@pytest.mark.parametrize("partition_bytes", [None, 20_000, 3_000])
def test_the_varied_log_reads_the_same(
    jvm: SparkSession, varied_log: Log, partition_bytes: int | None
) -> None:
    rows = same(jvm, varied_log.root, partitionBytes=partition_bytes)
    assert len(rows) == len(varied_log.messages)


def test_odd_records_read_the_same(jvm: SparkSession, tmp_path: Path) -> None:
    """Raw records: properties with empty parts, duplicates, invalid UTF-8; IPv6 hosts of
    every shape; V2 topics; timestamps outside Spark's range; stale bytes after each
    end-of-file marker."""
    write_raw(tmp_path, odd_records(400))
    rows = same(jvm, tmp_path)
    assert len(rows) == 400
    assert same(jvm, tmp_path, partitionBytes=777) == rows


def test_damaged_logs_read_the_same(jvm: SparkSession, tmp_path: Path, varied_log: Log) -> None:
    ms = varied_log.messages
    root = copy_log(varied_log.root, tmp_path / "damaged")
    patch(root, ms[20].physical_offset, b"\xff" * 3)  # absurd total size
    patch(root, ms[21].physical_offset + 28, struct.pack(">q", 12345))  # wrong own offset
    patch(root, ms[40].physical_offset + 4, b"\x00\x00\x00\x01")  # bad magic
    patch(root, ms[90].physical_offset, bytes(ms[90].total_size + ms[91].total_size))  # zeros
    first_of_second = next(m for m in ms if m.physical_offset >= SEGMENT)
    blank_at = ms[ms.index(first_of_second) - 1].end_offset
    patch(root, blank_at, struct.pack(">i", 5))  # an end-of-file marker of the wrong length
    last = ms[-1]
    patch(root, last.physical_offset + 100, bytes(last.total_size - 100))  # torn tail
    for pb in (None, 1000):
        rows = same(jvm, root, partitionBytes=pb)
    assert len(rows) == len(ms) - 6  # 20, 21, 40, 90, 91 and the torn last one


def test_truncated_and_missing_segments_read_the_same(
    jvm: SparkSession, tmp_path: Path, varied_log: Log
) -> None:
    root = copy_log(varied_log.root, tmp_path / "cut")
    last = segments(root)[-1]
    last.write_bytes(last.read_bytes()[: varied_log.messages[-1].physical_offset % SEGMENT + 50])
    segments(root)[1].unlink()  # a hole between files
    rows = same(jvm, root, partitionBytes=10_000)
    assert 0 < len(rows) < len(varied_log.messages)
    renamed = copy_log(varied_log.root, tmp_path / "renamed")
    seg = segments(renamed)[-1]
    seg.rename(seg.with_name(f"{int(seg.name) + SEGMENT:020d}"))
    same(jvm, renamed)


def test_bodies_holding_records_read_the_same(jvm: SparkSession, tmp_path: Path) -> None:
    """A body that is a perfect record with its own offset is still one body, in both."""
    from trioha.store import HostAddress, encode_message

    host = HostAddress("10.0.0.9", 10911)
    messages = []
    for i in range(60):
        inner = encode_message(
            topic="forged", body=b"x" * 50, born_host=host, store_host=host,
            physical_offset=i * 400 + 150,
        )  # fmt: skip
        messages.append(NewMessage(topic="outer", body=b"\xda\xa3\x20" * 7 + inner * 3))
    write_log(tmp_path, messages)
    for pb in (None, 1000, 333):
        rows = same(jvm, tmp_path, partitionBytes=pb)
        assert len(rows) == 60


def test_compressed_bodies_read_the_same(jvm: SparkSession, tmp_path: Path) -> None:
    import lz4.frame
    import zstandard

    plain = b"a body the producer compressed " * 200
    zstd = zstandard.ZstdCompressor(write_checksum=True).compress(plain)
    half = len(plain) // 2
    two_zstd = zstandard.ZstdCompressor().compress(plain[:half])
    two_zstd += zstandard.ZstdCompressor().compress(plain[half:])
    cases = [  # (sysflag, stored body, what decompress=true returns: None for as stored)
        (0, plain, plain),
        (0x1, zlib.compress(plain), plain),
        (0x1 | 1 << 8, lz4.frame.compress(plain), plain),
        (0x1 | 2 << 8, zstd, plain),
        (0x1 | 3 << 8, zlib.compress(plain) + b"trailing", plain),
        (0x1 | 2 << 8, two_zstd, plain),  # frames back to back, as ZstdInputStream reads them
        (0x1 | 1 << 8, lz4.frame.compress(plain) + b"trailing", plain),  # the first frame
        (0x1, b"not zlib at all", None),
        (0x1, zlib.compress(plain)[:-9], None),  # truncated stream
        (0x1 | 1 << 8, b"not lz4", None),
        (0x1 | 2 << 8, b"not zstd", None),
        (0x1 | 2 << 8, zstd[:-4], None),  # all the content, not the frame's end
        (0x1 | 2 << 8, zstd[: len(zstd) // 2], None),  # a stream reader yields a part
        (0x1 | 2 << 8, zstd + b"trailing", None),
        (0x1 | 5 << 8, b"who knows", None),
    ]
    write_log(tmp_path, [NewMessage(topic="z", body=b, sysflag=f) for f, b, _ in cases])
    stored = same(jvm, tmp_path)
    opened = same(jvm, tmp_path, decompress=True)
    body = 18
    assert [r[body] for r in stored] == [b for _, b, _ in cases]
    assert [r[body] for r in opened] == [b if p is None else p for _, b, p in cases]


def test_large_lz4_frames_of_linked_blocks_read_the_same(jvm: SparkSession, tmp_path: Path) -> None:
    """``lz4.frame`` links blocks by default: matches reach into earlier 64 KiB blocks."""
    import lz4.frame

    rng = random.Random(4)
    plain = b"".join(
        rng.choice((b"abc ", b"order-", b"\x00" * 9, rng.randbytes(3))) for _ in range(60_000)
    )
    frames = [
        lz4.frame.compress(plain),
        lz4.frame.compress(plain, block_linked=False, content_checksum=True),
        lz4.frame.compress(plain, block_checksum=True, store_size=False, block_size=5),
        lz4.frame.compress(plain)[:-5],  # truncated: left as stored
    ]
    write_log(
        tmp_path,
        [NewMessage(topic="z", body=f, sysflag=0x1 | 1 << 8) for f in frames],
        segment_size=4 << 20,
    )
    opened = same(jvm, tmp_path, decompress=True)
    assert [r[18] for r in opened] == [plain] * 3 + [frames[3]]


EDGE_SIZES = (0, 1, 65535, 65536, 65537, 131072)


def edge_bodies() -> list[tuple[int, bytes, bytes]]:
    """(sysflag, stored body, what the producer sent) around the sizes where a reader's
    loop turns: nothing at all, one byte, and one 64 KiB output chunk (or LZ4 block, or zlib
    stored block) less one, exact, plus one, and two; each codec in the forms its
    producers write (zlib at the default level and stored, level 0; Zstandard with and
    without the content size in the frame; LZ4 frames with and without it, linked or not)."""
    import lz4.frame
    import zstandard

    rng = random.Random(64)
    out = []
    for size in EDGE_SIZES:
        plain = bytes(rng.choice(b"ab\x00") for _ in range(size))
        zlibs = [zlib.compress(plain), zlib.compress(plain, 0)]
        zstds = [
            zstandard.ZstdCompressor().compress(plain),
            zstandard.ZstdCompressor(write_content_size=False).compress(plain),
        ]
        lz4s = [
            lz4.frame.compress(plain),
            lz4.frame.compress(plain, store_size=False, block_linked=False),
        ]
        out += [(0x1, z, plain) for z in zlibs]
        out += [(0x1 | 3 << 8, z, plain) for z in zlibs]
        out += [(0x1 | 2 << 8, z, plain) for z in zstds]
        out += [(0x1 | 1 << 8, f, plain) for f in lz4s]
    return out


def test_decompression_at_edge_sizes_reads_the_same(jvm: SparkSession, tmp_path: Path) -> None:
    """Empty, one byte, and 64 KiB - 1, exact, + 1 and twice of output, for zlib, Zstandard
    and LZ4: both engines return what the producer sent, not the stored bytes."""
    cases = edge_bodies()
    write_log(
        tmp_path,
        [NewMessage(topic="z", body=b, sysflag=f) for f, b, _ in cases],
        segment_size=4 << 20,
    )
    opened = same(jvm, tmp_path, decompress=True)
    body, compressed = 18, 20
    assert [(r[body], r[compressed]) for r in opened] == [(p, False) for _, _, p in cases]
    assert [r[body] for r in same(jvm, tmp_path)] == [b for _, b, _ in cases]


def test_offset_options_and_filters_read_the_same(jvm: SparkSession, varied_log: Log) -> None:
    ms = varied_log.messages
    lo, hi = ms[40].physical_offset + 3, ms[200].physical_offset
    rows = same(jvm, varied_log.root, startOffset=lo, endOffset=hi, partitionBytes=5000)
    assert [r[0] for r in rows] == [m.physical_offset for m in ms[41:200]]
    py = _jvm.read_commitlog(jvm, str(varied_log.root), engine="python")
    jv = _jvm.read_commitlog(jvm, str(varied_log.root), engine="jvm")
    where = f"physical_offset >= {lo} AND physical_offset < {hi} AND queue_id = 2"
    assert collect(jv.where(where)) == collect(py.where(where))
    assert jv.select("topic", "msg_id").count() == len(ms)  # a pruned read counts the same


# --- choosing the engine -------------------------------------------------------------------


def test_auto_takes_the_jvm_engine_when_the_session_has_it(
    jvm: SparkSession, varied_log: Log
) -> None:
    df = _jvm.read_commitlog(jvm, str(varied_log.root))
    assert "commitlog_jvm" in df._jdf.queryExecution().toString()
    problems = _jvm.read_commitlog(jvm, str(varied_log.root), output="problems")
    assert problems.count() == 0  # the problems output is the Python engine's


def test_auto_falls_back_to_python_without_the_jar(
    spark: SparkSession,
    varied_log: Log,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A session without the engine's class (started elsewhere, or without a JDK)."""
    monkeypatch.setattr(_jvm, "SOURCE_CLASS", "trioha.pipeline.jvm.NotThere")
    with caplog.at_level(logging.INFO, logger="trioha.pipeline"):
        df = _jvm.read_commitlog(spark, str(varied_log.root))
        assert df.count() == len(varied_log.messages)
    (line,) = [r.getMessage() for r in caplog.records if "Python engine" in r.getMessage()]
    assert "the session has no trioha.pipeline.jvm.NotThere" in line
    with pytest.raises(PipelineError, match="engine=jvm: the session has no"):
        _jvm.read_commitlog(spark, str(varied_log.root), engine="jvm")


def test_no_jdk_means_no_jar_and_a_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIOHA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_jvm, "find_javac", lambda: None)
    built = _jvm.ensure_jar()
    assert built.path is None
    assert "no javac" in built.reason
    settings: dict[str, str] = {"spark.jars": "/x/other.jar"}
    from trioha.pipeline._session import _add_engine_jar

    _add_engine_jar(settings)
    assert settings == {"spark.jars": "/x/other.jar"}


def test_engine_options_are_checked(spark: SparkSession, varied_log: Log) -> None:
    assert ReadOptions.from_options({"path": "p", "engine": "JVM"}).engine is Engine.JVM
    with pytest.raises(PipelineError, match="expected auto, jvm or python"):
        ReadOptions.from_options({"path": "p", "engine": "gpu"})
    with pytest.raises(Exception, match="for the JVM engine use"):
        spark.read.format("commitlog").option("engine", "jvm").load(str(varied_log.root)).count()
    with pytest.raises(PipelineError, match="output=problems is read by the Python engine"):
        _jvm.read_commitlog(spark, str(varied_log.root), engine="jvm", output="problems")


def test_export_and_stats_take_an_engine_option() -> None:
    from trioha.pipeline._cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["export", "d", "o"]).engine == "auto"
    assert parser.parse_args(["stats", "d", "--engine", "python"]).engine == "python"
    with pytest.raises(SystemExit):
        parser.parse_args(["stats", "d", "--engine", "gpu"])


@pytest.mark.slow
@pytest.mark.skipif(NO_JDK, reason="no javac: the JVM engine cannot be built here")
def test_an_unwritable_cache_builds_in_a_private_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("TRIOHA_CACHE_DIR", str(tmp_path / "a-file" / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    built = _jvm.ensure_jar()
    assert built.path is not None, built.reason
    assert built.path.parent.parent == tmp_path / "tmp"
    assert built.path.parent.stat().st_mode & 0o077 == 0
    assert _jvm.ensure_jar().path == built.path  # found again, not rebuilt
    built.path.parent.chmod(0o777)  # a directory others may write to is not trusted
    again = _jvm.ensure_jar()
    assert again.path is None
    assert "not a directory of this user's alone" in again.reason
