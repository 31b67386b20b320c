"""What a remoting server allows its peers: the frame deadline and the connection reserve.

The rules alone (``trioha.remoting._limits``), a connection's reader on memory streams under
the mock clock, and a server on real sockets from two loopback addresses (127.0.0.1 and
127.0.0.2), the mock clock jumping only once the sockets are quiet.
"""

from __future__ import annotations

import logging
import struct

import pytest
import trio
import trio.testing

from trioha.remoting import (
    ConnectionCounters,
    ConnectionReserve,
    FrameDeadline,
    RemotingCommand,
    ServerLimits,
    encode,
    serve_remoting,
)
from trioha.remoting._codec import FrameDecoder
from trioha.remoting._connection import NoBursts, RejectAllRequests, RemotingConnection
from trioha.remoting._limits import Admission, SlowFrame, ThrottledLog, address_key

MIB = 1 << 20


# --- the rules ---------------------------------------------------------------------------


def test_a_frame_gets_a_base_time_plus_time_for_its_size() -> None:
    deadline = FrameDeadline(base=10, min_rate=65536)
    assert deadline.seconds_for(0) == 10  # the length prefix is not complete yet
    assert deadline.seconds_for(MIB) == 10 + 16
    assert deadline.seconds_for(16 * MIB) == 10 + 256
    with pytest.raises(ValueError, match="min_rate"):
        FrameDeadline(base=10, min_rate=0)


def test_the_decoder_tells_the_size_of_the_frame_under_way() -> None:
    decoder = FrameDecoder()
    sizes: list[int | None] = [decoder.partial_frame_size]
    frame = encode(RemotingCommand.request(1, {"k": "v"}))
    for chunk in (frame[:2], frame[2:5], frame[5:]):
        decoder.receive_data(chunk)
        sizes.append(decoder.partial_frame_size)
    assert sizes == [None, 0, len(frame), len(frame)]  # complete, until taken out
    assert len(list(decoder.commands())) == 1
    assert decoder.partial_frame_size is None


@pytest.mark.parametrize(
    ("open_connections", "held", "expected"),
    [
        (0, 50, Admission.ACCEPT),  # an empty port refuses nobody, however many one holds
        (89, 50, Admission.ACCEPT),  # below the reserve
        (90, 3, Admission.ACCEPT),  # in the reserve: an address holding few gets in
        (90, 4, Admission.RESERVED),  # ... one holding many does not
        (99, 0, Admission.ACCEPT),
        (100, 0, Admission.FULL),
    ],
)
def test_the_reserve_keeps_the_last_slots_for_addresses_holding_few(
    open_connections: int, held: int, expected: Admission
) -> None:
    reserve = ConnectionReserve(percent=10, max_per_address=4)
    assert reserve.slots(100) == 10
    assert reserve.admit(open_connections, 100, held) is expected


def test_a_reserve_is_rounded_up_but_never_the_whole_cap() -> None:
    assert ConnectionReserve(percent=10).slots(5) == 1
    assert ConnectionReserve(percent=100).slots(5) == 4
    assert ConnectionReserve(percent=0).slots(5) == 0
    assert ConnectionReserve(percent=0).admit(4, 5, held=1000) is Admission.ACCEPT
    with pytest.raises(ValueError, match=r"0\.\.100"):
        ConnectionReserve(percent=101)


def test_addresses_count_by_host_and_ipv6_by_its_64_network() -> None:
    assert address_key("10.0.0.7") == "10.0.0.7"
    assert address_key("::ffff:10.0.0.7") == "10.0.0.7"
    assert address_key("2001:db8:1:2:aaaa::1") == address_key("2001:db8:1:2:bbbb::9")
    assert address_key("2001:db8:1:2:aaaa::1") == "2001:db8:1:2::/64"
    assert address_key("2001:db8:1:3::1") != address_key("2001:db8:1:2::1")
    assert address_key("fe80::1%eth0") == "fe80::/64"
    assert address_key("<stream>") == "<stream>"


def test_a_throttled_log_says_once_a_minute_what_it_held_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    throttled = ThrottledLog(logging.getLogger("test.throttled"), interval=60)
    logged = [throttled.log(logging.WARNING, t, "slow %s", t) for t in (0, 1, 30, 59.9, 60, 61)]
    assert logged == [True, False, False, False, True, False]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["slow 0", "slow 60 (and 3 more like it since the last such line, not logged)"]


# --- the deadline on a connection -----------------------------------------------------------


