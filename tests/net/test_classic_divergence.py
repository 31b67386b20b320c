"""End to end, real processes and sockets: a classic master loses the tail it had sent.

The scenario an operator meets after a power cut: the master process dies, the unflushed
tail of its commit log is gone (zeroed, as a page cache that never reached the disk), it
restarts and producers go on at once, then the slave restarts. The slave must be refused
with an ERROR on both sides and its log left exactly as it was (never spliced onto the new
history); after ``trioha slave --truncate-to-master`` it replicates the master's new history
and ends byte-identical to it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from tests.javaref import MISSING, rocketmq_sh
from tests.test_broker import _free_port, free_broker_port
from trioha.remoting import open_client_pool, runtime_info, send_message
from trioha.store import NewMessage, open_store

SEG = 64 * 1024
CMD = [sys.executable, "-m", "trioha"]
pytestmark = pytest.mark.slow


class Broker:
    def __init__(self, args: list[str], port: int) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.address = f"127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [*CMD, *args, "--listen", self.address],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.output = ""

    def stop(self, sig: int = signal.SIGTERM) -> str:
        if self.proc.returncode is not None:  # stopped already
            return self.output
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.output = self.proc.communicate(timeout=30)[0].decode()
        return self.output


@contextmanager
def broker(args: list[str], port: int) -> Iterator[Broker]:
    b = Broker(args, port)
    try:
        yield b
    finally:
        b.stop()


def status(address: str) -> dict[str, str]:
    async def ask() -> dict[str, str]:
        async with open_client_pool() as pool:
            with trio.fail_after(5):
                return await runtime_info(pool, address)

    return trio.run(ask)


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    start = time.monotonic()
    while True:
        try:
            if check():
                return
        except Exception:  # not up yet (refused, timed out, a table without the key)
            pass
        assert time.monotonic() - start < timeout, f"timed out waiting for {what}"
        time.sleep(0.1)


def produce(address: str, count: int, tag: str) -> None:
    async def send() -> None:
        async with open_client_pool() as pool:
            for i in range(count):
                with trio.fail_after(10):
                    result = await send_message(
                        pool,
                        address,
                        topic="FooBar",
                        body=b"%s-%04d" % (tag.encode(), i) * 40,
                        queue_id=i % 2,
                    )
                assert result.code == 0, result

    trio.run(send)


def log_bytes(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "commitlog").iterdir())}


def test_a_slave_holding_a_lost_tail_is_refused_then_cut_back_and_caught_up(
    tmp_path: Path,
) -> None:
    m_dir, s_dir = tmp_path / "m", tmp_path / "s"
    conf = tmp_path / "broker.conf"
    # No flush by interval: everything the master writes stays unflushed (a power cut's prey).
    conf.write_text(
        f"mappedFileSizeCommitLog={SEG}\nflushIntervalCommitLog=600000\nhaSyncFromOldest=true\n"
    )
    ha, m_port, s_port = _free_port(), free_broker_port(), free_broker_port()
    master_args = [
        "master",
        "--store-dir",
        str(m_dir),
        "-c",
        str(conf),
        "--ha-listen",
        f"127.0.0.1:{ha}",
    ]
    slave_args = [
        "slave",
        "--store-dir",
        str(s_dir),
        "-c",
        str(conf),
        "--master-ha",
        f"127.0.0.1:{ha}",
    ]

    # 1. A master and a slave in step; the master's tail past `cut` is never flushed.
    master = Broker(master_args, m_port)
    try:
        wait_for("the master", lambda: bool(status(master.address)))
        produce(master.address, 20, "kept")
        cut = int(status(master.address)["commitLogMaxOffset"])
        produce(master.address, 20, "lost")
        end = int(status(master.address)["commitLogMaxOffset"])
        with broker(slave_args, s_port) as slave:
            wait_for(
                "the slave to catch up",
                lambda: int(status(slave.address)["stats.client.reported_offset"]) == end,
            )
        # 2. Power cut: the master dies and its unflushed tail never reached the disk.
        master.stop(signal.SIGKILL)
    finally:
        master.stop(signal.SIGKILL)
    segment = m_dir / "commitlog" / f"{0:020d}"
    with segment.open("r+b") as f:
        f.seek(cut)
        f.write(bytes(end - cut))
    slave_before = log_bytes(s_dir)

    # 3. The master had answered PUT_OK for the lost messages and sent them: it refuses to
    # start as master, naming the range and the slave that holds them.
    refused = Broker(master_args, m_port)
    out = refused.proc.communicate(timeout=60)[0].decode()
    assert refused.proc.returncode == 1, out
    assert f"the acknowledged bytes [{cut}, " in out, out
    assert "slave 127.0.0.1, which acknowledged at least up to" in out, out
    assert "--accept-lost-acknowledged" in out, out
    assert log_bytes(s_dir) == slave_before
    # The operator discards them on purpose; producers go on at once; the slave restarts.
    with broker([*master_args, "--accept-lost-acknowledged"], m_port) as master:
        wait_for("the restarted master", lambda: bool(status(master.address)))
        produce(master.address, 60, "new")
        new_end = int(status(master.address)["commitLogMaxOffset"])
        assert new_end > end  # the master's log is past the slave's: only the new check helps
        with broker(slave_args, s_port) as slave:
            wait_for(
                "the slave to be refused",
                lambda: status(slave.address)["stats.client.needs_reseed"] == "true",
            )
            table = status(slave.address)
            assert table["stats.client.diverged_master_offset"] == str(cut)
            assert table["stats.client.diverged_slave_offset"] == str(end)
            assert int(status(master.address)["stats.ha.slaves_refused"]) >= 1
        slave_out = slave.output
    master_out = master.output
    assert log_bytes(s_dir) == slave_before  # never spliced, not a byte changed
    assert f"may have sent bytes [{cut}, " in master_out
    assert "ERROR" in master_out
    assert "refusing slave 127.0.0.1:" in master_out
    assert f"requests offset {end}, inside [{cut}, " in master_out
    assert "ERROR" in slave_out
    assert f"the master's history ends at {cut}" in slave_out
    assert f"this slave holds up to {end}" in slave_out
    assert (s_dir / "haDiverged").exists()

    # 4. The operator cuts the slave back; it then follows the master's new history exactly.
    done = subprocess.run(
        [*CMD, "slave", "--store-dir", str(s_dir), "-c", str(conf), "--truncate-to-master"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"back from {end} to {cut}" in done.stdout
    assert not (s_dir / "haDiverged").exists()
    assert list((s_dir / "lost+found").iterdir())  # the cut bytes are kept
    with broker(master_args, m_port) as master:
        wait_for("the master", lambda: bool(status(master.address)))
        with broker(slave_args, s_port) as slave:
            wait_for(
                "the slave to catch up",
                lambda: int(status(slave.address)["stats.client.reported_offset"]) == new_end,
            )
            assert status(slave.address)["stats.client.needs_reseed"] == "false"
    with open_store(m_dir) as m_store, open_store(s_dir) as s_store:
        assert s_store.commitlog.max_offset == m_store.commitlog.max_offset == new_end
        assert bytes(s_store.commitlog.read(0, cut)) == bytes(m_store.commitlog.read(0, cut))
        offset = cut
        while offset < new_end:
            m_chunk = bytes(m_store.commitlog.read(offset, SEG))
            assert bytes(s_store.commitlog.read(offset, SEG)) == m_chunk, offset
            offset += len(m_chunk)
        assert [m.body for m in s_store.commitlog.iter_messages()] == [
            m.body for m in m_store.commitlog.iter_messages()
        ]


# --- a Java RocketMQ 4.9.7 slave is told in its own protocol (optional interop) --------------


_JAVA_SLAVE_CONF = """brokerClusterName=DefaultCluster
brokerName=broker-a
brokerId=1
brokerRole=SLAVE
namesrvAddr=127.0.0.1:9876
listenPort=10921
brokerIP1=127.0.0.1
storePathRootDir={root}
storePathCommitLog={root}/commitlog
mappedFileSizeCommitLog={seg}
haMasterAddress=127.0.0.1:10912
"""

# Every path is absolute and the working directory is the test run's: a mutation run
# (tasks.py mutate) finds its configuration there, also in these child processes.
_NAMESPACE_SCRIPT = """set -u
ip link set lo up
{py} -m trioha namesrv --listen 127.0.0.1:9876 > {work}/ns.out 2>&1 &
NS=$!
{py} -m trioha master --store-dir {work}/m --ha-listen 127.0.0.1:10912 \\
  --listen 127.0.0.1:10911 --mapped-file-size {seg} --namesrv 127.0.0.1:9876 \\
  > {work}/master.out 2>&1 &
