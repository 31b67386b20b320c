"""What the HA service and client report about themselves, and serving over real sockets.

``statistics()`` is what an operator (and ``trioha status``) reads; every field is pinned here
against what a short replication run did. The last tests run the real listener and the real
TCP connector on 127.0.0.1 with port 0.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import trio
import trio.testing

from trioha import BrokerConfig, ConfigError
from trioha.net import HAClient, HAService, Wakeup
from trioha.proto import HEADER_SIZE, encode_report
from trioha.store import EpochFile, MemoryCommitLog, NewMessage, SentOffsets

SEG = 4096


def make_log(messages: int) -> MemoryCommitLog:
    log = MemoryCommitLog(segment_size=SEG)
    for i in range(messages):
        log.append(NewMessage(topic="Stats", body=b"s" * 100, queue_id=i % 2))
    return log


def config(**changes: object) -> BrokerConfig:
    return BrokerConfig(ha_listen_port=0, mapped_file_size_commit_log=SEG).evolve(**changes)


async def test_service_statistics_follow_one_slave(autojump_clock: trio.abc.Clock) -> None:
    master_log = make_log(10)
    service = HAService(config(), master_log)
    empty = service.statistics()
    assert empty.address is None
    assert empty.slaves == ()
    assert empty.replicated_offset == -1
    assert (empty.waiting_puts, empty.connections_accepted, empty.connections_closed) == (0, 0, 0)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.time_out_puts)
        master_end, slave_end = trio.testing.memory_stream_pair()
        nursery.start_soon(service.handle_stream, master_end, "10.0.0.7:4321")
        await trio.testing.wait_all_tasks_blocked()
        (before,) = service.statistics().slaves
        assert before.peer == "10.0.0.7:4321"
        assert before.ack_offset == -1
        assert before.lag == master_log.max_offset  # nothing acked yet: all of it
        assert (before.bytes_sent, before.frames_sent, before.heartbeats_sent) == (0, 0, 0)
        await slave_end.send_all(encode_report(0))
        await trio.testing.wait_all_tasks_blocked()
        received = len(await slave_end.receive_some())
        await trio.sleep(7.0)  # one heartbeat interval passes (5 s)
        received += len(await slave_end.receive_some())
        half = master_log.max_offset // 2
        await slave_end.send_all(encode_report(half))
        await trio.testing.wait_all_tasks_blocked()
        answers: list[object] = []

        async def wait() -> None:  # a sync put waiting for the rest
            answers.append(await service.wait_replicated(master_log.max_offset))

        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        stats = service.statistics()
        (slave,) = stats.slaves
        assert slave.ack_offset == half
        assert slave.lag == master_log.max_offset - half
        assert slave.frames_sent == 1  # the whole log in one frame (one segment, < batch)
        assert slave.heartbeats_sent == 1
        assert slave.bytes_sent == received == 2 * HEADER_SIZE + master_log.max_offset
        assert slave.connected_seconds == pytest.approx(7.0)
        assert stats.replicated_offset == half
        assert stats.waiting_puts == 1
        assert (stats.connections_accepted, stats.connections_closed) == (1, 0)
        await slave_end.send_all(encode_report(master_log.max_offset))
        await trio.testing.wait_all_tasks_blocked()
        assert service.statistics().waiting_puts == 0
        assert len(answers) == 1
        await slave_end.aclose()
        assert await service.wait_no_connections(trio.current_time() + 30)
        final = service.statistics()
        assert final.slaves == ()
        assert (final.connections_accepted, final.connections_closed) == (1, 1)
        assert final.replicated_offset == -1
        nursery.cancel_scope.cancel()


async def test_client_statistics_and_waits(autojump_clock: trio.abc.Clock) -> None:
    master_log = make_log(5)
    slave_log = MemoryCommitLog(segment_size=SEG)
    cfg = config(ha_master_address="192.0.2.1:10912", ha_sync_from_oldest=True)
    service = HAService(cfg, master_log)
    appended = Wakeup()
    masters: list[trio.abc.Stream] = []

    async def connect(host: str, port: int) -> trio.abc.Stream:
        assert (host, port) == ("192.0.2.1", 10912)
        master_end, slave_end = trio.testing.memory_stream_pair()
        masters.append(master_end)
        nursery.start_soon(service.handle_stream, master_end, "slave")
        return slave_end

    client = HAClient(cfg, slave_log, connect=connect, on_appended=appended.notify)
    first = client.statistics()
    assert first.master == "192.0.2.1:10912" == client.master
    assert (first.connected, first.reported_offset, first.bytes_received, first.connects) == (
        False,
        -1,
        0,
        0,
    )
    assert first.last_close_reason is None
    async with trio.open_nursery() as nursery:
        assert not await client.wait_connected(trio.current_time())  # not yet
        await nursery.start(client.run)
        assert await client.wait_connected(trio.current_time() + 10)
        assert await service.wait_connections(1, trio.current_time() + 10)
        with trio.fail_after(10):
            while slave_log.max_offset < master_log.max_offset:
                await appended.wait()
        await trio.testing.wait_all_tasks_blocked()
        stats = client.statistics()
        assert stats.connected
        assert stats.connects == 1
        assert stats.reported_offset == master_log.max_offset
        assert stats.bytes_received == HEADER_SIZE + master_log.max_offset  # as they arrive
        await masters[0].aclose()
        assert await client.wait_connected(trio.current_time() + 10, connects=2)
        stats = client.statistics()
        assert stats.connects == 2
        assert stats.bytes_received == HEADER_SIZE + master_log.max_offset
        assert stats.last_close_reason == "master closed the connection"
        assert not await service.wait_connections(5, trio.current_time() + 1)
        nursery.cancel_scope.cancel()


async def test_serve_on_a_real_port_with_the_real_connector() -> None:
    """127.0.0.1, port 0: the listener reports its address; the slave connects over TCP."""
    master_log = make_log(20)
    service = HAService(config(ha_listen_host="127.0.0.1"), master_log)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(service.serve)
            assert host == "127.0.0.1" and port > 0
            assert service.statistics().address == (host, port)
            slave_log = MemoryCommitLog(segment_size=SEG)
            appended = Wakeup()
            client = HAClient(
                config(ha_master_address=f"127.0.0.1:{port}"),
                slave_log,
                on_appended=appended.notify,
            )
            await nursery.start(client.run)
            assert await service.wait_connections(1)
            (slave,) = service.statistics().slaves
            peer_host, _, peer_port = slave.peer.rpartition(":")
            assert peer_host == "127.0.0.1" and int(peer_port) > 0
            # A report of 0 is served from the start of the master's last segment.
            last_segment = master_log.max_offset - master_log.max_offset % SEG
            while slave_log.max_offset < master_log.max_offset:
                await appended.wait()
            assert slave_log.min_offset == last_segment
            nursery.cancel_scope.cancel()


async def test_serving_on_a_port_in_use_is_a_config_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        service = HAService(config(ha_listen_host="127.0.0.1", ha_listen_port=port), make_log(1))
        with pytest.raises(ConfigError, match=f"cannot listen for slaves on 127.0.0.1:{port}"):
            await service.serve()


async def test_a_stream_without_a_socket_is_named_by_a_question_mark(
    autojump_clock: trio.abc.Clock,
) -> None:
    service = HAService(config(), make_log(1))
    async with trio.open_nursery() as nursery:
        master_end, _slave_end = trio.testing.memory_stream_pair()
        nursery.start_soon(service.handle_stream, master_end)
        await trio.testing.wait_all_tasks_blocked()
        assert [s.peer for s in service.statistics().slaves] == ["?"]
        nursery.cancel_scope.cancel()


def test_seconds_behind_is_zero_when_caught_up_else_the_age_of_the_last_message() -> None:
    """MySQL's Seconds_Behind_Master, from the store timestamp of the last whole message."""
    t0 = 1_700_000_000_000  # the master's clock, in ms, when the first message was put
    master = MemoryCommitLog(segment_size=SEG)
    offsets = [
        master.append(
            NewMessage(topic="T", body=b"x" * 100, store_timestamp=t0 + 1000 * i)
        ).physical_offset
        for i in range(5)
    ]
    slave_log = MemoryCommitLog(segment_size=SEG)
    now = [t0 / 1000 + 10]
    client = HAClient(
        config(ha_master_address="192.0.2.1:10912"), slave_log, wall_clock=lambda: now[0]
    )
    assert client.statistics().behind_seconds is None  # the master's end is not known yet
    client.learn_master_end(master.max_offset)
    assert client.statistics().behind_seconds is None  # no whole message to date it by
    slave_log.append_raw(0, master.read(0, offsets[3] + 50))  # mid-way through the fourth
    stats = client.statistics()
    assert stats.behind_bytes == master.max_offset - offsets[3] - 50
    assert stats.behind_seconds == pytest.approx(8.0)  # the third was put 2 s after t0
    now[0] += 5
    assert client.statistics().behind_seconds == pytest.approx(13.0)  # it grows while stuck
    slave_log.append_raw(slave_log.max_offset, master.read(slave_log.max_offset, SEG))
    assert client.statistics().behind_seconds == 0.0  # caught up with the master's known end
    master.append(NewMessage(topic="T", body=b"y", store_timestamp=t0 + 14_000))
    client.learn_master_end(master.max_offset)
    assert client.statistics().behind_seconds == pytest.approx(11.0)  # now: t0 + 15 s
    now[0] -= 60  # a clock behind the master's: never negative
    assert client.statistics().behind_seconds == 0.0


