"""The master's durable marks as the HA writers and the put path use them (``MarkKeeper``).

A sent mark that cannot be written is a state, not a traceback: sending past it pauses with
one ERROR, the connection stays up (heartbeats and acks go on), the write is tried again
every retry interval, and sending resumes by itself. The marks settle to the exact figures
once quiet, so that a crash then finds nothing it could have lost.
"""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest
import trio
import trio.testing

from tests.net.test_connection import inline
from tests.net.test_service import FakeSlave, config
from trioha._errors import StorageError
from trioha.net import HAService, MarkKeeper
from trioha.store import SENT_MARK, DiskGuard, MemoryCommitLog, NewMessage, SentOffsets

SEG = 4096


class FlakyMarks(SentOffsets):
    """A mark file on a disk that refuses writes while ``broken`` is set (ENOSPC)."""

    def __init__(self, path: Path, *, step: int) -> None:
        super().__init__(path, step=step)
        self.broken = False
        self.attempts = 0

    def _write(self, reserved: int | None = None, *, acked: int | None = None) -> None:
        self.attempts += 1
        if self.broken:
            raise StorageError(f"cannot write {self.path}: no space") from OSError(
                errno.ENOSPC, "No space left on device"
            )
        super()._write(reserved, acked=acked)


def make_log(messages: int) -> MemoryCommitLog:
    log = MemoryCommitLog(segment_size=SEG)
    for i in range(messages):
        log.append(NewMessage(topic="T", body=b"m%03d" % i))
    return log