M=$!
sleep 2
{sh} broker {work}/slave.conf {work}/javalogs > {work}/slave.out 2>&1 &
S=$!
for _ in $(seq 1 120); do
  grep -rqs "master pushed offset not equal" {work}/javalogs && break
  sleep 0.5
done
kill $S $M $NS
wait
"""


def test_a_java_slave_holding_lost_bytes_is_refused_in_its_own_protocol(tmp_path: Path) -> None:
    """Java's ``HAClient.dispatchReadRequest`` rejects the refusal header and logs both
    offsets at ERROR; its commit log is left as it was."""
    sh = rocketmq_sh()
    if sh is None:
        pytest.skip(MISSING)
    if shutil.which("java") is None or shutil.which("unshare") is None:
        pytest.skip("no JDK or unshare here")
    if subprocess.run(["unshare", "-n", "true"], check=False).returncode != 0:
        pytest.skip("cannot create a network namespace (the Java broker binds 0.0.0.0)")
    seg = 1 << 20
    with open_store(tmp_path / "m", segment_size=seg) as store:
        offsets = [
            store.commitlog.append(NewMessage(topic="TopicTest", body=b"x" * 200)).physical_offset
            for _ in range(40)
        ]
        end = store.commitlog.max_offset
        slave_bytes = bytes(store.commitlog.read(0, end))
        store.commitlog.truncate(offsets[20])  # the master lost [fork, end) it had sent
    fork = offsets[20]
    (tmp_path / "m" / "haSentOffset").write_text(f"sent {end}\nflushed 0\nlost {fork} {end}\n")
    java_log = tmp_path / "s" / "commitlog" / f"{0:020d}"
    java_log.parent.mkdir(parents=True)
    java_log.write_bytes(slave_bytes + bytes(seg - len(slave_bytes)))  # a full RocketMQ file
    (tmp_path / "slave.conf").write_text(_JAVA_SLAVE_CONF.format(root=tmp_path / "s", seg=seg))
    script = _NAMESPACE_SCRIPT.format(work=tmp_path, py=sys.executable, seg=seg, sh=sh)
    subprocess.run(
        ["unshare", "-n", "bash", "-c", script],
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    master_out = (tmp_path / "master.out").read_text()
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "javalogs").rglob("*.log"))
    if "boot success" not in (tmp_path / "slave.out").read_text(errors="replace"):
        pytest.skip("the Java broker did not start here (see slave.out)")
    assert "refusing slave 127.0.0.1:" in master_out
    assert f"requests offset {end}, inside [{fork}, {end})" in master_out
    assert (
        f"master pushed offset not equal the max phy offset in slave, SLAVE: {end} "
        f"MASTER: {fork}" in logs
    )
    assert java_log.read_bytes()[:end] == slave_bytes  # not a byte spliced on
