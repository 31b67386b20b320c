"""The remoting client: connections to brokers and name servers.

:func:`open_remoting_client` is one connection for a scoped conversation (the CLI, tests).
:class:`RemotingClientPool` mirrors ``NettyRemotingClient``'s channel table: one connection
per address, opened on first use, kept open (a name server notices a broker's death by its
connection closing) and reopened after a failure.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from trioha._config import parse_address
from trioha._errors import RemotingError
from trioha.remoting._codec import RemotingCommand
from trioha.remoting._connection import NO_RESPONSE, RemotingConnection, RequestHandler

log = logging.getLogger("trioha.remoting")

#: ``NettyClientConfig.connectTimeoutMillis``: 3 s.
CONNECT_TIMEOUT = 3.0

#: ``RPCHook.doBeforeRequest``: rewrites each outgoing request (the ACL signer).
RPCHook = Callable[[RemotingCommand], RemotingCommand]


def _split(address: str | tuple[str, int]) -> tuple[str, int]:
    if isinstance(address, tuple):
        return address
    return parse_address(address)


async def connect(
    address: str | tuple[str, int],
    *,
    connect_timeout: float = CONNECT_TIMEOUT,
    ssl_context: ssl.SSLContext | None = None,
) -> trio.abc.Stream:
    """A TCP stream to ``address``, in TLS when ``ssl_context`` is given (``useTLS``).

    Failures, a failed TLS handshake included, become :class:`RemotingError` (NO_RESPONSE).
    """
    host, port = _split(address)
    try:
        with trio.fail_after(connect_timeout):
            stream = await trio.open_tcp_stream(host, port)
            if ssl_context is None:
                return stream
            tls = trio.SSLStream(stream, ssl_context, server_hostname=host)
            try:
                await tls.do_handshake()
            except trio.BrokenResourceError as exc:
                await trio.aclose_forcefully(stream)
                raise RemotingError(
                    f"TLS handshake with {host}:{port} failed: {exc.__cause__ or exc}",
                    code=NO_RESPONSE,
                ) from None
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
            return tls
    except trio.TooSlowError:
        raise RemotingError(
            f"connect to {host}:{port} timed out after {connect_timeout:.3g} s", code=NO_RESPONSE
        ) from None
    except OSError as exc:
        raise RemotingError(
            f"cannot connect to {host}:{port}: {exc.strerror or exc}", code=NO_RESPONSE
        ) from None


@asynccontextmanager
async def open_remoting_client(
    address: str | tuple[str, int],
    *,
    connect_timeout: float = CONNECT_TIMEOUT,
    handler: RequestHandler | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> AsyncIterator[RemotingConnection]:
    """One connection to ``address`` (in TLS with ``ssl_context``), closed when the block ends."""
    host, port = _split(address)
    stream = await connect((host, port), connect_timeout=connect_timeout, ssl_context=ssl_context)
    connection = RemotingConnection(stream, peer=f"{host}:{port}", handler=handler)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection.run)
        try:
            yield connection
        finally:
            connection.close()


class RemotingClientPool:
    """Connections by address, run in the pool's nursery (see :func:`open_client_pool`)."""

    def __init__(
        self,
        nursery: trio.Nursery,
        *,
        connect_timeout: float = CONNECT_TIMEOUT,
        handler: RequestHandler | None = None,
        rpc_hook: RPCHook | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._nursery = nursery
        self._connect_timeout = connect_timeout
        self._handler = handler
        self._rpc_hook = rpc_hook
        self._ssl_context = ssl_context
        self._connections: dict[tuple[str, int], RemotingConnection] = {}
        self._locks: dict[tuple[str, int], trio.Lock] = {}
        self._closed = False

    async def connection(self, address: str | tuple[str, int]) -> RemotingConnection:
        key = _split(address)
        if self._closed:
            raise RemotingError(f"client pool is closed; not connecting to {key[0]}:{key[1]}")
        lock = self._locks.setdefault(key, trio.Lock())
        async with lock:
            existing = self._connections.get(key)
            if existing is not None and not existing.closed:
                return existing
            stream = await connect(
                key, connect_timeout=self._connect_timeout, ssl_context=self._ssl_context
            )
            connection = RemotingConnection(
                stream, peer=f"{key[0]}:{key[1]}", handler=self._handler
            )
            self._connections[key] = connection
            self._nursery.start_soon(connection.run)
            return connection

    async def request(
        self, address: str | tuple[str, int], command: RemotingCommand
    ) -> RemotingCommand:
        """``invokeSync``: connect if needed, send (through the RPC hook), await the response."""
        connection = await self.connection(address)
        if self._rpc_hook is not None:
            command = self._rpc_hook(command)
        return await connection.request(command)

    async def oneway(self, address: str | tuple[str, int], command: RemotingCommand) -> None:
        connection = await self.connection(address)
        if self._rpc_hook is not None:
            command = self._rpc_hook(command)
        await connection.oneway(command)

    def close(self, address: str | tuple[str, int]) -> None:
        connection = self._connections.pop(_split(address), None)
        if connection is not None:
            connection.close()

    def close_all(self) -> None:
        self._closed = True
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()


@asynccontextmanager
async def open_client_pool(
    *,
    connect_timeout: float = CONNECT_TIMEOUT,
    handler: RequestHandler | None = None,
    rpc_hook: RPCHook | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> AsyncIterator[RemotingClientPool]:
    async with trio.open_nursery() as nursery:
        pool = RemotingClientPool(
            nursery,
            connect_timeout=connect_timeout,
            handler=handler,
            rpc_hook=rpc_hook,
            ssl_context=ssl_context,
        )
        try:
            yield pool
        finally:
            pool.close_all()
