"""Idle and hostile connections on the remoting ports, over real sockets on 127.0.0.1 (and
127.0.0.2, for a second client address).

RocketMQ closes a client channel that has neither read nor written for
``serverChannelMaxIdleTimeSeconds`` (120 s; ``NettyRemotingServer``'s ``IdleStateHandler``).
trioha does that on the broker and name server ports, and also caps how many connections a
port holds, so that a connect storm cannot take the process near its open-file limit.
"""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

import pytest
import trio
import trio.testing

from tests.test_broker import master_config
from trioha.broker import open_broker
from trioha.namesrv import serve_namesrv
from trioha.remoting import ConnectionCounters, ServerLimits, open_client_pool, serve_remoting
from trioha.remoting._codec import RemotingCommand, encode
from trioha.remoting._connection import RejectAllRequests
from trioha.remoting._mqclient import runtime_info, send_message


async def closed_by_server(stream: trio.SocketStream) -> bool:
    """Read until EOF (True) or a reset; anything the server sends first is skipped."""
    try:
        while await stream.receive_some(4096):
            pass
    except trio.BrokenResourceError:
        pass
    return True


async def answered(stream: trio.SocketStream) -> bool:
    """Send one request and read its (whole) response frame header."""
    await stream.send_all(encode(RemotingCommand.request(999, {}).with_opaque(7)))
    data = b""
    while len(data) < 4:
        chunk = await stream.receive_some(4096)
        if not chunk:
            return False
        data += chunk
    length: int = struct.unpack(">i", data[:4])[0]
    return length > 0


