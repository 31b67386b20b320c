"""The master's Trio layer over memory streams and a mock clock (HAService, HAConnection)."""

from __future__ import annotations

import gc
import logging
import math
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from tests.net._streams import DelegatingStream
from trioha import BrokerConfig, ConfigError
from trioha._status import PutStatus
from trioha.net import HAClient, HAService, Wakeup
from trioha.net._connection import HAConnection
from trioha.net._timeline import LogTimeline
from trioha.proto import HEADER_SIZE, MasterOptions, Timing, TransferHeader, encode_report
from trioha.store import MemoryCommitLog, NewMessage

SEG = 4096


def make_log(messages: int = 0, body: bytes = b"x" * 100) -> MemoryCommitLog:
    log = MemoryCommitLog(segment_size=SEG)
    for i in range(messages):
        log.append(NewMessage(topic="FooBar", body=body, queue_id=i % 2))
    return log


def config(**changes: object) -> BrokerConfig:
    return BrokerConfig(ha_listen_port=0, mapped_file_size_commit_log=SEG).evolve(**changes)


class FakeSlave:
    """The slave end of a memory stream, driven byte by byte by the test."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buffer = b""

    async def report(self, offset: int) -> None:
        await self.stream.send_all(encode_report(offset))

    async def frame(self) -> tuple[TransferHeader, bytes]:
        while True:
            if len(self.buffer) >= HEADER_SIZE:
                header = TransferHeader.from_bytes(self.buffer[:HEADER_SIZE], max_body=1 << 22)
                if len(self.buffer) >= HEADER_SIZE + header.size:
                    body = self.buffer[HEADER_SIZE : HEADER_SIZE + header.size]
                    self.buffer = self.buffer[HEADER_SIZE + header.size :]
                    return header, body
            data = await self.stream.receive_some()
            if not data:
                raise EOFError
            self.buffer += data


@asynccontextmanager
async def running(service: HAService) -> AsyncIterator[trio.Nursery]:
    """A nursery with the service's put timeouts running (``serve`` would start them)."""
    async with trio.open_nursery() as nursery:
        await nursery.start(service.time_out_puts)
        yield nursery


async def serve_one(service: HAService, nursery: trio.Nursery) -> FakeSlave:
    master_end, slave_end = trio.testing.memory_stream_pair()
    nursery.start_soon(service.handle_stream, master_end, "fake-slave")
    await trio.testing.wait_all_tasks_blocked()
    return FakeSlave(slave_end)


async def test_nothing_is_sent_before_the_first_report(autojump_clock: trio.abc.Clock) -> None:
    service = HAService(config(), make_log(10))
    async with trio.open_nursery() as nursery:
        slave = await serve_one(service, nursery)
        with trio.move_on_after(4.0):
            await slave.frame()
            pytest.fail("the master sent before the slave reported")
        nursery.cancel_scope.cancel()


async def test_a_report_of_zero_is_served_from_the_last_segment_and_frames_stop_at_its_end(
    autojump_clock: trio.abc.Clock,
) -> None:
    commitlog = make_log(100)  # several segments
    last_start = commitlog.max_offset - commitlog.max_offset % SEG
    service = HAService(config(), commitlog)
    async with trio.open_nursery() as nursery:
        slave = await serve_one(service, nursery)
        await slave.report(0)
        received = b""
        offset = last_start
        while offset < commitlog.max_offset:
            header, body = await slave.frame()
            assert header.offset == offset
            assert header.size <= 32768
            received += body
            offset = header.end
        assert received == bytes(commitlog.read(last_start, SEG))
        nursery.cancel_scope.cancel()


async def test_the_writer_wakes_the_moment_the_log_grows(autojump_clock: trio.abc.Clock) -> None:
    commitlog = make_log(1)
    service = HAService(config(), commitlog)
    async with trio.open_nursery() as nursery:
        slave = await serve_one(service, nursery)
        await slave.report(commitlog.max_offset)
        await trio.testing.wait_all_tasks_blocked()
        before = trio.current_time()
        end = commitlog.max_offset
        commitlog.append(NewMessage(topic="FooBar", body=b"new"))
        service.notify_log_grew()
        header, _ = await slave.frame()
        assert header.offset == end
        assert trio.current_time() == before  # no polling interval elapsed
        nursery.cancel_scope.cancel()


