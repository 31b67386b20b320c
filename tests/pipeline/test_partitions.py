"""Exact partitions: message bodies that hold valid-looking records never become rows.

The logs here are written record by record with the store's codec (no store involved), so
each body can carry a perfect record, its stored physical offset equal to the position it
lands at in the log: what a scan for "something that looks like a record" would take for one.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.pipeline.conftest import MISSING, SKIP_REASON

if MISSING:
    pytest.skip(SKIP_REASON, allow_module_level=True)

from trioha.pipeline._layout import read_layout
from trioha.pipeline._plan import plan_partitions
from trioha.pipeline._read import read_messages, read_problems
from trioha.store import HostAddress, encode_blank, encode_message, message_length

HOST = HostAddress("10.0.0.1", 10911)
HEAD = 88  # TOTALSIZE .. body length with IPv4 hosts: the body starts this far into a record


def forged_log(root: Path, plan: list[tuple[int, int, int]], segment: int) -> list[int]:
    """Write messages whose bodies hold *count* forged records after *pad* random bytes,
    then *tail* more; return the physical offsets of the real records.

    Every forged record stores the offset where it really lies, so it passes every check a
    record at that position would pass.
    """
    rng = random.Random(len(plan))
    files: dict[int, bytearray] = {}
    offsets: list[int] = []
    pos = 0
    for i, (pad, count, tail) in enumerate(plan):
        inner = [message_length(0, 10 + j, len(f"forged-{j}"), 0) for j in range(count)]
        body_len = pad + sum(inner) + tail
        size = message_length(0, body_len, len("real"), 0)
        start = pos - pos % segment
        if pos + size + 8 > start + segment:  # CommitLog.doAppend: close the file
            rel = pos - start
            files.setdefault(start, bytearray(segment))[rel : rel + 8] = encode_blank(segment - rel)
            pos = start + segment
            start = pos
        at = pos + HEAD + pad
        body = bytearray(rng.randbytes(pad))
        for j in range(count):
            body += encode_message(
                topic=f"forged-{j}",
                body=bytes(10 + j),
                born_host=HOST,
                store_host=HOST,
                physical_offset=at,
                queue_offset=i,
            )
            at += inner[j]
        body += rng.randbytes(tail)
        record = encode_message(
            topic="real",
            body=bytes(body),
            born_host=HOST,
            store_host=HOST,
            physical_offset=pos,
            queue_offset=i,
        )
        assert len(record) == size
        seg = files.setdefault(start, bytearray(segment))
        seg[pos - start : pos - start + size] = record
        offsets.append(pos)
        pos += size
    (root / "commitlog").mkdir(parents=True)
    for start, data in files.items():
        (root / "commitlog" / f"{start:020d}").write_bytes(data)
    return offsets


messages = st.lists(
    st.tuples(
        st.integers(0, 300),  # random bytes before the forged records
        st.integers(0, 3),  # forged records in the body
        st.integers(0, 300),  # random bytes after them
    ),
    min_size=1,
    max_size=40,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    plan=messages,
    targets=st.lists(st.integers(300, 20_000), min_size=1, max_size=3),
    start=st.integers(0, 8192),
)
def test_rows_are_exactly_the_records(
    tmp_path_factory: pytest.TempPathFactory,
    plan: list[tuple[int, int, int]],
    targets: list[int],
    start: int,
) -> None:
    root = tmp_path_factory.mktemp("forged")
    offsets = forged_log(root, plan, segment=8192)
    layout = read_layout(root)
    for target in targets:
        for lo in (None, start):
            parts = plan_partitions(layout, target_bytes=target, start_offset=lo)
            got = [
                off
                for p in parts
                for b in read_messages(p)
                for off in b.column("physical_offset").to_pylist()
            ]
            want = [o for o in offsets if lo is None or o >= lo]
            assert got == want, (target, lo)
            assert [p for part in parts for p in read_problems(part)] == []
            topics = {
                t for p in parts for b in read_messages(p) for t in b.column("topic").to_pylist()
            }
            assert topics <= {"real"}


def test_a_boundary_inside_a_body_holding_a_record_reads_one_row(tmp_path: Path) -> None:
    """The case a pattern scan got wrong: a cut falls just before a forged record."""
    offsets = forged_log(tmp_path, [(100, 1, 50), (0, 2, 0), (7, 1, 7)], segment=8192)
    forged_at = offsets[0] + HEAD + 100
    layout = read_layout(tmp_path)
    for cut in range(forged_at - 3, forged_at + 4):
        parts = plan_partitions(layout, start_offset=None, target_bytes=cut)
        got = [o for p in parts for b in read_messages(p) for o in b["physical_offset"].to_pylist()]
        assert got == offsets, cut
    # startOffset inside the first body moves to the next real record
    (part,) = plan_partitions(layout, start_offset=forged_at)
    assert part.ranges[0].begin == offsets[1]
