"""The harness that runs real etcd members: start, stop by PID, restart on the same data,
pause, a command prefix, and failures that say what went wrong."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.etcd._harness import etcd_or_skip
from trioha.etcd import ETCD_INSTALL_HINT, EtcdMemberError, find_etcd, start_etcd


def test_a_member_starts_stops_by_pid_and_restarts_on_its_data(tmp_path: Path) -> None:
    binary = etcd_or_skip()
    with start_etcd(tmp_path, etcd=binary) as cluster:
        (member,) = cluster.members
        assert cluster.endpoints == (f"http://127.0.0.1:{member.client_port}",)
        assert member.data_dir.is_relative_to(tmp_path)
        pid = member.pid
        assert pid is not None
        before = member.status()
        assert before is not None
        assert before.is_leader
        member.restart()
        assert member.pid != pid
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # stopped and reaped
        after = member.status()
        assert after is not None
        assert after.member_id == before.member_id  # the same member, from its data directory
    assert not member.running
    assert member.status() is None


def test_a_paused_member_answers_nothing_until_resumed(tmp_path: Path) -> None:
    with start_etcd(tmp_path, etcd=etcd_or_skip()) as cluster:
        (member,) = cluster.members
        member.pause()
        try:
            assert member.running
            assert member.status(timeout=0.3) is None
        finally:
            member.resume()
        assert member.status(timeout=10) is not None
        # A paused member still stops: SIGCONT goes before SIGTERM.
        member.pause()
    assert not member.running


def test_a_command_prefix_runs_the_member_through_it(tmp_path: Path) -> None:
    binary = etcd_or_skip()
    with start_etcd(tmp_path, etcd=binary, command_prefixes=[("env", "TRIOHA_MARK=1")]) as cluster:
        (member,) = cluster.members
        assert member.command()[:3] == ["env", "TRIOHA_MARK=1", binary]
        environ = Path(f"/proc/{member.pid}/environ").read_bytes().split(b"\0")
        assert b"TRIOHA_MARK=1" in environ  # env exec'd etcd: the PID is etcd's own
        assert not any(v.startswith(b"ETCD_") for v in environ)


def test_a_member_that_cannot_start_shows_its_log(tmp_path: Path) -> None:
    with pytest.raises(EtcdMemberError) as raised:
        start_etcd(tmp_path, etcd=etcd_or_skip(), extra_args=["--no-such-flag"])
    assert str(raised.value).startswith("etcd member etcd1 exited (code 2): ")
    assert "flag provided but not defined: -no-such-flag" in str(raised.value)


def test_without_etcd_the_error_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIOHA_ETCD", str(tmp_path / "no-etcd-here"))
    assert find_etcd() is None
    with pytest.raises(EtcdMemberError) as raised:
        start_etcd(tmp_path)
    assert str(raised.value) == ETCD_INSTALL_HINT
    assert "apt-get install etcd-server" in ETCD_INSTALL_HINT
