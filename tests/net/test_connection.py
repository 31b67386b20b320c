"""One master-side connection (``HAConnection``) over memory streams: why it closed, in the
words the service logs and the kind it counts (``CloseKind``), and what a refused slave is told."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
import trio.testing

from trioha.net._connection import WRITE_BATCH, HAConnection
from trioha.proto import (
    EPOCH_TRANSFER_HEADER_SIZE,
    HEADER_SIZE,
    CloseKind,
    EpochTransferHeader,
    MasterOptions,
    SlaveHandshake,
    Timing,
    TransferHeader,
    encode_epoch_report,
    encode_master_handshake,
    encode_report,
)
from trioha.proto._epochs import entries_of
from trioha.store import EpochFile, MemoryCommitLog, NewMessage, SentOffsets

SEG = 4096


class _Acks:
    def __init__(self) -> None:
        self.acks: list[int] = []

    def on_ack(self, connection: HAConnection, offset: int) -> None:
        self.acks.append(offset)


def make_log(messages: int) -> MemoryCommitLog:
    log = MemoryCommitLog(segment_size=SEG)
    for i in range(messages):
        log.append(NewMessage(topic="FooBar", body=b"x" * 100, queue_id=i % 2))
    return log


def connection(
    stream: trio.abc.Stream,
    commitlog: MemoryCommitLog,
    timing: Timing | None = None,
    *,
    sent: SentOffsets | None = None,
    epoch_file: EpochFile | None = None,
) -> HAConnection:
    """The master's side of one slave connection; epoch mode when given an *epoch_file*."""
    return HAConnection(
        stream,
        commitlog=commitlog,
        listener=_Acks(),
        options=MasterOptions(epoch_mode=epoch_file is not None),
        timing=timing or Timing(),
        peer="fake-slave",
        sent=sent,
        epoch_file=epoch_file,
    )


def serving(
    messages: int = 3, pair: Callable[[], tuple[trio.abc.Stream, trio.abc.Stream]] | None = None
) -> tuple[MemoryCommitLog, HAConnection, trio.abc.Stream]:
    """A log of *messages*, a connection serving it and the slave's end of the stream."""
    commitlog = make_log(messages)
    master_end, slave_end = (pair or trio.testing.memory_stream_pair)()
    return commitlog, connection(master_end, commitlog), slave_end


def beyond_the_end(report: int, end: int) -> str:
    """The core's reason for refusing a first report beyond the master's end."""
    return (
        f"slave requests offset {report} but the master's log ends at {end}: the slave holds "
        f"data this master does not (diverged history or a wrong master). Cut the slave back "
        f"to {end} (a trioha slave: `trioha slave --truncate-to-master`; a Java slave, "
        f"stopped: `trioha slave --store-dir <its store> --truncate-to {end}`) or re-seed it"
    )


async def test_a_slave_hanging_up_is_named_as_routine(autojump_clock: trio.abc.Clock) -> None:
    master_end, slave_end = trio.testing.memory_stream_pair()
    conn = connection(master_end, make_log(1))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await slave_end.send_all(encode_report(0))
        await trio.testing.wait_all_tasks_blocked()
        await slave_end.aclose()
    assert conn.close_reason == "slave closed the connection"
    assert conn.close_kind is CloseKind.PEER_CLOSED


async def test_a_silent_slave_is_dropped_at_the_configured_interval_and_says_so(
    autojump_clock: trio.abc.Clock,
) -> None:
    master_end, _slave_end = trio.testing.memory_stream_pair()
    conn = connection(master_end, make_log(1), Timing(heartbeat=1.0, housekeeping=7.5))
    start = trio.current_time()
    await conn.run()
    assert trio.current_time() - start == pytest.approx(7.5)
    assert conn.close_reason == "nothing read from the slave for 7.5 s (housekeeping)"
    assert conn.close_kind is CloseKind.TIMEOUT
    assert conn.close_kind.level == logging.INFO