async def test_service_statistics_name_the_epoch_and_the_lost_ranges(tmp_path: Path) -> None:
    master_log = make_log(10)
    epochs = EpochFile.open(tmp_path / "epochs")
    epochs.append(1, 0)
    epochs.append(2, 200)
    epochs.append(3, 500)
    sent = SentOffsets(tmp_path / "sent")
    sent.lost = ((700, 900), (1200, 1300))
    epoch_mode = HAService(
        config(enable_controller_mode=True), master_log, sent=sent, epoch_file=epochs
    )
    stats = epoch_mode.statistics()
    assert (stats.epoch, stats.epoch_start) == (3, 500)  # the current epoch, not the first
    assert stats.lost_ranges == ((700, 900), (1200, 1300))
    # Classic mode ignores an epoch file it is handed; so does an empty history.
    classic = HAService(config(), master_log, epoch_file=epochs).statistics()
    assert (classic.epoch, classic.epoch_start, classic.lost_ranges) == (-1, -1, ())
    empty = EpochFile.open(tmp_path / "empty")
    fresh = HAService(config(enable_controller_mode=True), master_log, epoch_file=empty)
    assert (fresh.statistics().epoch, fresh.statistics().epoch_start) == (-1, -1)


async def test_seconds_behind_is_known_from_a_slaves_first_report(
    autojump_clock: trio.abc.Clock,
) -> None:
    master_log = make_log(10)
    service = HAService(config(), master_log)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.time_out_puts)
        await trio.sleep(4.0)
        master_end, slave_end = trio.testing.memory_stream_pair()
        nursery.start_soon(service.handle_stream, master_end, "slave")
        await trio.sleep(1.5)
        (silent,) = service.statistics().slaves
        assert silent.behind_seconds is None  # nothing reported: nothing to date
        assert silent.connected_seconds == pytest.approx(1.5)  # since it connected, not since 0
        await slave_end.send_all(encode_report(0))  # an empty slave: all of the log to go
        await trio.testing.wait_all_tasks_blocked()
        (empty,) = service.statistics().slaves
        assert (empty.ack_offset, empty.lag) == (0, master_log.max_offset)
        assert empty.behind_seconds is not None and empty.behind_seconds >= 0.0
        await slave_end.send_all(encode_report(master_log.max_offset))
        await trio.testing.wait_all_tasks_blocked()
        (caught_up,) = service.statistics().slaves
        assert (caught_up.lag, caught_up.behind_seconds) == (0, 0.0)
        nursery.cancel_scope.cancel()
