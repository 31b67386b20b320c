"""Epoch mode (``enable_controller_mode``) end to end: real brokers, sockets and stores.

The scenario the epochs exist for: a master killed with bytes its slave already holds and it
then loses (a power cut takes the unflushed tail), restarted, producing again past the slave's
end, and the slave restarted. The slave must cut its log back to the consistent point and then
be byte-identical to the master, never a splice of two histories.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from tests.test_broker import (
    FAST,
    _free_port,
    _same_files,
    caught_up,
    connected,
    files_identical,
    free_broker_port,
    master_config,
    put_many,
    running,
    serve_hostile_master,
    slave_config,
)
from trioha._errors import (
    DamagedLogError,
    LostAcknowledgedError,
    NotAMessageBoundaryError,
    RemotingError,
)
from trioha.cli._demo import compare_logs
from trioha.cli._reseed import truncate_to_master
from trioha.net import DIVERGED_FILE
from trioha.proto import encode_master_handshake
from trioha.proto._epochs import entries_of
from trioha.store import (
    EPOCH_FILE_NAME,
    SENT_OFFSET_FILE,
    EpochFile,
    SentOffsets,
    StoredMessage,
    open_store,
)

EPOCH: dict[str, Any] = {"enable_controller_mode": True}
SEG = FAST["mapped_file_size_commit_log"]


async def test_epoch_mode_replicates_and_rebuilds_the_history(tmp_path: Path) -> None:
    async with running(master_config(tmp_path / "m", **EPOCH)) as master:
        assert master.epoch_file is not None
        assert master.epoch_file.history == entries_of([(1, 0)])
        async with running(slave_config(tmp_path / "s", master, **EPOCH)) as slave:
            await connected(master)
            await put_many(master, 1500)
            await caught_up(master, slave)
            assert compare_logs(master, slave) is None
            assert slave.epoch_file is not None
            assert slave.epoch_file.history == master.epoch_file.history
            stats = master.statistics()
            assert stats.ha is not None and (stats.ha.epoch, stats.ha.epoch_start) == (1, 0)
            client = slave.statistics().client
            assert client is not None and (client.last_epoch, client.truncations) == (1, ())
    files_identical(tmp_path / "m", tmp_path / "s")


async def test_a_restarted_master_begins_a_new_epoch_that_the_slave_records(tmp_path: Path) -> None:
    async with running(master_config(tmp_path / "m", **EPOCH)) as master:
        address = master.ha_address
        assert address is not None
        await put_many(master, 300)
        first_end = master.store.commitlog.max_offset
    again = master_config(tmp_path / "m", ha_listen_port=address[1], **EPOCH)
    async with (
        running(slave_config(tmp_path / "s", address, **EPOCH)) as slave,
        running(again) as master,
    ):
        assert master.epoch_file is not None
        assert master.epoch_file.history == entries_of([(1, 0), (2, first_end)])
        await put_many(master, 300)
        await caught_up(master, slave)
        assert compare_logs(master, slave) is None
        assert slave.epoch_file is not None
        assert slave.epoch_file.history == master.epoch_file.history


# --- the scenario, with real processes --------------------------------------------------------


class _Process:
    """A broker run as ``python -m trioha``, its output in a file (a pipe nobody reads while
    the test waits could fill and stall the broker)."""

    def __init__(
        self,
        name: str,
        role: str,
        store: Path,
        *,
        conf: Path,
        ha: int,
        listen: int,
        logs: Path,
        extra: tuple[str, ...] = (),
    ) -> None:
        cmd = [
            sys.executable,
            "-m",
            "trioha",
            role,
            "--store-dir",
            str(store),
            "-c",
            str(conf),
            "--listen",
            f"127.0.0.1:{listen}",
        ]
        cmd += ["--ha-listen" if role == "master" else "--master-ha", f"127.0.0.1:{ha}", *extra]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.name = name
        self.log = logs / f"{name}.out"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.output.splitlines()[-lines:])

    def check_alive(self) -> None:
        assert self.proc.poll() is None, f"{self.name} exited early:\n{self.output}"

    def stop(self, sig: int = signal.SIGTERM) -> str:
        """Signal it and wait (bounded); SIGKILL if it does not stop. Returns its output."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        return self.output


