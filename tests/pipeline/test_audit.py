"""Replica audit: each kind of difference is found and described exactly."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.pipeline._logs import SEGMENT, copy_log, segments
from tests.pipeline.conftest import Log
from trioha.pipeline import AuditReport, OffsetRange, ProblemKind, Verdict
from trioha.store import StoredMessage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

CHUNK = 4096


def patch(root: Path, offset: int, data: bytes) -> None:
    seg = segments(root)[offset // SEGMENT]
    with seg.open("r+b") as f:
        f.seek(offset % SEGMENT)
        f.write(data)


def body_offset(root: Path, m: StoredMessage) -> int:
    """Where the body of *m* starts in the log."""
    seg = segments(root)[m.physical_offset // SEGMENT].read_bytes()
    rel = m.physical_offset % SEGMENT
    at = seg.find(m.body, rel, rel + m.total_size)
    assert at >= 0
    return m.physical_offset - rel + at


@pytest.fixture(scope="module")
def audit(
    spark: SparkSession, varied_log: Log, tmp_path_factory: pytest.TempPathFactory
) -> tuple[AuditReport, dict[str, int]]:
    """One audit of a master against five slaves, each damaged in its own way."""
    from trioha.pipeline import audit_replicas

    base = tmp_path_factory.mktemp("audit")
    ms = varied_log.messages
    master = copy_log(varied_log.root, base / "master")
    facts: dict[str, int] = {}

    copy_log(master, base / "identical")

    flipped = copy_log(master, base / "flipped")
    victim = next(m for m in ms[120:] if len(m.body) >= 1000)
    facts["victim"] = victim.physical_offset
    facts["flipped_byte"] = body_offset(flipped, victim) + 777
    patch(flipped, facts["flipped_byte"], bytes([victim.body[777] ^ 0x01]))

    missing = copy_log(master, base / "missing")
    segments(missing)[1].unlink()

    behind = copy_log(master, base / "behind")  # stopped exactly at a record boundary
    cut = ms[-20]
    patch(behind, cut.physical_offset, bytes(varied_log.end - cut.physical_offset))
    facts["behind_at"] = cut.physical_offset

    torn = copy_log(master, base / "torn")  # stopped inside a record
    facts["torn_at"] = ms[-5].physical_offset
    patch(torn, facts["torn_at"] + 40, bytes(varied_log.end - facts["torn_at"] - 40))

    slaves = [str(base / n) for n in ("identical", "flipped", "missing", "behind", "torn")]
    report = audit_replicas(spark, str(master), slaves, chunk_bytes=CHUNK)
    return report, facts


def test_master(audit: tuple[AuditReport, dict[str, int]], varied_log: Log) -> None:
    report, _ = audit
    assert report.master.end_offset == varied_log.end
    assert report.master.min_offset == 0
    assert report.master.problems == ()
    assert not report.ok  # some slaves are damaged


def test_a_replicated_copy_is_identical(
    audit: tuple[AuditReport, dict[str, int]], varied_log: Log
) -> None:
    slave = audit[0].slaves[0]
    assert slave.verdict is Verdict.IDENTICAL
    assert slave.headline() == "identical"
    assert slave.behind_bytes == 0
    assert slave.compared == (OffsetRange(0, varied_log.end),)
    assert slave.missing == slave.bad_ranges == ()
    assert slave.divergence is None
    assert slave.replica.problems == ()


def test_a_flipped_body_byte_diverges_at_that_message(
    audit: tuple[AuditReport, dict[str, int]],
) -> None:
    report, facts = audit
    slave = report.slaves[1]
    byte = facts["flipped_byte"]
    assert slave.verdict is Verdict.DIVERGED
    chunk = byte // CHUNK * CHUNK
    assert slave.bad_ranges == (OffsetRange(chunk, chunk + CHUNK),)
    d = slave.divergence
    assert d is not None
    assert (d.offset, d.first_byte, d.field) == (facts["victim"], byte, "body")
    assert d.differing == ("body",)
    assert d.master.crc_ok is True
    assert d.slave.crc_ok is False
    assert d.master.get("physical_offset") == d.slave.get("physical_offset") == str(d.offset)
    assert [(p.kind, p.offset) for p in slave.replica.problems] == [
        (ProblemKind.CRC_MISMATCH, facts["victim"])
    ]
    assert slave.headline() == f"diverges at offset {facts['victim']}"
    text = "\n".join(slave.render())
    assert (
        f"diverges at offset {facts['victim']} (first differing byte at {byte}, in the body)"
        in (text)
    )
    assert "the slave's body does not match its stored CRC" in text


def test_a_missing_segment_is_a_missing_range(
    audit: tuple[AuditReport, dict[str, int]], varied_log: Log
) -> None:
    slave = audit[0].slaves[2]
    assert slave.verdict is Verdict.MISSING
    assert slave.missing == (OffsetRange(SEGMENT, 2 * SEGMENT),)
    assert slave.compared == (OffsetRange(0, SEGMENT), OffsetRange(2 * SEGMENT, varied_log.end))
    assert slave.bad_ranges == ()
    assert slave.behind_bytes == 0
    assert [(p.kind, p.offset, p.length) for p in slave.replica.problems] == [
        (ProblemKind.MISSING_SEGMENT, SEGMENT, SEGMENT)
    ]
    assert slave.headline() == f"missing range [{SEGMENT}, {2 * SEGMENT}) ({SEGMENT} bytes)"


def test_a_lagging_slave_is_behind_by_exactly_the_missing_bytes(
    audit: tuple[AuditReport, dict[str, int]], varied_log: Log
) -> None:
    report, facts = audit
    slave = report.slaves[3]
    lag = varied_log.end - facts["behind_at"]
    assert slave.verdict is Verdict.BEHIND
    assert slave.behind_bytes == lag
    assert slave.headline() == f"slave behind by {lag} bytes"
    assert slave.replica.end_offset == facts["behind_at"]
    assert slave.compared == (OffsetRange(0, facts["behind_at"]),)
    assert slave.replica.problems == ()


def test_a_slave_stopped_inside_a_record_is_behind_with_a_torn_tail(
    audit: tuple[AuditReport, dict[str, int]], varied_log: Log
) -> None:
    report, facts = audit
    slave = report.slaves[4]
    assert slave.verdict is Verdict.BEHIND
    assert slave.behind_bytes == varied_log.end - facts["torn_at"]
    tail = slave.replica.torn_tail
    assert tail is not None
    assert tail.offset == facts["torn_at"]
    assert slave.bad_ranges == ()


def test_the_report_renders_every_verdict(audit: tuple[AuditReport, dict[str, int]]) -> None:
    text = audit[0].render()
    assert text.splitlines()[0].startswith("master ")
    for phrase in (
        "verdict: identical",
        "verdict: diverges at offset",
        "verdict: missing range",
        "verdict: slave behind by",
        "result: PROBLEMS FOUND",
    ):
        assert phrase in text


def test_healthy_replicas_are_ok(spark: SparkSession, varied_log: Log, tmp_path: Path) -> None:
    from trioha.pipeline import audit_replicas

    slave = copy_log(varied_log.root, tmp_path / "slave")
    report = audit_replicas(spark, str(varied_log.root), [str(slave)])
    assert report.ok
    assert [s.verdict for s in report.slaves] == [Verdict.IDENTICAL]
    assert report.render().endswith("result: OK")


def test_replicated_damage_needs_verify_records(
    spark: SparkSession, varied_log: Log, tmp_path: Path
) -> None:
    """A bad CRC on both sides is not a replication fault: the fast audit, which decodes
    only where replicas differ, calls the pair identical; verify_records finds the damage."""
    from trioha.pipeline import audit_replicas

    master = copy_log(varied_log.root, tmp_path / "master")
    victim = next(m for m in varied_log.messages if len(m.body) >= 1000)
    at = body_offset(master, victim) + 5
    patch(master, at, bytes([victim.body[5] ^ 0x80]))
    slave = copy_log(master, tmp_path / "slave")
    fast = audit_replicas(spark, str(master), [str(slave)])
    assert [s.verdict for s in fast.slaves] == [Verdict.IDENTICAL]
    assert fast.ok and fast.master.problems == ()
    full = audit_replicas(spark, str(master), [str(slave)], verify_records=True)
    assert [s.verdict for s in full.slaves] == [Verdict.IDENTICAL]
    assert not full.ok
    for info in (full.master, full.slaves[0].replica):
        assert [(p.kind, p.offset) for p in info.problems] == [
            (ProblemKind.CRC_MISMATCH, victim.physical_offset)
        ]


@pytest.mark.parametrize("slots", [1, 2, 3, 8, 40])
def test_compare_tasks_are_packed_one_group_per_slot(slots: int) -> None:
    """Many segment files make many compare tasks; Spark gets at most one group per slot,
    of about equal bytes, holding every task once, in order."""
    from trioha.pipeline._audit import CompareTask, _pack

    mib = 1 << 20
    tasks = [
        CompareTask(
            1, f"m{i}", i * 64 * mib, f"s{i}", i * 64 * mib, ((i * 64 * mib, (i * 64 + n) * mib),)
        )
        for i, n in enumerate([64] * 15 + [3])
    ]
    groups = _pack(tasks, slots)
    assert [t for g in groups for t in g] == tasks
    assert len(groups) == min(slots, len(tasks))
    sizes = [sum(e - s for t in g for s, e in t.chunks) for g in groups]
    assert max(sizes) - min(sizes) <= 64 * mib + 3 * mib
    assert _pack([], 4) == []
