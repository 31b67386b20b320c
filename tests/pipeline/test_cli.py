"""The ``audit``/``export``/``stats`` commands and the Spark setup's error messages."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.pipeline._logs import copy_log, segments
from tests.pipeline.conftest import Log
from trioha._errors import PipelineError
from trioha.pipeline import _session
from trioha.pipeline._cli import build_parser, main, register_commands

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parents[2]


def test_registering_the_commands_imports_no_heavy_dependency() -> None:
    code = (
        "import argparse, json, sys\n"
        "from trioha.pipeline._cli import register_commands\n"
        "p = argparse.ArgumentParser(); register_commands(p.add_subparsers(dest='c'))\n"
        "p.parse_args(['stats', 'x'])\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & "
        "{'pyspark', 'pyarrow', 'numpy', 'pandas', 'py4j'})\n"
        "print(json.dumps(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []


def test_commands_and_their_options() -> None:
    parser = argparse.ArgumentParser(prog="trioha")
    register_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["audit", "m", "s1", "s2", "--spark-master", "local[2]"])
    assert (args.master_dir, args.slave_dirs, args.spark_master) == ("m", ["s1", "s2"], "local[2]")
    assert callable(args.handler)
    args = parser.parse_args(["export", "d", "out", "--mode", "overwrite", "--start-offset", "5"])
    assert (args.directory, args.out, args.mode, args.start_offset) == ("d", "out", "overwrite", 5)
    args = parser.parse_args(["stats", "d"])
    assert args.spark_master is None  # local[*], or spark-submit's master
    with pytest.raises(SystemExit):
        build_parser().parse_args(["audit", "only-a-master"])


def test_a_missing_directory_fails_before_spark_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["stats", str(tmp_path / "nope")]) == 2
    assert f"trioha: error: not a directory: {tmp_path / 'nope'}" in capsys.readouterr().err


def test_no_java_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(PipelineError, match="no Java runtime: Spark needs Java 17"):
        _session.find_java()
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(PipelineError, match=r"JAVA_HOME is .* is not an executable"):
        _session.find_java()
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    with pytest.raises(PipelineError, match="JAVA_HOME"):
        _session.spark_session("local[1]")


def test_no_pyspark_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str) -> object:
        return None if name == "pyspark" else real(name)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(PipelineError, match=r"pyspark not installed.*trioha\[spark\]"):
        _session.require_pyspark()


_NO_PYARROW = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "pyarrow" or name.startswith("pyarrow."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, Block())
from trioha.pipeline._cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_without_pyarrow_the_commands_say_what_to_install(tmp_path: Path) -> None:
    """pyspark present, pyarrow not: one line naming it and the extra, exit 2, no trace."""
    out = subprocess.run(
        [sys.executable, "-c", _NO_PYARROW, "stats", str(tmp_path)],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        "trioha: error: pyarrow not installed: the pipeline needs the spark extra "
        "(pyspark, pyarrow, numpy): pip install 'trioha[spark]'"
    ]


def test_local_master_parsing() -> None:
    assert _session.local_cores("local") == 1
    assert _session.local_cores("local[3]") == 3
    assert _session.local_cores("local[*]") == (os.cpu_count() or 1)
    assert _session.is_local("local[2,4]")
    assert not _session.is_local("spark://host:7077")


@pytest.mark.spark
def test_stats_and_audit_commands(
    spark: SparkSession, varied_log: Log, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["stats", str(varied_log.root), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{varied_log.root}: 300 messages")

    slave = copy_log(varied_log.root, tmp_path / "slave")
    assert main(["audit", str(varied_log.root), str(slave), "--no-progress"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("result: OK")

    segments(slave)[1].unlink()
    assert main(["audit", str(varied_log.root), str(slave), "--no-progress"]) == 1
    assert "verdict: missing range [65536, 131072)" in capsys.readouterr().out

    out_dir = tmp_path / "pq"
    assert main(["export", str(varied_log.root), str(out_dir), "--no-progress"]) == 0
    assert "wrote 300 messages of 4 topic(s)" in capsys.readouterr().out
    assert main(["export", str(varied_log.root), str(out_dir), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trioha: error:")  # OUT exists and --mode is the default
    assert len(err.strip().splitlines()) == 1
    assert main(["export", str(varied_log.root), str(out_dir), "--mode", "append"]) == 0
    assert "appended 300 messages of 4 topic(s)" in capsys.readouterr().out
    assert main(["export", str(varied_log.root), str(out_dir), "--mode", "ignore"]) == 0
    assert f"nothing written: {out_dir} exists and the mode is ignore" in capsys.readouterr().out

    # an output path Hadoop cannot create: one line, the documented exit code
    (tmp_path / "a-file").write_text("x")
    bad = tmp_path / "a-file" / "out"
    assert main(["export", str(varied_log.root), str(bad), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trioha: error:") and len(err.strip().splitlines()) == 1, err

    # a log missing a segment: the damage is reported and fails the command...
    damaged = copy_log(varied_log.root, tmp_path / "damaged")
    segments(damaged)[2].unlink()
    assert main(["stats", str(damaged), "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "DAMAGE: 1 damaged region(s) (missing_segment), first at offset 131072, 65536" in out
    assert main(["export", str(damaged), str(tmp_path / "pq2"), "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"nothing written to {tmp_path / 'pq2'}: the log is damaged")
    assert not (tmp_path / "pq2").exists()
    # ...unless damage is allowed: the readable messages are written, the damage still shown
    argv = ["export", str(damaged), str(tmp_path / "pq2"), "--allow-damage", "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    kept = sum(1 for m in varied_log.messages if not 131072 <= m.physical_offset < 196608)
    assert f"wrote {kept} messages" in out and "DAMAGE: 1 damaged region(s)" in out
    assert not spark.sparkContext._jsc.sc().isStopped()  # the commands joined, not stopped
