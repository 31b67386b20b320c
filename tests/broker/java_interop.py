"""Drive RocketMQ 4.9.7's own tools against trioha, inside a private network namespace.

Run by ``test_java_interop.py`` as ``unshare -n python java_interop.py ROCKETMQ_SH WORKDIR``:
the Java broker binds 0.0.0.0, so everything (a trioha name server, a trioha SYNC_MASTER, a
Java slave of it, ``mqadmin``) runs in a namespace that has only loopback. Prints one JSON
document with what each step saw; every process started here is stopped by its pid.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio

from trioha.remoting._client import open_client_pool
from trioha.remoting._mqclient import send_message

NAMESRV = "127.0.0.1:9876"
MASTER = "127.0.0.1:10911"
TOPIC = "TopicJ"


def wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on port {port} after {timeout:g} s")


def wait_for(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.25)
    return False


def mqadmin(rocketmq: str, *args: str) -> str:
    done = subprocess.run(
        ["bash", rocketmq, "mqadmin", *args],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    lines = (done.stdout + done.stderr).splitlines()
    return "\n".join(
        line for line in lines if line.strip() and not line.startswith(("WARNING", "SLF4J"))
    )


async def send(count: int, pause: float) -> dict[str, int]:
    statuses: dict[str, int] = {}
    async with open_client_pool() as pool:
        for i in range(count):
            result = await send_message(
                pool, MASTER, topic=TOPIC, body=b"hello %d" % i, queue_id=0, keys=f"k{i}"
            )
            statuses[str(result.code)] = statuses.get(str(result.code), 0) + 1
            await trio.sleep(pause)
    return statuses


def main(rocketmq: str, work: Path) -> dict[str, Any]:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    python = sys.executable
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out: dict[str, Any] = {}
    procs: list[subprocess.Popen[bytes]] = []

    def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
        handle = open(log, "wb")  # noqa: SIM115 - the process owns it until it stops
        proc = subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT, env=env)
        procs.append(proc)
        return proc

    try:
        start([python, "-m", "trioha", "namesrv", "--listen", NAMESRV], work / "namesrv.log")
        wait_port(9876, 20)
        master_log = work / "master.log"
        master = start(
            [
                python, "-m", "trioha", "master", "--store-dir", str(work / "master"),
                "--role", "SYNC_MASTER", "--listen", MASTER, "--namesrv", NAMESRV,
            ],
            master_log,
        )  # fmt: skip
        wait_port(10911, 30)
        wait_port(10909, 5)
        out["first_sends"] = trio.run(send, 5, 0.0)
        out["clusterList"] = mqadmin(rocketmq, "clusterList", "-n", NAMESRV)
        out["brokerStatus"] = mqadmin(rocketmq, "brokerStatus", "-n", NAMESRV, "-b", MASTER)
        out["queryMsgByKey"] = mqadmin(
            rocketmq, "queryMsgByKey", "-n", NAMESRV, "-t", TOPIC, "-k", "k3"
        )
        out["topicStatus"] = mqadmin(rocketmq, "topicStatus", "-n", NAMESRV, "-t", TOPIC)
        out["getBrokerConfig"] = mqadmin(rocketmq, "getBrokerConfig", "-n", NAMESRV, "-b", MASTER)
        out["updateSubGroup"] = mqadmin(
            rocketmq, "updateSubGroup", "-n", NAMESRV, "-b", MASTER, "-g", "GroupJ"
        )
        out["brokerConsumeStats"] = mqadmin(
            rocketmq, "brokerConsumeStats", "-n", NAMESRV, "-b", MASTER
        )

        # A Java slave of the trioha master: topics over the VIP channel, bytes over HA.
        slave_dir = work / "jslave"
        slave_dir.mkdir()
        conf = slave_dir / "broker.conf"
        conf.write_text(
            "brokerClusterName=DefaultCluster\nbrokerName=broker-a\nbrokerId=1\n"
            f"brokerRole=SLAVE\nnamesrvAddr={NAMESRV}\nlistenPort=10931\nbrokerIP1=127.0.0.1\n"
            f"storePathRootDir={slave_dir}/store\nstorePathCommitLog={slave_dir}/store/commitlog\n"
        )
        start(["bash", rocketmq, "broker", str(conf), str(slave_dir)], slave_dir / "out.log")
        out["slave_connected"] = wait_for(
            lambda: "ha: slave connected from" in master_log.read_text(errors="replace"), 60
        )
        # Sends while the Java slave has not reported yet (it reports 5 s after connecting).
        out["sends_while_slave_connects"] = trio.run(send, 20, 0.25)
        topics = slave_dir / "store" / "config" / "topics.json"
        out["slave_learned_topic"] = wait_for(
            lambda: topics.exists() and f'"{TOPIC}"' in topics.read_text(errors="replace"), 40
        )
        master.send_signal(signal.SIGTERM)
        master.wait(timeout=30)
        out["queryMsgByKey_on_slave"] = mqadmin(
            rocketmq, "queryMsgByKey", "-n", NAMESRV, "-t", TOPIC, "-k", "k17"
        )
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], Path(sys.argv[2]))))