def _until(
    done: Callable[[], bool], what: str, processes: list[_Process], within: float = 60
) -> None:
    """Poll ``done`` until it holds; fail at once if a broker died, or after ``within`` s.

    A poll that comes back seconds late means this whole machine stalled, brokers included
    (a CI run's check once came 88 s after its deadline); the stall is added to the deadline
    rather than blamed on them."""
    last = time.monotonic()
    deadline = last + within
    while not done():
        for p in processes:
            p.check_alive()
        now = time.monotonic()
        if now - last > 5:
            deadline += now - last
        last = now
        if now >= deadline:
            tails = "\n".join(f"--- {p.name}, last lines:\n{p.tail()}" for p in processes)
            raise AssertionError(f"{what} within {within} s\n{tails}")
        time.sleep(0.1)


async def _produce(broker_process: _Process, port: int, count: int, tag: bytes) -> None:
    from trioha.remoting import open_client_pool, send_message

    async with open_client_pool() as pool:
        broker = f"127.0.0.1:{port}"
        with trio.fail_after(60):
            while True:  # the broker port may not listen yet (a refused connect stores nothing)
                try:
                    await send_message(pool, broker, topic="Epochs", body=b"probe", queue_id=0)
                    break
                except (OSError, RemotingError):
                    broker_process.check_alive()
                    await trio.sleep(0.1)
        for i in range(count):
            result = await send_message(
                pool, broker, topic="Epochs", body=tag + b"%05d" % i, queue_id=i % 4
            )
            assert result.code == 0, result


async def _queues(port: int) -> list[list[tuple[int, bytes]]] | None:
    """Every message of topic Epochs through the broker's consume queues, queue by queue
    (None when the broker did not answer: it may be busy; the caller asks again)."""
    from trioha.remoting import open_client_pool, pull_message

    out = []
    try:
        async with open_client_pool() as pool:
            for queue_id in range(4):
                got: list[tuple[int, bytes]] = []
                offset = 0
                for _ in range(100):
                    result = await pull_message(
                        pool,
                        f"127.0.0.1:{port}",
                        group="g",
                        topic="Epochs",
                        queue_id=queue_id,
                        offset=offset,
                    )
                    if not result.messages:
                        break
                    got += [(m.physical_offset, m.body) for m in result.messages]
                    offset = result.next_begin_offset
                out.append(got)
    except (OSError, RemotingError):
        return None
    return out


def _same_queues(master_port: int, slave_port: int, processes: list[_Process]) -> None:
    """The slave's consume queues list exactly the master's messages (once it has indexed)."""
    seen: list[list[list[tuple[int, bytes]]] | None] = [None]

    def same() -> bool:
        seen[0] = trio.run(_queues, master_port)
        return seen[0] is not None and seen[0] == trio.run(_queues, slave_port)

    _until(same, "the slave's consume queues list the master's messages", processes)
    assert seen[0] is not None
    assert sum(len(q) for q in seen[0]) == 3 + 200 - 40 + 100 + 20  # with one probe per run


def _messages(store_dir: Path, scratch: Path) -> list[StoredMessage]:
    """The messages of a store, read from a copy (opening recovers and would change it)."""
    shutil.copytree(store_dir, scratch)
    (scratch / "lock").unlink(missing_ok=True)
    with open_store(scratch, segment_size=SEG) as store:
        return list(store.commitlog.iter_messages())


