"""A manual failover end to end, real processes and sockets: promote the slave, bring the old
master back as its slave (docs/operations.md, "A failover").

Classic mode has nothing on the wire that names a history, so a promoted slave (a store that
did not last run as a trioha master) treats what lies past its end as a history it never
had: a returning old master holding bytes there is refused, never spliced, while the
promoted master's own slaves reconnect as usual. Epoch mode gets the same from its epochs.
And a master that lost messages it had acknowledged refuses to start while its slave holds
them; promoting that slave and starting the old master as its slave keeps every one.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from tests.test_broker import _free_port, _same_files, files_identical, free_broker_port
from tests.test_epoch_mode import _messages, _Process, _produce, _until

SEG = 64 * 1024
pytestmark = pytest.mark.slow

_CONF = (
    f"mappedFileSizeCommitLog={SEG}\n"
    # No flush by interval: the tails stay unflushed, as a power cut finds them.
    "flushIntervalCommitLog=600000\n"
    "haSyncFromOldest=true\nhaSendHeartbeatInterval=200\nhaHousekeepingInterval=2000\n"
    "haReconnectBackoffMax=200\n"
)


class _Cluster:
    """Brokers started by name on the stores of one test, with free ports."""

    def __init__(self, tmp_path: Path, conf: str) -> None:
        self.tmp_path = tmp_path
        self.conf = tmp_path / "broker.conf"
        self.conf.write_text(conf)
        self.ports: dict[str, int] = {}
        self.processes: list[_Process] = []

    def port(self, store: str) -> int:
        if store not in self.ports:
            self.ports[store] = free_broker_port()
        return self.ports[store]

    def start(self, name: str, role: str, store: str, ha: int, *extra: str) -> _Process:
        process = _Process(
            name,
            role,
            self.tmp_path / store,
            conf=self.conf,
            ha=ha,
            listen=self.port(store),
            logs=self.tmp_path,
            extra=extra,
        )
        self.processes.append(process)
        return process

    def produce(self, process: _Process, store: str, count: int, tag: bytes) -> None:
        trio.run(_produce, process, self.port(store), count, tag)

    def stop_all(self) -> None:
        for process in self.processes:
            process.stop()

    def pair_in_step(self, ha: int, count: int) -> tuple[_Process, _Process]:
        """A master on store ``m`` and its slave on ``s``, holding ``count`` messages alike."""
        master = self.start("m1", "master", "m", ha)
        slave = self.start("s1", "slave", "s", ha)
        self.produce(master, "m", count, b"old")
        m, s = self.tmp_path / "m", self.tmp_path / "s"
        _until(lambda: _same_files(m, s), "the slave copies the master", [master, slave])
        return master, slave

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "trioha", *args, "-c", str(self.conf)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


def _zero_tail(store: Path, offset: int) -> None:
    """A power cut: the store's commit log never got past ``offset`` on disk."""
    segment = store / "commitlog" / f"{offset - offset % SEG:020d}"
    with open(segment, "r+b") as f:
        f.seek(offset % SEG)
        f.write(bytes(SEG - offset % SEG))


def _log_bytes(store: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((store / "commitlog").iterdir())}


def test_classic_promote_the_slave_and_the_old_master_returns_refused_never_spliced(
    tmp_path: Path,
) -> None:
    c = _Cluster(tmp_path, _CONF)
    ha1, ha2 = _free_port(), _free_port()
    try:
        # 1. A master and its slave in step.
        master, slave = c.pair_in_step(ha1, 40)
        # 2. The slave's host loses power: its unflushed tail is gone. Then the master is
        # stopped, holding bytes the slave no longer has (it sent them: no self-refusal).
        slave.stop(signal.SIGKILL)
        held = _messages(tmp_path / "s", tmp_path / "copy1")
        promoted_end = held[30].physical_offset
        kept_old = sum(m.body.startswith(b"old") for m in held[:30])
        _zero_tail(tmp_path / "s", promoted_end)
        master.stop()
        m_before = _log_bytes(tmp_path / "m")
        # 3. The operator promotes the slave; producers move to it at once.
        promoted = c.start("s2", "master", "s", ha2)
        c.produce(promoted, "s", 60, b"new")
        assert "did not last run as a trioha master" in promoted.output
        # 4. A new slave of the promoted master copies it, restarts, and goes on normally.
        fresh = c.start("n1", "slave", "n", ha2)
        _until(lambda: _same_files(tmp_path / "s", tmp_path / "n"), "the new slave", [fresh])
        fresh.stop()
        fresh = c.start("n2", "slave", "n", ha2)
        c.produce(promoted, "s", 5, b"more")
        _until(lambda: _same_files(tmp_path / "s", tmp_path / "n"), "it goes on", [fresh])
        # 5. The old master comes back as the promoted master's slave: refused, untouched.
        returning = c.start("m2", "slave", "m", ha2)
        _until(
            lambda: "diverged from master" in returning.output,
            "the old master is refused",
            [promoted, returning],
        )
        returning.stop()
        assert _log_bytes(tmp_path / "m") == m_before  # not a byte spliced on
        refusal = f"inside [{promoted_end}, "
        assert refusal in promoted.output and "refusing slave 127.0.0.1:" in promoted.output
        assert f"the master's history ends at {promoted_end}" in returning.output
        # 6. Cut back as the refusal says, it copies the promoted master's history exactly.
        done = c.cli("slave", "--store-dir", str(tmp_path / "m"), "--truncate-to-master")
        assert done.returncode == 0, done.stderr
        assert f"to {promoted_end}," in done.stdout
        returning = c.start("m3", "slave", "m", ha2)
        _until(
            lambda: _same_files(tmp_path / "s", tmp_path / "m"),
            "the old master copies the new history",
            [promoted, returning],
        )
    finally:
        c.stop_all()
    for process in c.processes:
        assert "Traceback" not in process.output, process.output
    assert "diverged" not in "".join(p.output for p in c.processes if p.name.startswith("n"))
    files_identical(tmp_path / "s", tmp_path / "m")
    bodies = [m.body for m in _messages(tmp_path / "m", tmp_path / "final")]
    assert sum(b.startswith(b"old") for b in bodies) == kept_old  # the promoted slave's
    assert sum(b.startswith(b"new") for b in bodies) == 60


