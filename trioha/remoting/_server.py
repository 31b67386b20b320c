"""The remoting server: accept TCP connections and serve each with a handler.

Mirrors ``NettyRemotingServer``: one :class:`RemotingConnection` per accepted socket, all
owned by the server's nursery. A connection's failure (a hostile frame, a reset) ends only
that connection.

What a server allows its peers is a :class:`~trioha.remoting._limits.ServerLimits` (that
module says why each limit exists); ``NettyRemotingServer`` has only the first:

* ``idle_timeout``: a connection that neither reads nor writes for that long is closed
  (``serverChannelMaxIdleTimeSeconds``, 120 s in RocketMQ's ``IdleStateHandler``), half-open
  ones included; one INFO line each;
* ``max_connections``: a connection beyond that many open ones is closed as soon as it is
  accepted, so a connect storm cannot take the process to its open-file limit. A WARNING
  says when the cap starts biting and an INFO line when it stops;
* ``reserve``: once only the reserved slots of the cap are left, a connection from an address
  that holds many already is closed as soon as it is accepted;
* ``frame_deadline``: a connection whose frame does not arrive in time is closed.

The last two are logged at WARNING at most once a minute each (:class:`ThrottledLog`), naming
the address and counting what was not logged, so a slowloris cannot flood the log either.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import NoReturn

import attrs
import trio

from trioha._errors import ConfigError
from trioha.remoting._connection import RemotingConnection, RequestHandler, peer_host, peer_name
from trioha.remoting._limits import (
    Admission,
    ConnectionReserve,
    ServerLimits,
    ThrottledLog,
    address_key,
    default_max_connections,
)

log = logging.getLogger("trioha.remoting")

__all__ = ["ConnectionCounters", "default_max_connections", "listen_tcp", "serve_remoting"]

#: No slot is reserved: ``max_connections`` alone decides.
_NO_RESERVE = ConnectionReserve(percent=0)


@attrs.define
class ConnectionCounters:
    """What a remoting server has seen (for ``statistics()`` and ``status``)."""

    open: int = 0
    accepted: int = 0
    #: Connections closed as soon as they were accepted: by the cap or by the reserve.
    refused: int = 0
    #: The part of ``refused`` the reserve decided.
    reserve_refused: int = 0
    idle_closed: int = 0
    #: Connections closed because a frame missed its deadline.
    slow_frame_closed: int = 0
    #: True while new connections are being refused (the cap bites).
    capped: bool = False
    #: Open connections per client address (``trioha.remoting._limits.address_key``).
    by_address: dict[str, int] = attrs.field(factory=dict)


async def listen_tcp(host: str, port: int, *, setting: str) -> list[trio.SocketListener]:
    """``trio.open_tcp_listeners``, failing with one line that names the address and the
    setting that chose it (the OSError chained)."""
    try:
        return await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {host}:{port} ({setting}): {exc.strerror or exc}"
        ) from exc


class _ActivityStream(trio.abc.Stream):
    """A stream (plain or TLS) that notes when it last moved a byte (for the idle timeout)."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.last_active = trio.current_time()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.inner.receive_some(max_bytes)
        self.last_active = trio.current_time()
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)
        self.last_active = trio.current_time()

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _close_when_idle(
    connection: RemotingConnection,
    stream: _ActivityStream,
    idle_seconds: float,
    counters: ConnectionCounters,
) -> None:
    while not connection.closed:
        deadline = stream.last_active + idle_seconds
        if trio.current_time() >= deadline:
            counters.idle_closed += 1
            log.info(
                "closing remoting connection from %s: idle for %.0f s "
                "(serverChannelMaxIdleTimeSeconds)",
                connection.peer,
                idle_seconds,
            )
            connection.close(f"idle for {idle_seconds:.0f} s")
            return
        await trio.sleep_until(deadline)