async def test_a_sent_mark_that_cannot_be_written_pauses_sending_keeps_the_slave_and_resumes(
    autojump_clock: trio.abc.Clock,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(trio.to_thread, "run_sync", inline)
    commitlog = make_log(10)
    end = commitlog.max_offset
    marks = FlakyMarks(tmp_path / "haSentOffset", step=100)
    marks.broken = True
    disk = DiskGuard({})
    keeper = MarkKeeper(marks, disk=disk, retry_interval=10.0)
    service = HAService(config(), commitlog, marks=keeper)
    assert service.sent is marks
    with caplog.at_level(logging.INFO, logger="trioha"):
        async with trio.open_nursery() as nursery:
            master_end, slave_end = trio.testing.memory_stream_pair()
            nursery.start_soon(service.handle_stream, master_end, "10.0.0.7:4711")
            slave = FakeSlave(slave_end)
            await slave.report(0)
            # Nothing past the durable mark (0): heartbeats only, every 5 s, for 30 s.
            start = trio.current_time()
            heartbeat, body = await slave.frame()
            assert (heartbeat.offset, heartbeat.size, body) == (0, 0, b"")
            assert trio.current_time() - start == pytest.approx(5.0)
            with trio.move_on_after(20.0):
                while True:
                    header, _ = await slave.frame()
                    assert header.size == 0, "a frame went out past the durable mark"
                    await slave.report(0)  # acks keep the master's read side alive
            assert disk.failing(SENT_MARK)
            attempts = marks.attempts
            assert attempts == 3  # at 0, 10 and 20 s: one try per retry interval
            assert len(service.connections) == 1  # the slave stays connected
            # The disk is back: the next try works and sending resumes by itself.
            marks.broken = False
            received = b""
            while len(received) < end:
                header, body = await slave.frame()
                assert header.offset == len(received)
                received += body
            assert received == bytes(commitlog.read(0, end))
            assert not disk.failing(SENT_MARK)
            assert marks.reserved == end + 100 and marks.sent == end
            assert SentOffsets.open(tmp_path).reserved == end + 100  # durable first
            nursery.cancel_scope.cancel()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == [
        f"HA sent mark cannot be written: cannot write {tmp_path / 'haSentOffset'}: no space "
        "(No space left on device); replication to slaves is paused at offset 0 (the slaves "
        "stay connected); retrying every check until it works"
    ]
    assert any(
        r.levelno == logging.WARNING
        and r.getMessage() == "HA sent mark written again; replication to slaves resumes"
        for r in caplog.records
    )
    assert service.statistics().closed_by_reason == {"shutdown": 1}


async def test_every_writer_waits_for_the_one_retry_of_a_failing_mark(
    autojump_clock: trio.abc.Clock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trio.to_thread, "run_sync", inline)
    commitlog = make_log(10)
    marks = FlakyMarks(tmp_path / "haSentOffset", step=100)
    marks.broken = True
    keeper = MarkKeeper(marks, retry_interval=10.0)
    # Silent slaves: housekeeping must not close them within the 25 s watched.
    service = HAService(config(ha_housekeeping_interval=60_000), commitlog, marks=keeper)
    async with trio.open_nursery() as nursery:
        slaves = []
        for n in range(3):
            master_end, slave_end = trio.testing.memory_stream_pair()
            nursery.start_soon(service.handle_stream, master_end, f"10.0.0.{n}:1")
            slaves.append(FakeSlave(slave_end))
            await slaves[-1].report(0)
        await trio.sleep(25.0)
        assert marks.attempts == 3  # at 0, 10 and 20 s, whichever writer came first
        nursery.cancel_scope.cancel()


async def test_the_marks_settle_to_the_exact_figures_once_quiet_and_name_each_slave(
    autojump_clock: trio.abc.Clock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trio.to_thread, "run_sync", inline)
    commitlog = make_log(10)
    end = commitlog.max_offset
    marks = SentOffsets.open(tmp_path, step=1000)
    keeper = MarkKeeper(marks)
    service = HAService(config(), commitlog, marks=keeper)
    async with trio.open_nursery() as nursery:
        await nursery.start(keeper.run)
        master_end, slave_end = trio.testing.memory_stream_pair()
        nursery.start_soon(service.handle_stream, master_end, "10.0.0.7:4711")
        slave = FakeSlave(slave_end)
        await slave.report(0)
        received = 0
        while received < end:
            _, body = await slave.frame()
            received += len(body)
        await slave.report(end)
        assert await keeper.cover_acked(end - 10)
        assert SentOffsets.open(tmp_path).reserved == end + 1000  # reserved ahead while busy
        await trio.sleep(1.0)  # quiet: written down to what went out and was answered
        nursery.cancel_scope.cancel()
    again = SentOffsets.open(tmp_path)
    assert (again.reserved, again.acked_reserved) == (end, end - 10)
    assert again.slaves == {"10.0.0.7": end}


async def test_a_put_is_covered_by_the_acknowledged_mark_before_it_is_answered(
    autojump_clock: trio.abc.Clock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trio.to_thread, "run_sync", inline)
    marks = FlakyMarks(tmp_path / "haSentOffset", step=100)
    disk = DiskGuard({})
    keeper = MarkKeeper(marks, disk=disk, retry_interval=10.0)
    assert not keeper.covers_acked(50)  # a reservation first
    assert await keeper.cover_acked(50)
    assert SentOffsets.open(tmp_path).acked_reserved == 150
    assert keeper.covers_acked(150) and marks.acked == 150  # within the step: no write
    writes = marks.attempts
    marks.broken = True
    assert not await keeper.cover_acked(151)  # cannot be promised: not PUT_OK
    assert not disk.statistics().writable  # puts are refused until a retry works
    assert not await keeper.cover_acked(152)  # no new try before the retry interval
    assert marks.attempts == writes + 1
    marks.broken = False
    await trio.sleep(10.0)
    assert await keeper.cover_acked(152)
    assert disk.statistics().writable and marks.acked == 152


async def test_the_next_step_is_reserved_ahead_before_a_put_or_a_frame_has_to_wait(
    autojump_clock: trio.abc.Clock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trio.to_thread, "run_sync", inline)
    marks = FlakyMarks(tmp_path / "haSentOffset", step=100)
    keeper = MarkKeeper(marks)
    async with trio.open_nursery() as nursery:
        await nursery.start(keeper.run)
        assert await keeper.cover_acked(10)  # the first answer waits: to 110
        assert keeper.covers_acked(40)  # within the first half: nothing more
        await trio.testing.wait_all_tasks_blocked()
        assert marks.acked_reserved == 110
        assert keeper.covers_acked(70)  # past half: the next step, in the background
        await trio.testing.wait_all_tasks_blocked()
        assert marks.acked_reserved == 170
        assert SentOffsets.open(tmp_path).acked_reserved == 170
        writes = marks.attempts
        assert keeper.covers_acked(160)  # never waited; and it asks again, both at once
        assert not keeper.covers_sent(300)
        assert await keeper.reserve_sent(300) == 400
        assert keeper.covers_sent(360)
        await trio.testing.wait_all_tasks_blocked()
        assert (marks.acked_reserved, marks.reserved) == (260, 460)
        assert marks.attempts == writes + 2  # the sent reservation, then one write for both
        nursery.cancel_scope.cancel()


async def test_a_mark_nobody_uses_is_never_reserved_ahead(
    autojump_clock: trio.abc.Clock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under SYNC_FLUSH nothing keeps the acknowledged mark: frames sent must not make it
    grow, or the next start would take it for messages answered and lost."""
    monkeypatch.setattr(trio.to_thread, "run_sync", inline)
    marks = SentOffsets.open(tmp_path, step=100)
    keeper = MarkKeeper(marks)
    async with trio.open_nursery() as nursery:
        await nursery.start(keeper.run)
        assert await keeper.reserve_sent(10) == 110
        assert keeper.covers_sent(90)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert (marks.reserved, marks.acked_reserved) == (190, 0)
    assert SentOffsets.open(tmp_path).acked_reserved == 0


async def test_marks_in_use_are_never_lowered_and_a_new_slave_is_written_once(
    autojump_clock: trio.abc.Clock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slave's acks change all the time: that alone must not write the file, and settling
    must wait for quiet (lowering a mark in use makes the next put wait for a write)."""
    monkeypatch.setattr(trio.to_thread, "run_sync", inline)
    marks = FlakyMarks(tmp_path / "haSentOffset", step=10_000)
    keeper = MarkKeeper(marks)
    async with trio.open_nursery() as nursery:
        await nursery.start(keeper.run)
        assert await keeper.cover_acked(1)
        writes = marks.attempts
        for end in range(2, 202):  # two seconds of puts and acks
            assert keeper.covers_acked(end)
            keeper.note_slave("10.0.0.7", end)
            await trio.sleep(0.01)
        assert marks.attempts == writes + 1  # the new host, once
        assert marks.acked_reserved == 10_001  # never lowered while in use
        await trio.sleep(1.0)  # quiet: now written down
        assert marks.acked_reserved == 201
        nursery.cancel_scope.cancel()
    assert SentOffsets.open(tmp_path).slaves == {"10.0.0.7": 201}
