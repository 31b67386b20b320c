"""One remoting connection on Trio, used by both the server and the client side.

Mirrors ``NettyRemotingAbstract``: either end may send requests; a response is matched to
its request by ``opaque``; a oneway request gets no response. The connection owns one
nursery: a reader task (bytes → :class:`FrameDecoder` → commands), a writer task (the only
one that writes to the stream) and one task per inbound request, so a long-polling pull
never holds up the requests behind it. When the reader or writer ends, the nursery is
cancelled, pending requests fail with :class:`RemotingError` (code :data:`NO_RESPONSE`) and
the ``on_close`` callback runs in a ``finally``.

Work is done per read, not per request: every complete command of a read is decoded first,
and the handler's :meth:`~RequestHandler.take_burst` may take some of them (a broker takes
its sends) and answer them all with one task, one store append and one wait; their
responses go out as one write. The writer, too, writes everything queued at once. A burst
is one :data:`MAX_IN_FLIGHT` slot. Taking bursts is part of every handler's contract, so a
handler that wraps another (the ACL guard, the VIP channel) says what it does with them
instead of silently turning them off; one that takes none inherits :class:`NoBursts`.

A peer that sends a broken or hostile frame gets its connection closed with one log line; the
error never leaves :meth:`RemotingConnection.run`. With a ``frame_deadline``
(:class:`~trioha.remoting._limits.FrameDeadline`, the server side) a frame that does not arrive
in time closes the connection too; :attr:`RemotingConnection.slow_frame` then says what came of
it, for the server to report.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import attrs
import trio

from trioha._errors import LocalProtocolError, ProtocolError, RemotingError
from trioha.remoting._codec import FrameDecoder, HeaderError, RemotingCommand, encode
from trioha.remoting._codes import ResponseCode
from trioha.remoting._limits import FrameDeadline, SlowFrame

log = logging.getLogger("trioha.remoting")

#: :attr:`RemotingError.code` when no response came at all (timeout, connection closed).
NO_RESPONSE = -1

#: Requests one connection may have in progress at once; more wait (back pressure on that
#: peer only). RocketMQ bounds its processor thread pools' queues the same way.
MAX_IN_FLIGHT = 1024

_RECEIVE_SIZE = 65536
#: The writer joins queued frames into one write up to about this many bytes.
_WRITE_COALESCE = 1 << 20
_opaque_counter = itertools.count(1)


@attrs.frozen(eq=False)  # compared and hashed by identity: a limiter borrower
class Burst:
    """Requests a handler took from one read (:meth:`RequestHandler.take_burst`), and how to
    answer them.

    ``finish`` returns one response per request in ``requests`` (None: no response; bytes:
    the response's frame, already encoded); it runs in one task, and its responses are
    written together.
    """

    requests: Sequence[RemotingCommand]
    finish: Callable[[], Awaitable[Sequence[RemotingCommand | bytes | None]]]


class RequestHandler(Protocol):
    """Answers the requests that arrive on a connection (a ``NettyRequestProcessor``)."""

    async def handle_request(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand | None:
        """The response, or None to send none (a oneway request's response is dropped)."""

    def take_burst(
        self, requests: Sequence[RemotingCommand], connection: RemotingConnection
    ) -> Burst | None:
        """Take some of a read's *requests* to answer together (see the module docstring);
        the rest go to :meth:`handle_request`, one task each.

        Runs in the reader, between reads: it must not block. None takes nothing.
        """


class NoBursts:
    """For a handler that answers every request on its own: :meth:`take_burst` takes none."""

    def take_burst(
        self, requests: Sequence[RemotingCommand], connection: RemotingConnection
    ) -> Burst | None:
        return None


class RejectAllRequests(NoBursts):
    """The handler of a pure client: every inbound request is answered "not supported"."""

    async def handle_request(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand | None:
        return request.response(
            ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
            f" request type {request.code} not supported",
        )


class _Pending:
    __slots__ = ("done", "response")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.response: RemotingCommand | None = None


class RemotingConnection:
    """A remoting peer over one stream; call :meth:`run` in a nursery to start it."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        peer: str,
        handler: RequestHandler | None = None,
        on_close: Callable[[RemotingConnection], None] | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
        frame_deadline: FrameDeadline | None = None,
    ) -> None:
        self.peer = peer
        self._frame_deadline = frame_deadline
        #: The frame that missed ``frame_deadline`` and so closed the connection, if one did.
        self.slow_frame: SlowFrame | None = None
        self._stream = stream
        self._handler = handler or RejectAllRequests()
        self._on_close = on_close
        self._decoder = FrameDecoder()
        self._send, self._outgoing = trio.open_memory_channel[bytes](256)
        self._pending: dict[int, _Pending] = {}
        self._limiter = trio.CapacityLimiter(max_in_flight)
        self._closed = trio.Event()
        self._cancel: trio.CancelScope | None = None
        self.close_reason: str | None = None

    def __repr__(self) -> str:
        return f"<RemotingConnection {self.peer}>"

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    # --- life cycle ---------------------------------------------------------------------
    async def run(self) -> None:
        """Serve the connection until either side closes it; never raises for peer errors."""
        try:
            async with trio.open_nursery() as nursery:
                self._cancel = nursery.cancel_scope
                nursery.start_soon(self._writer)
                await self._reader(nursery)
                nursery.cancel_scope.cancel()
        finally:
            self._closed.set()
            self._outgoing.close()
            for pending in self._pending.values():
                pending.done.set()  # response stays None: the waiter raises
            self._pending.clear()
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self._stream)
            if self._on_close is not None:
                self._on_close(self)

    def close(self, reason: str = "closed locally") -> None:
        """Close the connection soon (from any task); pending requests fail."""
        if self.close_reason is None:
            self.close_reason = reason
        if self._cancel is not None:
            self._cancel.cancel()

    async def _reader(self, nursery: trio.Nursery) -> None:
        # With a frame deadline: seconds spent waiting for the peer since the first byte of the
        # frame under way. Only the waits in receive_some count, so a reader held back by this
        # side (MAX_IN_FLIGHT) never blames the peer.
        waited = 0.0
        while True:
            size = None if self._frame_deadline is None else self._decoder.partial_frame_size
            data: bytes | bytearray | None
            try:
                if size is None:
                    data = await self._stream.receive_some(_RECEIVE_SIZE)
                else:
                    assert self._frame_deadline is not None
                    started = trio.current_time()
                    data = None
                    with trio.move_on_after(self._frame_deadline.seconds_for(size) - waited):
                        data = await self._stream.receive_some(_RECEIVE_SIZE)
                    waited += trio.current_time() - started
                    if data is None:
                        self._frame_too_slow(size, waited)
                        return
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self.close_reason = self.close_reason or f"connection lost: {exc or 'reset'}"
                return
            if not data:
                self.close_reason = self.close_reason or "closed by the peer"
                return
            self._decoder.receive_data(data)
            requests: list[RemotingCommand] = []
            error: ProtocolError | None = None
            decoded = 0
            try:
                for command in self._decoder.commands():
                    decoded += 1
                    if command.is_response:
                        self._complete(command)
                    else:
                        requests.append(command)
            except ProtocolError as exc:
                error = exc  # the commands before the broken one are still answered
            if decoded:
                waited = 0.0  # what is left began in this read
            if requests:
                await self._dispatch(requests, nursery)
            if error is not None:
                self.close_reason = f"protocol error: {error}"
                log.warning("closing remoting connection %s: %s", self.peer, error)
                return

    def _frame_too_slow(self, size: int, waited: float) -> None:
        self.slow_frame = SlowFrame(size=size, received=self._decoder.buffered, seconds=waited)
        what = f"a frame of {size} bytes" if size else "a frame's length prefix"
        self.close_reason = self.close_reason or (
            f"{what} still incomplete after {waited:.1f} s ({self._decoder.buffered} bytes "
            "arrived; serverFrameTimeoutSeconds, serverFrameMinBytesPerSecond)"
        )

    async def _dispatch(self, requests: list[RemotingCommand], nursery: trio.Nursery) -> None:
        """Hand a read's requests to the handler: a burst in one task, the rest one each."""
        burst: Burst | None
        try:
            burst = self._handler.take_burst(requests, self)
        except Exception:
            # A bug in the fast path must not lose requests: they go the usual way.
            log.exception("%s: taking a burst of %d requests failed", self.peer, len(requests))
            burst = None
        if burst is not None and burst.requests:
            taken = {id(request) for request in burst.requests}
            await self._limiter.acquire_on_behalf_of(burst)
            nursery.start_soon(self._serve_burst, burst)
            requests = [request for request in requests if id(request) not in taken]
        for request in requests:
            # A token of its own: equal commands (a peer may send one frame twice) are equal
            # values, and the limiter tells borrowers apart by equality.
            token = object()
            await self._limiter.acquire_on_behalf_of(token)
            nursery.start_soon(self._serve_request, request, token)

    async def _writer(self) -> None:
        async with self._outgoing:
            async for first in self._outgoing:
                frame = first
                if len(first) < _WRITE_COALESCE:  # whatever else is queued goes in one write
                    frames = [first]
                    size = len(first)
                    while size < _WRITE_COALESCE:
                        try:
                            more = self._outgoing.receive_nowait()
                        except trio.WouldBlock:
                            break
                        frames.append(more)
                        size += len(more)
                    if len(frames) > 1:
                        frame = b"".join(frames)
                try:
                    await self._stream.send_all(frame)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    self.close_reason = self.close_reason or f"connection lost: {exc or 'reset'}"
                    self.close()
                    return

    def _complete(self, response: RemotingCommand) -> None:
        pending = self._pending.pop(response.opaque, None)
        if pending is None:
            # A response after its request timed out: RocketMQ logs and drops it too.
            log.debug("%s: response for unknown opaque %d dropped", self.peer, response.opaque)
            return
        pending.response = response
        pending.done.set()

    async def _serve_request(self, request: RemotingCommand, token: object) -> None:
        try:
            response = await self._answer(request)
            if response is not None and not request.is_oneway:
                await self._enqueue(self._encode_response(request, response))
        except RemotingError:
            pass  # the connection closed meanwhile: nobody to answer
        finally:
            self._limiter.release_on_behalf_of(token)

    async def _serve_burst(self, burst: Burst) -> None:
        try:
            try:
                responses: Sequence[RemotingCommand | bytes | None] = await burst.finish()
            except Exception as exc:
                log.exception("%s: a burst of %d requests failed", self.peer, len(burst.requests))
                responses = [
                    request.response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
                    for request in burst.requests
                ]
            frames = []
            for request, response in zip(burst.requests, responses, strict=True):
                if response is None or request.is_oneway:
                    continue
                if isinstance(response, bytes):
                    frames.append(response)
                else:
                    frames.append(self._encode_response(request, response))
            if frames:
                await self._enqueue(b"".join(frames))
        except RemotingError:
            pass  # the connection closed meanwhile: nobody to answer
        finally:
            self._limiter.release_on_behalf_of(burst)

    def _encode_response(self, request: RemotingCommand, response: RemotingCommand) -> bytes:
        try:
            return encode(response)
        except LocalProtocolError as exc:  # e.g. a response above the frame limit
            log.error("%s: response to code %d not sent: %s", self.peer, request.code, exc)
            return encode(request.response(ResponseCode.SYSTEM_ERROR, str(exc)))

    async def _answer(self, request: RemotingCommand) -> RemotingCommand | None:
        try:
            return await self._handler.handle_request(request, self)
        except HeaderError as exc:
            return request.response(ResponseCode.SYSTEM_ERROR, str(exc))
        except RemotingError as exc:
            return request.response(exc.code, str(exc))
        except ProtocolError as exc:
            log.warning("%s: request code %d rejected: %s", self.peer, request.code, exc)
            return request.response(ResponseCode.SYSTEM_ERROR, str(exc))
        except Exception as exc:
            # A bug in one processor must not take the connection (or broker) down; the
            # client gets SYSTEM_ERROR, as RocketMQ answers an exception in processRequest.
            log.exception("%s: request code %d failed", self.peer, request.code)
            return request.response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")

    async def _enqueue(self, frame: bytes) -> None:
        try:
            await self._send.send(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise RemotingError(f"connection to {self.peer} is closed", code=NO_RESPONSE) from None

    # --- sending --------------------------------------------------------------------------
    async def request(self, command: RemotingCommand) -> RemotingCommand:
        """Send a request and wait for its response (``invokeSync``).

        Bound the wait with ``trio.fail_after`` as usual in Trio; a late response is then
        dropped. Raises :class:`RemotingError` with code :data:`NO_RESPONSE` when the
        connection closes first. The response may carry any code; the caller checks it.
        """
        if self.closed:
            raise RemotingError(f"connection to {self.peer} is closed", code=NO_RESPONSE)
        opaque = next(_opaque_counter) & 0x7FFFFFFF
        pending = self._pending[opaque] = _Pending()
        try:
            await self._enqueue(encode(command.with_opaque(opaque)))
            await pending.done.wait()
        finally:
            self._pending.pop(opaque, None)
        if pending.response is None:
            why = self.close_reason or "closed"
            raise RemotingError(
                f"no response from {self.peer} to request code {command.code}: {why}",
                code=NO_RESPONSE,
            )
        return pending.response

    async def oneway(self, command: RemotingCommand) -> None:
        """Send a request that gets no response (``invokeOneway``)."""
        opaque = next(_opaque_counter) & 0x7FFFFFFF
        await self._enqueue(encode(command.with_opaque(opaque)))

    async def send_frame(self, command: RemotingCommand) -> None:
        """Send a command as it is (opaque and flags untouched)."""
        await self._enqueue(encode(command))


def _peer_address(stream: trio.abc.Stream) -> tuple[str, int] | str:
    """A socket stream's peer ``(host, port)``, or a placeholder for in-memory streams."""
    socket = getattr(stream, "socket", None)
    if socket is None:
        return "<stream>"
    try:
        host, port = socket.getpeername()[:2]
    except OSError:
        return "<unconnected>"
    return str(host), int(port)


def peer_name(stream: trio.abc.Stream) -> str:
    """``host:port`` of a socket stream's peer, or a placeholder for in-memory streams."""
    address = _peer_address(stream)
    return address if isinstance(address, str) else f"{address[0]}:{address[1]}"


def peer_host(stream: trio.abc.Stream) -> str:
    """The host of a socket stream's peer, or a placeholder for in-memory streams."""
    address = _peer_address(stream)
    return address if isinstance(address, str) else address[0]
