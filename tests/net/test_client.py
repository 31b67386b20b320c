"""The slave's client against the real master service: whole catch-ups, drops, order, timings.

Each test pins one behaviour that a one-line mistake in ``trioha/net`` would break without any
other test noticing: a frame handed out by the core but never written (the slave's offset check
closes the link, it reconnects, and the data still arrives, over several connections), a
reconnect that asks for the last *reported* offset instead of the log's end, a report sent
before its append (or flush), and configured timings ignored in favour of the defaults.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from tests.net._streams import DelegatingStream
from trioha import BrokerConfig, NotAMessageBoundaryError, StorageError
from trioha._status import PutStatus
from trioha.net import HAClient, HAService, Wakeup
from trioha.net._client import HAClientStatistics
from trioha.proto import (
    HEADER_SIZE,
    REPORT_SIZE,
    Report,
    SlaveHandshake,
    TransferHeader,
    encode_header,
    encode_report,
)
from trioha.store import EpochFile, MemoryCommitLog, NewMessage
from trioha.testing import Breakage, FaultyLink, faulty_stream_pair

MIB = 1 << 20


def backlog(total: int, segment: int, body: int = 1000) -> MemoryCommitLog:
    """A master log of about *total* bytes of messages over segments of *segment* bytes."""
    log = MemoryCommitLog(segment_size=segment)
    i = 0
    while log.max_offset < total:
        log.append(NewMessage(topic="CatchUp", body=bytes([i % 251]) * body, queue_id=i % 4))
        i += 1
    return log


def same_bytes(master: MemoryCommitLog, slave: MemoryCommitLog) -> bool:
    if (slave.min_offset, slave.max_offset) != (master.min_offset, master.max_offset):
        return False
    offset = master.min_offset
    while offset < master.max_offset:
        chunk = bytes(master.read(offset, MIB))
        if bytes(slave.read(offset, len(chunk))) != chunk:
            return False
        offset += len(chunk)
    return True


class Wire:
    """Connects a client to a service through fresh stream pairs, one per connection."""

    def __init__(self, service: HAService, nursery: trio.Nursery) -> None:
        self.service = service
        self.nursery = nursery
        self.links: list[FaultyLink] = []
        self.connected_at: list[float] = []
        #: The first report of each connection (the slave's request offset), as sent.
        self.requests: list[int] = []
        #: (report, what the slave's log held then) for every report the slave wrote.
        self.reports: list[tuple[int, int, int]] = []
        self.slave_log: MemoryCommitLog | None = None

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        link = FaultyLink()
        master_end, slave_end = faulty_stream_pair(link=link)
        self.links.append(link)
        self.connected_at.append(trio.current_time())
        self.nursery.start_soon(self.service.handle_stream, master_end, f"slave#{len(self.links)}")
        return _Recording(slave_end, self, first=True)


class _Recording(DelegatingStream):
    """The slave's end: notes each report with what the slave's log held when it was sent."""

    def __init__(self, inner: trio.abc.Stream, wire: Wire, *, first: bool) -> None:
        super().__init__(inner)
        self.wire = wire
        self.first = first

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        log = self.wire.slave_log
        assert log is not None and len(data) == REPORT_SIZE
        offset = Report.from_bytes(bytes(data)).offset
        if self.first:
            self.wire.requests.append(offset)
            self.first = False
        self.wire.reports.append((offset, log.max_offset, log.flushed_offset))
        await self.inner.send_all(data)


@asynccontextmanager
async def replicating(
    master_log: MemoryCommitLog,
    slave_log: MemoryCommitLog,
    *,
    on_appended: Callable[[Wire], None] | None = None,
    **changes: object,
) -> AsyncIterator[tuple[HAService, HAClient, Wire, Wakeup]]:
    """A service and a client replicating over :class:`Wire`; cancelled on exit."""
    cfg = BrokerConfig(
        ha_listen_port=0,
        mapped_file_size_commit_log=master_log.segment_size,
        ha_master_address="127.0.0.1:1",
        ha_sync_from_oldest=True,
    ).evolve(**changes)
    service = HAService(cfg, master_log)
    appended = Wakeup()
    async with trio.open_nursery() as nursery:
        wire = Wire(service, nursery)
        wire.slave_log = slave_log

        def notify() -> None:
            if on_appended is not None:
                on_appended(wire)
            appended.notify()

        client = HAClient(cfg, slave_log, connect=wire.connect, on_appended=notify)
        await nursery.start(service.time_out_puts)
        await nursery.start(client.run)
        yield service, client, wire, appended
        nursery.cancel_scope.cancel()


async def wait_caught_up(master: MemoryCommitLog, slave: MemoryCommitLog, appended: Wakeup) -> None:
    with trio.fail_after(120):  # virtual time; a hang fails here, with the offsets
        while slave.max_offset < master.max_offset:
            await appended.wait()
        await trio.testing.wait_all_tasks_blocked()


@pytest.mark.parametrize(
    ("batch", "segment"),
    [
        (32 * 1024, MIB),  # the default batch: frames end mid-record and at segment ends
        (33_333, MIB),  # frames end anywhere
        (4 * MIB - 12, MIB),  # the largest batch a Java slave accepts; frames end at segments
        (7_777, 256 * 1024),
    ],
)
async def test_a_healthy_catch_up_of_several_mib_uses_one_connection(
    autojump_clock: trio.abc.Clock, batch: int, segment: int
) -> None:
    master_log = backlog(3 * MIB + 300_000, segment)
    assert master_log.max_offset > 3 * MIB
    slave_log = MemoryCommitLog(segment_size=segment)
    async with replicating(master_log, slave_log, ha_transfer_batch_size=batch) as (
        service,
        client,
        wire,
        appended,
    ):
        await wait_caught_up(master_log, slave_log, appended)
        stats = service.statistics()
        assert client.connects == 1, client.last_close_reason
        assert stats.connections_accepted == 1
        assert stats.connections_closed == 0
        assert client.connected
        assert [s.ack_offset for s in stats.slaves] == [master_log.max_offset]
        assert wire.requests == [0]
    assert same_bytes(master_log, slave_log)


async def test_a_link_dropped_between_append_and_report_resumes_from_the_log_end(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The slave appended, the link died before its report: it must ask for its log's end."""
    master_log = backlog(2 * MIB, MIB)
    slave_log = MemoryCommitLog(segment_size=MIB)
    dropped_at: list[int] = []

    def drop_once(wire: Wire) -> None:
        if not dropped_at:
            assert wire.slave_log is not None
            dropped_at.append(wire.slave_log.max_offset)
            wire.links[0].break_(Breakage.RESET)

    async with replicating(master_log, slave_log, on_appended=drop_once) as (
        service,
        client,
        wire,
        appended,
    ):
        await wait_caught_up(master_log, slave_log, appended)
        assert client.connects == 2
        assert service.statistics().connections_accepted == 2
        # The first connection's reports never covered the appended bytes; the second asks
        # for the log's end, not for what was last reported.
        assert dropped_at[0] > 0
        assert all(offset < dropped_at[0] for offset, _, _ in wire.reports[:1])
        assert wire.requests == [0, dropped_at[0]]
    assert same_bytes(master_log, slave_log)


