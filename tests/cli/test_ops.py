"""``python -m trioha`` for operators: --version, help texts, --set, JSON logs, --metrics-listen."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.cli.test_main import run
from trioha._config import BrokerRole
from trioha._errors import ConfigError
from trioha.cli import COMMAND_HELP, EXIT_CODES, build_parser
from trioha.cli._brokers import _broker_config
from trioha.store import FlushDiskType


def test_version() -> None:
    import importlib.metadata

    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"trioha {importlib.metadata.version('trioha')}"


def test_every_command_has_a_description_an_example_and_the_exit_codes() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    commands: dict[str, argparse.ArgumentParser] = sub.choices  # type: ignore[assignment]
    for name in ("master", "slave", "namesrv", "put", "tail", "status", "demo"):
        assert name in commands
    for name, p in commands.items():
        text = p.format_help()
        assert p.description, name
        assert "example:\n  trioha " + name in text, name
        assert "exit codes:" in text
        for code, _ in EXIT_CODES:
            assert f"  {code} " in text
        assert "--log-format" in text
        if name in COMMAND_HELP and COMMAND_HELP[name][0]:
            assert p.description == COMMAND_HELP[name][0]


def config_of(*argv: str) -> object:
    args = build_parser().parse_args(list(argv))
    return _broker_config(args, BrokerRole.SLAVE if args.command == "slave" else None)


def test_set_overrides_broker_conf_and_flags_override_set(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(
        f"storePathRootDir={tmp_path}\nhaSendHeartbeatInterval=3000\nflushDiskType=ASYNC_FLUSH\n"
    )
    config = config_of(
        "master",
        "-c",
        str(conf),
        "--set",
        "haSendHeartbeatInterval=7000",
        "--set",
        "flushDiskType=SYNC_FLUSH",
        "--set",
        "brokerRole=SYNC_MASTER",
    )
    assert config.ha_send_heartbeat_interval == 7000  # type: ignore[attr-defined]
    assert config.flush_disk_type is FlushDiskType.SYNC_FLUSH  # type: ignore[attr-defined]
    assert config.broker_role is BrokerRole.SYNC_MASTER  # type: ignore[attr-defined]
    flagged = config_of(
        "master",
        "-c",
        str(conf),
        "--set",
        "flushDiskType=SYNC_FLUSH",
        "--flush-disk-type",
        "ASYNC_FLUSH",
    )
    assert flagged.flush_disk_type is FlushDiskType.ASYNC_FLUSH  # type: ignore[attr-defined]
    # No file at all: --set storePathRootDir is enough.
    alone = config_of("master", "--set", f"storePathRootDir={tmp_path / 'x'}")
    assert alone.store_root == tmp_path / "x"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            "haSendHeartBeatInterval=5",
            "--set haSendHeartBeatInterval=5: unknown key "
            "'haSendHeartBeatInterval'; did you mean 'haSendHeartbeatInterval'",
        ),
        ("haSendHeartbeatInterval=soon", "--set haSendHeartbeatInterval=soon"),
    ],
)
def test_a_bad_set_is_a_config_error_naming_it(tmp_path: Path, setting: str, message: str) -> None:
    with pytest.raises(ConfigError, match="^" + message.replace("?", r"\?")):
        config_of("master", "--store-dir", str(tmp_path), "--set", setting)


def test_a_set_without_equals_is_a_usage_error(tmp_path: Path) -> None:
    result = run("master", "--store-dir", str(tmp_path), "--set", "flushDiskType")
    assert result.returncode == 2
    assert "not key=value: 'flushDiskType'" in result.stderr


def test_metrics_without_prometheus_client_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trioha.cli._shared import require_prometheus_client

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    args = build_parser().parse_args(["namesrv", "--metrics-listen", "9100"])
    assert args.metrics_listen == ("127.0.0.1", 9100)
    with pytest.raises(ConfigError, match=r"pip install 'trioha\[metrics\]'"):
        require_prometheus_client(args)


def test_json_logs_and_metrics_of_a_running_master(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trioha",
            "master",
            "--store-dir",
            str(tmp_path / "m"),
            "--listen",
            "127.0.0.1:0",
            "--ha-listen",
            "127.0.0.1:0",
            "--set",
            "mappedFileSizeCommitLog=65536",
            "--metrics-listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 30
        url = None
        while time.monotonic() < deadline and not (url and any("started" in x for x in lines)):
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            message = json.loads(line)["message"]
            if message.startswith("metrics on "):
                url = message.removeprefix("metrics on ")
        assert url, "".join(lines)
        with urllib.request.urlopen(url, timeout=10) as response:
            body = response.read().decode()
        assert 'trioha_broker_info{role="ASYNC_MASTER"} 1.0' in body
    finally:
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=30)
    lines += rest.splitlines(keepends=True)
    assert proc.returncode == 0
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    assert any("SIGTERM received" in r["message"] for r in records)


def test_a_slave_catching_up_logs_progress_with_rate_and_eta(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from types import SimpleNamespace

    from trioha.cli._report import BrokerReport

    caplog.set_level(logging.INFO)
    now = [0.0]
    report = BrokerReport(interval=10, clock=lambda: now[0], terminal=False)

    def snapshot(end: int, master_end: int | None, connected: bool = True) -> object:
        client = SimpleNamespace(
            master="10.0.0.1:10912",
            connected=connected,
            needs_reseed=False,
            master_end=master_end,
            state="connected" if connected else "connecting",
            behind_bytes=None if master_end is None else max(0, master_end - end),
        )
        return SimpleNamespace(max_offset=end, ha=None, client=client)

    mib = 1 << 20

    def catching_up() -> bool:
        return report.catch_up is not None

    report.tick(snapshot(0, None))  # the master's end not learned yet: no progress
    assert not catching_up()
    report.tick(snapshot(0, 400 * mib))  # learned: 400 MiB to fetch
    assert catching_up()
    for second in range(1, 31):  # 10 MiB/s towards a master 400 MiB ahead
        now[0] = float(second)
        report.tick(snapshot(second * 10 * mib, 400 * mib))
    lines = [r.getMessage() for r in caplog.records if r.name == "trioha.progress"]
    assert lines == [
        "slave catch-up: 100.0 MiB of 400.0 MiB (25%), 10.0 MiB/s, ETA 30.0 s",
        "slave catch-up: 200.0 MiB of 400.0 MiB (50%), 10.0 MiB/s, ETA 20.0 s",
        "slave catch-up: 300.0 MiB of 400.0 MiB (75%), 10.0 MiB/s, ETA 10.0 s",
    ]
    for second in range(31, 41):
        now[0] = float(second)
        report.tick(snapshot(min(second * 10 * mib, 400 * mib), 400 * mib))
    assert not catching_up()
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        m.startswith("slave catch-up: 400.0 MiB of 400.0 MiB (100%)") and "done in" in m
        for m in messages
    )
    assert messages[-1] == f"slave caught up with master 10.0.0.1:10912 at {400 * mib}"


def test_a_slave_state_line_says_bytes_and_seconds_behind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from types import SimpleNamespace

    from trioha.cli._report import BrokerReport

    caplog.set_level(logging.INFO)
    now = [0.0]
    report = BrokerReport(interval=10, clock=lambda: now[0], terminal=False)
    client = SimpleNamespace(
        master="10.0.0.1:10912",
        connected=True,
        needs_reseed=False,
        master_end=5000,
        state="connected",
        behind_bytes=1000,  # too little for a catch-up report: a state line every interval
        behind_seconds=2.5,
        fell_behind_master_offset=-1,
    )
    now[0] = 10.0
    report.tick(SimpleNamespace(max_offset=4000, ha=None, client=client))
    (record,) = [r for r in caplog.records if r.name == "trioha"]
    assert record.getMessage() == (
        "connected to master 10.0.0.1:10912; log ends at 4000, 1000 bytes behind (2.5 s)"
    )
    assert (record.behind_bytes, record.behind_seconds) == (1000, 2.5)  # type: ignore[attr-defined]


def test_a_slave_that_fell_behind_says_so_and_what_to_do(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from types import SimpleNamespace

    from trioha.cli._report import BrokerReport

    caplog.set_level(logging.INFO)
    now = [0.0]
    report = BrokerReport(interval=10, clock=lambda: now[0], terminal=False)
    now[0] = 10.0
    client = SimpleNamespace(
        master="10.0.0.1:10912",
        connected=False,
        needs_reseed=True,
        master_end=9000,
        state="fell_behind",
        behind_bytes=5000,
        behind_seconds=None,
        fell_behind_master_offset=8192,
    )
    report.tick(SimpleNamespace(max_offset=4000, ha=None, client=client))
    (record,) = [r for r in caplog.records if r.name == "trioha"]
    assert (record.levelno, record.getMessage()) == (
        logging.ERROR,
        "not replicating: master 10.0.0.1:10912 deleted what this slave needs (its log begins "
        "at 8192, this slave's ends at 4000); re-seed this slave",
    )