async def test_heartbeat_after_five_seconds_of_write_silence(
    autojump_clock: trio.abc.Clock,
) -> None:
    commitlog = make_log(1)
    service = HAService(config(), commitlog)
    async with trio.open_nursery() as nursery:
        slave = await serve_one(service, nursery)
        start = trio.current_time()
        await slave.report(commitlog.max_offset)
        header, body = await slave.frame()
        assert header == TransferHeader(commitlog.max_offset, 0)
        assert body == b""
        assert trio.current_time() - start == pytest.approx(5.0)
        nursery.cancel_scope.cancel()


async def test_a_silent_peer_is_dropped_after_housekeeping_and_leaves_the_registry(
    autojump_clock: trio.abc.Clock,
) -> None:
    service = HAService(config(), make_log(1))
    async with trio.open_nursery() as nursery:
        slave = await serve_one(service, nursery)
        assert len(service.connections) == 1
        start = trio.current_time()
        assert await slave.stream.receive_some() == b""
        assert trio.current_time() - start == pytest.approx(20.0)
        await trio.testing.wait_all_tasks_blocked()
        assert service.connections == {}
        assert service.statistics().connections_closed == 1


async def test_an_ack_beyond_the_end_drops_the_connection_and_never_counts(
    autojump_clock: trio.abc.Clock,
) -> None:
    commitlog = make_log(5)
    service = HAService(config(), commitlog)
    async with trio.open_nursery() as nursery:
        slave = await serve_one(service, nursery)
        await slave.report(commitlog.max_offset)
        await trio.testing.wait_all_tasks_blocked()
        await slave.report(commitlog.max_offset + 1_000_000)
        await trio.testing.wait_all_tasks_blocked()
        assert service.connections == {}
        assert service.replicated_offset() == -1
        nursery.cancel_scope.cancel()


async def test_garbage_and_a_closed_peer_never_touch_the_log(
    autojump_clock: trio.abc.Clock,
) -> None:
    commitlog = make_log(5)
    before = bytes(commitlog.read(0, SEG))
    service = HAService(config(), commitlog)
    async with trio.open_nursery() as nursery:
        slave = await serve_one(service, nursery)
        await slave.stream.send_all(b"\xff" * 8 + b"GET / HTTP/1.1\r\n")
        await trio.testing.wait_all_tasks_blocked()
        assert service.connections == {}
    assert bytes(commitlog.read(0, SEG)) == before


async def test_sync_put_statuses(autojump_clock: trio.abc.Clock) -> None:
    commitlog = make_log(5)
    service = HAService(config(), commitlog)
    end = commitlog.max_offset
    # No slave: SLAVE_NOT_AVAILABLE at once (HATest.testSemiSyncReplica, 4.9).
    assert await service.wait_replicated(end) is PutStatus.SLAVE_NOT_AVAILABLE
    async with running(service) as nursery:
        slave = await serve_one(service, nursery)
        await slave.report(0)
        await trio.testing.wait_all_tasks_blocked()
        # A slave that never acks: FLUSH_SLAVE_TIMEOUT after slave_timeout (3 s), per request.
        start = trio.current_time()
        assert await service.wait_replicated(end) is PutStatus.FLUSH_SLAVE_TIMEOUT
        assert trio.current_time() - start == pytest.approx(3.0)
        # Thousands of waiters are released by one ack.
        results: list[PutStatus] = []

        async def put() -> None:
            results.append(await service.wait_replicated(end))

        async with trio.open_nursery() as puts:
            for _ in range(2000):
                puts.start_soon(put)
            await trio.testing.wait_all_tasks_blocked()
            await slave.report(end)
        assert results == [PutStatus.PUT_OK] * 2000
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("first_report_after", [2.0, 5.0])
async def test_a_put_waits_for_a_connected_slaves_first_report(
    autojump_clock: trio.abc.Clock, first_report_after: float
) -> None:
    """A Java slave reports 5 s after connecting: a put in that window waits (as RocketMQ's
    isSlaveOK counts the connection) instead of SLAVE_NOT_AVAILABLE."""
    commitlog = make_log(5)
    service = HAService(config(), commitlog)
    async with running(service) as nursery:
        slave = await serve_one(service, nursery)
        caught_up = commitlog.max_offset
        put = commitlog.append(NewMessage(topic="FooBar", body=b"during the silence"))
        service.notify_log_grew()
        started = trio.current_time()
        results: list[PutStatus] = []

        async def wait() -> None:
            results.append(await service.wait_replicated(put.end_offset, start=caught_up))

        async def java_slave() -> None:
            await trio.sleep(first_report_after)
            await slave.report(caught_up)
            header, _ = await slave.frame()
            assert header.offset == caught_up
            await slave.report(header.end)

        async with trio.open_nursery() as inner:
            inner.start_soon(wait)
            inner.start_soon(java_slave)
        if first_report_after < 3.0:
            assert results == [PutStatus.PUT_OK]
            assert trio.current_time() - started == pytest.approx(first_report_after)
        else:  # the report came after slave_timeout: one FLUSH_SLAVE_TIMEOUT, as Java
            assert results == [PutStatus.FLUSH_SLAVE_TIMEOUT]
        # Once it streams, puts are acked as usual.
        assert await service.wait_replicated(put.end_offset, start=caught_up) is PutStatus.PUT_OK
        nursery.cancel_scope.cancel()