@pytest.mark.parametrize("ack_flushed", [False, True])
async def test_every_report_follows_the_append_it_reports(ack_flushed: bool) -> None:
    """A report never runs ahead of the slave's log (nor, with acks of flushed data, its disk).

    On the real clock: with flushed acks the slave flushes in a worker thread, which a mock
    clock's autojump would not wait for. Nothing here sleeps; it takes milliseconds.
    """
    master_log = backlog(MIB, 256 * 1024)
    slave_log = MemoryCommitLog(segment_size=256 * 1024)
    async with replicating(
        master_log, slave_log, ha_slave_ack_flushed=ack_flushed, ha_transfer_batch_size=10_000
    ) as (_service, _client, wire, appended):
        await wait_caught_up(master_log, slave_log, appended)
        for i in range(20):  # live traffic too, one message at a time
            master_log.append(NewMessage(topic="Live", body=b"%d" % i))
            _service.notify_log_grew()
            await wait_caught_up(master_log, slave_log, appended)
        # With flushed acks the last report waits for a flush in a worker thread, which
        # wait_all_tasks_blocked does not wait for: wait (bounded) for that report itself.
        with trio.fail_after(30):
            while not wire.reports or wire.reports[-1][0] < master_log.max_offset:  # noqa: ASYNC110
                await trio.sleep(0.001)
    assert len(wire.reports) > 20
    for offset, written, flushed in wire.reports:
        assert offset <= written
        if ack_flushed:
            assert offset <= flushed
    assert wire.reports[-1][0] == master_log.max_offset


# --- configured timings, not the defaults ---------------------------------------------------


