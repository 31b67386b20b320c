"""Optional: RocketMQ 4.9.7's ``mqadmin``, a Java slave and Java clients against trioha.

Needs a Java RocketMQ 4.9.7 (``TRIOHA_JAVA_ROCKETMQ``: the directory holding its
``rocketmq.sh``, :mod:`tests.javaref`), a JDK with its libraries, and ``unshare -n`` (the Java
broker binds 0.0.0.0, so it runs in a network namespace of its own). Skips when any of these is
missing. The operator's admin commands run against a trioha cluster and a Java one in the same
namespace, and what an operator checks in each answer is checked in both
(``check_admin_commands``). The protocol behaviours themselves are tested without Java in
``test_parity.py`` and ``test_admin_codes.py``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.javaref import MISSING, rocketmq_sh

HERE = Path(__file__).resolve()


def _skip_reason() -> str | None:
    if shutil.which("java") is None:
        return "no JDK"
    if rocketmq_sh() is None:
        return MISSING
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
@pytest.mark.timeout(1500)
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
            str(rocketmq_sh()),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=1400,
        check=False,
        env={**os.environ, "PYTHONPATH": str(HERE.parents[2])},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    (tmp_path / "seen.json").write_text(json.dumps(seen, indent=1))  # every answer, to read
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
    # It keeps the groups and system topics a Java master would have given it.
    for group in ("TOOLS_CONSUMER", "SELF_TEST_C_GROUP", "CID_ONSAPI_OWNER", "CID_ONS-HTTP-PROXY"):
        assert f'"{group}"' in seen["slave_groups"], group
    for topic in ("BenchmarkTest", "SCHEDULE_TOPIC_XXXX", "DefaultCluster_REPLY_TOPIC"):
        assert f'"{topic}"' in seen["slave_topics"], topic

    for cluster in ("trioha", "java"):
        check_admin_commands(cluster, seen["admin"][cluster])
    trioha, java = seen["admin"]["trioha"], seen["admin"]["java"]
    # Retention's admin codes and a live retention setting: the same answer from both.
    for command in ("cleanExpiredCQ", "deleteExpiredCommitLog"):
        assert trioha[command] == java[command] == "success", (trioha[command], java[command])
    for cluster in (trioha, java):
        assert "update broker config success" in cluster["updateBrokerConfig_retention"]
    # Where trioha answers otherwise, on purpose: a key read only at start is refused by name
    # instead of stored and ignored.
    assert (
        "messageDelayLevel cannot be changed while the broker runs"
        in (trioha["updateBrokerConfig_startOnly"])
    )
    assert "update broker config success" in java["updateBrokerConfig_startOnly"]


def check_admin_commands(cluster: str, out: dict[str, Any]) -> None:
    """What an operator checks after each command; the same for trioha and Java."""
    for step in (
        "clients_ready",
        "consumed_first",
        "origin_seen",
        "consumed_again",
        "clients_done",
    ):
        assert out[step] is True, (cluster, step)
    assert re.search(
        r"0001  \S+@admin-clients +127\.0\.0\.1:\d+ +JAVA +V4_9_7", out["producerConnection"]
    ), (
        cluster,
        out["producerConnection"],
    )
    status = out["consumerStatus"]
    assert "Same subscription in the same group of consumer" in status, (cluster, status)
    assert "Rebalance OK" in status, (cluster, status)
    # An idle push consumer's held pulls are no load: (queue size, head wait) are (0, 0ms).
    assert re.search(r"pullThreadPoolQueueSize\s*: 0\b", out["brokerStatus"]), cluster
    loads = re.findall(r"\((\d+),(\d+)ms\)", out["clusterList"])
    assert loads == [("0", "0"), ("0", "0")], (cluster, out["clusterList"])
    # The retried message's ORIGIN_MESSAGE_ID is an offset id queryMsgById decodes.
    assert "Keys:                [retry-me]" in out["queryMsgById"], (cluster, out["queryMsgById"])
    # Online: the broker tells the consumer, which consumes everything again.
    online = out["resetOffsetByTime_online"]
    assert online.startswith("rollback consumer offset by specified group[AdminG]"), online
    assert re.findall(r"broker-a +\d +(\d+)", online) == ["0"] * 4, (cluster, online)
    # Offline: CONSUMER_NOT_ONLINE, and mqadmin's fallback writes the offsets itself.
    offline = out["resetOffsetByTime_offline"]
    assert "#rollbackOffset" in offline, (cluster, offline)
    assert "Diff Total: 10" in out["consumerProgress_reset"], (
        cluster,
        out["consumerProgress_reset"],
    )
    assert "#rollbackOffset" in out["skipAccumulatedMessage"], cluster
    assert "Diff Total: 0" in out["consumerProgress_skipped"], cluster
    assert out["queryCq"].count("ConsumeQueueData{physicOffset=") == 2, (cluster, out["queryCq"])
    assert "update broker config success" in out["updateBrokerConfig"], cluster
    assert re.search(r"flushIntervalCommitLog\s+=  1000", out["getBrokerConfig"]), cluster
    assert re.search(r"listenPort\s+=  98[78]6", out["getNamesrvConfig"]), (
        cluster,
        out["getNamesrvConfig"],
    )
    assert "CODE: 16  DESC: Can not update config path" in out["updateNamesrvConfig_path"], cluster
    assert re.search(r"wipe write perm of broker\[broker-a\] .* OK, \d+", out["wipeWritePerm"]), (
        cluster
    )
    assert '"perm":4' in out["topicRoute_wiped"], (cluster, out["topicRoute_wiped"])
    assert re.search(r"add write perm of broker\[broker-a\] .* OK, \d+", out["addWritePerm"]), (
        cluster
    )
    assert '"perm":6' in out["topicRoute_added"] and '"perm":4' not in out["topicRoute_added"]
    assert "delete subscription group [DelG] from broker" in out["deleteSubGroup"], cluster
    assert out["cleanUnusedTopic"] == "success", (cluster, out["cleanUnusedTopic"])
