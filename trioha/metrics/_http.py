"""A small HTTP/1.1 responder for ``GET /metrics``, on Trio.

Prometheus scrapes with a plain GET; ``prometheus_client``'s own server runs threads, which a
Trio program does not want. This answers one request per connection (``Connection: close``):
``/metrics`` with the exposition format, ``/`` with a pointer to it, anything else 404, a
malformed or oversized request 400. A slow or silent client is dropped after ``client_timeout``.
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

import trio

from trioha._errors import ConfigError

log = logging.getLogger("trioha.metrics")

MAX_REQUEST = 8192
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _registry(collector: Any) -> Any:
    try:
        from prometheus_client import CollectorRegistry
    except ImportError:
        raise ConfigError(
            "--metrics-listen needs prometheus-client: pip install 'trioha[metrics]'"
        ) from None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def _response(status: str, body: bytes, content_type: str = "text/plain; charset=utf-8") -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


async def _answer(stream: trio.abc.Stream, registry: Any, client_timeout: float) -> None:
    from prometheus_client import generate_latest

    request = bytearray()
    with trio.move_on_after(client_timeout) as scope:
        while b"\r\n\r\n" not in request and len(request) <= MAX_REQUEST:
            chunk = await stream.receive_some(4096)
            if not chunk:
                break
            request += chunk
    if scope.cancelled_caught or b"\r\n\r\n" not in request:
        return  # a silent, slow or oversized client: just close
    line = bytes(request).split(b"\r\n", 1)[0].decode("latin-1").split()
    if len(line) != 3 or not line[2].startswith("HTTP/"):
        reply = _response("400 Bad Request", b"malformed request line\n")
    elif line[0] not in {"GET", "HEAD"}:
        reply = _response("405 Method Not Allowed", b"only GET\n")
    elif line[1].split("?", 1)[0] == "/metrics":
        body = generate_latest(registry)  # reads snapshots only: quick, on the Trio thread
        reply = _response("200 OK", b"" if line[0] == "HEAD" else body, CONTENT_TYPE)
    elif line[1] == "/":
        reply = _response("200 OK", b"trioha: metrics at /metrics\n")
    else:
        reply = _response("404 Not Found", b"not found; metrics are at /metrics\n")
    with trio.move_on_after(client_timeout):
        await stream.send_all(reply)


async def serve_metrics(
    collector: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    client_timeout: float = 10.0,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Serve ``collector``'s metrics over HTTP on ``host:port`` until cancelled.

    Reports the bound address through ``task_status`` (port 0 picks a free one). Raises
    :class:`ConfigError` when prometheus-client is missing or the address cannot be bound.
    """
    registry = _registry(collector)
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise ConfigError(
            f"cannot listen for metrics on {host}:{port} (--metrics-listen): {exc.strerror or exc}"
        ) from None

    async def handle(stream: trio.SocketStream) -> None:
        try:
            await _answer(stream, registry, client_timeout)
        except trio.BrokenResourceError:
            pass
        except Exception:
            log.exception("metrics request failed")
        finally:
            await stream.aclose()

    bound = listeners[0].socket.getsockname()
    log.info("metrics on http://%s:%d/metrics", bound[0], bound[1])
    task_status.started((bound[0], bound[1]))
    await trio.serve_listeners(handle, listeners)
    raise AssertionError("unreachable")  # pragma: no cover