class BareSlave:
    """The slave end of a memory stream, driven by the test (reads whole frames)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buffer = b""

    async def frame(self) -> TransferHeader:
        while True:
            if len(self.buffer) >= HEADER_SIZE:
                header = TransferHeader.from_bytes(self.buffer[:HEADER_SIZE], max_body=1 << 22)
                if len(self.buffer) >= HEADER_SIZE + header.size:
                    self.buffer = self.buffer[HEADER_SIZE + header.size :]
                    return header
            data = await self.stream.receive_some()
            if not data:
                raise EOFError
            self.buffer += data


def small_config(**changes: object) -> BrokerConfig:
    return BrokerConfig(ha_listen_port=0, mapped_file_size_commit_log=4096).evolve(**changes)


async def test_the_master_heartbeats_at_the_configured_interval(
    autojump_clock: trio.abc.Clock,
) -> None:
    log = MemoryCommitLog(segment_size=4096)
    log.append(NewMessage(topic="T", body=b"x"))
    service = HAService(small_config(ha_send_heartbeat_interval=1250), log)
    async with trio.open_nursery() as nursery:
        master_end, slave_end = trio.testing.memory_stream_pair()
        nursery.start_soon(service.handle_stream, master_end, "slave")
        slave = BareSlave(slave_end)
        await slave_end.send_all(encode_report(log.max_offset))
        start = trio.current_time()
        times = []
        for _ in range(3):
            header = await slave.frame()
            assert header == TransferHeader(log.max_offset, 0)
            times.append(trio.current_time() - start)
            await slave_end.send_all(encode_report(log.max_offset))  # keep it alive
        assert times == pytest.approx([1.25, 2.5, 3.75])
        nursery.cancel_scope.cancel()


async def test_the_master_drops_a_silent_slave_after_the_configured_housekeeping(
    autojump_clock: trio.abc.Clock,
) -> None:
    log = MemoryCommitLog(segment_size=4096)
    service = HAService(small_config(ha_housekeeping_interval=7300), log)
    async with trio.open_nursery() as nursery:
        master_end, slave_end = trio.testing.memory_stream_pair()
        nursery.start_soon(service.handle_stream, master_end, "slave")
        start = trio.current_time()
        assert await slave_end.receive_some() == b""
        assert trio.current_time() - start == pytest.approx(7.3)
        await trio.testing.wait_all_tasks_blocked()
        assert service.connections == {}


async def test_a_sync_put_times_out_after_the_configured_slave_timeout(
    autojump_clock: trio.abc.Clock,
) -> None:
    log = MemoryCommitLog(segment_size=4096)
    service = HAService(small_config(slave_timeout=1700), log)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.time_out_puts)
        master_end, slave_end = trio.testing.memory_stream_pair()
        nursery.start_soon(service.handle_stream, master_end, "slave")
        await slave_end.send_all(encode_report(0))
        await trio.testing.wait_all_tasks_blocked()
        result = log.append(NewMessage(topic="T", body=b"never acked"))
        start = trio.current_time()
        status = await service.wait_replicated(result.end_offset, start=result.physical_offset)
        assert status is PutStatus.FLUSH_SLAVE_TIMEOUT
        assert trio.current_time() - start == pytest.approx(1.7)
        nursery.cancel_scope.cancel()


async def slave_client_against(
    nursery: trio.Nursery, **changes: object
) -> tuple[HAClient, list[trio.abc.Stream], list[float]]:
    """A client whose connections end at streams the test holds (no master behind them)."""
    cfg = small_config(ha_master_address="127.0.0.1:1").evolve(**changes)
    masters: list[trio.abc.Stream] = []
    attempts: list[float] = []

    async def connect(host: str, port: int) -> trio.abc.Stream:
        attempts.append(trio.current_time())
        master_end, slave_end = trio.testing.memory_stream_pair()
        masters.append(master_end)
        return slave_end

    client = HAClient(cfg, MemoryCommitLog(segment_size=4096), connect=connect)
    await nursery.start(client.run)
    return client, masters, attempts


async def test_the_slave_heartbeats_and_gives_up_on_a_silent_master_as_configured(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with trio.open_nursery() as nursery:
        client, masters, attempts = await slave_client_against(
            nursery, ha_send_heartbeat_interval=900, ha_housekeeping_interval=3100
        )
        await trio.testing.wait_all_tasks_blocked()
        start = attempts[0]
        received: list[tuple[float, bytes]] = []
        while True:
            data = await masters[0].receive_some()
            if not data:
                break
            received.append((trio.current_time() - start, bytes(data)))
        # The first report at once, then one every 0.9 s of write silence, until the slave
        # closes the silent master at 3.1 s.
        assert [t for t, _ in received] == pytest.approx([0.0, 0.9, 1.8, 2.7])
        assert all(data == encode_report(0) for _, data in received)
        assert trio.current_time() - start == pytest.approx(3.1)
        assert client.last_close_reason == (
            "nothing read from the master within the housekeeping interval"
        )
        await trio.sleep(0.2)  # and it tries again, after the first backoff
        assert [round(t - start, 3) for t in attempts] == [0.0, 3.2]
        nursery.cancel_scope.cancel()


async def test_reconnects_back_off_up_to_the_configured_cap(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with trio.open_nursery() as nursery:
        _client, masters, attempts = await slave_client_against(
            nursery, ha_reconnect_backoff_max=300
        )
        while len(attempts) < 6:
            await trio.testing.wait_all_tasks_blocked()
            await masters[-1].aclose()  # the master hangs up at once, every time
            await trio.sleep(0.01)
        gaps = [round(b - a, 3) for a, b in itertools.pairwise(attempts)]
        assert gaps[:2] == pytest.approx([0.1, 0.2], abs=0.011)
        assert max(gaps) <= 0.3 + 0.011
        assert gaps[-1] == pytest.approx(0.3, abs=0.011)
        nursery.cancel_scope.cancel()


# --- epoch mode: the cut to the consistent point and the new epoch --------------------------


def diverged_pair(tmp_path: Path) -> tuple[MemoryCommitLog, EpochFile, MemoryCommitLog, EpochFile]:
    """A master whose epoch 2 began at the end of epoch 1's 10 messages, and a slave that
    holds those 10 and 5 of its own after them (an epoch-1 tail the master lost)."""
    master_log = MemoryCommitLog(segment_size=MIB)
    for i in range(10):
        master_log.append(NewMessage(topic="T", body=b"shared %d" % i))
    point = master_log.max_offset
    slave_log = MemoryCommitLog(segment_size=MIB)
    slave_log.append_raw(0, master_log.read(0, point))
    for i in range(5):
        slave_log.append(NewMessage(topic="T", body=b"lost tail %d" % i))
    for i in range(7):
        master_log.append(NewMessage(topic="T", body=b"epoch 2 message %d" % i))
    master_epochs = EpochFile.open(tmp_path / "master-epochs")
    master_epochs.append(1, 0)
    master_epochs.append(2, point)
    slave_epochs = EpochFile.open(tmp_path / "slave-epochs")
    slave_epochs.append(1, 0)
    return master_log, master_epochs, slave_log, slave_epochs


def epoch_config(segment: int = MIB, **changes: object) -> BrokerConfig:
    """An epoch-mode config, shared by the master and the slave of these tests."""
    return BrokerConfig(
        ha_listen_port=0,
        mapped_file_size_commit_log=segment,
        ha_master_address="127.0.0.1:1",
        enable_controller_mode=True,
    ).evolve(**changes)


def connector(
    nursery: trio.Nursery, service: HAService
) -> Callable[[str, int], Awaitable[trio.abc.Stream]]:
    """The slave's connections, to *service* over memory streams."""

    async def connect(host: str, port: int) -> trio.abc.Stream:
        master_end, slave_end = trio.testing.memory_stream_pair()
        nursery.start_soon(service.handle_stream, master_end, "slave")
        return slave_end

    return connect


