"""Automatic failover with real processes (``python -m trioha demo --failover``): three
``python -m trioha master -c broker.conf`` brokers of one group, a real etcd member and a
name server; sync sends through trioha's client; the master killed with SIGKILL; a slave
elected, found through the name server and taking sends; every SEND_OK in the new master's
log at the offset it was acknowledged with, and the surviving replica a byte prefix of it
(docs/failover.md).

The failover time is printed, not asserted (speed targets are measured elsewhere).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import attrs
import trio

from tests.etcd._harness import etcd_or_skip
from trioha.cli._demo import check_failover, failover_demo


def test_a_killed_master_is_replaced_and_every_send_ok_survives(tmp_path: Path) -> None:
    etcd_or_skip()
    result = trio.run(lambda: failover_demo(tmp_path, messages=80, lease_ttl=2))
    print(f"failover: SIGKILL -> first SEND_OK on the new master {result.failover_seconds:.2f} s")
    assert len(result.acked) == 80
    assert result.new_master is not result.killed
    assert {broker for broker, _ in list(result.acked.values())[40:]} == {result.new_master.addr}
    log = result.new_master.log.read_text()
    assert "becoming master of epoch 2" in log, log
    assert "role SLAVE -> SYNC_MASTER (epoch 2" in log, log
    assert check_failover(result) == []
    # The check can fail: a SEND_OK whose message is not at its offset is reported.
    broker, offset = result.acked[79]
    moved = attrs.evolve(result, acked={**result.acked, 79: (broker, offset - 1)})
    assert check_failover(moved) == [f"message 79: not at offset {offset - 1} of the new master"]


def test_the_documented_command_shows_a_failover(tmp_path: Path) -> None:
    etcd_or_skip()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trioha",
            "demo",
            "--failover",
            "--messages",
            "20",
            "--lease-ttl",
            "2",
            "--dir",
            str(tmp_path),
        ],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "acked: 20 of 20 sends" in done.stdout
    assert "verdict: every acknowledged message is on the new master" in done.stdout
    assert "acknowledged the first send" in done.stdout