class _Held(NoBursts):
    """Answers code 1 at once; code 2 only after ``hold`` seconds (back pressure)."""

    def __init__(self, hold: float = 0.0) -> None:
        self.hold = hold
        self.seen: list[int] = []

    async def handle_request(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand | None:
        self.seen.append(request.int_field("n"))
        if request.code == 2:
            await trio.sleep(self.hold)
        return request.response(0)


def _serve(
    handler: _Held, deadline: FrameDeadline, *, max_in_flight: int = 1024
) -> tuple[RemotingConnection, trio.abc.Stream]:
    """A server-side connection (call its ``run``) and the client's end of its stream."""
    server_side, client_side = trio.testing.memory_stream_pair()
    connection = RemotingConnection(
        server_side,
        peer="client",
        handler=handler,
        frame_deadline=deadline,
        max_in_flight=max_in_flight,
    )
    return connection, client_side


async def test_a_trickled_frame_is_closed_at_its_deadline(autojump_clock: trio.abc.Clock) -> None:
    """The slowloris: a 1 MiB length prefix, then one byte every 3 s."""
    connection, client = _serve(_Held(), FrameDeadline(base=10, min_rate=65536))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection.run)
        start = trio.current_time()
        await client.send_all(struct.pack(">i", MIB - 4))
        sent = 4
        while not connection.closed:
            await trio.sleep(3)
            try:
                await client.send_all(b"\x00")
            except trio.BrokenResourceError:
                break
            sent += 1
        took = trio.current_time() - start
    assert 26 <= took < 29  # 10 s + 1 MiB at 64 KiB/s, give or take one byte's wait
    slow = connection.slow_frame
    assert isinstance(slow, SlowFrame)
    assert slow.size == MIB and slow.received == sent and 26 <= slow.seconds < 27
    assert "a frame of 1048576 bytes still incomplete after 26" in (connection.close_reason or "")


async def test_a_trickled_length_prefix_gets_the_base_time(autojump_clock: trio.abc.Clock) -> None:
    connection, client = _serve(_Held(), FrameDeadline(base=10, min_rate=65536))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection.run)
        start = trio.current_time()
        for _ in range(3):
            await client.send_all(b"\x00")
            await trio.sleep(3)
        await connection.wait_closed()
    assert trio.current_time() - start == pytest.approx(10)
    slow = connection.slow_frame
    assert slow is not None
    assert (slow.size, slow.received) == (0, 3)
    assert slow.seconds == pytest.approx(10)


async def test_slow_frames_within_their_deadline_are_served(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Each frame arrives one byte a second; every frame is in time, so the connection lives
    however long all of them take together."""
    handler = _Held()
    connection, client = _serve(handler, FrameDeadline(base=10, min_rate=1))
    answers = FrameDecoder()
    opaques: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection.run)
        start = trio.current_time()
        for n in range(3):  # each frame has 10 s + its size at 1 B/s; it takes its size in s
            for byte in encode(RemotingCommand.request(1, {"n": n}).with_opaque(n + 1)):
                await client.send_all(bytes([byte]))
                await trio.sleep(1)
        assert trio.current_time() - start > 3 * 10  # longer than any frame's base time
        while len(opaques) < 3:
            with trio.fail_after(10):
                answers.receive_data(await client.receive_some())
            opaques += [response.opaque for response in answers.commands()]
        assert not connection.closed
        connection.close()
    assert handler.seen == [0, 1, 2]
    assert opaques == [1, 2, 3]
    assert connection.slow_frame is None


async def test_time_the_server_holds_back_is_not_the_peers(autojump_clock: trio.abc.Clock) -> None:
    """A frame whose bytes wait while the server's reader is held back (MAX_IN_FLIGHT) is
    not late: only the reader's waits for the peer count."""
    handler = _Held(hold=100)
    connection, client = _serve(handler, FrameDeadline(base=10, min_rate=65536), max_in_flight=1)
    first = encode(RemotingCommand.request(2, {"n": 1}).with_opaque(1))  # held 100 s
    second = encode(RemotingCommand.request(1, {"n": 2}).with_opaque(2))  # waits for a slot
    third = encode(RemotingCommand.request(1, {"n": 3}).with_opaque(3))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection.run)
        await client.send_all(first)
        await trio.sleep(1)
        await client.send_all(second + third[:10])  # the third begins; the reader then waits
        await trio.sleep(1)
        await client.send_all(third[10:])  # ... 100 s, holding it, before it reads this
        with trio.fail_after(200):
            while len(handler.seen) < 3:  # noqa: ASYNC110 - the handler is the test's own fake
                await trio.sleep(1)
        connection.close()
    assert handler.seen == [1, 2, 3]
    assert connection.slow_frame is None


# --- the server: reserve and deadline on real sockets -------------------------------------------


async def _start_server(
    nursery: trio.Nursery, limits: ServerLimits, counters: ConnectionCounters
) -> tuple[str, int]:
    """A server on 127.0.0.1 answering every request "not supported"; its address."""
    address: tuple[str, int] = await nursery.start(
        lambda task_status: serve_remoting(
            RejectAllRequests(),
            "127.0.0.1",
            0,
            limits=limits,
            counters=counters,
            task_status=task_status,
        )
    )
    return address