@pytest.mark.parametrize("own_truncator", [False, True])
async def test_an_epoch_mode_slave_cuts_to_the_consistent_point_and_records_the_new_epoch(
    autojump_clock: trio.abc.Clock,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    own_truncator: bool,
) -> None:
    master_log, master_epochs, slave_log, slave_epochs = diverged_pair(tmp_path)
    point = master_epochs.history.entries[1].start_offset
    before = slave_log.max_offset
    cfg = epoch_config()
    service = HAService(cfg, master_log, epoch_file=master_epochs)
    cuts: list[int] = []

    async def truncate(offset: int) -> None:  # what the broker passes: log and queues
        cuts.append(offset)
        slave_log.truncate_to_boundary(offset)

    appended = Wakeup()
    async with trio.open_nursery() as nursery:
        client = HAClient(
            cfg,
            slave_log,
            connect=connector(nursery, service),
            on_appended=appended.notify,
            epoch_file=slave_epochs,
            truncate=truncate if own_truncator else None,
        )
        with caplog.at_level(logging.INFO, logger="trioha.ha"):
            await nursery.start(client.run)
            await wait_caught_up(master_log, slave_log, appended)
        stats = client.statistics()
        nursery.cancel_scope.cancel()
    assert cuts == ([point] if own_truncator else [])
    assert same_bytes(master_log, slave_log)
    assert slave_epochs.history == master_epochs.history
    assert EpochFile.open(tmp_path / "slave-epochs").history == master_epochs.history
    assert (stats.last_epoch, stats.truncations) == (2, ((before, point),))
    assert stats.connects == 1 and stats.state == "connected"
    lines = [r.getMessage() for r in caplog.records if r.name == "trioha.ha"]
    cut = (
        f"cut this slave's log back from {before} to {point}, the consistent point with "
        "master 127.0.0.1:1: the bytes after it were not the master's history (kept in "
        "lost+found)"
    )
    epoch = f"epoch 2 begins at {point} (from master 127.0.0.1:1)"
    assert cut in lines and epoch in lines
    assert lines.index(cut) < lines.index(epoch)
    levels = {r.getMessage(): r.levelno for r in caplog.records}
    assert (levels[cut], levels[epoch]) == (logging.WARNING, logging.INFO)
    if not own_truncator:  # the log's own cut keeps the bytes aside
        assert [a.offset for a in slave_log.set_aside] == [point]


