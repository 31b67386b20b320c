"""The nemesis harness (bench/nemesis.py): its checker on histories made by hand, and short
runs with real etcd members and broker processes, the design's brokers passing and a known-bad
twin's caught (docs/failover.md, "Nemesis runs").

The real runs print their figures; nothing here asserts a time.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import trio

from bench.nemesis import (
    TWINS,
    Ack,
    Fault,
    History,
    RunResult,
    check_lost,
    check_two_masters,
    master_terms,
    power_cut,
    run_once,
    summary,
)
from tests.etcd._harness import etcd_or_skip

A, B = "127.0.0.1:1001", "127.0.0.1:2001"


def test_an_acknowledged_id_missing_moved_or_twice_is_lost() -> None:
    acked = {
        1: Ack(A, 100, 0.0, 0.1),
        2: Ack(A, 200, 0.0, 0.1),
        3: Ack(A, 300, 0.0, 0.1),
        4: Ack(A, 400, 0.0, 0.1),
    }
    ids = {1: [100], 2: [250], 4: [400, 900]}
    assert check_lost(acked, ids) == [
        f"id 2 acknowledged by {A} at 200: found at [250]",
        f"id 3 acknowledged by {A} at 300: missing",
        f"id 4 acknowledged by {A} at 400: found at [400, 900]",
    ]
    assert check_lost(acked, {1: [100], 2: [200], 3: [300], 4: [400]}) == []


def test_a_clean_handover_has_one_master_per_epoch() -> None:
    history = History(acked={1: Ack(A, 0, 1.0, 1.1), 2: Ack(B, 100, 5.0, 5.1)})
    terms = {A: [(0.5, 1)], B: [(4.0, 2)]}
    assert check_two_masters(history, terms) == []


def test_an_old_master_acknowledging_after_the_new_one_is_caught() -> None:
    # A was stopped from 2.0 to 8.0; the send it answered at 8.05 waited through the stop,
    # so A decided it after 8.0, after B (epoch 2) had acknowledged at 5.1.
    history = History(
        acked={1: Ack(A, 0, 1.0, 1.1), 2: Ack(B, 100, 5.0, 5.1), 3: Ack(A, 50, 1.9, 8.05)}
    )
    history.paused[A].append((2.0, 8.0))
    terms = {A: [(0.5, 1)], B: [(4.0, 2)]}
    assert check_two_masters(history, terms) == [
        f"epoch 1: {A} acknowledged 1 send(s) after a newer epoch's master had acknowledged one"
    ]
    # Without the stop, the same answer may have been decided before B's: not provably late.
    history.paused.clear()
    assert check_two_masters(history, terms) == []


def test_two_brokers_acknowledging_in_one_epoch_are_caught() -> None:
    history = History(acked={1: Ack(A, 0, 1.0, 1.1), 2: Ack(B, 100, 5.0, 5.1)})
    terms = {A: [(0.5, 1)], B: [(4.0, 1)]}
    assert check_two_masters(history, terms) == [f"epoch 1: acknowledged by {[A, B]}"]


def test_an_ack_by_a_broker_that_never_became_master_is_reported() -> None:
    history = History(acked={1: Ack(A, 0, 1.0, 1.1)})
    assert check_two_masters(history, {A: [(3.0, 1)]}) == [
        f"id 1: {A} acknowledged it as master of no epoch"
    ]


def test_master_terms_are_read_from_the_json_warning_lines(tmp_path: Path) -> None:
    log = tmp_path / "b.log"
    log.write_text(
        '{"time": "2026-01-02T03:04:05.250Z", "level": "WARNING", "logger": "trioha.failover", '
        '"message": "becoming master of epoch 3 at log end 0 (epoch file at 2), '
        'SyncStateSet [1]"}\n'
        "not json: becoming master of epoch 9\n"
        '{"time": "2026-01-02T03:04:06.000Z", "level": "INFO", "message": "other"}\n'
    )
    assert master_terms(log) == [(1767323045.25, 3)]


def test_a_power_cut_zeroes_the_tail_and_drops_later_segments(tmp_path: Path) -> None:
    commitlog = tmp_path / "commitlog"
    commitlog.mkdir()
    (commitlog / f"{0:020d}").write_bytes(b"\x01" * 100)
    (commitlog / f"{100:020d}").write_bytes(b"\x02" * 100)
    (commitlog / f"{200:020d}").write_bytes(b"\x03" * 100)
    power_cut(tmp_path, 150)
    assert sorted(p.name for p in commitlog.iterdir()) == [f"{0:020d}", f"{100:020d}"]
    assert (commitlog / f"{0:020d}").read_bytes() == b"\x01" * 100
    assert (commitlog / f"{100:020d}").read_bytes() == b"\x02" * 50 + bytes(50)


def test_the_summary_line_counts_what_the_runs_found(tmp_path: Path) -> None:
    good = RunResult(
        1, (Fault("kill-master", "broker 1", 1.0, 7.0, 2.0),), 10, 1, (), (), (), "", tmp_path
    )
    bad = RunResult(
        2,
        (Fault("pause-master-etcd", "broker 2", 1.0, 7.0, 4.0), Fault("kill-slave", skipped="x")),
        20,
        0,
        ("id 3 missing",),
        (),
        ("epoch 1: late",),
        "",
        tmp_path,
    )
    lines = summary([good, bad])
    assert lines[0] == (
        "nemesis: runs=2 faults=2 acked=30 lost=1 diverged=0 two_masters=1 "
        "failover_p50_s=4.00 failover_p99_s=4.00"
    )
    assert "| kill-master | 1 | 0 | 0 | 2.00 | 2.00 | 2.00 |" in lines
    assert "| pause-master-etcd | 1 | 1 | 0 | 4.00 | 4.00 | 4.00 |" in lines


# --- real runs: three etcd members, a name server, three broker processes ------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("twin", "faults"),
    [
        ("none", ["pause-master-etcd"]),
        ("none", ["kill-master", "kill-etcd-leader"]),
        ("no-self-fence", ["pause-master-etcd"]),
    ],
)
def test_a_short_nemesis_run(tmp_path: Path, twin: str, faults: list[str]) -> None:
    etcd_or_skip()
    out = io.StringIO()
    result = trio.run(
        lambda: run_once(tmp_path, 7, seconds=10, twin=TWINS[twin], faults=faults, out=out)
    )
    print(out.getvalue())
    assert result.acked > 0
    assert not result.unsettled, result.unsettled
    assert all(not f.skipped for f in result.faults), result.faults
    if twin == "none":
        assert result.ok, out.getvalue()
    else:
        # A master cut off from etcd answers PUT_OK without the fence: in its old epoch after
        # the new master has, and what it acknowledged is cut when it follows the new one.
        assert result.lost or result.two_masters, out.getvalue()
