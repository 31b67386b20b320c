"""The slave's HA client: its sticky divergence record and the settings it refuses."""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path

import pytest
import trio
import trio.testing

from tests.net.test_client import connector
from trioha import BrokerConfig, ConfigError, StorageError, StoreLayoutError
from trioha.net import HAClient, HAService, Wakeup
from trioha.net._client import Divergence
from trioha.store import EpochFile, MemoryCommitLog, NewMessage
from trioha.testing import Breakage, FaultyLink, faulty_stream_pair

SEG = 4096
RECORD = Divergence(4096, 8192, "10.0.0.1:10912", "the master's log ends at 4096\nfor good")


def test_a_divergence_round_trips_through_its_file(tmp_path: Path) -> None:
    path = tmp_path / "diverged"
    assert Divergence.read(path) is None
    RECORD.write(path)
    reason = "the master's log ends at 4096 for good"  # one line in the file
    assert Divergence.read(path) == Divergence(4096, 8192, "10.0.0.1:10912", reason)
    assert not path.with_name("diverged.tmp").exists()


@pytest.mark.parametrize(
    "text",
    ["", "master_offset 10\n", "master_offset ten\nslave_offset 3\n", "garbage"],
)
def test_a_divergence_file_not_written_by_trioha_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "diverged"
    path.write_text(text)
    with pytest.raises(StoreLayoutError, match="does not record a divergence as trioha writes it"):
        Divergence.read(path)


def test_an_unreadable_divergence_file_is_a_named_error(tmp_path: Path) -> None:
    path = tmp_path / "diverged"
    path.mkdir()
    with pytest.raises(StoreLayoutError, match=r"cannot read .*diverged"):
        Divergence.read(path)
    path.rmdir()
    path.write_bytes(b"master_offset \xff\n")
    with pytest.raises(StoreLayoutError, match=r"cannot read .*utf-8"):
        Divergence.read(path)


def test_a_divergence_that_cannot_be_recorded_is_logged_and_kept_in_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "missing-dir" / "diverged"
    with caplog.at_level(logging.ERROR):
        RECORD.write(path)
    assert [r.getMessage() for r in caplog.records] == [
        f"cannot record the divergence in {path}: [Errno 2] No such file or directory: "
        f"'{path.with_name('diverged.tmp')}'"
    ]
    assert not path.exists()


def test_a_slave_without_a_master_address_is_refused() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^a slave needs ha_master_address \(HOST:PORT of the master's HA port\)$",
    ):
        HAClient(BrokerConfig(), MemoryCommitLog())


def test_an_epoch_mode_slave_without_an_epoch_file_is_refused() -> None:
    config = BrokerConfig(ha_master_address="127.0.0.1:10912", enable_controller_mode=True)
    with pytest.raises(
        ConfigError, match=r"^epoch mode \(enable_controller_mode\) needs the store's epoch file$"
    ):
        HAClient(config, MemoryCommitLog())


def _master(**changes: object) -> tuple[MemoryCommitLog, BrokerConfig, HAService]:
    """A master log of 20 messages, its service, and the config a slave of it uses."""
    master_log = MemoryCommitLog(segment_size=SEG)
    for i in range(20):
        master_log.append(NewMessage(topic="T", body=b"%d" % i))
    cfg = BrokerConfig(
        ha_listen_port=0,
        mapped_file_size_commit_log=SEG,
        ha_master_address="127.0.0.1:1",
        ha_sync_from_oldest=True,
        clean_resource_interval=2000,
    ).evolve(**changes)
    return master_log, cfg, HAService(cfg, master_log)


class _FullDisk(MemoryCommitLog):
    """A slave log whose first appends fail as on a full disk."""

    def __init__(self, failures: int) -> None:
        super().__init__(segment_size=SEG)
        self.failures = failures

    def append_raw(self, offset: int, data: bytes | bytearray | memoryview) -> int:
        if self.failures:
            self.failures -= 1
            raise StorageError(f"write at {offset} failed") from OSError(28, "No space left")
        return super().append_raw(offset, data)


