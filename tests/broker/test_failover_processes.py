"""Automatic failover with real processes: three ``python -m trioha master -c broker.conf``
brokers of one group, a real etcd member and a name server; sync sends through trioha's
client; the master killed with SIGKILL; a slave elected, found through the name server, and
taking sends; every SEND_OK message in the new master's log at the offset it was
acknowledged with (docs/failover.md).

The failover time is printed, not asserted (speed targets are measured elsewhere).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import trio

from tests.etcd._harness import running_etcd
from tests.test_broker import SEG, _free_port, free_broker_port
from trioha._errors import RemotingError
from trioha.namesrv import serve_namesrv
from trioha.remoting._client import RemotingClientPool, open_client_pool
from trioha.remoting._mqclient import get_route, send_message
from trioha.store import DecodedMessage, decode_record, open_store

GROUP = 3
TOPIC = "TBW102"  # every broker registers it: its route names the group's master
WAIT = 60.0


@attrs.define
class Node:
    broker_id: int
    root: Path
    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"


@contextmanager
def running_brokers(tmp_path: Path, etcd: str, namesrv: str) -> Iterator[list[Node]]:
    nodes: list[Node] = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        for bid in range(1, GROUP + 1):
            node = Node(bid, tmp_path / f"b{bid}", free_broker_port())
            conf = tmp_path / f"b{bid}.conf"
            conf.write_text(
                "\n".join(
                    [
                        "brokerName=broker-f",
                        f"storePathRootDir={node.root}",
                        f"mappedFileSizeCommitLog={SEG}",
                        "brokerIP1=127.0.0.1",
                        f"listenPort={node.port}",
                        f"haListenPort={_free_port()}",
                        f"namesrvAddr={namesrv}",
                        "enableControllerMode=true",
                        f"failoverEtcdEndpoints={etcd}",
                        f"failoverBrokerId={bid}",
                        "failoverLeaseTtl=2",
                        "slaveTimeout=3000",
                        "",
                    ]
                )
            )
            with open(tmp_path / f"b{bid}.log", "wb") as out:
                node.process = subprocess.Popen(
                    [sys.executable, "-m", "trioha", "master", "-c", str(conf)],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            nodes.append(node)
        yield nodes
    finally:
        for node in nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.send_signal(signal.SIGTERM)
        for node in nodes:
            if node.process is not None:
                try:
                    node.process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    node.process.kill()
                    node.process.wait()


async def _send(pool: RemotingClientPool, namesrv: str, i: int) -> tuple[str, int] | None:
    """One sync send to the master the name server names: (broker, offset) if SEND_OK."""
    try:
        with trio.fail_after(5):
            route = await get_route(pool, namesrv, TOPIC)
            master = next((b.master for b in route.brokers if b.master), None)
            if master is None:
                return None
            result = await send_message(
                pool, master, topic="FailoverOrders", body=b"id-%08d" % i, queue_id=i % 4
            )
    except (RemotingError, trio.TooSlowError, OSError):
        return None
    if result.status != "SEND_OK" or result.msg_id is None:
        return None
    return master, int(result.msg_id[-16:], 16)


async def _send_until_ok(
    pool: RemotingClientPool, namesrv: str, i: int, *, not_to: str | None = None
) -> tuple[str, int]:
    with trio.move_on_after(WAIT):
        while True:
            acked = await _send(pool, namesrv, i)
            if acked is not None and acked[0] != not_to:
                return acked
            await trio.sleep(0.05)
    raise AssertionError(f"no SEND_OK within {WAIT} s (message {i})")


def test_a_killed_master_is_replaced_and_every_send_ok_survives(tmp_path: Path) -> None:
    with running_etcd(tmp_path / "etcd") as cluster:
        etcd = cluster.endpoints[0]
        acked: dict[int, tuple[str, int]] = {}
        figures: dict[str, float] = {}

        async def main() -> list[Node]:
            async with trio.open_nursery() as nursery:
                host, port = await nursery.start(serve_namesrv, "127.0.0.1", 0)
                namesrv = f"{host}:{port}"
                with running_brokers(tmp_path, etcd, namesrv) as nodes:
                    async with open_client_pool() as pool:
                        for i in range(40):
                            acked[i] = await _send_until_ok(pool, namesrv, i)
                        old = acked[39][0]
                        victim = next(n for n in nodes if n.addr == old)
                        assert victim.process is not None
                        victim.process.send_signal(signal.SIGKILL)
                        killed = time.monotonic()
                        acked[40] = await _send_until_ok(pool, namesrv, 40, not_to=old)
                        figures["failover_s"] = time.monotonic() - killed
                        for i in range(41, 80):
                            acked[i] = await _send_until_ok(pool, namesrv, i, not_to=old)
                        assert len({broker for broker, _ in list(acked.values())[40:]}) == 1
                nursery.cancel_scope.cancel()
            return nodes

        nodes = trio.run(main)
    new = acked[79][0]
    print(f"failover: SIGKILL -> first SEND_OK on the new master {figures['failover_s']:.2f} s")
    node = next(n for n in nodes if n.addr == new)
    logs = {n.broker_id: (tmp_path / f"b{n.broker_id}.log").read_text() for n in nodes}
    assert "becoming master of epoch" in logs[node.broker_id], logs[node.broker_id]
    with open_store(node.root, segment_size=SEG) as store:
        for i, (_broker, offset) in sorted(acked.items()):
            decoded = decode_record(bytes(store.commitlog.read(offset, 4096)), base_offset=offset)
            assert isinstance(decoded, DecodedMessage), (i, offset, decoded)
            assert decoded.message.body == b"id-%08d" % i, (i, offset)
