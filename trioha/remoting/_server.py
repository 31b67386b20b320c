"""The remoting server: accept TCP connections and serve each with a handler.

Mirrors ``NettyRemotingServer``: one :class:`RemotingConnection` per accepted socket, all
owned by the server's nursery. A connection's failure (a hostile frame, a reset) ends only
that connection.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import NoReturn

import trio

from trioha.remoting._connection import RemotingConnection, RequestHandler, peer_name

log = logging.getLogger("trioha.remoting")


async def serve_remoting(
    handler: RequestHandler,
    host: str,
    port: int,
    *,
    on_connect: Callable[[RemotingConnection], None] | None = None,
    on_close: Callable[[RemotingConnection], None] | None = None,
    wrap_stream: Callable[[trio.SocketStream], Awaitable[trio.abc.Stream | None]] | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Listen on ``host:port`` (0: any free port) and serve forever.

    Reports the bound ``(host, port)`` through ``task_status``. ``wrap_stream``, if given,
    runs on each accepted socket before any frame is read (TLS: ``trioha.acl.TlsAcceptor``)
    and returns the stream to serve, or None to close the socket.
    """
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound_host, bound_port = listeners[0].socket.getsockname()[:2]

    async def serve_one(socket_stream: trio.SocketStream) -> None:
        peer = peer_name(socket_stream)
        stream: trio.abc.Stream = socket_stream
        if wrap_stream is not None:
            wrapped = await wrap_stream(socket_stream)
            if wrapped is None:
                await trio.aclose_forcefully(socket_stream)
                return
            stream = wrapped
        connection = RemotingConnection(stream, peer=peer, handler=handler, on_close=on_close)
        log.debug("remoting connection from %s", connection.peer)
        if on_connect is not None:
            on_connect(connection)
        try:
            await connection.run()
        except Exception:
            # A bug in one connection must not end the server (and the broker with it).
            log.exception("remoting connection from %s failed", connection.peer)
        log.debug("remoting connection from %s ended: %s", connection.peer, connection.close_reason)

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, serve_one, listeners)
        task_status.started((bound_host, bound_port))
        await trio.sleep_forever()
    raise AssertionError("unreachable")  # pragma: no cover