async def test_a_slave_too_far_behind_is_not_available(autojump_clock: trio.abc.Clock) -> None:
    commitlog = make_log(50)
    service = HAService(config(ha_slave_fallbehind_max=1000), commitlog)
    async with running(service) as nursery:
        slave = await serve_one(service, nursery)
        await slave.report(0)
        await trio.testing.wait_all_tasks_blocked()
        assert await service.wait_replicated(commitlog.max_offset) is (
            PutStatus.SLAVE_NOT_AVAILABLE
        )
        nursery.cancel_scope.cancel()


async def test_two_slaves_can_be_required(autojump_clock: trio.abc.Clock) -> None:
    commitlog = make_log(5)
    end = commitlog.max_offset
    service = HAService(config(in_sync_replicas=3, ha_sync_from_oldest=True), commitlog)
    async with running(service) as nursery:
        first = await serve_one(service, nursery)
        await first.report(0)
        await trio.testing.wait_all_tasks_blocked()
        assert await service.wait_replicated(end) is PutStatus.SLAVE_NOT_AVAILABLE
        second = await serve_one(service, nursery)
        await second.report(0)
        await trio.testing.wait_all_tasks_blocked()
        async with trio.open_nursery() as puts:
            results: list[PutStatus] = []

            async def put() -> None:
                results.append(await service.wait_replicated(end))

            puts.start_soon(put)
            await trio.testing.wait_all_tasks_blocked()
            for slave in (first, second):
                while (header := (await slave.frame())[0]).end < end:
                    pass
                assert results == []
                await slave.report(header.end)
                await trio.testing.wait_all_tasks_blocked()
        assert results == [PutStatus.PUT_OK]
        nursery.cancel_scope.cancel()


async def test_a_slave_served_from_the_last_segment_does_not_ack_older_puts(
    autojump_clock: trio.abc.Clock,
) -> None:
    # model/ finding (empty-slave-gap): its acks cover ends, not the bytes before its start.
    commitlog = make_log(60)
    end = commitlog.max_offset
    last = end - end % SEG
    service = HAService(config(slave_timeout=1000), commitlog)
    async with running(service) as nursery:
        slave = await serve_one(service, nursery)
        await slave.report(0)
        while (header := (await slave.frame())[0]).end < end:
            pass
        assert header.offset >= last
        await slave.report(end)
        await trio.testing.wait_all_tasks_blocked()
        assert await service.wait_replicated(end, start=last - 100) is (
            PutStatus.FLUSH_SLAVE_TIMEOUT
        )
        assert await service.wait_replicated(end, start=last) is PutStatus.PUT_OK
        nursery.cancel_scope.cancel()


async def test_a_client_reporting_the_masters_end_acks_nothing(
    autojump_clock: trio.abc.Clock,
) -> None:
    # model/ finding (rogue-at-end): no handshake, so any client can write 8 bytes.
    commitlog = make_log(5)
    end = commitlog.max_offset
    service = HAService(config(slave_timeout=1000), commitlog)
    async with running(service) as nursery:
        slave = await serve_one(service, nursery)
        await slave.report(0)  # the real slave, empty, not yet caught up
        await trio.testing.wait_all_tasks_blocked()
        rogue = await serve_one(service, nursery)
        await rogue.report(end)
        await trio.testing.wait_all_tasks_blocked()
        assert await service.wait_replicated(end) is PutStatus.FLUSH_SLAVE_TIMEOUT
        nursery.cancel_scope.cancel()


# --- master and slave together, over memory streams -------------------------------------------