# --- what statistics() says -------------------------------------------------------------------


async def test_a_caught_up_slaves_statistics_say_exactly_what_it_holds(
    autojump_clock: trio.abc.Clock,
) -> None:
    master_log = backlog(200_000, 64 * 1024)
    slave_log = MemoryCommitLog(segment_size=64 * 1024)
    end = master_log.max_offset
    async with replicating(master_log, slave_log, ha_transfer_batch_size=10_000) as (
        _service,
        client,
        _wire,
        appended,
    ):
        await wait_caught_up(master_log, slave_log, appended)
        stats = client.statistics()
        frames, rest = divmod(stats.bytes_received - end, HEADER_SIZE)
        assert rest == 0 and frames >= end // 10_000  # the data and one header per frame
        assert attrs.evolve(stats, bytes_received=0) == HAClientStatistics(
            master="127.0.0.1:1",
            connected=True,
            reported_offset=end,
            bytes_received=0,
            connects=1,
            last_close_reason=None,
            append_error=None,
            needs_reseed=False,
            diverged_master_offset=-1,
            diverged_slave_offset=-1,
            last_epoch=-1,
            truncations=(),
            bytes_appended=end,
            closed_by_reason={},
            state="connected",
            master_end=None,
            behind_bytes=None,
            behind_seconds=None,
        )
        # Once the master's end is learned: bytes and seconds behind it.
        last = slave_log.last_record()
        assert last is not None
        client.wall_clock = lambda: last[1] / 1000 + 7.5
        client.learn_master_end(end + 1000)
        client.learn_master_end(end)  # an older answer does not move it back
        stats = client.statistics()
        assert (stats.master_end, stats.behind_bytes) == (end + 1000, 1000)
        assert stats.behind_seconds == pytest.approx(7.5)
    # Stopped: the bytes of the ended connection still count.
    after = client.statistics()
    assert (after.connected, after.bytes_received) == (False, stats.bytes_received)


def test_a_master_end_of_0_is_known_and_nothing_is_behind_it() -> None:
    config = BrokerConfig(ha_master_address="127.0.0.1:1")
    client = HAClient(config, MemoryCommitLog(segment_size=4096))
    assert client.statistics().master_end is None
    client.learn_master_end(0)
    stats = client.statistics()
    assert (stats.master_end, stats.behind_bytes, stats.behind_seconds) == (0, 0, 0.0)


def test_a_new_clients_statistics_before_it_ever_connects() -> None:
    config = BrokerConfig(ha_master_address="10.0.0.7:10912")
    assert HAClient(config, MemoryCommitLog(segment_size=4096)).statistics() == (
        HAClientStatistics(
            master="10.0.0.7:10912",
            connected=False,
            reported_offset=-1,
            bytes_received=0,
            connects=0,
            last_close_reason=None,
        )
    )


# --- connecting, reconnecting, and what the log says -----------------------------------------


def ha_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    """The slave's own lines (the master's service logs to the same logger)."""
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.module == "_client"]


