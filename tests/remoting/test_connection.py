"""RemotingConnection, the server and the client: matching, oneway, errors, hostile peers."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

import pytest
import trio
import trio.testing

from trioha import RemotingError
from trioha.remoting._client import RemotingClientPool, open_client_pool, open_remoting_client
from trioha.remoting._codec import FrameDecoder, HeaderError, RemotingCommand, encode
from trioha.remoting._connection import NO_RESPONSE, Burst, NoBursts, RemotingConnection
from trioha.remoting._server import serve_remoting


class Echo(NoBursts):
    """Answers code 1 with the body reversed after ``delay``; code 2 raises; 3 waits forever."""

    def __init__(self) -> None:
        self.oneways: list[RemotingCommand] = []

    async def handle_request(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand | None:
        if request.is_oneway:
            self.oneways.append(request)
            return None
        if request.code == 1:
            await trio.sleep(request.int_field("delay", 0) / 1000)
            return request.response(0, body=request.body[::-1])
        if request.code == 2:
            raise RuntimeError("processor bug")
        if request.code == 4:
            raise HeaderError("the custom field <topic> is null")
        await trio.sleep_forever()


async def test_responses_match_requests_out_of_order(autojump_clock: trio.abc.Clock) -> None:
    a, b = trio.testing.memory_stream_pair()
    server = RemotingConnection(a, peer="client", handler=Echo())
    client = RemotingConnection(b, peer="server")
    results: dict[bytes, bytes] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.run)
        nursery.start_soon(client.run)

        async def ask(body: bytes, delay: int) -> None:
            response = await client.request(RemotingCommand.request(1, {"delay": delay}, body))
            results[body] = response.body

        async with trio.open_nursery() as asks:
            asks.start_soon(ask, b"slow", 300)
            asks.start_soon(ask, b"fast", 10)
        client.close()
    assert results == {b"slow": b"wols", b"fast": b"tsaf"}


async def test_handler_errors_become_responses(autojump_clock: trio.abc.Clock) -> None:
    a, b = trio.testing.memory_stream_pair()
    server = RemotingConnection(a, peer="client", handler=Echo())
    client = RemotingConnection(b, peer="server")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.run)
        nursery.start_soon(client.run)
        bug = await client.request(RemotingCommand.request(2))
        header = await client.request(RemotingCommand.request(4))
        ok = await client.request(RemotingCommand.request(1, body=b"ab"))
        client.close()
    assert (bug.code, bug.remark) == (1, "RuntimeError: processor bug")
    assert (header.code, header.remark) == (1, "the custom field <topic> is null")
    assert ok.body == b"ba"


async def test_oneway_gets_no_response(autojump_clock: trio.abc.Clock) -> None:
    a, b = trio.testing.memory_stream_pair()
    echo = Echo()
    server = RemotingConnection(a, peer="client", handler=echo)
    client = RemotingConnection(b, peer="server")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.run)
        nursery.start_soon(client.run)
        await client.oneway(RemotingCommand.request(1, body=b"x", oneway=True))
        await client.request(RemotingCommand.request(1, body=b"sync"))  # ordered after it
        client.close()
    assert [c.body for c in echo.oneways] == [b"x"]


async def test_timeout_then_late_response_is_dropped(autojump_clock: trio.abc.Clock) -> None:
    a, b = trio.testing.memory_stream_pair()
    server = RemotingConnection(a, peer="client", handler=Echo())
    client = RemotingConnection(b, peer="server")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.run)
        nursery.start_soon(client.run)
        with pytest.raises(trio.TooSlowError), trio.fail_after(0.1):
            await client.request(RemotingCommand.request(1, {"delay": 500}))
        await trio.sleep(1)  # the late response arrives and is dropped
        again = await client.request(RemotingCommand.request(1, body=b"ok"))
        client.close()
    assert again.body == b"ko"


async def test_pending_requests_fail_when_the_connection_closes(
    autojump_clock: trio.abc.Clock,
) -> None:
    a, b = trio.testing.memory_stream_pair()
    server = RemotingConnection(a, peer="client", handler=Echo())
    client = RemotingConnection(b, peer="server")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.run)
        nursery.start_soon(client.run)

        async def close_soon() -> None:
            await trio.sleep(1)
            server.close()

        nursery.start_soon(close_soon)
        with pytest.raises(RemotingError, match="no response") as info:
            await client.request(RemotingCommand.request(3))
        assert info.value.code == NO_RESPONSE
        with pytest.raises(RemotingError, match="closed"):
            await client.request(RemotingCommand.request(1))


async def test_hostile_frame_closes_only_that_connection(caplog: pytest.LogCaptureFixture) -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(serve_remoting, Echo(), "127.0.0.1", 0)
            assert host == "127.0.0.1"
            assert port > 0
            # A 1 GiB length prefix: the server must close without trying to buffer it.
            evil = await trio.open_tcp_stream(host, port)
            await evil.send_all(struct.pack(">i", 1 << 30) + b"junk")
            assert await evil.receive_some(10) == b""
            await evil.aclose()
            # Garbage JSON in a well-formed frame closes too.
            junk = await trio.open_tcp_stream(host, port)
            await junk.send_all(struct.pack(">ii", 8, 4) + b"{{{{")
            assert await junk.receive_some(10) == b""
            await junk.aclose()
            # The server still serves others.
            async with open_remoting_client((host, port)) as client:
                response = await client.request(RemotingCommand.request(1, body=b"abc"))
                assert response.body == b"cba"
            nursery.cancel_scope.cancel()
    assert "outside 4..16777216" in caplog.text
    assert "not valid JSON" in caplog.text


async def test_raw_socket_sees_rocketmq_frames() -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(serve_remoting, Echo(), "127.0.0.1", 0)
            stream = await trio.open_tcp_stream(host, port)
            request = RemotingCommand.request(1, body=b"xyz").with_opaque(77)
            data = encode(request)
            for i in range(len(data)):  # one byte at a time over TCP
                await stream.send_all(data[i : i + 1])
            decoder = FrameDecoder()
            response = None
            while response is None:
                decoder.receive_data(await stream.receive_some(100))
                response = decoder.next_command()
            assert (response.opaque, response.is_response, response.body) == (77, True, b"zyx")
            await stream.aclose()
            nursery.cancel_scope.cancel()


async def test_pool_reconnects_after_the_server_restarts() -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as outer, open_client_pool() as pool:
            scope = trio.CancelScope()

            async def run_server(task_status: trio.TaskStatus[tuple[str, int]]) -> None:
                with scope:
                    await serve_remoting(Echo(), host="127.0.0.1", port=0, task_status=task_status)

            address = await outer.start(run_server)
            first = await pool.request(address, RemotingCommand.request(1, body=b"12"))
            assert first.body == b"21"
            scope.cancel()
            await until_refused(pool, address)
            with pytest.raises(RemotingError, match="cannot connect"):
                await pool.request(address, RemotingCommand.request(1))


async def until_refused(pool: RemotingClientPool, address: tuple[str, int]) -> None:
    """Send until the pool notices the closed connection (bounded by the caller's fail_after)."""
    while True:
        try:
            await pool.request(address, RemotingCommand.request(1, body=b"x"))
        except RemotingError:
            return
        await trio.sleep(0.01)


async def test_connect_failure_is_a_remoting_error() -> None:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    await listener.aclose()
    with pytest.raises(RemotingError, match=f"cannot connect to 127.0.0.1:{port}"):
        async with open_remoting_client(("127.0.0.1", port)):
            pass


async def raw_server() -> tuple[trio.SocketListener, tuple[str, int]]:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    return listener, listener.socket.getsockname()[:2]


async def serve_raw(
    listener: trio.SocketListener,
    reply_for: Callable[[RemotingCommand], bytes],
    *,
    bytewise: bool = False,
) -> None:
    """Answer each request with ``reply_for(request)``, optionally one byte per send."""
    stream = await listener.accept()
    decoder = FrameDecoder()
    async with stream:
        while True:
            data = await stream.receive_some(4096)
            if not data:
                return
            decoder.receive_data(data)
            for request in decoder.commands():
                reply = reply_for(request)
                if bytewise:
                    for i in range(len(reply)):
                        await stream.send_all(reply[i : i + 1])
                else:
                    await stream.send_all(reply)


@pytest.mark.parametrize("bytewise", [False, True])
async def test_client_decodes_responses_however_they_are_split(bytewise: bool) -> None:
    """Whole, one byte at a time, and two responses in one segment (out of order)."""
    listener, address = await raw_server()
    held: list[RemotingCommand] = []

    def reply(request: RemotingCommand) -> bytes:
        if not held:  # hold the first response back ...
            held.append(request)
            return b""
        first = held.pop()  # ... and send it after the second one, in the same segment
        return b"".join(
            encode(r.response(0, f"re {r.code}", {"x": r.code}, b"body")) for r in (request, first)
        )

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: serve_raw(listener, reply, bytewise=bytewise))
            async with open_remoting_client(address) as client:
                answers: dict[int, RemotingCommand] = {}

                async def ask(code: int) -> None:
                    answers[code] = await client.request(RemotingCommand.request(code))

                async with trio.open_nursery() as asks:
                    asks.start_soon(ask, 7)
                    await trio.sleep(0.05)
                    asks.start_soon(ask, 8)
                assert {c: (a.remark, a.ext_fields, a.body) for c, a in answers.items()} == {
                    7: ("re 7", {"x": "7"}, b"body"),
                    8: ("re 8", {"x": "8"}, b"body"),
                }
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("garbage", "reason"),
    [
        (struct.pack(">i", 1 << 30), "outside 4..16777216"),
        (struct.pack(">ii", 6, 2) + b"{]", "not valid JSON"),
    ],
)
async def test_client_closes_on_a_hostile_server(garbage: bytes, reason: str) -> None:
    listener, address = await raw_server()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: serve_raw(listener, lambda request: garbage))
            async with open_remoting_client(address) as client:
                with pytest.raises(RemotingError, match=reason) as info:
                    await client.request(RemotingCommand.request(7))
                assert info.value.code == NO_RESPONSE
                assert client.closed
            nursery.cancel_scope.cancel()