async def test_a_slave_replicates_byte_for_byte_over_memory_streams(
    autojump_clock: trio.abc.Clock,
) -> None:
    master_log, slave_log = make_log(120), MemoryCommitLog(segment_size=SEG)
    cfg = config(ha_master_address="127.0.0.1:1", ha_sync_from_oldest=True)
    service = HAService(cfg, master_log)
    appended = Wakeup()
    client = HAClient(cfg, slave_log, on_appended=appended.notify)
    async with trio.open_nursery() as nursery:
        master_end, slave_end = trio.testing.memory_stream_pair()
        nursery.start_soon(service.handle_stream, master_end, "slave")
        nursery.start_soon(client.session, slave_end)
        with trio.fail_after(10):
            while slave_log.max_offset < master_log.max_offset:
                await appended.wait()
        for i in range(30):
            master_log.append(NewMessage(topic="Later", body=b"%d" % i))
            service.notify_log_grew()
        with trio.fail_after(10):
            while slave_log.max_offset < master_log.max_offset:
                await appended.wait()
            await trio.testing.wait_all_tasks_blocked()  # the last report reaches the master
        assert service.replicated_offset() == master_log.max_offset
        nursery.cancel_scope.cancel()
    assert slave_log.min_offset == master_log.min_offset
    assert slave_log.max_offset == master_log.max_offset
    offset = master_log.min_offset
    while offset < master_log.max_offset:
        chunk = bytes(master_log.read(offset, SEG))
        assert bytes(slave_log.read(offset, SEG)) == chunk
        offset += len(chunk)
    assert math.isfinite(trio.current_time())


class _ShortReads(MemoryCommitLog):
    """A commit log whose reads come back one byte short (a store bug or a torn segment)."""

    def read(self, offset: int, max_bytes: int) -> memoryview | bytes:
        return bytes(super().read(offset, max_bytes))[:-1]


class _Acks:
    def __init__(self) -> None:
        self.acks: list[int] = []

    def on_ack(self, connection: HAConnection, offset: int) -> None:
        self.acks.append(offset)