async def test_a_full_disk_pauses_replication_and_it_resumes_with_one_log_line_each_way(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    master_log, cfg, service = _master()
    slave_log = _FullDisk(failures=3)
    async with trio.open_nursery() as nursery:
        appended = Wakeup()
        connect = connector(nursery, service)
        client = HAClient(cfg, slave_log, connect=connect, on_appended=appended.notify)
        started = trio.current_time()
        await nursery.start(client.run)
        with trio.fail_after(60):
            while client.statistics().append_error is None:  # noqa: ASYNC110
                await trio.sleep(0.01)
        stats = client.statistics()
        assert (stats.state, stats.append_error) == ("disk_full", "write at 0 failed")
        assert (stats.connected, stats.closed_by_reason) == (False, {"disk": 1})
        assert stats.last_close_reason == (
            f"cannot append {master_log.max_offset} bytes at 0: write at 0 failed"
        )
        with trio.fail_after(60):
            while slave_log.max_offset < master_log.max_offset:
                await appended.wait()
        # Three failed sessions, each followed by the disk retry interval, not the backoff.
        assert trio.current_time() - started >= 3 * 2.0
        assert client.append_error is None
        nursery.cancel_scope.cancel()
    assert bytes(slave_log.read(0, SEG)) == bytes(master_log.read(0, SEG))
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "slave cannot append replicated data: write at 0 failed" in errors[0]
    assert "retrying every 2 s until there is space" in errors[0]
    assert any("slave appends replicated data again" in r.getMessage() for r in caplog.records)


class _FlushFails(MemoryCommitLog):
    """A slave log whose first two flushes after its first append fail as on a broken disk."""

    def __init__(self) -> None:
        super().__init__(segment_size=SEG)
        self.to_fail = 0
        self.flushes = 0

    def append_raw(self, offset: int, data: bytes | bytearray | memoryview) -> int:
        if not self.max_offset:
            self.to_fail = 2
        return super().append_raw(offset, data)

    def flush(self) -> int:
        self.flushes += 1
        if self.to_fail:
            self.to_fail -= 1
            raise StorageError(f"fsync {self.flushes} failed") from OSError(5, "I/O error")
        return super().flush()


async def test_a_slave_that_must_ack_flushed_bytes_stops_acking_while_fsync_fails(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    master_log, cfg, service = _master(ha_slave_ack_flushed=True)
    # The ack after the first append cannot flush: that session ends; the next session's
    # flush at its start fails too; then the disk works again.
    slave_log = _FlushFails()
    async with trio.open_nursery() as nursery:
        client = HAClient(cfg, slave_log, connect=connector(nursery, service))
        await nursery.start(client.run)
        with trio.fail_after(60):
            while client.statistics().append_error is None:  # noqa: ASYNC110
                await trio.sleep(0.01)
        # The session start's flush worked; the ack's, the second, did not.
        assert client.last_close_reason == "cannot flush what was appended: fsync 2 failed"
        for more in (0, 5):
            for i in range(more):
                master_log.append(NewMessage(topic="T", body=b"later %d" % i))
            service.notify_log_grew()
            with trio.fail_after(600):
                while service.replicated_offset() < master_log.max_offset:  # noqa: ASYNC110
                    await trio.sleep(0.5)  # the master's acks have no event to wait on
            # The flush that lets the slave ack again ends the spell, caught up or not.
            assert client.append_error is None
        nursery.cancel_scope.cancel()
    # The ack's flush and the next session's first flush failed: one ERROR for the whole
    # spell, one WARNING at the first flush that worked after it.
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert re.search(r"slave cannot append replicated data: fsync \d+ failed", errors[0])
    assert "retrying every 2 s" in errors[0]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("slave flushes its commit log again (after: fsync" in m for m in warnings) == 1
    assert not any("appends replicated data again" in m for m in warnings)


class _RefusingEpochFile(EpochFile):
    """An epoch file that cannot be written (a full or read-only disk)."""

    def append(self, epoch: int, start_offset: int) -> None:
        raise StorageError(f"cannot write epoch file {self.path}: [Errno 28] No space left")


async def test_an_epoch_the_slave_cannot_record_ends_the_session_before_any_byte(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The real clock: the epoch file is read in a worker thread, and a jumping clock would
    # reach the master's housekeeping timeout while that thread runs.
    master_log, classic, _ = _master()
    cfg = classic.evolve(enable_controller_mode=True)
    master_epochs = EpochFile.open(tmp_path / "master-epochs")
    master_epochs.begin_epoch(master_log.max_offset, master_log.min_offset)  # as a broker does
    service = HAService(cfg, master_log, epoch_file=master_epochs)
    slave_log = MemoryCommitLog(segment_size=SEG)
    epochs = _RefusingEpochFile.open(tmp_path / "slave-epochs")
    client = HAClient(cfg, slave_log, epoch_file=epochs)
    async with trio.open_nursery() as nursery:
        master_end, slave_end = trio.testing.memory_stream_pair()
        nursery.start_soon(service.handle_stream, master_end, "slave")
        with trio.fail_after(10):
            assert await client.session(slave_end) is False
        nursery.cancel_scope.cancel()
    reason = client.last_close_reason or ""
    assert reason.startswith("cannot record epoch 1 from 0: cannot write epoch file")
    assert slave_log.max_offset == 0 and not epochs.history  # no byte without its epoch
    assert "cannot record epoch 1 from 0 (master 127.0.0.1:1)" in caplog.text


def test_a_divergence_file_without_master_or_reason_reads_with_placeholders(
    tmp_path: Path,
) -> None:
    path = tmp_path / "diverged"
    path.write_text("master_offset 4096\nslave_offset 8192\n")
    found = Divergence.read(path)
    assert found == Divergence(4096, 8192, "?", "")
    assert found.describe() == (
        "diverged from master ?: the master's history ends at 4096 where this slave's "
        "differs, and this slave holds up to 8192 (). Replication is stopped: cut this slave "
        "back to 4096 with `trioha slave --truncate-to-master` (the cut bytes are kept in "
        "lost+found) or re-seed it"
    )


def test_a_divergence_file_not_understood_is_quoted_up_to_80_characters(tmp_path: Path) -> None:
    path = tmp_path / "diverged"
    text = "master_offset 1\nslave_offset x" + "y" * 100
    path.write_text(text)
    with pytest.raises(StoreLayoutError) as raised:
        Divergence.read(path)
    assert str(raised.value) == (
        f"{path} does not record a divergence as trioha writes it ({text[:80]!r}); check it "
        "and remove it by hand if the slave was re-seeded"
    )


def test_a_temporary_file_left_by_an_interrupted_record_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "haDiverged"
    (tmp_path / "haDiverged.tmp").write_text("master_offset 1\n")  # a crash before the rename
    RECORD.write(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["haDiverged"]
    assert Divergence.read(path) == Divergence(
        4096, 8192, "10.0.0.1:10912", "the master's log ends at 4096 for good"
    )


def test_a_divergence_is_recorded_in_utf_8_whatever_the_locale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reason may carry any text (a path, a peer's message): on a machine whose locale
    encoding is ASCII the record must neither fail nor be read back differently."""
    path = tmp_path / "haDiverged"
    record = Divergence(1, 2, "m\u00e4ster:10912", "caf\u00e9 \u2192 bad")
    # Where Python turns "no encoding given" into the locale's (pathlib asks io for it).
    monkeypatch.setattr(io, "text_encoding", lambda encoding, stacklevel=2: encoding or "ascii")
    record.write(path)
    assert (
        path.read_bytes()
        == (
            "master_offset 1\nslave_offset 2\n"
            "master m\u00e4ster:10912\nreason caf\u00e9 \u2192 bad\n"
        ).encode()
    )
    assert Divergence.read(path) == record


def _longer_slave(master_log: MemoryCommitLog) -> MemoryCommitLog:
    """A slave holding the master's log and two messages more (a history it never had)."""
    slave_log = MemoryCommitLog(segment_size=SEG)
    slave_log.append_raw(0, master_log.read(0, master_log.max_offset))
    slave_log.append(NewMessage(topic="T", body=b"not the master's"))
    slave_log.append(NewMessage(topic="T", body=b"nor this"))
    return slave_log


async def test_a_diverged_slave_stops_says_so_every_minute_and_resumes_when_cleared(
    autojump_clock: trio.abc.Clock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    master_log, cfg, service = _master()
    slave_log = _longer_slave(master_log)
    slave_end = slave_log.max_offset
    record = tmp_path / "haDiverged"
    async with trio.open_nursery() as nursery:
        client = HAClient(cfg, slave_log, connect=connector(nursery, service), diverged_file=record)
        assert not await client.wait_diverged(trio.current_time() + 1)  # not before it runs
        with caplog.at_level(logging.ERROR, logger="trioha.ha"):
            await nursery.start(client.run)
            start = trio.current_time()
            assert await client.wait_diverged(start + 10)
            expected = Divergence(
                master_log.max_offset,
                slave_end,
                "127.0.0.1:1",
                f"master pushed offset {master_log.max_offset} but the slave's log ends at "
                f"{slave_end}; nothing appended",
            )
            assert client.divergence == expected
            assert Divergence.read(record) == expected
            stats = client.statistics()
            assert (stats.state, stats.needs_reseed, stats.connects) == ("diverged", True, 1)
            assert (stats.diverged_master_offset, stats.diverged_slave_offset) == (
                master_log.max_offset,
                slave_end,
            )
            said = expected.describe()

            def repeats() -> int:
                return sum(
                    r.getMessage() == said and r.levelno == logging.ERROR for r in caplog.records
                )

            await trio.sleep(59)  # when it diverged, and when it settled into the stop
            assert repeats() == 2
            await trio.sleep(2)
            assert repeats() == 3  # a minute later, again
            await trio.sleep(120)
            assert repeats() == 5
            assert client.connects == 1  # and never tried the master again
        # The operator cuts the slave back (and may have removed the record already).
        slave_log.truncate(master_log.max_offset)
        record.unlink()
        client.clear_divergence()
        assert not client.statistics().needs_reseed
        assert await client.wait_connected(trio.current_time() + 10, connects=2)
        assert client.statistics().state == "connected"
        nursery.cancel_scope.cancel()
    assert not record.exists()


async def test_a_recorded_divergence_keeps_a_restarted_slave_from_its_master(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    _, cfg, service = _master()
    record = tmp_path / "haDiverged"
    RECORD.write(record)
    async with trio.open_nursery() as nursery:
        client = HAClient(
            cfg,
            MemoryCommitLog(segment_size=SEG),
            connect=connector(nursery, service),
            diverged_file=record,
        )
        await nursery.start(client.run)
        assert await client.wait_diverged(trio.current_time())  # at once: it was recorded
        await trio.sleep(300)
        assert (client.connects, client.statistics().state) == (0, "diverged")
        client.clear_divergence()  # the record goes with it
        assert not record.exists()
        assert await client.wait_connected(trio.current_time() + 10)
        nursery.cancel_scope.cancel()


class _SecondAppendFails(MemoryCommitLog):
    """A slave log whose second append fails as on a full disk."""

    def __init__(self) -> None:
        super().__init__(segment_size=SEG)
        self.appends = 0

    def append_raw(self, offset: int, data: bytes | bytearray | memoryview) -> int:
        self.appends += 1
        if self.appends == 2:
            raise StorageError(f"write at {offset} failed") from OSError(28, "No space left")
        return super().append_raw(offset, data)


async def test_bytes_appended_before_the_disk_filled_in_the_same_read_are_announced(
    autojump_clock: trio.abc.Clock,
) -> None:
    _, cfg, service = _master(ha_transfer_batch_size=200)
    slave_log = _SecondAppendFails()
    grew: list[int] = []
    client = HAClient(cfg, slave_log, on_appended=lambda: grew.append(slave_log.max_offset))
    async with trio.open_nursery() as nursery:
        master_end, slave_end = trio.testing.memory_stream_pair()
        nursery.start_soon(service.handle_stream, master_end, "slave")
        assert await client.session(slave_end) is True
        nursery.cancel_scope.cancel()
    assert slave_log.appends == 2  # both frames came in one read
    assert grew == [slave_log.max_offset] and 0 < slave_log.max_offset <= 200
    assert client.append_error is not None


def test_a_classic_slave_ignores_an_epoch_file_it_is_handed(tmp_path: Path) -> None:
    epochs = EpochFile.open(tmp_path / "epochs")
    epochs.append(3, 0)
    config = BrokerConfig(ha_master_address="127.0.0.1:10912")
    client = HAClient(config, MemoryCommitLog(), epoch_file=epochs)
    assert client.epoch_file is None
    assert client.statistics().last_epoch == -1  # classic mode, not epoch 3


async def test_an_immediate_close_after_a_real_master_served_data_is_no_wrong_port(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """Once the peer has answered as an HA master, a close at once without a byte is a
    restart, a cut connection or a refusal (the master's log says which): not a wrong port."""
    master_log, cfg, service = _master()
    slave_log = MemoryCommitLog(segment_size=SEG)
    links: list[FaultyLink] = []
    async with trio.open_nursery() as nursery:
        attempts = 0

        async def alternate(host: str, port: int) -> trio.abc.Stream:
            nonlocal attempts
            attempts += 1
            if attempts == 2:  # the real master, once
                link = FaultyLink()
                links.append(link)
                master_end, slave_end = faulty_stream_pair(link=link)
                nursery.start_soon(service.handle_stream, master_end, "slave")
                return slave_end
            refusing, slave_side = trio.testing.memory_stream_pair()

            async def hang_up() -> None:  # a port that hangs up on the slave's first report
                await refusing.receive_some()
                await refusing.aclose()

            nursery.start_soon(hang_up)
            return slave_side

        appended = Wakeup()
        client = HAClient(cfg, slave_log, connect=alternate, on_appended=appended.notify)
        with caplog.at_level(logging.WARNING, logger="trioha.ha"):
            await nursery.start(client.run)
            with trio.fail_after(60):
                while slave_log.max_offset < master_log.max_offset:
                    await appended.wait()
            links[0].break_(Breakage.RESET)
            with trio.fail_after(60):
                while attempts < 3:  # noqa: ASYNC110
                    await trio.sleep(0.05)
            await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    levels = [r.levelno for r in caplog.records if "does not speak RocketMQ HA" in r.getMessage()]
    assert levels == [logging.WARNING]  # only before the master had spoken


class _FirstFlushFails(MemoryCommitLog):
    """A slave log whose first flush fails as on a broken disk, then works."""

    def __init__(self) -> None:
        super().__init__(segment_size=SEG)
        self.flushes = 0

    def flush(self) -> int:
        self.flushes += 1
        if self.flushes == 1:
            raise StorageError("fsync 1 failed") from OSError(5, "I/O error")
        return super().flush()


async def test_a_slave_that_cannot_flush_at_the_start_of_a_session_asks_for_nothing(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """With flushed acks a session starts with a flush: if it fails the slave does not even
    report (it could not ack what it holds), says so once, and retries after the disk wait."""
    master_log, cfg, service = _master(ha_slave_ack_flushed=True)
    slave_log = _FirstFlushFails()
    client = HAClient(cfg, slave_log)
    with caplog.at_level(logging.WARNING, logger="trioha.ha"):
        async with trio.open_nursery() as nursery:
            master_end, slave_end = trio.testing.memory_stream_pair()
            nursery.start_soon(service.handle_stream, master_end, "slave")
            assert await client.session(slave_end) is False
            assert client.append_error == "fsync 1 failed"
            assert client.statistics().state == "disk_full"
            master_end, slave_end = trio.testing.memory_stream_pair()
            nursery.start_soon(service.handle_stream, master_end, "slave")
            nursery.start_soon(client.session, slave_end)
            with trio.fail_after(30):
                while slave_log.max_offset < master_log.max_offset:  # noqa: ASYNC110
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    assert client.connects == 1  # the first session never got as far as connecting
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.module == "_client"]
    assert lines[:2] == [
        (logging.ERROR, "slave cannot flush its commit log: fsync 1 failed; retrying every 2 s"),
        (logging.WARNING, "slave flushes its commit log again (after: fsync 1 failed)"),
    ]


async def test_a_slave_whose_next_bytes_were_deleted_says_so_once_and_stops(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """RocketMQ #3388, answered: the master pushes its oldest offset as a heartbeat past the
    slave's end; the slave logs one ERROR naming both offsets and re-seeding, and does not
    reconnect (Java's master would heartbeat such a slave forever)."""
    master_log, cfg, service = _master()
    while master_log.max_offset < 3 * SEG:
        master_log.append(NewMessage(topic="T", body=b"x" * 500))
    slave_log = MemoryCommitLog(segment_size=SEG)
    slave_log.append_raw(0, bytes(master_log.read(0, 100)))  # what it copied long ago
    assert master_log.delete_segments_before(2 * SEG) == 2
    async with trio.open_nursery() as nursery:
        client = HAClient(cfg, slave_log, connect=connector(nursery, service))
        with caplog.at_level(logging.ERROR, logger="trioha.ha"):
            await nursery.start(client.run)
            assert await client.wait_fell_behind(trio.current_time() + 60)
            await trio.sleep(120)  # no reconnect loop, no repeated line
        stats = client.statistics()
        assert (stats.state, stats.connects, stats.needs_reseed) == ("fell_behind", 1, True)
        assert stats.fell_behind_master_offset == 2 * SEG
        assert stats.closed_by_reason == {"deleted": 1}
        assert slave_log.max_offset == 100  # nothing appended
        nursery.cancel_scope.cancel()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert errors[0].startswith(
        f"fell behind master 127.0.0.1:1: this slave's log ends at 100, but the master's now "
        f"begins at {2 * SEG}; the master deleted [100, {2 * SEG})"
    )
    assert "re-seed this slave" in errors[0]
