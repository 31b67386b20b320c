"""trioha's ACL beside the Java RocketMQ 4.9.7 reference: refusals compared with the Java
broker's case by case, and the Java ``mqadmin``'s signed requests verified by trioha.

The Java name server and broker (``TRIOHA_JAVA_ROCKETMQ``, :mod:`tests.javaref`; with
``aclEnable=true`` and the ACL file below) run in a network namespace of their own (they bind
0.0.0.0); the same requests (``java_probe.py``) go to them and to a trioha broker with the same
file, and the answers (code and remark) must be equal. Skipped when Java, its libraries or
``unshare`` are not available.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import trio

from tests.acl.java_probe import probe
from tests.acl.test_acl_e2e import ACL
from tests.javaref import java_rocketmq
from trioha._config import BrokerConfig
from trioha.broker import open_broker

ROOT = Path(__file__).resolve().parents[2]


REFERENCE = java_rocketmq() or ROOT / "missing-rocketmq-reference"

JVM = (
    "-Xms256m -Xmx512m -XX:+UseG1GC -XX:MaxDirectMemorySize=512m "
    "--add-exports java.base/sun.nio.ch=ALL-UNNAMED --add-opens java.base/java.nio=ALL-UNNAMED "
    "--add-opens java.base/sun.nio.ch=ALL-UNNAMED --add-opens java.base/java.lang=ALL-UNNAMED "
    "--add-exports java.base/jdk.internal.ref=ALL-UNNAMED "
    "--add-opens java.base/jdk.internal.ref=ALL-UNNAMED"
)

SCRIPT = """
set -u
ip link set lo up
CP=$({ref}/rocketmq.sh classpath)
D="-Duser.home={tmp} -Drocketmq.home.dir={tmp}/home"
java {jvm} $D -cp "$CP" org.apache.rocketmq.namesrv.NamesrvStartup -c {tmp}/namesrv.conf \
  > {tmp}/namesrv.log 2>&1 &
NS=$!
java {jvm} $D -cp "$CP" org.apache.rocketmq.broker.BrokerStartup -c {tmp}/broker.conf \
  > {tmp}/broker.log 2>&1 &
B=$!
for i in $(seq 1 240); do grep -q "boot success" {tmp}/broker.log && break; sleep 0.5; done
cd {root} && PYTHONPATH={root} {python} -m tests.acl.java_probe 127.0.0.1:20911
kill $B $NS
wait
"""


def _java_ready() -> bool:
    return (
        os.geteuid() == 0
        and shutil.which("java") is not None
        and shutil.which("unshare") is not None
        and (REFERENCE / "rocketmq.sh").exists()
        and Path("/usr/share/java/netty-transport.jar").exists()
    )


@pytest.mark.slow
@pytest.mark.skipif(not _java_ready(), reason="the Java 4.9.7 reference broker cannot run here")
async def test_refusals_are_those_of_the_java_broker(tmp_path: Path) -> None:
    home = tmp_path / "home" / "conf"
    home.mkdir(parents=True)
    for name in ("logback_broker.xml", "logback_namesrv.xml"):
        shutil.copy(REFERENCE / "rmqhome" / "conf" / name, home / name)
    (home / "plain_acl.yml").write_text(ACL)
    (tmp_path / "namesrv.conf").write_text("listenPort=19876\n")
    (tmp_path / "broker.conf").write_text(
        "brokerClusterName=DefaultCluster\nbrokerName=broker-j\nbrokerId=0\n"
        "brokerRole=ASYNC_MASTER\nnamesrvAddr=127.0.0.1:19876\nlistenPort=20911\n"
        f"brokerIP1=127.0.0.1\nstorePathRootDir={tmp_path}/store\n"
        f"storePathCommitLog={tmp_path}/store/commitlog\naclEnable=true\n"
    )
    script = SCRIPT.format(ref=REFERENCE, tmp=tmp_path, jvm=JVM, root=ROOT, python=sys.executable)
    with trio.fail_after(180):
        done = await trio.run_process(
            ["unshare", "-n", "bash", "-c", script],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    lines = done.stdout.decode().strip().splitlines()
    if not lines:
        pytest.skip(f"the Java broker did not answer: {done.stderr.decode()[-500:]}")
    java = json.loads(lines[-1])

    config = BrokerConfig(
        store_path_root_dir=str(tmp_path / "trioha"),
        listen_port=0,
        ha_listen_port=0,
        mapped_file_size_commit_log=1 << 20,
        acl_enable=True,
        acl_file=str(home / "plain_acl.yml"),
    )
    async with open_broker(config) as broker:
        assert broker.client_side is not None
        ours = await probe(broker.client_side.broker_addr)
    assert ours == java
    assert all(code == 1 for code, _ in java.values())


@pytest.mark.slow
@pytest.mark.skipif(not _java_ready(), reason="the Java 4.9.7 tools cannot run here")
async def test_java_mqadmin_signs_as_trioha_verifies(tmp_path: Path) -> None:
    """RocketMQ's own ``mqadmin`` (Java ``AclClientRPCHook``, account ``rocketmq2`` from the
    reference's ``conf/tools.yml``) creates a topic through trioha's ACL-checking name server and
    broker; once the account loses ``admin`` (a reload), creating a topic is refused."""
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(
        "accounts:\n  - {accessKey: rocketmq2, secretKey: '12345678', admin: true}\n"
    )
    config = BrokerConfig(
        store_path_root_dir=str(tmp_path / "store"),
        listen_port=0,
        ha_listen_port=0,
        mapped_file_size_commit_log=1 << 20,
        namesrv_addr="127.0.0.1:0",
        embedded_namesrv=True,
        acl_enable=True,
        acl_file=str(acl_file),
        acl_access_key="rocketmq2",
    )

    async def mqadmin(*args: str) -> str:
        with trio.fail_after(120):
            done = await trio.run_process(
                [str(REFERENCE / "rocketmq.sh"), "mqadmin", *args],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        return done.stdout.decode() + done.stderr.decode()

    async with open_broker(config) as broker:
        side = broker.client_side
        assert side is not None and side.namesrv_addr is not None and side.acl is not None
        namesrv = f"{side.namesrv_addr[0]}:{side.namesrv_addr[1]}"
        out = await mqadmin("updateTopic", "-n", namesrv, "-c", "DefaultCluster", "-t", "MqT1")
        assert "success" in out, out[-2000:]
        assert "MqT1" in side.meta.topics.wrapper()["topicConfigTable"]
        acl_file.write_text(
            "accounts:\n  - {accessKey: rocketmq2, secretKey: '12345678', admin: false}\n"
        )
        assert side.acl.reload_if_changed() or side.acl.reloads == 1  # (or the watcher did)
        out = await mqadmin("updateTopic", "-b", side.broker_addr, "-t", "MqT2")
        assert "Need admin permission for request code=17" in out, out[-2000:]
        assert "MqT2" not in side.meta.topics.wrapper()["topicConfigTable"]
