"""Send a write made of several parts without joining them first (``sendmsg``).

The master's HA writer gathers up to 1 MiB of frames per write: a 12-byte header and a view of
the mapped commit log for each. Joining them copied every replicated byte once more in this
process before the kernel copied it again; over a plain TCP socket ``socket.sendmsg`` hands the
kernel the parts as they are (a gather write), so the bytes go from the page cache to the socket
in one copy. Over anything else (TLS, a test's memory stream) the parts are joined and sent with
``send_all`` as before. docs/performance.md ("No copy on the HA path") has the figures.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence

import trio

#: Most buffers one ``sendmsg`` takes (Linux: 1024); a write has two per frame.
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 16


async def send_parts(stream: trio.abc.SendStream, parts: Sequence[bytes | memoryview]) -> None:
    """Send *parts*, in order, as one byte stream (what ``send_all(b"".join(parts))`` sends).

    Raises what ``send_all`` raises: :class:`trio.BrokenResourceError` when the connection
    fails, :class:`trio.ClosedResourceError` when it was closed here.
    """
    if len(parts) == 1 or not isinstance(stream, trio.SocketStream):
        await stream.send_all(parts[0] if len(parts) == 1 else b"".join(parts))
        return
    sock = stream.socket
    views = [memoryview(p) for p in parts]
    first = 0
    try:
        while first < len(views):
            try:
                sent = await sock.sendmsg(views[first : first + _IOV_MAX])
            except OSError as exc:
                if exc.errno == errno.EBADF:
                    raise trio.ClosedResourceError("the socket was closed") from None
                raise trio.BrokenResourceError(f"sendmsg failed: {exc}") from exc
            while sent:
                head = views[first]
                if sent >= head.nbytes:
                    sent -= head.nbytes
                    first += 1
                else:
                    views[first] = head[sent:]
                    sent = 0
            while first < len(views) and not views[first].nbytes:
                first += 1
    finally:
        for view in views:
            view.release()
