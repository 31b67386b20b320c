"""Idle and hostile connections on the remoting ports, over real sockets on 127.0.0.1.

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
from trioha.namesrv._processor import serve_namesrv
from trioha.remoting._codec import RemotingCommand, encode
from trioha.remoting._connection import RejectAllRequests
from trioha.remoting._server import ConnectionCounters, serve_remoting


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
                    idle_timeout=120,
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
        assert 120 <= closed_at["half-open"] < 125
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
                idle_timeout=120,
                max_connections=cap,
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