@pytest.mark.slow
def test_a_slave_holding_the_masters_lost_tail_is_cut_back_never_spliced(tmp_path: Path) -> None:
    master_dir, slave_dir = tmp_path / "m", tmp_path / "s"
    conf = tmp_path / "broker.conf"
    # No flush by interval: the master's tail stays unflushed, so the power cut below takes
    # only bytes that were never durable. (A flush that got in first would make the cut
    # damage below the flushed mark, which a master rightly refuses to start on.)
    conf.write_text(
        f"mappedFileSizeCommitLog={SEG}\nenableControllerMode=true\nflushIntervalCommitLog=600000\n"
        "haSendHeartbeatInterval=200\nhaHousekeepingInterval=2000\n"
        "haReconnectBackoffMax=200\n"
    )
    ha, m_port, s_port = _free_port(), free_broker_port(), free_broker_port()

    def start(name: str, role: str, *extra: str) -> _Process:
        store, port = (master_dir, m_port) if role == "master" else (slave_dir, s_port)
        return _Process(
            name, role, store, conf=conf, ha=ha, listen=port, logs=tmp_path, extra=extra
        )

    master, slave = start("master1", "master"), start("slave1", "slave")
    try:
        trio.run(_produce, master, m_port, 200, b"old")
        _until(
            lambda: _same_files(master_dir, slave_dir),
            "the slave copies the master",
            [master, slave],
        )
        # Kill the master (no clean shutdown) and stop the slave; then the power cut: the
        # master's last 40 messages, which the slave holds, were never on its disk.
        master.stop(signal.SIGKILL)
        slave.stop()
        offsets = [m.physical_offset for m in _messages(master_dir, tmp_path / "copy")]
        cut = offsets[-40]
        # The classic-mode marks are there and say bytes past the cut were sent: epoch mode
        # must not act on them (no END_OF_FILE padding past the lost range, no refusal).
        marks = (master_dir / SENT_OFFSET_FILE).read_text().split()
        assert int(marks[marks.index("sent") + 1]) > cut, marks
        # ... and none of the bytes the cut takes had been flushed: a lost tail, not damage.
        flushed = int(marks[marks.index("flushed") + 1]) if "flushed" in marks else 0
        assert flushed <= cut, marks
        segment = master_dir / "commitlog" / f"{0:020d}"
        with open(segment, "r+b") as f:
            f.seek(cut)
            f.write(b"\0" * (SEG - cut))
        # The lost messages had been answered PUT_OK and the slave holds them: the master
        # refuses to start until the operator discards them on purpose.
        refused = start("refused", "master")
        assert refused.proc.wait(timeout=60) == 1, refused.output
        assert f"the acknowledged bytes [{cut}, " in refused.output, refused.output
        # The master restarts, begins epoch 2 at the cut, and producers resume at once,
        # taking the master's log past where the slave's ends.
        master = start("master2", "master", "--accept-lost-acknowledged")
        trio.run(_produce, master, m_port, 100, b"new")
        # Epoch 2 begins exactly at the cut: the sent mark past it did not pad the log.
        assert EpochFile.open(master_dir / EPOCH_FILE_NAME).history == entries_of(
            [(1, 0), (2, cut)]
        )
        slave = start("slave2", "slave")
        _until(
            lambda: _same_files(master_dir, slave_dir),
            "the slave is cut back and copies the master's new history",
            [master, slave],
        )
        trio.run(_produce, master, m_port, 20, b"more")
        _until(
            lambda: _same_files(master_dir, slave_dir),
            "the slave copies the master",
            [master, slave],
        )
        # The slave's consume queues were cut with its log: they index the new history.
        _same_queues(m_port, s_port, [master, slave])
    finally:
        slave_out, master_out = slave.stop(), master.stop()
    assert slave.proc.returncode == 0, slave_out
    assert master.proc.returncode == 0, master_out
    files_identical(master_dir, slave_dir)
    assert "cut this slave's log back from" in slave_out, slave_out
    assert f"to {cut}, the consistent point" in slave_out, slave_out
    assert "diverged" not in slave_out, slave_out
    assert "may have sent bytes" not in master_out, master_out  # the classic refusal
    assert EpochFile.open(slave_dir / EPOCH_FILE_NAME).history == entries_of([(1, 0), (2, cut)])
    assert EpochFile.open(master_dir / EPOCH_FILE_NAME).history == entries_of([(1, 0), (2, cut)])
    # The new history starts exactly at the cut: no padding, no skipped offsets, nothing
    # recorded as lost.
    messages = _messages(master_dir, tmp_path / "final")
    new = next(m for m in messages if m.physical_offset >= cut)
    assert (new.physical_offset, new.body) == (cut, b"probe")
    assert "lost" not in (master_dir / SENT_OFFSET_FILE).read_text()
    # The cut bytes are kept aside on the slave, and its log reads as messages throughout.
    assert any((slave_dir / "lost+found").iterdir())
    with open_store(slave_dir, segment_size=SEG) as store:
        bodies = [m.body for m in store.commitlog.iter_messages()]
    assert sum(b.startswith(b"old") for b in bodies) == 200 - 40
    assert sum(b.startswith(b"new") for b in bodies) == 100


