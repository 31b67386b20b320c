"""The vectorised decoder against the store's codec, and how it reports damage.

No Spark here: these read partitions the way a Spark task does (``_read``), so they run in
a second and pin down the decoding that the Spark tests then only need to see arrive.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.pipeline.conftest import MISSING, SKIP_REASON

if MISSING:  # only when the extra is not installed at all; a broken install fails
    pytest.skip(SKIP_REASON, allow_module_level=True)

import numpy as np
import pyarrow as pa

from tests.pipeline._logs import (
    SEGMENT,
    copy_log,
    expected_row,
    segments,
    varied_messages,
    write_log,
)
from tests.pipeline.conftest import Log
from trioha.pipeline import _format
from trioha.pipeline._batches import MESSAGE_ARROW_SCHEMA, decompress
from trioha.pipeline._decode import SegmentData, open_segment
from trioha.pipeline._format import Problem, ProblemKind
from trioha.pipeline._framing import _chain, scan_range, written_end
from trioha.pipeline._layout import Segment, read_layout
from trioha.pipeline._plan import plan_partitions
from trioha.pipeline._read import read_messages, read_problems
from trioha.pipeline._validation import explain_record
from trioha.pipeline._validation import record_layout as _layout
from trioha.store import _message as codec


def rows(root: Path, target: int = 1 << 27, **kw: Any) -> list[dict[str, Any]]:
    """Every message the partitions of *root* yield, timestamps as milliseconds."""
    out = []
    for part in plan_partitions(read_layout(root), target_bytes=target, **kw):
        for read in read_messages(part):
            batch = read
            for name in ("born_timestamp", "store_timestamp"):
                i = batch.schema.get_field_index(name)
                micros = batch.column(i).cast(pa.int64()).to_numpy(zero_copy_only=False)
                batch = batch.set_column(i, name, pa.array(micros // 1000))
            for row in batch.to_pylist():
                row["properties"] = dict(row["properties"])
                out.append(row)
    return out


def problems(root: Path, target: int = 1 << 27, **kw: Any) -> list[Problem]:
    plan = plan_partitions(read_layout(root), target_bytes=target, **kw)
    return [p for part in plan for p in read_problems(part)]


def patch(root: Path, offset: int, data: bytes) -> None:
    """Overwrite bytes of the commit log at an absolute offset."""
    seg = segments(root)[offset // SEGMENT]
    with seg.open("r+b") as f:
        f.seek(offset % SEGMENT)
        f.write(data)


def test_constants_agree_with_the_store_codec() -> None:
    assert _format.MESSAGE_MAGIC == codec.MESSAGE_MAGIC
    assert _format.MESSAGE_MAGIC_V2 == codec.MESSAGE_MAGIC_V2
    assert _format.BLANK_MAGIC == codec.BLANK_MAGIC
    assert _format.MIN_RECORD_SIZE == codec.MIN_RECORD_SIZE
    assert _format.BLANK_MARKER_SIZE == codec.BLANK_RECORD_SIZE
    assert _format.SYSFLAG_BORNHOST_V6 == codec.SYSFLAG_BORNHOST_V6
    assert _format.SYSFLAG_STOREHOST_V6 == codec.SYSFLAG_STOREHOST_V6


def test_arrow_schema_is_what_spark_expects() -> None:
    from trioha.pipeline._batches import PROBLEM_ARROW_SCHEMA
    from trioha.pipeline._schema import MESSAGE_SCHEMA, PROBLEM_SCHEMA, arrow_schema

    assert arrow_schema(MESSAGE_SCHEMA).equals(MESSAGE_ARROW_SCHEMA)
    assert arrow_schema(PROBLEM_SCHEMA).equals(PROBLEM_ARROW_SCHEMA)


@pytest.mark.parametrize("target", [1 << 27, 30_000, 1000])
def test_every_field_equals_the_store_codec(varied_log: Log, target: int) -> None:
    expected = [expected_row(m) for m in varied_log.messages]
    assert rows(varied_log.root, target) == expected
    assert problems(varied_log.root, target) == []


def test_the_varied_log_covers_what_it_should(varied_log: Log) -> None:
    ms = varied_log.messages
    assert len(segments(varied_log.root)) == 4  # several segments, blank records between
    assert {m.magic for m in ms} == {codec.MESSAGE_MAGIC, codec.MESSAGE_MAGIC_V2}
    assert {m.sysflag & 0x30 for m in ms} == {0, 0x10, 0x20, 0x30}  # IPv4 and IPv6 hosts
    assert any(not m.body for m in ms)
    assert any(not m.properties for m in ms)
    assert {m.properties_form for m in ms} == set(codec.PropertiesForm)
    assert any(len(m.properties) != len(m.properties_dict()) for m in ms)


def test_offset_range_option_reads_records_starting_inside_it(varied_log: Log) -> None:
    ms = varied_log.messages
    lo, hi = ms[40].physical_offset + 1, ms[200].physical_offset + 1
    got = [
        r["physical_offset"] for r in rows(varied_log.root, 5000, start_offset=lo, end_offset=hi)
    ]
    assert got == [m.physical_offset for m in ms[41:201]]


def test_vectorised_and_scalar_checks_agree_on_damaged_records(tmp_path: Path) -> None:
    stored = write_log(tmp_path, varied_messages(120, seed=3))
    layout = read_layout(tmp_path)
    rng = random.Random(11)
    data = bytearray(Path(layout.segments[0].path).read_bytes())
    starts = [m.physical_offset for m in stored if m.physical_offset < SEGMENT]
    for _ in range(400):
        damaged = bytearray(data)
        for _ in range(rng.choice((1, 2, 3))):
            at = rng.choice(starts) + rng.randrange(0, 120)
            damaged[at] = rng.randrange(256)
        sd = SegmentData.from_bytes(layout.segments[0], bytes(damaged))
        ok = _layout(sd, np.array(starts, dtype=np.int64)).ok
        assert ok.tolist() == [explain_record(sd, s) is None for s in starts]


def test_a_log_truncated_mid_message_reads_the_valid_prefix(
    tmp_path: Path, varied_log: Log
) -> None:
    root = copy_log(varied_log.root, tmp_path / "cut")
    last = varied_log.messages[-1]
    cut = last.physical_offset + 50
    path = segments(root)[-1]
    path.write_bytes(path.read_bytes()[: cut % SEGMENT])
    assert rows(root) == [expected_row(m) for m in varied_log.messages[:-1]]
    found = problems(root)
    assert [(p.kind, p.offset, p.length) for p in found] == [
        (ProblemKind.BAD_SEGMENT, path_start(path), 0),
        (ProblemKind.TORN_TAIL, last.physical_offset, 50),
    ]
    assert f"total size {last.total_size} runs past the end of the file (50 bytes left)" in (
        found[1].detail
    )


def path_start(path: Path) -> int:
    return int(path.name)


def test_a_torn_tail_in_a_preallocated_segment_is_reported(tmp_path: Path, varied_log: Log) -> None:
    """A slave that received half a record: the rest of the file is zeros."""
    root = copy_log(varied_log.root, tmp_path / "torn")
    last = varied_log.messages[-1]
    patch(root, last.physical_offset + 100, bytes(last.total_size - 100))
    assert rows(root) == [expected_row(m) for m in varied_log.messages[:-1]]
    (torn,) = problems(root)
    assert (torn.kind, torn.offset) == (ProblemKind.TORN_TAIL, last.physical_offset)
    with open_segment(read_layout(root).segments[-1]) as sd:
        end, problem = written_end(sd)
    assert end == last.physical_offset
    assert problem == torn


def test_bad_magic_in_the_middle_skips_exactly_one_record(tmp_path: Path, varied_log: Log) -> None:
    root = copy_log(varied_log.root, tmp_path / "magic")
    victim = varied_log.messages[150]
    patch(root, victim.physical_offset + 4, b"\x00\x00\x00\x01")
    kept = [m for m in varied_log.messages if m is not victim]
    for target in (1 << 27, 3000):
        assert rows(root, target) == [expected_row(m) for m in kept]
        (bad,) = problems(root, target)
        assert bad == Problem(
            victim.physical_offset,
            f"{victim.physical_offset // SEGMENT * SEGMENT:020d}",
            ProblemKind.BAD_MAGIC,
            victim.total_size,
            "magic code 0x00000001 is neither a message's (0xdaa320a7 or 0xdaa320ab) nor the "
            f"end-of-file marker's (0xcbd43194); skipped {victim.total_size} bytes to the next "
            f"record at {victim.end_offset}",
        )


def test_a_flipped_body_byte_is_a_crc_mismatch(tmp_path: Path, varied_log: Log) -> None:
    root = copy_log(varied_log.root, tmp_path / "crc")
    victim = next(m for m in varied_log.messages[100:] if len(m.body) > 100)
    body_at = victim.end_offset - len(victim.body) - len(victim.topic.encode()) - 1 - 2
    body_at -= len(codec.properties_to_string(victim.properties, victim.properties_form).encode())
    body_at -= 1 if victim.magic == codec.MESSAGE_MAGIC_V2 else 0
    patch(root, body_at + 10, bytes([victim.body[10] ^ 0x40]))
    got = rows(root)
    assert len(got) == len(varied_log.messages)  # framing is intact: still a message
    changed = next(r for r in got if r["physical_offset"] == victim.physical_offset)
    assert changed["body"][10] == victim.body[10] ^ 0x40
    (bad,) = problems(root)
    assert (bad.kind, bad.offset, bad.length) == (
        ProblemKind.CRC_MISMATCH,
        victim.physical_offset,
        len(victim.body),
    )
    assert f"differs from the stored {victim.body_crc}" in bad.detail


def test_problems_do_not_depend_on_partitioning(tmp_path: Path, varied_log: Log) -> None:
    root = copy_log(varied_log.root, tmp_path / "many")
    ms = varied_log.messages
    patch(root, ms[20].physical_offset, b"\xff" * 3)  # absurd total size
    patch(root, ms[21].physical_offset + 28, struct.pack(">q", 12345))  # wrong own offset
    patch(root, ms[90].physical_offset, bytes(ms[90].total_size + ms[91].total_size))  # zeros
    reference = (rows(root), problems(root))
    kinds = [p.kind for p in reference[1]]
    assert kinds == [ProblemKind.SIZE_MISMATCH, ProblemKind.GAP]
    assert reference[1][0].length == ms[20].total_size + ms[21].total_size
    assert reference[1][1].length == ms[90].total_size + ms[91].total_size
    assert len(reference[0]) == len(ms) - 4
    for target in (500, 1000, 7777, 40_000):
        assert (rows(root, target), problems(root, target)) == reference


def test_zeros_before_the_end_of_a_full_segment_are_a_gap(tmp_path: Path, varied_log: Log) -> None:
    root = copy_log(varied_log.root, tmp_path / "gap")
    first_of_second = next(m for m in varied_log.messages if m.physical_offset >= SEGMENT)
    last_of_first = varied_log.messages[varied_log.messages.index(first_of_second) - 1]
    patch(root, last_of_first.physical_offset, bytes(SEGMENT - last_of_first.physical_offset))
    (gap,) = problems(root)
    assert (gap.kind, gap.offset, gap.length) == (
        ProblemKind.GAP,
        last_of_first.physical_offset,
        SEGMENT - last_of_first.physical_offset,
    )
    assert "no end-of-file marker" in gap.detail


def test_a_blank_marker_with_a_wrong_length_is_reported(tmp_path: Path, varied_log: Log) -> None:
    root = copy_log(varied_log.root, tmp_path / "blank")
    first_of_second = next(m for m in varied_log.messages if m.physical_offset >= SEGMENT)
    blank_at = varied_log.messages[varied_log.messages.index(first_of_second) - 1].end_offset
    patch(root, blank_at, struct.pack(">i", 5))
    (bad,) = problems(root)
    assert (bad.kind, bad.offset) == (ProblemKind.SIZE_MISMATCH, blank_at)
    assert f"says 5 bytes remain, but {SEGMENT - blank_at} do" in bad.detail
    assert len(rows(root)) == len(varied_log.messages)


def test_a_renamed_segment_is_an_offset_mismatch(tmp_path: Path, varied_log: Log) -> None:
    root = copy_log(varied_log.root, tmp_path / "renamed")
    last = segments(root)[-1]
    last.rename(last.with_name(f"{int(last.name) + SEGMENT:020d}"))
    found = problems(root)
    assert [p.kind for p in found] == [ProblemKind.MISSING_SEGMENT, ProblemKind.TORN_TAIL]
    assert "stored physical offset 196608 is not the record's own offset 262144" in (
        found[1].detail
    )


def test_invalid_utf8_is_replaced_as_the_store_does(tmp_path: Path) -> None:
    stored = write_log(tmp_path, varied_messages(3))
    m = stored[1]
    topic_at = (
        m.end_offset
        - 2
        - len(codec.properties_to_string(m.properties, m.properties_form).encode())
        - len(m.topic.encode())
    )
    patch(tmp_path, topic_at, b"\xff")
    with open_segment(read_layout(tmp_path).segments[0]) as sd:
        ref = codec.decode_record(sd.data, m.physical_offset, check_crc=False)
        assert isinstance(ref, codec.DecodedMessage)
        (got,) = [r for r in rows(tmp_path) if r["physical_offset"] == m.physical_offset]
    assert got["topic"] == ref.message.topic
    assert "\ufffd" in got["topic"]


def test_batches_are_cut_by_rows_and_bytes(varied_log: Log) -> None:
    (part,) = plan_partitions(read_layout(varied_log.root))
    batches = list(read_messages(part, batch_rows=50, batch_bytes=1 << 30))
    per_segment = [0] * 4
    for m in varied_log.messages:
        per_segment[m.physical_offset // SEGMENT] += 1
    expected = [min(50, n - i) for n in per_segment for i in range(0, n, 50)]
    assert [b.num_rows for b in batches] == expected  # batches never span segments
    assert all(b.schema.equals(MESSAGE_ARROW_SCHEMA) for b in batches)
    small = list(read_messages(part, batch_rows=1000, batch_bytes=20_000))
    assert sum(b.num_rows for b in small) == 300
    assert all(sum(b.column("size").to_pylist()) <= 20_000 + 4000 for b in small)
    table = pa.Table.from_batches(small)
    assert table.column("physical_offset").to_pylist() == [
        m.physical_offset for m in varied_log.messages
    ]


def test_scan_range_on_bytes_in_memory(varied_log: Log) -> None:
    seg = read_layout(varied_log.root).segments[1]
    sd = SegmentData.from_bytes(seg, Path(seg.path).read_bytes())
    starts, found = scan_range(sd, seg.start, seg.end, last=False)
    expected = [
        m.physical_offset - seg.start
        for m in varied_log.messages
        if seg.start <= m.physical_offset < seg.end
    ]
    assert starts.tolist() == expected
    assert found == []
    # a range is read from where it begins: a position inside a record is not a record
    starts, found = scan_range(sd, seg.start + 1, seg.end, last=False)
    assert starts.tolist() == expected[1:]
    assert [(p.offset, p.kind) for p in found] == [(seg.start + 1, ProblemKind.BAD_MAGIC)]


def test_msg_id_is_rocketmqs_offset_message_id() -> None:
    from trioha.pipeline._batches import _msg_ids

    addr = np.zeros((2, 16), dtype=np.uint8)
    addr[0, :4] = [127, 0, 0, 1]
    addr[1] = list(bytes.fromhex("20010db8000000000000000000000001"))
    ids = _msg_ids(
        addr,
        np.array([10911, 10911], dtype=np.int64),
        np.array([1234567, 1234567], dtype=np.int64),
        np.array([False, True]),
    ).to_pylist()
    assert ids[0] == "7F00000100002A9F000000000012D687"  # createMessageId's own vector
    assert ids[1] == "20010DB800000000000000000000000100002A9F000000000012D687"
    assert ids[1] == codec.make_msg_id(codec.HostAddress("2001:db8::1", 10911), 1234567)


def test_compressed_bodies_are_marked_and_decompressed(tmp_path: Path) -> None:
    import zlib

    import lz4.frame
    import zstandard

    from tests.pipeline._logs import write_log
    from trioha.store import NewMessage

    plain = b"a body the producer compressed " * 200
    cases = [
        (0, plain, None),  # not compressed
        (0x1, zlib.compress(plain), "zlib"),  # 4.x: the flag alone means zlib
        (0x1 | 1 << 8, lz4.frame.compress(plain), "lz4"),
        (0x1 | 2 << 8, zstandard.ZstdCompressor().compress(plain), "zstd"),
        (0x1 | 3 << 8, zlib.compress(plain), "zlib"),
        (0x1, b"not zlib at all", "zlib"),  # flagged, but does not decompress
        (0x1 | 5 << 8, b"who knows", "unknown(5)"),
    ]
    write_log(tmp_path, [NewMessage(topic="z", body=b, sysflag=f) for f, b, _ in cases])
    (part,) = plan_partitions(read_layout(tmp_path))
    stored = [r for b in read_messages(part) for r in b.to_pylist()]
    assert [r["compression"] for r in stored] == [c for _, _, c in cases]
    assert [r["compressed"] for r in stored] == [c is not None for _, _, c in cases]
    assert [r["body"] for r in stored] == [b for _, b, _ in cases]
    opened = [r for b in read_messages(part, decompress=True) for r in b.to_pylist()]
    assert [r["body"] for r in opened] == [plain] * 5 + [cases[5][1], cases[6][1]]
    assert [r["compressed"] for r in opened] == [False] * 5 + [True, True]
    assert [r["compression"] for r in opened] == [c for _, _, c in cases]


def test_a_zstandard_body_decompresses_only_when_every_frame_is_whole() -> None:
    """zstd-jni's ``ZstdInputStream`` (RocketMQ's ``ZstdCompressor``) reads frames back to
    back and fails on one cut short; a stream reader would return the part it decoded."""
    import zstandard

    plain = b"a body the producer compressed " * 200
    frame = zstandard.ZstdCompressor(write_checksum=True).compress(plain)
    assert decompress(frame, "zstd") == plain
    assert decompress(frame + frame, "zstd") == plain + plain
    assert decompress(b"", "zstd") == b""  # no frame: nothing, as ZstdInputStream reads it
    for cut in (frame[:-4], frame[: len(frame) // 2], frame[:-1]):
        with pytest.raises(ValueError, match="truncated"):
            decompress(cut, "zstd")
    with pytest.raises(ValueError, match="not a Zstandard frame"):
        decompress(frame + b"trailing", "zstd")


def _hop_by_hop(data: bytes, pos: int, hi: int) -> tuple[list[int], int]:
    """The record chain followed one record at a time (what ``_chain`` must return)."""
    out = []
    while pos < hi and pos <= len(data) - 8:
        total, magic = struct.unpack_from(">iI", data, pos)
        if magic not in (_format.MESSAGE_MAGIC, _format.MESSAGE_MAGIC_V2) or not (
            _format.MIN_RECORD_SIZE <= total <= len(data) - pos
        ):
            break
        out.append(pos)
        pos += total
    return out, pos


@settings(max_examples=300, deadline=None)
@given(
    runs=st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 80), st.sampled_from([0, 1, 2])),
        min_size=1,
        max_size=12,
    ),
    tail=st.sampled_from(["zeros", "garbage", "short", "oversized", "cut", "none"]),
    hi_cut=st.floats(0, 1.2),
)
def test_the_predicted_chain_is_the_hopped_chain(
    runs: list[tuple[int, int, int]], tail: str, hi_cut: float
) -> None:
    """Runs of same-sized records (where ``_chain`` predicts positions) and of varied
    ones, then something that ends the chain, cut anywhere: the same positions as hopping
    one record at a time. Every body is full of record heads claiming the previous run's
    size, which is what a prediction that ran on past a change of size would accept."""
    base = _format.MIN_RECORD_SIZE
    data = bytearray()
    previous = base
    for size_code, count, magic_code in runs:
        size = base + 16 * size_code
        magic = (_format.MESSAGE_MAGIC, _format.MESSAGE_MAGIC_V2, _format.MESSAGE_MAGIC)[magic_code]
        record = bytearray(size)
        for at in range(8, size - 8, 8):  # forged heads inside the body
            struct.pack_into(">iI", record, at, previous, _format.MESSAGE_MAGIC)
        struct.pack_into(">iI", record, 0, size, magic)
        data += bytes(record) * count
        previous = size
    data += {
        "zeros": bytes(64),
        "garbage": b"\xff" * 64,
        "short": struct.pack(">iI", base, _format.MESSAGE_MAGIC)[:6],
        "oversized": struct.pack(">iI", 1 << 30, _format.MESSAGE_MAGIC) + bytes(8),
        # one more record of the last run's size, cut short by the end of the data
        "cut": struct.pack(">iI", previous, _format.MESSAGE_MAGIC) + bytes(8),
        "none": b"",
    }[tail]
    blob = bytes(data)
    sd = SegmentData.from_bytes(Segment("/nonexistent/" + "0" * 20, 0, len(blob)), blob)
    hi = int(len(blob) * hi_cut)
    found, stop = _chain(sd, 0, hi)
    assert (found.tolist(), stop) == _hop_by_hop(blob, 0, hi)
