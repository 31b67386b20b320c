"""Partition planning and directory listing: pure Python, no Spark."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trioha._errors import PipelineError
from trioha.pipeline._format import ProblemKind
from trioha.pipeline._layout import LogLayout, Segment, commitlog_directory, read_layout
from trioha.pipeline._plan import MIB, ScanRange, plan_partitions

GIB = 1024 * MIB


def layout(*starts: int, size: int, last_length: int | None = None) -> LogLayout:
    segs = [Segment(f"/x/{s:020d}", s, size) for s in starts]
    if last_length is not None:
        segs[-1] = Segment(segs[-1].path, segs[-1].start, last_length)
    return LogLayout("/x", size, tuple(segs))


def test_a_1_gib_segment_is_cut_into_128_mib_ranges() -> None:
    plan = plan_partitions(layout(0, size=GIB), exact=False)
    assert [p.index for p in plan] == list(range(8))
    assert [(r.begin, r.end) for p in plan for r in p.ranges] == [
        (i * 128 * MIB, (i + 1) * 128 * MIB) for i in range(8)
    ]
    assert all(r.last for p in plan for r in p.ranges)
    assert [r.at_segment_start for p in plan for r in p.ranges] == [True] + [False] * 7


def test_uneven_segments_are_cut_into_equal_pieces_at_most_the_target() -> None:
    plan = plan_partitions(layout(0, size=200 * MIB), exact=False)
    assert [(r.begin, r.end) for p in plan for r in p.ranges] == [
        (0, 100 * MIB),
        (100 * MIB, 200 * MIB),
    ]


def test_small_segments_are_packed_into_one_partition() -> None:
    plan = plan_partitions(layout(*(i * 16 * MIB for i in range(20)), size=16 * MIB), exact=False)
    assert [len(p.ranges) for p in plan] == [8, 8, 4]
    assert [p.nbytes for p in plan] == [128 * MIB, 128 * MIB, 64 * MIB]
    flat = [r for p in plan for r in p.ranges]
    assert [r.segment.start for r in flat] == [i * 16 * MIB for i in range(20)]
    assert [r.last for r in flat] == [False] * 19 + [True]
    assert all(r.at_segment_start for r in flat)


def test_offset_range_limits_and_starts_inside_a_segment() -> None:
    plan = plan_partitions(
        layout(0, GIB, 2 * GIB, size=GIB),
        start_offset=GIB + 5,
        end_offset=GIB + 300 * MIB,
        exact=False,
    )
    ranges = [(r.segment.start, r.begin, r.end) for p in plan for r in p.ranges]
    step = 104_857_599  # ceil((300 MiB - 5) / 3): three equal pieces under 128 MiB
    assert ranges == [
        (GIB, GIB + 5, GIB + 5 + step),
        (GIB, GIB + 5 + step, GIB + 5 + 2 * step),
        (GIB, GIB + 5 + 2 * step, GIB + 300 * MIB),
    ]
    assert not plan[0].ranges[0].at_segment_start


def test_an_empty_range_plans_nothing() -> None:
    assert plan_partitions(layout(0, size=MIB), start_offset=MIB, exact=False) == ()
    assert plan_partitions(LogLayout("/x", 0, ()), exact=False) == ()


def test_ranges_must_lie_inside_their_segment() -> None:
    seg = Segment("/x/0", 0, 100)
    with pytest.raises(ValueError, match="not inside"):
        ScanRange(seg, 50, 150, last=True)


def write(path: Path, size: int) -> None:
    path.write_bytes(bytes(size))


def test_read_layout_finds_commitlog_under_a_store_root(tmp_path: Path) -> None:
    cl = tmp_path / "commitlog"
    cl.mkdir()
    for start in (0, 4096, 8192):
        write(cl / f"{start:020d}", 4096)
    (cl / "not-a-segment").write_text("x")
    (tmp_path / "checkpoint").write_bytes(bytes(4096))
    for given in (tmp_path, cl):
        lay = read_layout(given)
        assert lay.directory == str(cl.resolve())
        assert lay.segment_size == 4096
        assert [s.start for s in lay.segments] == [0, 4096, 8192]
        assert lay.problems == ()
        assert commitlog_directory(given) == cl


def test_read_layout_reports_a_missing_segment_and_wrong_lengths(tmp_path: Path) -> None:
    for start in (0, 4096, 16384):
        write(tmp_path / f"{start:020d}", 4096)
    write(tmp_path / f"{20480:020d}", 1000)
    lay = read_layout(tmp_path)
    assert [(p.kind, p.offset, p.length) for p in lay.problems] == [
        (ProblemKind.MISSING_SEGMENT, 8192, 8192),
        (ProblemKind.BAD_SEGMENT, 20480, 0),
    ]
    assert "no segment file holds offsets [8192, 16384) (2 file(s) missing" in (
        lay.problems[0].detail
    )
    assert "truncated copy" in lay.problems[1].detail
    assert lay.holes() == ((8192, 16384),)
    # the layout problems travel with the first partition (and only inside the range)
    plan = plan_partitions(lay)
    assert plan[0].problems == lay.problems
    assert all(not p.problems for p in plan[1:])
    assert plan_partitions(lay, start_offset=16384)[0].problems == (lay.problems[1],)


def test_read_layout_takes_the_start_marker_of_a_log_begun_mid_segment(tmp_path: Path) -> None:
    cl = tmp_path / "commitlog"
    cl.mkdir()
    write(cl / f"{8192:020d}", 4096)
    (tmp_path / "commitlog.start").write_text("9000\n")
    lay = read_layout(tmp_path)
    assert lay.min_offset == 9000
    assert [(r.begin, r.end) for p in plan_partitions(lay) for r in p.ranges] == [(9000, 12288)]
    (tmp_path / "commitlog.start").write_text("100")  # not inside the first file: ignored
    assert read_layout(tmp_path).min_offset == 8192


def test_read_layout_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match=r"not found: .*nope"):
        read_layout(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(PipelineError, match="not a directory"):
        read_layout(tmp_path / "file")
    assert read_layout(tmp_path).segments == ()


def test_planning_a_segment_into_many_ranges_reads_each_record_once(tmp_path: Path) -> None:
    """Records straddle range boundaries; each is read by the range it starts in."""
    from tests.pipeline.conftest import MISSING, SKIP_REASON

    if MISSING:
        pytest.skip(SKIP_REASON)
    from tests.pipeline._logs import varied_messages, write_log
    from trioha.pipeline._read import read_messages

    stored = write_log(tmp_path, varied_messages(300))
    expected = [m.physical_offset for m in stored]
    lay = read_layout(tmp_path)
    for target in (997, 4096, 30_000, 10 * MIB):
        plan = plan_partitions(lay, target_bytes=target)
        got = [
            off
            for p in plan
            for b in read_messages(p)
            for off in b.column("physical_offset").to_pylist()
        ]
        assert got == expected, f"target {target}"
        # every range begins at a record start (or at a segment's end-of-file marker, just
        # after its last record): the cuts were moved to positions the chain reaches
        markers = {m.end_offset for m in stored}
        begins = [r.begin for p in plan for r in p.ranges]
        assert set(begins) <= set(expected) | markers, f"target {target}"
        if target < 4096:
            assert len(begins) > len(lay.segments), "the segments were cut into many ranges"
    assert os.path.exists(tmp_path / "commitlog")