async def test_a_body_shorter_than_its_header_is_never_put_on_the_wire(
    autojump_clock: trio.abc.Clock,
) -> None:
    commitlog = _ShortReads(segment_size=SEG)
    commitlog.append(NewMessage(topic="FooBar", body=b"x" * 100, queue_id=0))
    master_end, slave_end = trio.testing.memory_stream_pair()
    conn = HAConnection(
        master_end,
        commitlog=commitlog,
        listener=_Acks(),
        options=MasterOptions(),
        timing=Timing(),
        peer="fake-slave",
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await slave_end.send_all(encode_report(0))
        await trio.testing.wait_all_tasks_blocked()
    size = commitlog.max_offset
    assert conn.close_reason == f"commit log returned {size - 1} bytes at 0, expected {size}"
    assert conn.frames_sent == 0 and conn.bytes_sent == 0
    with trio.move_on_after(1):
        received = await slave_end.receive_some()
        pytest.fail(f"the slave received {received!r}")  # nothing, not even the header


# --- settings refused, gates and deadlines ------------------------------------------------------


def test_an_epoch_mode_master_without_an_epoch_file_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        HAService(config(enable_controller_mode=True), make_log())
    assert str(err.value) == "epoch mode (enable_controller_mode) needs the store's epoch file"


async def test_a_port_in_use_is_a_config_error_naming_the_setting() -> None:
    (taken,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    try:
        port = taken.socket.getsockname()[1]
        service = HAService(config(ha_listen_port=port), make_log())
        with pytest.raises(
            ConfigError, match=f"cannot listen for slaves on 127.0.0.1:{port} "
        ) as err:
            await service.serve()
        # The operator reads the system's words, not Python's ``[Errno 98]`` repr.
        assert str(err.value).endswith("(haListenPort, --ha-listen): Address already in use")
    finally:
        await taken.aclose()


async def test_a_connection_the_gate_refuses_is_closed_unserved() -> None:
    seen: list[str] = []

    async def refuse(stream: trio.abc.Stream, peer: str) -> trio.abc.Stream | None:
        seen.append(peer)
        return None

    service = HAService(config(), make_log(5), accept=refuse)
    async with trio.open_nursery() as nursery:
        address = await nursery.start(service.serve)
        stream = await trio.open_tcp_stream(*address)
        await stream.send_all(encode_report(0))
        with trio.fail_after(5):
            assert await stream.receive_some() == b""  # closed, nothing sent
        await stream.aclose()
        assert service.connections == {} and len(seen) == 1
        assert seen[0].startswith("127.0.0.1:")
        nursery.cancel_scope.cancel()


async def test_a_stream_with_no_socket_is_named_question_mark(
    autojump_clock: trio.abc.Clock,
) -> None:
    service = HAService(config(), make_log(5))
    master_end, _slave_end = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(service.handle_stream, master_end)
        await trio.testing.wait_all_tasks_blocked()
        (conn,) = service.connections.values()
        assert conn.peer == "?"
        nursery.cancel_scope.cancel()


async def test_with_no_acks_required_a_put_is_ok_at_once(autojump_clock: trio.abc.Clock) -> None:
    service = HAService(config(in_sync_replicas=1), make_log(5))
    assert service.required_acks == 0
    assert await service.wait_replicated(10**9) is PutStatus.PUT_OK


async def test_waits_for_connections_give_up_at_their_deadline(
    autojump_clock: trio.abc.Clock,
) -> None:
    service = HAService(config(), make_log(5))
    assert await service.wait_connections(1, deadline=trio.current_time() + 3) is False
    assert await service.wait_no_connections(deadline=trio.current_time() + 3) is True
    async with trio.open_nursery() as nursery:
        await serve_one(service, nursery)
        assert await service.wait_no_connections(deadline=trio.current_time() + 3) is False
        nursery.cancel_scope.cancel()


class _BrokenReads(MemoryCommitLog):
    """A commit log whose reads fail with an error no layer expects (a bug elsewhere)."""

    def read(self, offset: int, max_bytes: int) -> memoryview | bytes:
        raise ValueError("read of a closed segment")


async def test_an_unexpected_error_ends_that_connection_only_and_is_logged(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trioha.ha")
    commitlog = _BrokenReads(segment_size=SEG)
    commitlog.append(NewMessage(topic="FooBar", body=b"x" * 100, queue_id=0))
    service = HAService(config(), commitlog)
    async with trio.open_nursery() as nursery:
        slave = await serve_one(service, nursery)
        await slave.report(0)
        await trio.testing.wait_all_tasks_blocked()
        assert service.connections == {}  # gone from the registry; the service still serves
        assert await slave.stream.receive_some() == b""  # and its stream closed
        assert service.statistics().connections_closed == 1
        await serve_one(service, nursery)
        assert len(service.connections) == 1
        nursery.cancel_scope.cancel()
    (failed,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert failed.getMessage() == "HA connection with fake-slave failed"
    assert "read of a closed segment" in caplog.text
    assert "slave fake-slave disconnected: internal error" in caplog.text
    # Each connection's start and end, the end with fields a JSON log pipeline filters on.
    connected = [r for r in caplog.records if r.getMessage() == "slave connected from fake-slave"]
    assert [r.levelno for r in connected] == [logging.INFO, logging.INFO]
    gone, stopped = [r for r in caplog.records if "disconnected" in r.getMessage()]
    assert gone.getMessage() == "slave fake-slave disconnected: internal error"
    assert stopped.getMessage() == "slave fake-slave disconnected: cancelled"  # the second
    assert gone.levelno == logging.WARNING  # an internal error needs an operator
    fields = {key: gone.__dict__.get(key) for key in ("peer", "reason", "ack_offset")}
    assert fields == {"peer": "fake-slave", "reason": "internal error", "ack_offset": 0}


# --- what the operator reads about closes ------------------------------------------------------


async def test_statistics_count_closes_by_category(autojump_clock: trio.abc.Clock) -> None:
    commitlog = make_log(5)
    service = HAService(config(), commitlog)
    async with running(service) as nursery:
        rogue = await serve_one(service, nursery)
        await rogue.report(commitlog.max_offset + 1)
        await trio.testing.wait_all_tasks_blocked()
        for _ in range(2):  # counts add up: a later close does not overwrite an earlier one
            slave = await serve_one(service, nursery)
            await slave.report(0)
            await trio.testing.wait_all_tasks_blocked()
            await slave.stream.aclose()
            await trio.testing.wait_all_tasks_blocked()
        stats = service.statistics()
        nursery.cancel_scope.cancel()
    assert stats.closed_by_reason == {"peer_closed": 2, "diverged": 1}
    assert (stats.connections_accepted, stats.connections_closed) == (3, 3)
    assert stats.slaves_refused == 1
    assert service.connections == {}


async def test_a_connection_open_when_the_service_stops_is_counted_and_logged(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trioha.ha")
    commitlog = make_log(5)
    service = HAService(config(), commitlog)
    async with running(service) as nursery:
        slave = await serve_one(service, nursery)
        await slave.report(0)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    stats = service.statistics()
    assert stats.closed_by_reason == {"shutdown": 1}
    assert (stats.connections_accepted, stats.connections_closed) == (1, 1)
    assert service.connections == {}
    lines = [r.getMessage() for r in caplog.records if "disconnected" in r.getMessage()]
    assert lines == ["slave fake-slave disconnected: cancelled"]


async def test_a_put_wakes_the_writers_itself(autojump_clock: trio.abc.Clock) -> None:
    """A put appended without ``notify_log_grew`` still goes out at once: waiting for it does
    the waking (the next heartbeat, 5 s away, is beyond ``slave_timeout``)."""
    commitlog = make_log(5)
    service = HAService(config(), commitlog)
    async with running(service) as nursery:
        slave = await serve_one(service, nursery)
        await slave.report(commitlog.max_offset)
        await trio.testing.wait_all_tasks_blocked()
        put = commitlog.append(NewMessage(topic="FooBar", body=b"no notify"))
        results: list[PutStatus] = []

        async def wait() -> None:
            results.append(await service.wait_replicated(put.end_offset, start=put.physical_offset))

        nursery.start_soon(wait)
        header, _ = await slave.frame()
        assert (header.offset, header.end) == (put.physical_offset, put.end_offset)
        await slave.report(header.end)
        await trio.testing.wait_all_tasks_blocked()
        assert results == [PutStatus.PUT_OK]
        assert trio.current_time() == 0.0
        nursery.cancel_scope.cancel()


async def test_a_slave_that_acked_and_left_no_longer_counts(autojump_clock: trio.abc.Clock) -> None:
    commitlog = make_log(5)
    end = commitlog.max_offset
    service = HAService(config(), commitlog)
    async with running(service) as nursery:
        slave = await serve_one(service, nursery)
        await slave.report(0)
        while (await slave.frame())[0].end < end:
            pass
        await slave.report(end)
        await trio.testing.wait_all_tasks_blocked()
        assert await service.wait_replicated(end) is PutStatus.PUT_OK
        assert service.replicated_offset() == end
        await slave.stream.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert service.connections == {}
        assert service.replicated_offset() == -1
        assert await service.wait_replicated(end) is PutStatus.SLAVE_NOT_AVAILABLE
        nursery.cancel_scope.cancel()


async def test_an_unreported_slave_is_available_only_within_fallbehind_max(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A connection that has not reported counts as having acked 0 (``isSlaveOK``): a put
    ending ``fallbehind_max`` or more past 0 is refused at once, one below waits its time."""
    commitlog = make_log(20)
    service = HAService(config(ha_slave_fallbehind_max=1000), commitlog)
    async with running(service) as nursery:
        await serve_one(service, nursery)
        assert await service.wait_replicated(1000) is PutStatus.SLAVE_NOT_AVAILABLE
        assert trio.current_time() == 0.0
        assert await service.wait_replicated(999) is PutStatus.FLUSH_SLAVE_TIMEOUT
        assert trio.current_time() == pytest.approx(3.0)
        nursery.cancel_scope.cancel()


async def test_waiting_for_a_streaming_slave_ends_at_its_first_report(
    autojump_clock: trio.abc.Clock,
) -> None:
    service = HAService(config(), make_log(5))
    async with running(service) as nursery:
        slave = await serve_one(service, nursery)
        woke: list[float] = []

        async def wait() -> None:
            assert await service.wait_connections(1)
            woke.append(trio.current_time())

        nursery.start_soon(wait)
        await trio.sleep(2.0)
        assert woke == []  # connected, but not streaming before it reports
        await slave.report(0)
        await trio.testing.wait_all_tasks_blocked()
        assert woke == [2.0]
        nursery.cancel_scope.cancel()


class _UnconnectedSocket:
    def getpeername(self) -> tuple[str, int]:
        raise OSError(107, "Transport endpoint is not connected")


class _V6Socket:
    def getpeername(self) -> tuple[str, int, int, int]:
        return ("::1", 10912, 0, 0)  # (host, port, flowinfo, scope_id)


class _NoPeer(DelegatingStream):
    """A stream whose socket has no peer address any more (``getpeername`` fails)."""

    def __init__(
        self, inner: trio.abc.Stream, sock: _UnconnectedSocket | _V6Socket | None = None
    ) -> None:
        super().__init__(inner)
        self.socket = sock or _UnconnectedSocket()


async def test_a_socket_without_a_peer_address_is_named_question_mark(
    autojump_clock: trio.abc.Clock,
) -> None:
    service = HAService(config(), make_log(5))
    master_end, _slave_end = trio.testing.memory_stream_pair()
    stream = _NoPeer(master_end)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(service.handle_stream, stream)
        await trio.testing.wait_all_tasks_blocked()
        (conn,) = service.connections.values()
        assert conn.peer == "?"
        nursery.cancel_scope.cancel()


async def test_a_gate_sees_the_socket_and_its_stream_is_served_under_the_sockets_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The gate (TLS, auth) gets the accepted socket and may hand back another stream, which
    has no socket of its own: the connection still carries the socket's peer name."""
    caplog.set_level(logging.INFO, logger="trioha.ha")
    gated: list[tuple[trio.abc.Stream, str]] = []

    async def wrap(stream: trio.abc.Stream, peer: str) -> trio.abc.Stream | None:
        gated.append((stream, peer))
        return DelegatingStream(stream)

    commitlog = make_log(5)
    service = HAService(config(ha_listen_host="127.0.0.1"), commitlog, accept=wrap)
    async with trio.open_nursery() as nursery:
        address = await nursery.start(service.serve)
        assert f"HA service listening on 127.0.0.1:{address[1]}" in caplog.messages
        stream = await trio.open_tcp_stream(*address)
        await stream.send_all(encode_report(0))
        with trio.fail_after(5):
            assert len(await stream.receive_some()) >= HEADER_SIZE  # served through the gate
        ((raw, peer),) = gated
        assert isinstance(raw, trio.SocketStream)
        assert peer == "{}:{}".format(*stream.socket.getsockname()[:2])
        (conn,) = service.connections.values()
        assert conn.peer == peer
        await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_waiting_for_two_streaming_slaves_is_not_satisfied_by_one(
    autojump_clock: trio.abc.Clock,
) -> None:
    service = HAService(config(), make_log(5))
    async with running(service) as nursery:
        slave = await serve_one(service, nursery)
        await slave.report(0)
        await trio.testing.wait_all_tasks_blocked()
        assert await service.wait_connections(1, deadline=trio.current_time() + 1) is True
        assert await service.wait_connections(2, deadline=trio.current_time() + 1) is False
        nursery.cancel_scope.cancel()


async def test_an_ipv6_peer_is_named_by_address_and_port(autojump_clock: trio.abc.Clock) -> None:
    service = HAService(config(), make_log(5))
    master_end, _slave_end = trio.testing.memory_stream_pair()
    stream = _NoPeer(master_end, _V6Socket())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(service.handle_stream, stream)
        await trio.testing.wait_all_tasks_blocked()
        (conn,) = service.connections.values()
        assert conn.peer == "::1:10912"
        nursery.cancel_scope.cancel()


async def test_the_logs_growth_is_forgotten_once_every_slave_holds_it(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The samples behind ``behind_seconds`` stay few while slaves keep up (memory), and a
    slave that stops is still aged from when the log first went past its ack."""
    commitlog = make_log(1)
    service = HAService(config(), commitlog)
    service.timeline = LogTimeline(commitlog.max_offset, clock=trio.current_time)
    async with running(service) as nursery:
        fast, slow = await serve_one(service, nursery), await serve_one(service, nursery)
        for slave in (fast, slow):
            await slave.report(commitlog.max_offset)
        await trio.testing.wait_all_tasks_blocked()

        async def grow(acking: tuple[FakeSlave, ...]) -> None:
            await trio.sleep(1.0)
            commitlog.append(NewMessage(topic="FooBar", body=b"y" * 10))
            service.notify_log_grew()
            for slave in acking:
                header, _ = await slave.frame()
                await slave.report(header.end)
            await trio.testing.wait_all_tasks_blocked()

        longest = 0
        for _ in range(100):
            await grow((fast, slow))
            longest = max(longest, len(service.timeline))
        assert longest <= 34  # trimmed as both acked: not 100 samples
        slow_ack = commitlog.max_offset
        for i in range(30):
            if i % 5 == 0:
                await slow.report(slow_ack)  # alive (housekeeping), but stuck
            await grow((fast,))
        (slow_stats, _) = sorted(service.statistics().slaves, key=lambda s: s.ack_offset)
        assert slow_stats.ack_offset == slow_ack
        assert slow_stats.behind_seconds == pytest.approx(29.0)  # the first growth past it
        nursery.cancel_scope.cancel()


async def test_an_ack_releases_only_the_puts_its_slave_carried(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A slave served from the last segment acks the end: the waiting put that begins there is
    answered, the one that begins before (bytes the slave never got) waits out its time."""
    commitlog = make_log(60)
    end = commitlog.max_offset
    last = end - end % SEG
    service = HAService(config(slave_timeout=1000), commitlog)
    async with running(service) as nursery:
        slave = await serve_one(service, nursery)
        await slave.report(0)
        while (await slave.frame())[0].end < end:
            pass
        answers: dict[str, tuple[PutStatus, float]] = {}

        async def put(name: str, start: int) -> None:
            status = await service.wait_replicated(end, start=start)
            answers[name] = (status, trio.current_time())

        nursery.start_soon(put, "older", last - 100)
        nursery.start_soon(put, "carried", last)
        await trio.testing.wait_all_tasks_blocked()
        assert answers == {}
        await slave.report(end)
        await trio.testing.wait_all_tasks_blocked()
        assert answers == {"carried": (PutStatus.PUT_OK, 0.0)}
        await trio.sleep(2.0)
        status, when = answers["older"]
        assert status is PutStatus.FLUSH_SLAVE_TIMEOUT and when == pytest.approx(1.0)
        nursery.cancel_scope.cancel()


async def test_one_unreported_slave_does_not_stand_in_for_two(
    autojump_clock: trio.abc.Clock,
) -> None:
    commitlog = make_log(5)
    service = HAService(config(in_sync_replicas=3), commitlog)
    async with running(service) as nursery:
        await serve_one(service, nursery)  # connected, not reported yet
        assert await service.wait_replicated(commitlog.max_offset) is (
            PutStatus.SLAVE_NOT_AVAILABLE
        )
        assert trio.current_time() == 0.0
        await serve_one(service, nursery)  # two of them may make it: the put waits
        assert await service.wait_replicated(commitlog.max_offset) is (
            PutStatus.FLUSH_SLAVE_TIMEOUT
        )
        nursery.cancel_scope.cancel()


async def test_by_default_a_put_counts_only_slaves_served_from_the_logs_start(
    autojump_clock: trio.abc.Clock,
) -> None:
    commitlog = make_log(5)
    end = commitlog.max_offset
    service = HAService(config(slave_timeout=1000), commitlog)
    async with running(service) as nursery:
        slave = await serve_one(service, nursery)
        await slave.report(1)  # served from offset 1: it never held byte 0
        while (await slave.frame())[0].end < end:
            pass
        await slave.report(end)
        await trio.testing.wait_all_tasks_blocked()
        assert await service.wait_replicated(end, start=1) is PutStatus.PUT_OK
        assert await service.wait_replicated(end) is PutStatus.FLUSH_SLAVE_TIMEOUT
        nursery.cancel_scope.cancel()


async def test_a_closed_connection_is_not_kept_alive_by_the_service(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Nothing of a departed slave stays behind (its acks least of all): a master that sees
    many reconnects does not grow."""
    commitlog = make_log(5)
    service = HAService(config(), commitlog)
    async with running(service) as nursery:
        slave = await serve_one(service, nursery)
        await slave.report(0)
        await trio.testing.wait_all_tasks_blocked()
        (conn,) = service.connections.values()
        gone = weakref.ref(conn)
        del conn
        await slave.stream.aclose()
        await trio.testing.wait_all_tasks_blocked()
        gc.collect()
        assert gone() is None
        nursery.cancel_scope.cancel()


async def test_frames_are_cut_at_the_configured_batch_size(autojump_clock: trio.abc.Clock) -> None:
    commitlog = make_log(20)
    service = HAService(config(ha_transfer_batch_size=1000), commitlog)
    async with running(service) as nursery:
        slave = await serve_one(service, nursery)
        await slave.report(0)
        header, body = await slave.frame()
        assert (header.offset, header.size, len(body)) == (0, 1000, 1000)
        nursery.cancel_scope.cancel()
