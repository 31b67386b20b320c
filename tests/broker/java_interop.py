"""Drive RocketMQ 4.9.7's own tools against trioha, inside a private network namespace.

Run by ``test_java_interop.py`` as ``unshare -n python java_interop.py ROCKETMQ_SH WORKDIR``:
the Java broker binds 0.0.0.0, so everything (a trioha name server, a trioha SYNC_MASTER, a
Java slave of it, a Java name server and broker beside them, ``mqadmin``, a Java producer and
consumer) runs in a namespace that has only loopback. The operator's admin commands run
against the trioha cluster and the Java one alike (:func:`admin_commands`), so each answer can
be set beside Java's. Prints one JSON document with what each step saw; every process started
here is stopped by its pid.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import trio

from trioha.remoting import open_client_pool, send_message

NAMESRV = "127.0.0.1:9876"
MASTER = "127.0.0.1:10911"
TOPIC = "TopicJ"
#: The Java cluster beside trioha's: its own name server, one Java ASYNC_MASTER.
JAVA_NAMESRV = "127.0.0.1:9886"
JAVA_MASTER = "127.0.0.1:10951"
#: What the admin commands work on, in both clusters.
ADMIN_TOPIC = "AdminT"
ADMIN_GROUP = "AdminG"
ADMIN_MESSAGES = 10
HERE = Path(__file__).resolve().parent


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


#: mqadmin runs that timed out on the client side (its 3 s budget, on a loaded machine) and
#: were run again: (command, attempt). Printed with the rest, so a slow run shows.
RETRIED: list[tuple[str, int]] = []


def mqadmin(rocketmq: str, *args: str, cwd: Path | None = None) -> str:
    """Run ``mqadmin``; its output without the JVM's warnings. A run whose only trouble is
    the tool's own request timeout is run again (twice at most), as an operator would."""
    for attempt in range(3):
        done = subprocess.run(
            ["bash", rocketmq, "mqadmin", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=cwd,
        )
        lines = (done.stdout + done.stderr).splitlines()
        output = "\n".join(
            line for line in lines if line.strip() and not line.startswith(("WARNING", "SLF4J"))
        )
        if "RemotingTimeoutException" not in output:
            break
        RETRIED.append((args[0], attempt + 1))
    return output


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


class JavaClients:
    """``java/AdminClients.java`` running in the background; its stdout lines as they come."""

    def __init__(self, java: list[str], namesrv: str, log: Path) -> None:
        self.lines: list[str] = []
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [*java, namesrv, ADMIN_TOPIC, ADMIN_GROUP, str(ADMIN_MESSAGES), "75"],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def seen(self, prefix: str) -> str | None:
        return next((line for line in self.lines if line.startswith(prefix)), None)

    def consumed(self) -> int:
        counts = [int(line.split()[1]) for line in self.lines if line.startswith("consumed ")]
        return counts[-1] if counts else 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def java_clients_command(rocketmq: str, work: Path) -> list[str]:
    """Compile ``AdminClients.java`` against the reference's jars; the ``java`` command."""
    classpath = subprocess.run(
        ["bash", rocketmq, "classpath"], capture_output=True, text=True, check=True
    ).stdout.strip()
    classes = work / "java-classes"
    classes.mkdir(exist_ok=True)
    subprocess.run(
        ["javac", "-d", str(classes), "-cp", classpath, str(HERE / "java" / "AdminClients.java")],
        check=True,
    )
    return [
        "java",
        "-Xmx256m",
        f"-Duser.home={work}",
        "-cp",
        f"{classpath}:{classes}",
        "AdminClients",
    ]


def admin_commands(
    rocketmq: str, java: list[str], namesrv: str, broker: str, work: Path
) -> dict[str, Any]:
    """The commands of an operator's week, against one cluster (trioha's or Java's)."""
    work.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {}

    def run(name: str, *args: str) -> str:
        out[name] = mqadmin(rocketmq, *args, "-n", namesrv, cwd=work)
        return str(out[name])

    clients = JavaClients(java, namesrv, work / "clients.log")
    try:
        out["clients_ready"] = wait_for(lambda: clients.seen("ready") is not None, 90)
        out["consumed_first"] = wait_for(lambda: clients.consumed() >= ADMIN_MESSAGES, 60)
        # Online: the broker finds the producer and asks the consumer.
        run("producerConnection", "producerConnection", "-g", f"{ADMIN_GROUP}-P", "-t", ADMIN_TOPIC)
        run("consumerStatus", "consumerStatus", "-g", ADMIN_GROUP)
        # An idle push consumer holds long polls: no load in the pull pool's figures.
        run("brokerStatus", "brokerStatus", "-b", broker)
        run("clusterList", "clusterList")
        # The retried message's ORIGIN_MESSAGE_ID is an offset message id queryMsgById reads.
        out["origin_seen"] = wait_for(lambda: clients.seen("origin ") is not None, 60)
        origin = (clients.seen("origin ") or "origin -").split()[1]
        out["origin"] = origin
        run("queryMsgById", "queryMsgById", "-i", origin)
        # With the consumer online the broker tells it the new offsets: it consumes again.
        before = clients.consumed()
        run(
            "resetOffsetByTime_online",
            "resetOffsetByTime",
            "-g",
            ADMIN_GROUP,
            "-t",
            ADMIN_TOPIC,
            "-s",
            "0",
        )
        out["consumed_again"] = wait_for(lambda: clients.consumed() >= before + ADMIN_MESSAGES, 60)
        out["clients_done"] = wait_for(lambda: clients.seen("done ") is not None, 90)
    finally:
        clients.stop()
    # No consumer online: CONSUMER_NOT_ONLINE, and mqadmin writes the offsets itself.
    run(
        "resetOffsetByTime_offline",
        "resetOffsetByTime",
        "-g",
        ADMIN_GROUP,
        "-t",
        ADMIN_TOPIC,
        "-s",
        "0",
    )
    run("consumerProgress_reset", "consumerProgress", "-g", ADMIN_GROUP)
    run("skipAccumulatedMessage", "skipAccumulatedMessage", "-g", ADMIN_GROUP, "-t", ADMIN_TOPIC)
    run("consumerProgress_skipped", "consumerProgress", "-g", ADMIN_GROUP)
    run("queryCq", "queryCq", "-t", ADMIN_TOPIC, "-q", "0", "-i", "0", "-c", "2", "-b", broker)
    run(
        "updateBrokerConfig",
        "updateBrokerConfig",
        "-b",
        broker,
        "-k",
        "flushIntervalCommitLog",
        "-v",
        "1000",
    )
    run("getBrokerConfig", "getBrokerConfig", "-b", broker)
    run("getNamesrvConfig", "getNamesrvConfig")
    run(
        "updateNamesrvConfig_path",
        "updateNamesrvConfig",
        "-k",
        "kvConfigPath",
        "-v",
        str(work / "kv"),
    )
    run("wipeWritePerm", "wipeWritePerm", "-b", "broker-a")
    run("topicRoute_wiped", "topicRoute", "-t", ADMIN_TOPIC)
    run("addWritePerm", "addWritePerm", "-b", "broker-a")
    run("topicRoute_added", "topicRoute", "-t", ADMIN_TOPIC)
    run("updateSubGroup", "updateSubGroup", "-b", broker, "-g", "DelG")
    run("deleteSubGroup", "deleteSubGroup", "-b", broker, "-g", "DelG")
    run("cleanUnusedTopic", "cleanUnusedTopic", "-b", broker)
    run("cleanExpiredCQ", "cleanExpiredCQ", "-b", broker)
    run("deleteExpiredCommitLog", "deleteExpiredCommitLog", "-b", broker)
    run(
        "updateBrokerConfig_retention",
        "updateBrokerConfig",
        "-b",
        broker,
        "-k",
        "fileReservedTime",
        "-v",
        "48",
    )
    # A key read only at start: Java stores it and answers success, trioha refuses it.
    run(
        "updateBrokerConfig_startOnly",
        "updateBrokerConfig",
        "-b",
        broker,
        "-k",
        "messageDelayLevel",
        "-v",
        "1s 5s",
    )
    return out


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
        # The Java cluster starts meanwhile (a JVM takes seconds).
        java_dir = work / "java"
        java_dir.mkdir()
        start(["bash", rocketmq, "namesrv", "9886", str(java_dir / "namesrv")], work / "jns.log")
        java_conf = java_dir / "broker.conf"
        java_conf.write_text(
            "brokerClusterName=DefaultCluster\nbrokerName=broker-a\nbrokerId=0\n"
            f"brokerRole=ASYNC_MASTER\nnamesrvAddr={JAVA_NAMESRV}\nlistenPort=10951\n"
            f"brokerIP1=127.0.0.1\nstorePathRootDir={java_dir}/store\n"
            f"storePathCommitLog={java_dir}/store/commitlog\n"
        )
        start(["bash", rocketmq, "broker", str(java_conf), str(java_dir)], work / "jbroker.log")
        java = java_clients_command(rocketmq, work)
        wait_port(10911, 30)
        # The JVMs' start-up takes the machine for seconds: let it pass before mqadmin's 3 s
        # request timeouts start counting.
        wait_port(10951, 120)
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

        # The admin commands, against trioha and against Java (same commands, same clients).
        out["admin"] = {
            "trioha": admin_commands(rocketmq, java, NAMESRV, MASTER, work / "admin-trioha"),
        }
        out["admin"]["java"] = admin_commands(
            rocketmq, java, JAVA_NAMESRV, JAVA_MASTER, work / "admin-java"
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
        groups = slave_dir / "store" / "config" / "subscriptionGroup.json"
        out["slave_groups"] = groups.read_text(errors="replace") if groups.exists() else ""
        out["slave_topics"] = topics.read_text(errors="replace") if topics.exists() else ""
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
    out["mqadmin_retried"] = RETRIED
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], Path(sys.argv[2]))))