async def test_a_slave_whose_bytes_no_epoch_vouches_for_is_refused_and_keeps_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Replicated in classic mode: the slave's log holds the master's bytes but no epochs.
    async with running(master_config(tmp_path / "m")) as master:
        address = master.ha_address
        assert address is not None
        async with running(slave_config(tmp_path / "s", master)) as slave:
            await connected(master)
            await put_many(master, 200)
            await caught_up(master, slave)
    held = (tmp_path / "s" / "commitlog" / f"{0:020d}").read_bytes()
    # Both switch to epoch mode: nothing proves the slave's bytes are this master's history.
    again = master_config(tmp_path / "m", ha_listen_port=address[1], **EPOCH)
    async with (
        running(again) as master,
        running(slave_config(tmp_path / "s", address, **EPOCH)) as slave,
    ):
        client = slave.ha_client
        assert client is not None
        with trio.fail_after(10):
            while client.last_close_reason is None:  # noqa: ASYNC110 (the client runs apart)
                await trio.sleep(0.02)
        assert "no epoch history" in client.last_close_reason
        assert client.truncations == []
        assert master.ha_service is not None
        assert not master.ha_service.live_acks()
    assert (tmp_path / "s" / "commitlog" / f"{0:020d}").read_bytes() == held
    # Sticky, as a classic refusal is: ERROR, and no reconnecting until an operator acts.
    assert any(
        r.levelname == "ERROR"
        and "diverged from master" in r.getMessage()
        and "Replication is stopped" in r.getMessage()
        for r in caplog.records
    )
    # What the operator does, as in classic mode: `trioha slave --truncate-to-master` cuts the
    # slave back to where the master said the histories part (nothing is shared here: 0),
    # keeping the bytes; the next start copies the master's history and its epochs.
    slave_conf = slave_config(tmp_path / "s", address, **EPOCH)
    assert (tmp_path / "s" / DIVERGED_FILE).exists()
    summary = truncate_to_master(slave_conf)
    assert "back from" in summary and " to 0," in summary
    assert not (tmp_path / "s" / DIVERGED_FILE).exists()
    assert any((tmp_path / "s" / "lost+found").iterdir())
    async with running(again) as master, running(slave_conf) as slave:
        await put_many(master, 10)
        await caught_up(master, slave)
        assert compare_logs(master, slave) is None
        assert slave.epoch_file is not None and master.epoch_file is not None
        assert slave.epoch_file.history == master.epoch_file.history
    files_identical(tmp_path / "m", tmp_path / "s")


def _flip_body_byte(segment: Path, message: StoredMessage) -> None:
    with open(segment, "r+b") as f:
        f.seek(message.physical_offset)
        record = f.read(message.total_size)
        at = record.index(message.body)
        f.seek(message.physical_offset + at)
        f.write(bytes([record[at] ^ 0xFF]))


