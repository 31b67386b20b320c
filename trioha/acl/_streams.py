"""Stream helpers shared by the TLS sniffer and the HA handshake."""

from __future__ import annotations

import trio


class PrefixedStream(trio.abc.Stream):
    """A stream whose first reads return bytes already taken from it (a peeked first byte,
    or what arrived behind a handshake message), then read on from the stream itself."""

    def __init__(self, stream: trio.abc.Stream, prefix: bytes) -> None:
        self.stream = stream
        self._prefix = prefix
        #: The socket, for code that asks a stream for its peer (``peer_name``).
        self.socket = getattr(stream, "socket", None)

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._prefix:
            size = len(self._prefix) if max_bytes is None else max_bytes
            data, self._prefix = self._prefix[:size], self._prefix[size:]
            await trio.lowlevel.checkpoint()
            return data
        return await self.stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.stream.aclose()


async def receive_exactly(stream: trio.abc.Stream, size: int, what: str) -> tuple[bytes, bytes]:
    """*size* bytes and whatever came after them in the same reads.

    Raises ``ConnectionError`` naming *what* if the stream ends first.
    """
    data = bytearray()
    while len(data) < size:
        chunk = await stream.receive_some(65536)
        if not chunk:
            raise ConnectionError(f"connection closed during {what} ({len(data)}/{size} bytes)")
        data += chunk
    return bytes(data[:size]), bytes(data[size:])
