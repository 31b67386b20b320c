"""What the etcd tests share: real members (or a skip naming what to install), a TCP proxy
whose connections a test can cut, and tiny HTTP servers that are not etcd.

Every server binds 127.0.0.1 on a free port; every loop is bounded.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest
import trio

from trioha.etcd import ETCD_INSTALL_HINT, EtcdCluster, find_etcd, start_etcd


def etcd_or_skip() -> str:
    """The etcd binary, or skip the test with the one line that says what to install.

    ``python3 tasks.py test`` installs Debian's etcd-server first when it runs as root, so
    the skip is only seen where etcd truly cannot be had.
    """
    binary = find_etcd()
    if binary is None:
        pytest.skip(ETCD_INSTALL_HINT)
    return binary


@contextmanager
def running_etcd(directory: Path, size: int = 1, *extra: str) -> Iterator[EtcdCluster]:
    """A fresh cluster of *size* members under *directory*, stopped (by PID) on exit."""
    binary = etcd_or_skip()
    with start_etcd(directory, size, etcd=binary, extra_args=extra) as cluster:
        yield cluster


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to *target*; :meth:`cut` drops every open connection."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self.connections = 0
        self.blocked = False
        self._scopes: set[trio.CancelScope] = set()

    def block(self) -> int:
        """Cut every connection and refuse new ones until :meth:`unblock` (a partition)."""
        self.blocked = True
        return self.cut()

    def unblock(self) -> None:
        self.blocked = False

    def cut(self) -> int:
        """Close every forwarded connection now (both sides see it end); how many."""
        scopes = list(self._scopes)
        for scope in scopes:
            scope.cancel()
        return len(scopes)

    async def _serve_one(self, client: trio.SocketStream) -> None:
        if self.blocked:
            await client.aclose()
            return
        with trio.CancelScope() as scope:
            self._scopes.add(scope)
            self.connections += 1
            try:
                upstream = await trio.open_tcp_stream(*self.target)
            except OSError:
                await client.aclose()
                return
            try:
                async with client, upstream, trio.open_nursery() as nursery:
                    nursery.start_soon(_pump, client, upstream, nursery.cancel_scope)
                    nursery.start_soon(_pump, upstream, client, nursery.cancel_scope)
            finally:
                self._scopes.discard(scope)


async def _pump(src: trio.SocketStream, dst: trio.SocketStream, done: trio.CancelScope) -> None:
    try:
        while data := await src.receive_some(65536):
            await dst.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    done.cancel()


@asynccontextmanager
async def open_proxy(target: tuple[str, int]) -> AsyncIterator[TcpProxy]:
    proxy = TcpProxy(target)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, proxy._serve_one, 0, host="127.0.0.1")
        )
        proxy.port = listeners[0].socket.getsockname()[1]
        yield proxy
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def serve_http(answer: bytes | None) -> AsyncIterator[str]:
    """An HTTP server on 127.0.0.1 that is not etcd: every request gets *answer* (a whole
    HTTP response) after its headers arrive; None: it accepts and never answers. Its URL."""

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            data = b""
            with trio.move_on_after(30):
                while b"\r\n\r\n" not in data:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        return
                    data += chunk
                if answer is None:
                    await trio.sleep_forever()
                await stream.send_all(answer)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, handle, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        yield f"http://127.0.0.1:{port}"
        nursery.cancel_scope.cancel()


def http_answer(status: str, content_type: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
