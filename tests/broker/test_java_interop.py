"""Optional: RocketMQ 4.9.7's ``mqadmin`` and a Java slave against a trioha master.

Needs a Java RocketMQ 4.9.7 (``rocketmq.sh``: set ``TRIOHA_ROCKETMQ_SH``, or keep it at
``shared/reference/rocketmq-4.9.7/`` beside a parent of this checkout), a JDK with its
libraries, and ``unshare -n`` (the Java broker binds 0.0.0.0, so it runs in a network namespace
of its own). Skips when any of these is missing. The protocol behaviours themselves are tested
without Java in ``test_parity.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()


def _rocketmq_sh() -> Path | None:
    configured = os.environ.get("TRIOHA_ROCKETMQ_SH")
    if configured:
        return Path(configured) if Path(configured).is_file() else None
    for parent in HERE.parents:
        candidate = parent / "shared" / "reference" / "rocketmq-4.9.7" / "rocketmq.sh"
        if candidate.is_file():
            return candidate
    return None


def _skip_reason() -> str | None:
    if shutil.which("java") is None:
        return "no JDK"
    if _rocketmq_sh() is None:
        return "no RocketMQ 4.9.7 reference (TRIOHA_ROCKETMQ_SH)"
    if not Path("/usr/share/java/netty-transport.jar").is_file():
        return "the Java libraries rocketmq.sh needs are not installed"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "no unshare/ip"
    probe = subprocess.run(
        ["unshare", "-n", "ip", "link", "set", "lo", "up"], capture_output=True, check=False
    )
    if probe.returncode != 0:
        return "unshare -n is not permitted here"
    return None


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_mqadmin_and_a_java_slave_against_trioha(tmp_path: Path) -> None:
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    done = subprocess.run(
        [
            "unshare",
            "-n",
            sys.executable,
            str(HERE.parent / "java_interop.py"),
            str(_rocketmq_sh()),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
        env={**os.environ, "PYTHONPATH": str(HERE.parents[2])},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["first_sends"] == {
        "11": 5
    }  # SYNC_MASTER, no slave yet: stored, SLAVE_NOT_AVAILABLE

    # clusterList reads the runtime info: version and disk ratio, no NullPointerException.
    cluster = seen["clusterList"]
    assert "V4_9_7" in cluster and "Exception" not in cluster, cluster
    status = seen["brokerStatus"]
    assert "brokerVersionDesc" in status and "putTps" in status, status
    assert "None" not in status, status
    assert "#Message ID" in seen["queryMsgByKey"], seen["queryMsgByKey"]
    assert "Exception" not in seen["topicStatus"], seen["topicStatus"]
    assert "listenPort" in seen["getBrokerConfig"], seen["getBrokerConfig"]
    assert "success" in seen["updateSubGroup"], seen["updateSubGroup"]
    assert "Diff Total" in seen["brokerConsumeStats"], seen["brokerConsumeStats"]

    # The Java slave: sends while it has not reported wait instead of SLAVE_NOT_AVAILABLE,
    # it learns the topics over the VIP channel, and it answers queries once the master is gone.
    assert seen["slave_connected"]
    assert "11" not in seen["sends_while_slave_connects"], seen["sends_while_slave_connects"]
    assert seen["slave_learned_topic"]
    on_slave = seen["queryMsgByKey_on_slave"]
    assert "#Message ID" in on_slave and "Exception" not in on_slave, on_slave
