"""Name server + SYNC_MASTER + slave for the client-port benchmark: trioha's, Java's, or given.

* :func:`open_trioha_cluster` runs the README's commands (``python -m trioha namesrv``,
  ``master --role SYNC_MASTER``, ``slave``), each in its own process, on free loopback ports.
* :func:`open_java_cluster` runs Java RocketMQ 4.9.7 from the reference directory through its
  ``rocketmq.sh``; the Java processes bind 0.0.0.0, so the caller must already be inside a
  network namespace of its own (``client_bench.py`` re-executes itself under ``unshare -n``).
* :func:`wait_sendable` returns once a send through the name server's route is stored and
  replicated (SEND_OK), i.e. the master registered and its slave is streaming.

Every cluster is a :class:`Cluster`: its name server address and the master's and slave's PIDs
(the benchmark reads their CPU from ``/proc``).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

from bench._common import ROOT
from tests.javaref import MISSING, java_rocketmq

JAVA_HOME_DIR = java_rocketmq() or ROOT / "missing-rocketmq-reference"
READY_TIMEOUT = 90.0


@attrs.define
class Cluster:
    name: str
    namesrv: str
    master_pid: int | None = None
    slave_pid: int | None = None
    processes: list[trio.Process] = attrs.field(factory=list)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def in_own_netns() -> bool:
    """True when loopback is the only network interface (a namespace of our own).

    ``/proc/net/dev`` follows the reader's namespace (``/sys/class/net`` does not).
    """
    try:
        lines = Path("/proc/net/dev").read_text().splitlines()[2:]
    except OSError:
        return False
    return [line.split(":")[0].strip() for line in lines] == ["lo"]


def java_missing() -> str | None:
    """Why the Java broker cannot run here, or None when it can."""
    script = JAVA_HOME_DIR / "rocketmq.sh"
    if not script.exists():
        return MISSING
    if shutil.which("java") is None:
        return "no java on PATH"
    if not Path("/usr/share/java/netty-transport.jar").exists():
        return f"Java libraries missing: run {script} setup"
    return None


async def _spawn(cmd: list[str], log: Path, cluster: Cluster) -> trio.Process:
    out = log.open("wb")
    process = await trio.lowlevel.open_process(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    out.close()
    cluster.processes.append(process)
    return process


async def _stop(cluster: Cluster) -> None:
    with trio.CancelScope(shield=True):
        for process in reversed(cluster.processes):  # the slave, the master, the name server
            if process.returncode is None:
                process.terminate()
            with trio.move_on_after(20):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()


@asynccontextmanager
async def open_trioha_cluster(work: Path, *, segment_size: int) -> AsyncIterator[Cluster]:
    await trio.Path(work).mkdir(parents=True, exist_ok=True)
    ns, listen, ha, slave_listen = (free_port() for _ in range(4))
    namesrv = f"127.0.0.1:{ns}"
    cluster = Cluster("trioha", namesrv)
    py = [sys.executable, "-m", "trioha"]
    size = str(segment_size)
    try:
        await _spawn([*py, "namesrv", "--listen", namesrv], work / "namesrv.log", cluster)
        master = await _spawn(
            [
                *py,
                "master",
                "--store-dir",
                str(work / "master"),
                "--role",
                "SYNC_MASTER",
                "--namesrv",
                namesrv,
                "--listen",
                f"127.0.0.1:{listen}",
                "--ha-listen",
                f"127.0.0.1:{ha}",
                "--mapped-file-size",
                size,
            ],
            work / "master.log",
            cluster,
        )
        slave = await _spawn(
            [
                *py,
                "slave",
                "--store-dir",
                str(work / "slave"),
                "--namesrv",
                namesrv,
                "--listen",
                f"127.0.0.1:{slave_listen}",
                "--master-ha",
                f"127.0.0.1:{ha}",
                "--mapped-file-size",
                size,
            ],
            work / "slave.log",
            cluster,
        )
        cluster.master_pid, cluster.slave_pid = master.pid, slave.pid
        yield cluster
    finally:
        await _stop(cluster)


def _java_conf(
    path: Path,
    *,
    store: Path,
    role: str,
    broker_id: int,
    port: int,
    namesrv: str,
    segment_size: int,
    master_ha: str | None = None,
) -> None:
    lines = {
        "brokerClusterName": "DefaultCluster",
        "brokerName": "broker-a",
        "brokerId": broker_id,
        "brokerRole": role,
        "flushDiskType": "ASYNC_FLUSH",
        "namesrvAddr": namesrv,
        "listenPort": port,
        "haListenPort": port + 1,
        "brokerIP1": "127.0.0.1",
        "storePathRootDir": store,
        "storePathCommitLog": store / "commitlog",
        "mappedFileSizeCommitLog": segment_size,
        "autoCreateTopicEnable": "true",
    }
    if master_ha:
        lines["haMasterAddress"] = master_ha
    path.write_text("".join(f"{k}={v}\n" for k, v in lines.items()))


@asynccontextmanager
async def open_java_cluster(work: Path, *, segment_size: int) -> AsyncIterator[Cluster]:
    """Java RocketMQ 4.9.7: name server 9876, master 10911 (HA 10912), slave 10921."""
    why = java_missing()
    if why is not None:
        raise RuntimeError(why)
    if not in_own_netns():
        raise RuntimeError("the Java broker binds 0.0.0.0: run it inside `unshare -n` only")
    await trio.Path(work).mkdir(parents=True, exist_ok=True)
    script = str(JAVA_HOME_DIR / "rocketmq.sh")
    namesrv = "127.0.0.1:9876"
    cluster = Cluster("java", namesrv)
    master_conf, slave_conf = work / "master.conf", work / "slave.conf"
    _java_conf(
        master_conf,
        store=work / "master",
        role="SYNC_MASTER",
        broker_id=0,
        port=10911,
        namesrv=namesrv,
        segment_size=segment_size,
    )
    _java_conf(
        slave_conf,
        store=work / "slave",
        role="SLAVE",
        broker_id=1,
        port=10921,
        namesrv=namesrv,
        segment_size=segment_size,
        master_ha="127.0.0.1:10912",
    )
    try:
        await _spawn([script, "namesrv", "9876", str(work / "ns")], work / "namesrv.log", cluster)
        master = await _spawn(
            [script, "broker", str(master_conf), str(work / "m")], work / "master.log", cluster
        )
        slave = await _spawn(
            [script, "broker", str(slave_conf), str(work / "s")], work / "slave.log", cluster
        )
        cluster.master_pid, cluster.slave_pid = master.pid, slave.pid
        yield cluster
    finally:
        await _stop(cluster)


async def wait_sendable(cluster: Cluster, topic: str) -> None:
    """Send to *topic* through the name server until SEND_OK; then its route is known."""
    from trioha._errors import TriohaError
    from trioha.remoting import get_route, open_client_pool, send_message

    last = "nothing tried"
    with trio.move_on_after(READY_TIMEOUT):
        async with open_client_pool() as pool:
            while True:
                for process in cluster.processes:
                    if process.returncode is not None:
                        raise RuntimeError(
                            f"{cluster.name}: a process exited with code {process.returncode}"
                            f" ({str(process.args)[:160]})"
                        )
                try:
                    route = await get_route(pool, cluster.namesrv, "TBW102")
                    master = next((b.master for b in route.brokers if b.master), None)
                    if master is not None:
                        result = await send_message(
                            pool, master, topic=topic, body=b"ready", queue_id=0
                        )
                        last = result.status
                        if result.status == "SEND_OK":
                            await get_route(pool, cluster.namesrv, topic)
                            return
                except (TriohaError, OSError) as exc:
                    last = repr(exc)[:200]
                await trio.sleep(0.5)
    raise RuntimeError(f"{cluster.name} not ready after {READY_TIMEOUT:g} s: {last}")
