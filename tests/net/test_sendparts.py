"""``send_parts`` sends exactly what ``send_all(b"".join(parts))`` would, however the kernel
splits the gather writes, and fails as ``send_all`` fails."""

from __future__ import annotations

import mmap
import socket

import pytest
import trio
import trio.testing

from trioha.net._sendparts import send_parts


def _parts(frames: int, size: int) -> tuple[list[bytes | memoryview], bytes, mmap.mmap]:
    """Headers and views of an anonymous mapping, as the HA writer's parts."""
    area = mmap.mmap(-1, frames * size)
    for k in range(frames):
        area[k * size : (k + 1) * size] = bytes([k % 251]) * size
    view = memoryview(area)
    parts: list[bytes | memoryview] = []
    for k in range(frames):
        parts.append(b"HDR%09d" % k)
        parts.append(view[k * size : (k + 1) * size])
    expected = b"".join(parts)
    return parts, expected, area


async def _drain(stream: trio.SocketStream, total: int) -> bytes:
    got = bytearray()
    while len(got) < total:
        chunk = await stream.receive_some(7919)  # an odd size: reads straddle the parts
        assert chunk
        got += chunk
    return bytes(got)


async def test_a_socket_gets_the_joined_bytes_across_partial_sends() -> None:
    a, b = trio.socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # many partial sendmsg calls
    sender, receiver = trio.SocketStream(a), trio.SocketStream(b)
    parts, expected, area = _parts(frames=40, size=32 * 1024 + 3)
    received: list[bytes] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _collect(receiver, len(expected), received))
        await send_parts(sender, parts)
    assert received == [expected]
    parts.clear()
    area.close()
    await sender.aclose()
    await receiver.aclose()


async def _collect(stream: trio.SocketStream, total: int, into: list[bytes]) -> None:
    into.append(await _drain(stream, total))


async def test_empty_parts_and_a_single_part() -> None:
    a, b = trio.socket.socketpair()
    sender, receiver = trio.SocketStream(a), trio.SocketStream(b)
    await send_parts(sender, [b"", b"ab", memoryview(b""), b"c", b""])
    await send_parts(sender, [b"only"])
    assert await _drain(receiver, 7) == b"abconly"


async def test_other_streams_get_the_joined_bytes() -> None:
    sender, receiver = trio.testing.memory_stream_one_way_pair()
    parts, expected, _ = _parts(frames=3, size=10)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_parts, sender, parts)
        got = bytearray()
        while len(got) < len(expected):
            got += await receiver.receive_some()
    assert bytes(got) == expected


async def test_a_closed_peer_is_a_broken_resource() -> None:
    a, b = trio.socket.socketpair()
    sender = trio.SocketStream(a)
    b.close()
    with pytest.raises(trio.BrokenResourceError):
        await _send_until_refused(sender)


async def _send_until_refused(sender: trio.SocketStream) -> None:
    for _ in range(100):  # the first sends may still be buffered
        await send_parts(sender, [b"x" * 65536, b"y" * 65536])


async def test_a_socket_closed_here_is_a_closed_resource() -> None:
    a, _b = trio.socket.socketpair()
    sender = trio.SocketStream(a)
    a.close()
    with pytest.raises(trio.ClosedResourceError):
        await send_parts(sender, [b"x", b"y"])