async def test_a_damaged_record_cut_by_recovery_makes_the_slave_truncate(tmp_path: Path) -> None:
    """Recovery moves a damaged record (and all after it) aside; the master refuses to start
    until the operator accepts that, then starts over there in a new epoch, and a slave holding
    the old bytes cuts back to the damage."""
    async with running(master_config(tmp_path / "m", **EPOCH)) as master:
        address = master.ha_address
        assert address is not None
        async with running(slave_config(tmp_path / "s", master, **EPOCH)) as slave:
            await connected(master)
            await put_many(master, 300, producers=1)
            await caught_up(master, slave)
        damaged = list(master.store.commitlog.iter_messages())[250]
        held_end = master.store.commitlog.max_offset
    # The clean stop flushed everything; the flushers record that at most once a second, so
    # write the mark a later flush would have written rather than depend on when they ran.
    SentOffsets.open(tmp_path / "m").note_flushed(held_end, now=0.0)
    # One byte of record 250's body flipped: its CRC fails, and recovery cuts there.
    _flip_body_byte(tmp_path / "m" / "commitlog" / f"{0:020d}", damaged)
    again = master_config(tmp_path / "m", ha_listen_port=address[1], **EPOCH)
    # Recovery cut flushed bytes: damage, not a lost tail. Epoch mode refuses it as classic
    # mode does, naming the offsets and where the cut bytes were kept.
    with pytest.raises(DamagedLogError) as refused:
        async with running(again):
            pass
    assert f"ends at {damaged.physical_offset}, below {held_end}" in str(refused.value)
    assert "lost+found" in str(refused.value)
    again = attrs.evolve(again, ha_accept_damaged_log=True)
    # The cut records had been answered PUT_OK and sent: the slave holds them. Discarding
    # them takes a second, explicit choice.
    with pytest.raises(LostAcknowledgedError) as lost:
        async with running(again):
            pass
    assert f"the acknowledged bytes [{damaged.physical_offset}, {held_end})" in str(lost.value)
    again = attrs.evolve(again, ha_accept_lost_acknowledged=True)
    async with running(again) as master:
        assert master.store.commitlog.max_offset == damaged.physical_offset
        assert master.epoch_file is not None
        assert master.epoch_file.history == entries_of([(1, 0), (2, damaged.physical_offset)])
        await put_many(master, 200)  # new history past where the slave's log ends
        assert master.store.commitlog.max_offset > held_end
        async with running(slave_config(tmp_path / "s", address, **EPOCH)) as slave:
            await caught_up(master, slave)
            assert compare_logs(master, slave) is None
            assert slave.ha_client is not None
            assert slave.ha_client.truncations == [(held_end, damaged.physical_offset)]
    files_identical(tmp_path / "m", tmp_path / "s")


async def test_a_consistent_point_inside_a_record_stops_the_slave_for_a_reseed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A master whose epoch 2 begins inside one of the slave's records: the histories part
    where no cut at a boundary keeps only the master's bytes ("need manual fix"). The slave
    changes nothing and stops, sticky, instead of retrying the same cut forever."""
    async with running(master_config(tmp_path / "m", **EPOCH)) as master:
        async with running(slave_config(tmp_path / "s", master, **EPOCH)) as slave:
            await connected(master)
            await put_many(master, 50)
            await caught_up(master, slave)
        end = master.store.commitlog.max_offset
        inside = list(master.store.commitlog.iter_messages())[30].physical_offset + 7
    held = (tmp_path / "s" / "commitlog" / f"{0:020d}").read_bytes()
    handshake = encode_master_handshake(end + 500, entries_of([(1, 0), (2, inside)]))
    async with trio.open_nursery() as nursery:
        address = await nursery.start(serve_hostile_master, handshake)
        async with running(slave_config(tmp_path / "s", tuple(address), **EPOCH)) as slave:
            client = slave.ha_client
            assert client is not None
            with trio.fail_after(10):
                assert await client.wait_diverged()
            stats = slave.statistics().client
            assert stats is not None and stats.needs_reseed
            assert (stats.diverged_master_offset, stats.diverged_slave_offset) == (inside, end)
        nursery.cancel_scope.cancel()
    assert (tmp_path / "s" / "commitlog" / f"{0:020d}").read_bytes() == held
    assert (tmp_path / "s" / DIVERGED_FILE).exists()
    assert any(
        r.levelname == "ERROR" and f"consistent point {inside}" in r.getMessage()
        for r in caplog.records
    )
    # The operator's cut refuses too, naming the boundaries around it: re-seed this slave.
    with pytest.raises(NotAMessageBoundaryError):
        truncate_to_master(slave_config(tmp_path / "s", tuple(address), **EPOCH))