async def test_a_protocol_close_keeps_the_cores_reason_and_refuses_nobody(
    autojump_clock: trio.abc.Clock,
) -> None:
    commitlog, conn, slave_end = serving()
    end = commitlog.max_offset
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await slave_end.send_all(encode_report(end))
        await trio.testing.wait_all_tasks_blocked()
        await slave_end.send_all(encode_report(end + 1))
    assert conn.close_reason == (
        f"slave acks offset {end + 1}, beyond what was sent to it ({end}; master's log ends at "
        f"{end}); the ack is not trusted (RocketMQ #3015)"
    )
    assert not conn.refused  # an untrusted ack is not a diverged history
    assert conn.close_kind is CloseKind.PROTOCOL_ERROR
    await conn.stream.aclose()  # as HAService does once run() returns
    assert await slave_end.receive_some() == b""  # nothing was written before the close


async def test_a_refused_slave_is_told_where_the_master_ends_and_the_operator_why(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    commitlog, conn, slave_end = serving()
    end = commitlog.max_offset
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await slave_end.send_all(encode_report(end + 100))
    reason = beyond_the_end(end + 100, end)
    assert conn.refused and conn.close_reason == reason
    assert conn.close_kind is CloseKind.DIVERGED and conn.close_kind.level == logging.WARNING
    # The refusal: a heartbeat header at the master's end, which the slave's offset check
    # rejects (HAClient.dispatchReadRequest), and nothing more.
    data = await slave_end.receive_some()
    assert len(data) == HEADER_SIZE
    assert TransferHeader.from_bytes(data, max_body=1) == TransferHeader(end, 0)
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.getMessage() == (
        f"refusing slave fake-slave: {reason}. Its log and this master's are not one history; "
        "it gets no data until the operator cuts it back or re-seeds it"
    )


async def test_a_refusal_to_a_slave_that_already_hung_up_keeps_the_reason(
    autojump_clock: trio.abc.Clock,
) -> None:
    commitlog, conn, slave_end = serving()
    end = commitlog.max_offset
    await slave_end.send_all(encode_report(end + 100))
    await slave_end.aclose()  # the refusal's write then fails: it is not a broken link
    await conn.run()
    assert conn.refused and conn.close_reason == beyond_the_end(end + 100, end)


async def test_a_refusal_waits_at_most_a_second_for_a_slave_that_does_not_read(
    autojump_clock: trio.abc.Clock,
) -> None:
    commitlog, conn, slave_end = serving(pair=trio.testing.lockstep_stream_pair)
    end = commitlog.max_offset
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await slave_end.send_all(encode_report(end + 100))
        start = trio.current_time()
    assert trio.current_time() - start == pytest.approx(1.0)
    assert conn.refused and conn.close_reason == beyond_the_end(end + 100, end)


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (trio.BrokenResourceError("connection reset by peer"), "connection reset by peer"),
        (trio.BrokenResourceError(), "BrokenResourceError"),
    ],
)
async def test_a_broken_transport_is_named_and_counted_as_broken(
    autojump_clock: trio.abc.Clock, error: Exception, said: str
) -> None:
    async def fail() -> None:
        raise error

    stream = trio.StapledStream(
        trio.testing.MemorySendStream(), trio.testing.MemoryReceiveStream(fail)
    )
    conn = connection(stream, make_log(1))
    await conn.run()
    assert conn.close_reason == f"connection broken while reading: {said}"
    assert conn.close_kind is CloseKind.BROKEN


async def test_a_transport_broken_under_a_write_is_named(autojump_clock: trio.abc.Clock) -> None:
    async def fail() -> None:
        raise trio.BrokenResourceError

    receive = trio.testing.MemoryReceiveStream()
    receive.put_data(encode_report(0))
    stream = trio.StapledStream(trio.testing.MemorySendStream(fail), receive)
    conn = connection(stream, make_log(1))
    await conn.run()
    assert conn.close_reason == "connection broken while writing: BrokenResourceError"
    assert conn.close_kind is CloseKind.BROKEN