async def test_an_unreachable_master_is_retried_with_a_doubling_capped_backoff_and_named(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    master_log = backlog(10_000, 64 * 1024)
    cfg = small_config(ha_master_address="127.0.0.1:1", ha_reconnect_backoff_max=300)
    service = HAService(cfg.evolve(mapped_file_size_commit_log=64 * 1024), master_log)
    attempts: list[float] = []
    async with trio.open_nursery() as nursery:

        async def connect(host: str, port: int) -> trio.abc.Stream:
            attempts.append(trio.current_time())
            if len(attempts) == 3:
                await trio.sleep_forever()  # a SYN that nobody answers
            if len(attempts) <= 4:
                raise OSError(111, "Connection refused")
            return await connector(nursery, service)(host, port)

        slave_log = MemoryCommitLog(segment_size=64 * 1024)
        client = HAClient(cfg, slave_log, connect=connect)
        with caplog.at_level(logging.INFO, logger="trioha.ha"):
            start = trio.current_time()
            await nursery.start(client.run)
            assert await client.wait_connected(start + 60)
            await trio.testing.wait_all_tasks_blocked()
        stats = client.statistics()
        nursery.cancel_scope.cancel()
    # 0.1, 0.2, then the 5 s connect timeout and the cap of 0.3 s, twice.
    assert [round(t - start, 3) for t in attempts] == [0.0, 0.1, 0.3, 5.6, 5.9]
    refused = "cannot connect to master 127.0.0.1:1: [Errno 111] Connection refused"
    assert ha_lines(caplog)[:5] == [
        (logging.WARNING, f"{refused}; retrying in 0.1 s"),
        (logging.WARNING, f"{refused}; retrying in 0.2 s"),
        (logging.WARNING, "cannot connect to master 127.0.0.1:1: timed out; retrying in 0.3 s"),
        (logging.WARNING, f"{refused}; retrying in 0.3 s"),
        (logging.INFO, "connected to master 127.0.0.1:1; requesting from offset 0"),
    ]
    assert stats.closed_by_reason == {"connect_failed": 4}
    assert (stats.connects, stats.state) == (1, "connected")


async def test_a_session_that_brought_data_resets_the_backoff(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    master_log = backlog(100_000, 64 * 1024)
    slave_log = MemoryCommitLog(segment_size=64 * 1024)
    breaks: list[float] = []

    def drop_twice(wire: Wire) -> None:
        """The first two connections die after their first data, with more to come."""
        link = wire.links[-1]
        if len(wire.links) <= 2 and not link.broken:
            breaks.append(trio.current_time())
            link.break_(Breakage.RESET)
            master_log.append(NewMessage(topic="Later", body=b"x" * 500))
            wire.service.notify_log_grew()

    with caplog.at_level(logging.INFO, logger="trioha.ha"):
        async with replicating(
            master_log,
            slave_log,
            on_appended=drop_twice,
            ha_transfer_batch_size=10_000,
            ha_reconnect_backoff_max=5000,
        ) as (_service, client, wire, appended):
            assert await client.wait_connected(trio.current_time() + 30, connects=3)
            await wait_caught_up(master_log, slave_log, appended)
            stats = client.statistics()
    # Each reconnect 0.1 s after its break: data came, so the backoff starts over.
    assert [round(b - a, 3) for a, b in zip(breaks, wire.connected_at[1:], strict=True)] == [
        0.1,
        0.1,
    ]
    assert (stats.connects, stats.closed_by_reason) == (3, {"broken": 2})
    # What ended connections received still counts, with the live one's.
    assert stats.bytes_received >= stats.bytes_appended == slave_log.max_offset
    reason = "connection broken while reading: <FaultyStream b broken=Breakage.RESET>: "
    assert stats.last_close_reason == reason + "connection reset"
    dropped = (logging.INFO, f"disconnected from master 127.0.0.1:1: {reason}connection reset")
    lines = ha_lines(caplog)
    assert lines.count(dropped) == 2  # a routine close: INFO
    assert lines[-2:] == [
        (
            logging.INFO,
            f"connected to master 127.0.0.1:1; requesting from offset {wire.requests[2]}",
        ),
        (logging.INFO, "disconnected from master 127.0.0.1:1: cancelled"),  # the test's end
    ]


async def test_a_master_that_hangs_up_at_once_is_named_with_the_offset_asked(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="trioha.ha"):
        async with trio.open_nursery() as nursery:
            _client, masters, _attempts = await slave_client_against(nursery)
            for n in (1, 2):
                await trio.testing.wait_all_tasks_blocked()
                assert len(masters) == n
                await masters[-1].aclose()
                await trio.sleep(0.15)  # past the backoff: the next connection is made
            nursery.cancel_scope.cancel()
    said = [(level, m) for level, m in ha_lines(caplog) if "does not speak RocketMQ HA" in m]
    line = (
        "the master at 127.0.0.1:1 does not speak RocketMQ HA (is that the broker port? the HA "
        "port is usually listenPort+1): it closed the connection at once without sending "
        "anything (if it is the HA port, it refused this slave's offset 0, or it runs the "
        "AutoSwitch (epoch) protocol, enableControllerMode=true, which this slave "
        "(enableControllerMode=false) does not speak: its log says which)"
    )
    assert said == [(logging.WARNING, line), (logging.ERROR, line)]  # then louder


async def test_bytes_appended_before_a_bad_frame_in_the_same_read_are_announced(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A read may bring good frames and then one the slave refuses: the good ones are in
    the log, so those waiting for it to grow (the broker's reput, long polls) are told, but
    no report covers them on a connection that is being closed."""
    source = MemoryCommitLog(segment_size=4096)
    source.append(NewMessage(topic="T", body=b"kept"))
    record = bytes(source.read(0, source.max_offset))
    slave_log = MemoryCommitLog(segment_size=4096)
    grew: list[int] = []
    async with trio.open_nursery() as nursery:
        master_end, slave_end = trio.testing.memory_stream_pair()
        client = HAClient(
            small_config(ha_master_address="127.0.0.1:1"),
            slave_log,
            on_appended=lambda: grew.append(slave_log.max_offset),
        )
        nursery.start_soon(client.session, slave_end)
        assert await master_end.receive_some() == encode_report(0)
        bad = len(record) + 100  # not where the slave's log ends
        await master_end.send_all(encode_header(0, len(record)) + record + encode_header(bad, 1))
        received = b""
        while data := await master_end.receive_some():
            received += data
        nursery.cancel_scope.cancel()
    assert grew == [len(record)]
    assert bytes(slave_log.read(0, len(record))) == record
    assert received == b""  # no report after the first: the session ended instead
    assert client.last_close_reason == (
        f"master pushed offset {bad} but the slave's log ends at {len(record)}; nothing appended"
    )
    assert client.statistics().diverged_master_offset == bad


async def test_a_peer_that_is_no_master_is_named_by_its_first_bytes_however_they_arrive(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="trioha.ha"):
        async with trio.open_nursery() as nursery:
            _client, masters, _attempts = await slave_client_against(nursery)
            await trio.testing.wait_all_tasks_blocked()
            await masters[0].send_all(b"GET ")  # a web server, answering in pieces
            await trio.testing.wait_all_tasks_blocked()
            await masters[0].send_all(b"/ HTTP/1.1\r\nHost: x\r\n\r\n")
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    said = [m for _, m in ha_lines(caplog) if "does not speak RocketMQ HA" in m]
    assert said == [
        "the master at 127.0.0.1:1 does not speak RocketMQ HA (is that the broker port? the HA "
        "port is usually listenPort+1): its first bytes (47 45 54 20 2f 20 48 54 54 50 2f 31) "
        "are not an HA frame"
    ]


@pytest.mark.parametrize("inside_a_record", [False, True])
async def test_a_cut_to_the_consistent_point_that_fails_ends_the_session_named(
    autojump_clock: trio.abc.Clock,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    inside_a_record: bool,
) -> None:
    """A cut the disk refuses is retried on the next connection; a consistent point inside
    one of this slave's records cannot be reached by any cut: the slave stops, diverged."""
    master_log, master_epochs, slave_log, slave_epochs = diverged_pair(tmp_path)
    point = master_epochs.history.entries[1].start_offset
    cfg = epoch_config()
    service = HAService(cfg, master_log, epoch_file=master_epochs)
    problem = (
        NotAMessageBoundaryError("inside a record", offset=point, before=0, after=None)
        if inside_a_record
        else StorageError("disk says no")
    )

    async def truncate(offset: int) -> None:
        raise problem

    client = HAClient(cfg, slave_log, epoch_file=slave_epochs, truncate=truncate)
    async with trio.open_nursery() as nursery:
        master_end, slave_end = trio.testing.memory_stream_pair()
        nursery.start_soon(service.handle_stream, master_end, "slave")
        with caplog.at_level(logging.ERROR, logger="trioha.ha"):
            assert await client.session(slave_end) is False
        nursery.cancel_scope.cancel()
    what = f"cut the log back to the consistent point {point}"
    assert client.last_close_reason == f"cannot {what}: {problem}"
    assert (logging.ERROR, f"cannot {what} (master 127.0.0.1:1): {problem}") in ha_lines(caplog)
    assert client.statistics().truncations == ()  # nothing was cut
    if inside_a_record:
        assert client.divergence is not None and client.divergence.master_offset == point
    else:
        assert client.divergence is None


async def test_only_reads_that_appended_are_announced_and_acked(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Heartbeats from a master with nothing new are neither log growth nor a reason to ack
    (with flushed acks, not a reason to flush either)."""
    master_log = backlog(50_000, 64 * 1024)
    slave_log = MemoryCommitLog(segment_size=64 * 1024)
    flushes: list[int] = []
    flush = slave_log.flush

    def counted_flush() -> int:
        flushes.append(slave_log.max_offset)
        return flush()

    slave_log.flush = counted_flush  # type: ignore[method-assign]
    announced: list[int] = []
    async with replicating(
        master_log,
        slave_log,
        on_appended=lambda wire: announced.append(slave_log.max_offset),
        ha_send_heartbeat_interval=500,
        ha_slave_ack_flushed=True,
    ) as (_service, _client, wire, appended):
        await wait_caught_up(master_log, slave_log, appended)
        with trio.fail_after(30):
            while not wire.reports or wire.reports[-1][0] < master_log.max_offset:  # noqa: ASYNC110
                await trio.sleep(0.01)
        before = (len(announced), len(flushes), len(wire.reports))
        await trio.sleep(5)  # ten heartbeats from the master, five reports from the slave
        after = (len(announced), len(flushes), len(wire.reports))
    assert after[:2] == before[:2]
    assert after[2] > before[2]  # the slave's own heartbeats went on


class _Breaking(trio.abc.Stream):
    """A transport that fails, without a message, on the first send or the first read."""

    def __init__(self, *, on_send: bool) -> None:
        self.on_send = on_send
        self.blocked = trio.Event()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.on_send:
            raise trio.BrokenResourceError
        await self.blocked.wait()

    async def wait_send_all_might_not_block(self) -> None:
        pass

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if not self.on_send:
            raise trio.BrokenResourceError
        await self.blocked.wait()
        return b""

    async def aclose(self) -> None:
        pass


@pytest.mark.parametrize(("on_send", "where"), [(True, "writing"), (False, "reading")])
async def test_a_transport_broken_without_a_message_is_named_by_its_error_type(
    autojump_clock: trio.abc.Clock, on_send: bool, where: str
) -> None:
    client = HAClient(
        small_config(ha_master_address="127.0.0.1:1"), MemoryCommitLog(segment_size=4096)
    )
    assert await client.session(_Breaking(on_send=on_send)) is False
    assert client.last_close_reason == f"connection broken while {where}: BrokenResourceError"
    assert client.statistics().closed_by_reason == {"broken": 1}


class _NoEpochTwo(EpochFile):
    """An epoch file that records epoch 1 but cannot record epoch 2 (the disk filled)."""

    def append(self, epoch: int, start_offset: int) -> None:
        if epoch >= 2:
            raise StorageError(f"cannot write epoch file {self.path}: [Errno 28] No space left")
        super().append(epoch, start_offset)


async def test_bytes_of_one_epoch_appended_before_the_next_cannot_be_recorded_are_announced(
    autojump_clock: trio.abc.Clock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    master_log, master_epochs, _, _ = diverged_pair(tmp_path)
    point = master_epochs.history.entries[1].start_offset
    cfg = epoch_config()
    service = HAService(cfg, master_log, epoch_file=master_epochs)
    slave_log = MemoryCommitLog(segment_size=MIB)
    epochs = _NoEpochTwo.open(tmp_path / "slave-epochs")
    grew: list[int] = []
    client = HAClient(
        cfg,
        slave_log,
        epoch_file=epochs,
        on_appended=lambda: grew.append(slave_log.max_offset),
    )
    async with trio.open_nursery() as nursery:
        master_end, slave_end = trio.testing.memory_stream_pair()
        nursery.start_soon(service.handle_stream, master_end, "slave")
        with caplog.at_level(logging.ERROR, logger="trioha.ha"):
            assert await client.session(slave_end) is True
        nursery.cancel_scope.cancel()
    assert slave_log.max_offset == point  # all of epoch 1, nothing of epoch 2
    assert grew == [point]
    assert client.last_close_reason is not None
    assert client.last_close_reason.startswith(f"cannot record epoch 2 from {point}: ")
    assert client.divergence is None  # a full disk: retried, not diverged


async def test_an_empty_epoch_mode_slave_asks_for_the_last_file_when_configured(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    """The handshake carries the slave's sync_from_last_file (and broker id): an empty slave
    that wants only the last file is served from the master's last segment."""
    segment = 4096
    master_log = MemoryCommitLog(segment_size=segment)
    while master_log.max_offset < 2 * segment + 100:
        master_log.append(NewMessage(topic="T", body=b"x" * 300))
    epochs = EpochFile.open(tmp_path / "master-epochs")
    epochs.append(1, 0)
    cfg = epoch_config(segment, sync_from_last_file=True)
    service = HAService(cfg, master_log, epoch_file=epochs)
    slave_log = MemoryCommitLog(segment_size=segment)
    appended = Wakeup()
    async with trio.open_nursery() as nursery:
        client = HAClient(
            cfg,
            slave_log,
            connect=connector(nursery, service),
            on_appended=appended.notify,
            epoch_file=EpochFile.open(tmp_path / "slave-epochs"),
        )
        await nursery.start(client.run)
        await wait_caught_up(master_log, slave_log, appended)
        nursery.cancel_scope.cancel()
    assert slave_log.min_offset == 2 * segment  # the last file only, not from 0


async def test_an_epoch_mode_slave_opens_with_its_handshake_naming_its_broker_id(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    cfg = epoch_config(4096, sync_from_last_file=True, broker_id=3)
    client = HAClient(
        cfg, MemoryCommitLog(segment_size=4096), epoch_file=EpochFile.open(tmp_path / "epochs")
    )
    async with trio.open_nursery() as nursery:
        master_end, slave_end = trio.testing.memory_stream_pair()
        nursery.start_soon(client.session, slave_end)
        first = await master_end.receive_some()
        nursery.cancel_scope.cancel()
    assert first == SlaveHandshake(sync_from_last_file=True, broker_id=3).to_bytes()