def test_epoch_promote_the_slave_and_the_old_master_returns_cut_back(tmp_path: Path) -> None:
    c = _Cluster(tmp_path, _CONF + "enableControllerMode=true\n")
    ha1, ha2 = _free_port(), _free_port()
    try:
        master, slave = c.pair_in_step(ha1, 40)
        # The slave goes away; the master takes 20 more it never sends, then stops.
        slave.stop()
        kept = len(_messages(tmp_path / "s", tmp_path / "copy1"))
        c.produce(master, "m", 20, b"unsent")
        master.stop()
        promoted = c.start("s2", "master", "s", ha2)
        c.produce(promoted, "s", 60, b"new")
        returning = c.start("m2", "slave", "m", ha2)
        _until(
            lambda: _same_files(tmp_path / "s", tmp_path / "m"),
            "the old master is cut back and copies the new history",
            [promoted, returning],
        )
    finally:
        c.stop_all()
    assert "cut this slave's log back from" in returning.output, returning.output
    assert "diverged" not in returning.output
    files_identical(tmp_path / "s", tmp_path / "m")
    bodies = [m.body for m in _messages(tmp_path / "m", tmp_path / "final")]
    assert not any(b.startswith(b"unsent") for b in bodies)
    assert sum(b.startswith(b"new") for b in bodies) == 60
    assert kept == 41  # 40 and the probe


def test_a_master_that_lost_acknowledged_messages_waits_for_its_slave_to_be_promoted(
    tmp_path: Path,
) -> None:
    """SYNC_MASTER with ASYNC_FLUSH: every PUT_OK is on the slave, the master's tail is not
    flushed. A power cut takes the tail; the restarted master refuses to start and says
    which slave holds it; promoting that slave and starting the master as its slave keeps
    every acknowledged message."""
    c = _Cluster(tmp_path, _CONF + "brokerRole=SYNC_MASTER\n")
    ha1, ha2 = _free_port(), _free_port()
    try:
        master = c.start("m1", "master", "m", ha1)
        slave = c.start("s1", "slave", "s", ha1)
        _until(lambda: "slave connected from" in master.output, "the slave", [master, slave])
        c.produce(master, "m", 40, b"acked")  # each one PUT_OK (SEND_OK): on the slave
        master.stop(signal.SIGKILL)
        slave.stop()
        offsets = [m.physical_offset for m in _messages(tmp_path / "m", tmp_path / "copy1")]
        cut = offsets[25]
        _zero_tail(tmp_path / "m", cut)
        refused = c.start("m2", "master", "m", ha1)
        assert refused.proc.wait(timeout=60) == 1, refused.output
        assert f"the acknowledged bytes [{cut}, " in refused.output, refused.output
        assert "slave 127.0.0.1, which acknowledged at least up to" in refused.output
        assert "--accept-lost-acknowledged" in refused.output
        # What the error says to do: promote the slave, start this broker as its slave.
        promoted = c.start("s2", "master", "s", ha2)
        returning = c.start("m3", "slave", "m", ha2)
        _until(lambda: "slave connected from" in promoted.output, "the old master", [promoted])
        c.produce(promoted, "s", 10, b"after")
        _until(
            lambda: _same_files(tmp_path / "s", tmp_path / "m"),
            "the old master copies the promoted history back",
            [promoted, returning],
        )
    finally:
        c.stop_all()
    assert "diverged" not in returning.output, returning.output
    bodies = [m.body for m in _messages(tmp_path / "m", tmp_path / "final")]
    assert sum(b.startswith(b"acked") for b in bodies) == 40  # not one acknowledged lost
    assert sum(b.startswith(b"after") for b in bodies) == 10