async def test_an_epoch_mode_close_found_by_the_writer_is_named_and_counts_the_handshake(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    commitlog = make_log(1)
    end = commitlog.max_offset
    # The master's only epoch begins beyond its end: the bytes it appends next belong to no
    # epoch, a local inconsistency that the writer must refuse to send.
    epochs = EpochFile(tmp_path / "epoch", entries_of([(3, end + 1000)]))
    master_end, slave_end = trio.testing.memory_stream_pair()
    conn = connection(master_end, commitlog, epoch_file=epochs)
    received = b""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await slave_end.send_all(SlaveHandshake().to_bytes() + encode_epoch_report(end))
        await trio.testing.wait_all_tasks_blocked()
        received += await slave_end.receive_some()
        commitlog.append(NewMessage(topic="FooBar", body=b"y" * 100, queue_id=0))
        conn.wakeup.notify()
    assert conn.close_reason == f"no epoch of the master holds offset {end}"
    assert conn.close_kind is CloseKind.PROTOCOL_ERROR  # decided by the writer's core call
    assert not conn.refused
    assert received[:20] == encode_master_handshake(end, epochs.history)[:20]
    assert conn.bytes_sent == len(received) == len(encode_master_handshake(end, epochs.history))


# --- the writer: batching, counting, and when write silence starts ------------------------------


def _reported_zero() -> tuple[
    trio.StapledStream[trio.testing.MemorySendStream, trio.testing.MemoryReceiveStream], list[int]
]:
    """A master-side stream whose slave has reported 0, and the sizes of its writes in order."""
    writes: list[int] = []
    send = trio.testing.MemorySendStream()

    async def record() -> None:
        writes.append(len(send.get_data_nowait()))

    send.send_all_hook = record
    receive = trio.testing.MemoryReceiveStream()
    receive.put_data(encode_report(0))
    return trio.StapledStream(send, receive), writes


async def test_a_long_catch_up_goes_out_in_writes_of_about_a_mebibyte_counted_exactly(
    autojump_clock: trio.abc.Clock,
) -> None:
    commitlog = MemoryCommitLog(segment_size=8 << 20)
    for i in range(300):
        commitlog.append(NewMessage(topic="FooBar", body=bytes([i % 251]) * 10_000, queue_id=0))
    end = commitlog.max_offset
    frame = HEADER_SIZE + 32 * 1024
    stream, writes = _reported_zero()
    conn = connection(stream, commitlog)
    await conn.run()  # served, then heartbeats, then closed by housekeeping after 20 s
    frames = -(-end // (32 * 1024))
    catch_up, heartbeats = writes[:-3], writes[-3:]
    assert sum(catch_up) == frames * HEADER_SIZE + end
    # Frames are gathered until a write holds at least WRITE_BATCH bytes, or the log's end.
    assert all(WRITE_BATCH <= n < WRITE_BATCH + frame for n in catch_up[:-1])
    assert len(catch_up) == -(-(frames * HEADER_SIZE + end) // (32 * frame))
    assert heartbeats == [HEADER_SIZE] * 3
    assert (conn.frames_sent, conn.heartbeats_sent) == (frames, 3)
    assert conn.bytes_sent == sum(writes)


async def test_write_silence_is_counted_from_the_end_of_a_slow_write(
    autojump_clock: trio.abc.Clock,
) -> None:
    # haSendHeartbeatInterval of silence after the last byte left, not after it was queued.
    commitlog = make_log(3)
    master_end, slave_end = trio.testing.lockstep_stream_pair()
    conn = connection(master_end, commitlog)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await slave_end.send_all(encode_report(0))
        await trio.sleep(3.0)  # the slave is slow to read the catch-up
        data = b""
        while len(data) < HEADER_SIZE + commitlog.max_offset:
            data += await slave_end.receive_some()
        written = trio.current_time()
        heartbeat = await slave_end.receive_some()
        assert TransferHeader.from_bytes(heartbeat, max_body=1) == TransferHeader(
            commitlog.max_offset, 0
        )
        assert trio.current_time() - written == pytest.approx(5.0)
        nursery.cancel_scope.cancel()


async def inline(fn: Callable[..., object], *args: object) -> object:
    """``trio.to_thread.run_sync`` without a thread: the mock clock must not jump meanwhile."""
    return fn(*args)


async def test_the_durable_sent_mark_covers_frames_and_never_moves_for_heartbeats(
    autojump_clock: trio.abc.Clock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trio.to_thread, "run_sync", inline)
    commitlog = make_log(3)
    end = commitlog.max_offset
    for report, sent_to in [(end, 0), (0, end)]:
        sent = SentOffsets(tmp_path / f"sent-{report}", step=1000)
        master_end, slave_end = trio.testing.memory_stream_pair()
        conn = connection(master_end, commitlog, sent=sent)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.run)
            await slave_end.send_all(encode_report(report))
            await trio.sleep(12.0)  # two heartbeats on an idle link
            nursery.cancel_scope.cancel()
        assert conn.heartbeats_sent == 2
        # Reserved before anything went out, and only when bytes did.
        assert sent.sent == sent_to
        assert sent.reserved == (sent_to + 1000 if sent_to else 0)


async def test_an_epoch_frame_confirms_everything_the_master_wrote(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    # With static roles every written byte is confirmed (getConfirmOffset, no SyncStateSet).
    commitlog = make_log(3)
    end = commitlog.max_offset
    epochs = EpochFile(tmp_path / "epoch", entries_of([(1, 0)]))
    master_end, slave_end = trio.testing.memory_stream_pair()
    conn = connection(master_end, commitlog, epoch_file=epochs)
    handshake = len(encode_master_handshake(end, epochs.history))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await slave_end.send_all(SlaveHandshake().to_bytes() + encode_epoch_report(0))
        data = b""
        while len(data) < handshake + EPOCH_TRANSFER_HEADER_SIZE:
            data += await slave_end.receive_some()
        nursery.cancel_scope.cancel()
    header = EpochTransferHeader.from_bytes(
        data[handshake : handshake + EPOCH_TRANSFER_HEADER_SIZE], max_body=1 << 20
    )
    assert header == EpochTransferHeader(0, end, epoch=1, epoch_start=0, confirm_offset=end)


async def test_a_repeated_handshake_is_answered_again_and_every_byte_counted(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    # AutoSwitchHAClient repeats its handshake when no answer came within 5 s.
    commitlog = make_log(1)
    epochs = EpochFile(tmp_path / "epoch", entries_of([(1, 0)]))
    master_end, slave_end = trio.testing.memory_stream_pair()
    conn = connection(master_end, commitlog, epoch_file=epochs)
    answer = encode_master_handshake(commitlog.max_offset, epochs.history)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        received = b""
        for answers in (1, 2):
            await slave_end.send_all(SlaveHandshake().to_bytes())
            while len(received) < answers * len(answer):
                received += await slave_end.receive_some()
            await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert received == answer * 2
    assert conn.bytes_sent == 2 * len(answer)


async def test_a_write_that_reaches_the_batch_size_exactly_goes_out_alone(
    autojump_clock: trio.abc.Clock,
) -> None:
    commitlog = MemoryCommitLog(segment_size=8 << 20)
    while commitlog.max_offset < 2 * WRITE_BATCH + 1000:
        commitlog.append(NewMessage(topic="FooBar", body=b"z" * 50_000, queue_id=0))
    stream, writes = _reported_zero()
    conn = HAConnection(
        stream,
        commitlog=commitlog,
        listener=_Acks(),
        options=MasterOptions(batch_size=WRITE_BATCH - HEADER_SIZE),  # one frame: one batch
        timing=Timing(housekeeping=1.0),
        peer="fake-slave",
    )
    await conn.run()
    assert writes[:2] == [WRITE_BATCH, WRITE_BATCH]
