"""``python -m trioha``: every bad flag or file is one line and a non-zero exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trioha", *args], capture_output=True, text=True, timeout=60,
        check=False,
    )


def test_help_lists_the_commands() -> None:
    result = run("--help")
    assert result.returncode == 0
    for command in ("master", "slave", "demo", "audit", "namesrv", "status"):
        assert command in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["master"], "the following arguments are required: --store-dir"),
        (["master", "--store-dir", "x", "--ha-listen", "nowhere"], "HOST:PORT"),
        (["master", "--store-dir", "x", "--mapped-file-size", "12q"], "not a size"),
        (["slave", "--store-dir", "x"], "a slave needs --master-ha"),
    ],
)
def test_bad_flags_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trioha", *args], capture_output=True, text=True, timeout=60,
        cwd=tmp_path, check=False,
    )
    assert result.returncode != 0
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_bad_broker_conf_is_one_line(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("haSendHeartBeatInterval=3\n")
    result = run("master", "--store-dir", str(tmp_path / "s"), "-c", str(conf))
    assert result.returncode == 1
    assert "did you mean 'haSendHeartbeatInterval'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_locked_store_is_one_line(tmp_path: Path) -> None:
    from trioha.store import open_store

    with open_store(tmp_path / "s", segment_size=1 << 20):
        result = run("master", "--store-dir", str(tmp_path / "s"), "--ha-listen",
                     "127.0.0.1:0", "--listen", "127.0.0.1:0")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("trioha master: error:")
    assert "lock" in result.stderr


def test_truncate_to_master_without_a_recorded_divergence_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    result = run("slave", "--store-dir", str(tmp_path / "s"), "--truncate-to-master")
    assert result.returncode == 1
    assert "records no divergence" in result.stderr
    assert "nothing to cut back" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_truncate_to_master_refuses_a_cut_inside_a_record(tmp_path: Path) -> None:
    from trioha.store import open_store

    root = tmp_path / "s"
    with open_store(root, segment_size=4096) as store:
        first = store.commitlog.append(topic="T", body=b"x" * 100)
        store.commitlog.append(topic="T", body=b"y" * 100)
        end = store.commitlog.max_offset
    inside = first.physical_offset + 10
    (root / "haDiverged").write_text(
        f"master_offset {inside}\nslave_offset {end}\nmaster 127.0.0.1:1\nreason r\n"
    )
    result = run(
        "slave", "--store-dir", str(root), "--mapped-file-size", "4096", "--truncate-to-master"
    )
    assert result.returncode == 1
    assert f"at {inside}: it is not a message boundary" in result.stderr
    assert f"boundaries are 0 and {first.end_offset}" in result.stderr
    assert (root / "haDiverged").exists()  # nothing changed: still to be dealt with
    with open_store(root) as store:
        assert store.commitlog.max_offset == end


def test_a_master_on_a_log_damaged_below_its_flushed_mark_refuses_to_start(
    tmp_path: Path,
) -> None:
    from trioha.store import open_store
    from trioha.store._sent import SentOffsets

    root = tmp_path / "m"
    with open_store(root, segment_size=4096) as store:
        offsets = [store.commitlog.append(topic="T", body=b"x" * 100).physical_offset
                   for _ in range(10)]
    SentOffsets.open(root).note_flushed(4096 // 2, now=0.0)
    with (root / "commitlog" / f"{0:020d}").open("r+b") as f:  # a bad magic, mid-log
        f.seek(offsets[3] + 4)
        f.write(b"\xde\xad\xbe\xef")
    args = ["master", "--store-dir", str(root), "--mapped-file-size", "4096",
            "--ha-listen", "127.0.0.1:0", "--listen", "127.0.0.1:0"]
    result = run(*args)
    assert result.returncode == 1
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("trioha master: error: refusing to start as master")
    assert f"ends at {offsets[3]}, below {4096 // 2}" in error
    assert "lost+found" in error
    assert "--accept-damaged-log" in error