@pytest.mark.parametrize("port_kind", ["broker", "namesrv"])
async def test_idle_connections_are_closed_after_120_seconds(
    mock_clock: trio.testing.MockClock, port_kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    mock_clock.autojump_threshold = 0.02  # jump only once the real sockets are quiet too
    counters = ConnectionCounters()
    async with trio.open_nursery() as nursery:
        if port_kind == "broker":
            host, port = await nursery.start(
                lambda task_status: serve_remoting(
                    RejectAllRequests(),
                    "127.0.0.1",
                    0,
                    limits=ServerLimits(idle_timeout=120),
                    counters=counters,
                    task_status=task_status,
                )
            )
        else:
            host, port = await nursery.start(serve_namesrv, "127.0.0.1", 0)
        start = trio.current_time()
        idle = await trio.open_tcp_stream(host, port)
        half_open = await trio.open_tcp_stream(host, port)
        await half_open.send_all(b"\x00\x00\x01\x00")  # a frame length, then nothing more
        busy = await trio.open_tcp_stream(host, port)
        closed_at: dict[str, float] = {}

        async def watch(name: str, stream: trio.SocketStream) -> None:
            await closed_by_server(stream)
            closed_at[name] = trio.current_time() - start

        nursery.start_soon(watch, "idle", idle)
        nursery.start_soon(watch, "half-open", half_open)
        for _ in range(4):  # a request every 60 s keeps a connection open
            await trio.sleep(60)
            assert await answered(busy)
        assert 120 <= closed_at["idle"] < 125
        if port_kind == "broker":  # the idle timeout alone
            assert 120 <= closed_at["half-open"] < 125
        else:  # a name server's frame deadline is first: 10 s + 260 bytes at 64 KiB/s
            assert 10 <= closed_at["half-open"] < 11
        assert "busy" not in closed_at
        nursery.cancel_scope.cancel()
    if port_kind == "broker":
        assert counters.idle_closed == 2
    assert any("serverChannelMaxIdleTimeSeconds" in r.getMessage() for r in caplog.records)


async def test_the_broker_port_closes_idle_connections_at_its_setting(tmp_path: Path) -> None:
    config = master_config(tmp_path, server_channel_max_idle_time_seconds=1)
    async with open_broker(config) as broker:
        assert broker.client_side is not None
        host, port = broker.client_side.broker_addr.rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        with trio.fail_after(5):
            assert await closed_by_server(stream)
        assert broker.client_side.connections.idle_closed == 1


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_a_connect_storm_is_capped_far_from_the_fd_limit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    cap, storm = 50, 400
    counters = ConnectionCounters()
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(
            lambda task_status: serve_remoting(
                RejectAllRequests(),
                "127.0.0.1",
                0,
                limits=ServerLimits(idle_timeout=120, max_connections=cap),
                counters=counters,
                task_status=task_status,
            )
        )
        before = open_fds()
        clients: list[trio.SocketStream] = []

        async def connect() -> None:
            clients.append(await trio.open_tcp_stream(host, port))

        with trio.fail_after(20):
            async with trio.open_nursery() as storm_nursery:
                for _ in range(storm):
                    storm_nursery.start_soon(connect)
            while counters.accepted + counters.refused < storm:  # noqa: ASYNC110
                await trio.sleep(0.01)
        # The server holds no more than its cap; the rest are the storm's own sockets.
        assert counters.open == cap and counters.refused == storm - cap
        assert open_fds() - before <= storm + cap + 10
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "serverMaxConnections" in warnings[0].getMessage()

        for client in clients:
            await client.aclose()
        with trio.fail_after(10):
            while counters.open:  # noqa: ASYNC110
                await trio.sleep(0.01)
        assert not counters.capped
        assert any("accepts connections again" in r.getMessage() for r in caplog.records)
        fresh = await trio.open_tcp_stream(host, port)
        with trio.fail_after(5):
            assert await answered(fresh)
        await fresh.aclose()
        nursery.cancel_scope.cancel()


MIB = 1 << 20


async def test_a_slowloris_does_not_lock_a_producer_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The attack of issue 24, scaled down: from 127.0.0.2, as many connections as the broker
    port takes, each sending a 1 MiB length prefix and then one byte every 0.5 s, reconnecting
    whenever closed. A producer on 127.0.0.1 sends all the while and gets SEND_OK every time:
    the reserve keeps its slot, and the frame deadline closes the hoarded connections."""
    caplog.set_level(logging.INFO)
    cap = 8
    config = master_config(
        tmp_path,
        listen_port=0,
        server_max_connections=cap,
        server_connection_reserve_percent=25,  # 2 of the 8 kept for addresses holding few
        server_frame_timeout_seconds=1,
        server_frame_min_bytes_per_second=MIB,  # a 1 MiB frame has 2 s
    )
    attempts = 0
    statuses: list[str] = []
    async with open_broker(config) as broker, open_client_pool() as pool:
        side = broker.client_side
        assert side is not None
        host, port = side.broker_addr.rsplit(":", 1)
        stop = trio.Event()

        async def slowloris() -> None:
            nonlocal attempts
            while not stop.is_set():
                attempts += 1
                stream = await trio.open_tcp_stream(host, int(port), local_address="127.0.0.2")
                try:
                    await stream.send_all(struct.pack(">i", MIB - 4))
                    while not stop.is_set():
                        await trio.sleep(0.5)
                        await stream.send_all(b"\x00")
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    await trio.sleep(0.05)
                finally:
                    await stream.aclose()

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for _ in range(cap + 2):
                    nursery.start_soon(slowloris)
                await trio.sleep(0.5)  # the attack holds what it can before the producer starts
                for n in range(10):
                    result = await send_message(
                        pool, side.broker_addr, topic="T", body=b"m%d" % n, queue_id=0
                    )
                    statuses.append(result.status)
                    await trio.sleep(0.5)
                stop.set()
        counters = side.connections
        assert statuses == ["SEND_OK"] * 10
        assert counters.reserve_refused > 0  # the attack was refused the reserved slots ...
        assert counters.slow_frame_closed >= cap - 2  # ... and lost what it held, in 2 s
        assert attempts > cap + 2
        info = await runtime_info(pool, side.broker_addr)
        assert int(info["connectionsSlowFrameClosed"]) == counters.slow_frame_closed
        assert int(info["connectionsReserveRefused"]) == counters.reserve_refused
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    # Each kind logged once (a minute apart at most), not once per connection.
    assert len([w for w in warnings if "still incomplete" in w]) == 1
    assert len([w for w in warnings if "refused a connection from 127.0.0.2" in w]) == 1