async def _request(stream: trio.SocketStream, opaque: int) -> int:
    """Send one request; the response's code (RejectAllRequests: not supported)."""
    await stream.send_all(encode(RemotingCommand.request(999, {}).with_opaque(opaque)))
    decoder = FrameDecoder()
    while (response := decoder.next_command()) is None:
        chunk = await stream.receive_some(4096)
        assert chunk, "closed by the server"
        decoder.receive_data(chunk)
    return response.code


async def _closed_at_once(stream: trio.SocketStream) -> bool:
    try:
        with trio.fail_after(1):
            return await stream.receive_some(4096) == b""
    except trio.BrokenResourceError:
        return True


async def test_one_address_cannot_take_the_reserved_slots(
    mock_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    mock_clock.autojump_threshold = 0.02
    counters = ConnectionCounters()
    limits = ServerLimits(
        idle_timeout=1000,
        max_connections=10,
        reserve=ConnectionReserve(percent=20, max_per_address=2),  # 2 slots kept
    )
    async with trio.open_nursery() as nursery:
        host, port = await _start_server(nursery, limits, counters)
        hoard = [
            await trio.open_tcp_stream(host, port, local_address="127.0.0.2") for _ in range(8)
        ]
        for n, stream in enumerate(hoard):  # all 8 served: the port is not near full yet
            assert await _request(stream, n + 1) != 0
        assert counters.by_address == {"127.0.0.2": 8}
        refused = [
            await trio.open_tcp_stream(host, port, local_address="127.0.0.2") for _ in range(5)
        ]
        for stream in refused:
            assert await _closed_at_once(stream)
        assert (counters.refused, counters.reserve_refused) == (5, 5)
        # Others still get in, up to the cap.
        mine = [await trio.open_tcp_stream(host, port) for _ in range(2)]
        for n, stream in enumerate(mine):
            assert await _request(stream, 100 + n) != 0
        assert counters.by_address == {"127.0.0.2": 8, "127.0.0.1": 2}
        full = await trio.open_tcp_stream(host, port, local_address="127.0.0.3")
        assert await _closed_at_once(full)
        assert (counters.refused, counters.reserve_refused, counters.open) == (6, 5, 10)
        # The hoarder's refusals: one WARNING, and the next only a minute later, with a count.
        await mine.pop().aclose()
        with trio.fail_after(5):
            while counters.open == 10:  # noqa: ASYNC110
                await trio.sleep(0.01)
        await trio.sleep(61)
        late = await trio.open_tcp_stream(host, port, local_address="127.0.0.2")
        assert await _closed_at_once(late)
        assert (counters.refused, counters.reserve_refused) == (7, 6)
        for stream in [*hoard, *mine, *refused, full, late]:
            await stream.aclose()
        with trio.fail_after(5):
            while counters.open:  # noqa: ASYNC110
                await trio.sleep(0.01)
        assert counters.by_address == {}
        nursery.cancel_scope.cancel()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    reserve_lines = [line for line in warnings if "refused a connection from 127.0.0.2" in line]
    assert len(reserve_lines) == 2
    assert reserve_lines[0].startswith(f"127.0.0.1:{port} refused a connection from 127.0.0.2")
    assert "which holds 8 of its 8 connections" in reserve_lines[0]
    assert "the last 2 of serverMaxConnections (10)" in reserve_lines[0]
    assert "which holds 8 of its 9 connections" in reserve_lines[1]
    assert "4 more like it" in reserve_lines[1]  # the other four of the first five
    assert len([line for line in warnings if "its cap (serverMaxConnections)" in line]) == 1


async def test_slow_frames_are_closed_and_logged_once_a_minute(
    mock_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    mock_clock.autojump_threshold = 0.02
    counters = ConnectionCounters()
    limits = ServerLimits(idle_timeout=120, frame_deadline=FrameDeadline(base=5, min_rate=65536))
    async with trio.open_nursery() as nursery:
        host, port = await _start_server(nursery, limits, counters)
        start = trio.current_time()
        slow = [await trio.open_tcp_stream(host, port) for _ in range(6)]
        for stream in slow:
            await stream.send_all(struct.pack(">i", MIB - 4) + b"\x00")
        for stream in slow:
            with trio.fail_after(60):
                assert await stream.receive_some(4096) == b""
            await stream.aclose()
        assert 21 <= trio.current_time() - start < 22  # 5 s + 1 MiB at 64 KiB/s
        assert counters.slow_frame_closed == 6
        fine = await trio.open_tcp_stream(host, port)
        assert await _request(fine, 1) != 0
        await fine.aclose()
        nursery.cancel_scope.cancel()
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1
    assert "a frame of 1048576 bytes still incomplete after 21" in lines[0]
    assert "serverFrameTimeoutSeconds" in lines[0]
