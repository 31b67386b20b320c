"""A stream that hands every call to another: the base of the tests' stream wrappers."""

from __future__ import annotations

import trio


class DelegatingStream(trio.abc.Stream):
    """Another stream over *inner* (as a TLS layer is), with no socket of its own.

    Subclasses override the one call they observe or change and leave the rest to *inner*.
    """

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()