class Oversized(NoBursts):
    async def handle_request(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand | None:
        return request.response(0, body=b"x" * (16 * 1024 * 1024))


async def test_a_response_too_large_to_send_becomes_an_error_response(
    autojump_clock: trio.abc.Clock,
) -> None:
    a, b = trio.testing.memory_stream_pair()
    server = RemotingConnection(a, peer="client", handler=Oversized())
    client = RemotingConnection(b, peer="server")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.run)
        nursery.start_soon(client.run)
        response = await client.request(RemotingCommand.request(1))
        assert response.code == 1
        assert "exceeds the 16777216-byte limit" in (response.remark or "")
        again = await client.request(RemotingCommand.request(1))  # still serving
        assert again.code == 1
        client.close()


class Bursty(Echo):
    """Takes every code-5 request of a read as one burst; the rest go to ``Echo``."""

    def __init__(self) -> None:
        super().__init__()
        self.bursts: list[list[int]] = []

    def take_burst(
        self, requests: Sequence[RemotingCommand], connection: RemotingConnection
    ) -> Burst | None:
        taken = [r for r in requests if r.code == 5]
        if not taken:
            return None
        self.bursts.append([r.opaque for r in taken])

        async def finish() -> list[RemotingCommand | None]:
            await trio.sleep(0.01)
            return [r.response(0, body=r.body.upper()) for r in taken]

        return Burst(taken, finish)


