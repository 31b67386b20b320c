"""``python -m model``: what it prints and how it exits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import attrs
import pytest

import model
from model._cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_list_names_every_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in ("smoke", "ci", "nightly", "ack-written-restart", "segment-deletion"):
        assert name in out
    assert "must fail on SyncAckedOnSlave" in out


def test_a_passing_configuration_prints_every_property(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--config", "fixed-ack-flushed-restart"]) == 0
    out = capsys.readouterr().out
    assert "states 573 " in out
    assert "time " in out
    for name in ("NoDivergence", "FramesContiguous", "AckNotAhead", "EventuallyCaughtUp"):
        assert f"ok    {name}" in out
    assert "caught_up_after_restart" in out
    assert out.rstrip().endswith("result: ok")


def test_a_known_bad_configuration_prints_its_trace_and_says_it_was_expected(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--config", "async-flush-crash"]) == 1
    out = capsys.readouterr().out
    assert "NoDivergence violated: master and slave disagree at offset 0" in out
    assert "shortest trace (8 steps):" in out
    assert "  7. MasterCrash" in out
    assert "result: fails on NoDivergence, as expected" in out


def test_a_broken_property_exits_non_zero_with_a_trace(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A known-bad world presented as one that must pass.
    must_pass = attrs.evolve(model.CONFIGS["ack-written-restart"], expect=None)
    monkeypatch.setitem(model.CONFIGS, "ack-written-restart", must_pass)
    assert main(["--config", "ack-written-restart"]) == 1
    out = capsys.readouterr().out
    assert "SyncAckedOnSlave violated" in out
    assert "shortest trace (9 steps):" in out
    assert out.rstrip().endswith("result: FAILED")


def test_max_states_makes_the_run_inconclusive(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", "smoke", "--max-states", "50"]) == 1
    out = capsys.readouterr().out
    assert "stopped early" in out
    assert "result: inconclusive: stopped at max_states" in out


def test_dfs_and_keep_going_and_no_symmetry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", "ack-written-restart", "--dfs", "--keep-going"]) == 1
    out = capsys.readouterr().out
    assert "(dfs, symmetry on)" in out
    assert main(["--config", "fixed-sync-flush-crash", "--no-symmetry"]) == 0
    assert "symmetry off" in capsys.readouterr().out


def test_unknown_configuration_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--config", "nope"])
    assert exc.value.code == 2
    assert "unknown configuration 'nope'" in capsys.readouterr().err


def test_runs_as_a_module() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "model", "--config", "fixed-oldest-copy"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "EventuallyFullCopy" in proc.stdout