async def serve_remoting(
    handler: RequestHandler,
    host: str,
    port: int,
    *,
    on_connect: Callable[[RemotingConnection], None] | None = None,
    on_close: Callable[[RemotingConnection], None] | None = None,
    setting: str = "listen address",
    limits: ServerLimits = ServerLimits(),  # noqa: B008 - frozen: one shared default is fine
    counters: ConnectionCounters | None = None,
    wrap_stream: Callable[[trio.SocketStream], Awaitable[trio.abc.Stream | None]] | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Listen on ``host:port`` (0: any free port) and serve forever.

    Reports the bound ``(host, port)`` through ``task_status``; an address that cannot be
    bound is a :class:`ConfigError` naming it and *setting*. *limits* are enforced as the
    module docstring says (none by default: ``ServerLimits.from_config`` gives a port's).
    *counters* may be shared by several servers (the broker port and its VIP channel): the
    cap and the reserve then count their connections together. ``wrap_stream``, if given,
    runs on each accepted socket before any frame is read (TLS: ``trioha.acl.TlsAcceptor``)
    and returns the stream to serve, or None to close the socket.
    """
    listeners = await listen_tcp(host, port, setting=setting)
    bound_host, bound_port = listeners[0].socket.getsockname()[:2]
    counters = counters if counters is not None else ConnectionCounters()
    cap = limits.max_connections
    reserve = limits.reserve or _NO_RESERVE
    reserve_log = ThrottledLog(log)
    slow_log = ThrottledLog(log)

    def refuse(admission: Admission, address: str, held: int) -> None:
        assert cap is not None
        counters.refused += 1
        if admission is Admission.RESERVED:
            counters.reserve_refused += 1
            reserve_log.log(
                logging.WARNING,
                trio.current_time(),
                "%s:%d refused a connection from %s, which holds %d of its %d connections: the "
                "last %d of serverMaxConnections (%d) are kept for addresses holding fewer than "
                "%d (serverConnectionReservePercent, serverConnectionReserveMaxPerAddress)",
                bound_host,
                bound_port,
                address,
                held,
                counters.open,
                reserve.slots(cap),
                cap,
                reserve.max_per_address,
            )
        elif not counters.capped:
            counters.capped = True
            log.warning(
                "%s:%d holds %d connections, its cap (serverMaxConnections): new "
                "connections are closed at once until some end",
                bound_host,
                bound_port,
                counters.open,
            )

    async def serve_one(stream: trio.SocketStream) -> None:
        address = address_key(peer_host(stream))
        held = counters.by_address.get(address, 0)
        if cap is not None:
            admission = reserve.admit(counters.open, cap, held)
            if admission is not Admission.ACCEPT:
                refuse(admission, address, held)
                await trio.aclose_forcefully(stream)
                return
        counters.open += 1
        counters.accepted += 1
        counters.by_address[address] = held + 1
        try:
            await _serve_connection(stream)
        finally:
            counters.open -= 1
            left = counters.by_address.pop(address) - 1
            if left:
                counters.by_address[address] = left
            if counters.capped and cap is not None and (counters.open < max(1, cap * 9 // 10)):
                counters.capped = False
                log.info(
                    "%s:%d accepts connections again (%d open, %d refused so far)",
                    bound_host,
                    bound_port,
                    counters.open,
                    counters.refused,
                )

    async def _serve_connection(raw: trio.SocketStream) -> None:
        peer = peer_name(raw)
        base: trio.abc.Stream = raw
        if wrap_stream is not None:
            wrapped = await wrap_stream(raw)
            if wrapped is None:
                await trio.aclose_forcefully(raw)
                return
            base = wrapped
        idle_timeout = limits.idle_timeout
        watched = _ActivityStream(base) if idle_timeout is not None else None
        stream: trio.abc.Stream = watched if watched is not None else base
        connection = RemotingConnection(
            stream,
            peer=peer,
            handler=handler,
            on_close=on_close,
            frame_deadline=limits.frame_deadline,
        )
        log.debug("remoting connection from %s", connection.peer)
        if on_connect is not None:
            on_connect(connection)
        try:
            async with trio.open_nursery() as nursery:
                if watched is not None and idle_timeout is not None:
                    nursery.start_soon(
                        _close_when_idle, connection, watched, idle_timeout, counters
                    )
                await connection.run()
                nursery.cancel_scope.cancel()
        except Exception:
            # A bug in one connection must not end the server (and the broker with it).
            log.exception("remoting connection from %s failed", connection.peer)
        if connection.slow_frame is not None:
            counters.slow_frame_closed += 1
            slow_log.log(
                logging.WARNING,
                trio.current_time(),
                "closed remoting connection from %s: %s",
                connection.peer,
                connection.close_reason,
            )
        log.debug("remoting connection from %s ended: %s", connection.peer, connection.close_reason)

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, serve_one, listeners)
        task_status.started((bound_host, bound_port))
        await trio.sleep_forever()
    raise AssertionError("unreachable")  # pragma: no cover