async def test_a_read_s_burst_is_answered_together_and_the_rest_one_by_one(
    autojump_clock: trio.abc.Clock,
) -> None:
    a, b = trio.testing.memory_stream_pair()
    handler = Bursty()
    server = RemotingConnection(a, peer="client", handler=handler)
    frames = [
        encode(RemotingCommand.request(5, body=b"one", opaque=1)),
        encode(RemotingCommand.request(1, {"delay": 0}, b"abc", opaque=2)),
        encode(RemotingCommand.request(5, body=b"two", opaque=3)),
        encode(RemotingCommand.request(5, body=b"three", opaque=4, oneway=True)),
    ]
    decoder = FrameDecoder()
    got: dict[int, bytes] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.run)
        await b.send_all(b"".join(frames))  # one read holds all four
        with trio.fail_after(5):
            while len(got) < 3:
                decoder.receive_data(await b.receive_some(65536))
                for response in decoder.commands():
                    got[response.opaque] = response.body
        server.close()
    assert handler.bursts == [[1, 3, 4]]
    assert got == {1: b"ONE", 2: b"cba", 3: b"TWO"}  # the oneway one gets no response


async def test_a_failing_burst_answers_each_request_with_system_error(
    autojump_clock: trio.abc.Clock,
) -> None:
    class Broken(Bursty):
        def take_burst(
            self, requests: Sequence[RemotingCommand], connection: RemotingConnection
        ) -> Burst | None:
            async def finish() -> list[RemotingCommand | None]:
                raise RuntimeError("store bug")

            return Burst(requests, finish)

    a, b = trio.testing.memory_stream_pair()
    server = RemotingConnection(a, peer="client", handler=Broken())
    client = RemotingConnection(b, peer="server")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.run)
        nursery.start_soon(client.run)
        response = await client.request(RemotingCommand.request(5, body=b"x"))
        client.close()
        server.close()
    assert response.code == 1
    assert "store bug" in (response.remark or "")


async def test_a_frame_sent_twice_is_answered_twice(autojump_clock: trio.abc.Clock) -> None:
    """Two equal requests in flight at once (a peer resending one frame, same opaque) are two
    requests: both answered, the connection kept (it used to fail with the limiter's
    "borrower is already holding" RuntimeError)."""
    server_side, client_side = trio.testing.memory_stream_pair()
    server = RemotingConnection(server_side, peer="client", handler=Echo())
    frame = encode(RemotingCommand.request(1, {"delay": 100}, b"ab").with_opaque(7))
    answers = FrameDecoder()
    responses: list[RemotingCommand] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.run)
        await client_side.send_all(frame + frame)
        while len(responses) < 2:
            with trio.fail_after(5):
                answers.receive_data(await client_side.receive_some())
            responses += answers.commands()
        assert not server.closed
        server.close()
    assert [(r.opaque, r.body) for r in responses] == [(7, b"ba"), (7, b"ba")]
