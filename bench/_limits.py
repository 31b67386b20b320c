"""What this machine allows, measured in the same run as the broker figures.

Every broker figure is printed as a ratio to one of these, because the machine is shared and
noisy: a number alone says little, a number next to what the loopback link and the disk did a
minute earlier says a lot.

* loopback TCP between two Python processes, blocking sockets with 4 MiB buffers (the best a
  Python process can move), the same with Trio on both ends, and the same with the receiver
  writing what it gets to a file (a copy: what a slave catching up must at least do);
* loopback ping-pong of 8 bytes (a report's size) between two processes, blocking and Trio;
* sequential file appends, without fsync and with an fdatasync after each write.

Run as a script, this module is the far end of those measurements (``send``, ``send-trio``,
``echo``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio

from bench._common import KIB, MIB, ROOT, child_command, percentile, self_cpu

BUFFER = 4 * MIB
CHUNK = MIB
TRIO_READ = 256 * KIB  # what trioha's HA client asks per read
PING = 8


def _listener() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock


def _spawn(*args: str | int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(child_command("_limits", *args), cwd=ROOT)


def _child_cpu(before: Any) -> float:
    import resource

    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return float(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)


def tcp_copy(nbytes: int, *, to_file: Path | None = None) -> dict[str, float]:
    """Receive *nbytes* from a blocking sender process; optionally ``pwrite`` them to a file."""
    import resource

    listener = _listener()
    port = listener.getsockname()[1]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0 = self_cpu()
    proc = _spawn("send", port, nbytes)
    conn, _ = listener.accept()
    listener.close()
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER)
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    fd = -1
    if to_file is not None:
        fd = os.open(to_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    got = 0
    start = time.perf_counter()
    try:
        while got < nbytes:
            n = conn.recv_into(view)
            if n == 0:
                raise RuntimeError(f"sender closed after {got} of {nbytes} bytes")
            if fd >= 0:
                os.pwrite(fd, view[:n], got)
            got += n
        elapsed = time.perf_counter() - start
    finally:
        conn.close()
        if fd >= 0:
            os.close(fd)
            assert to_file is not None
            to_file.unlink()
        proc.wait()
    return {
        "bytes": nbytes,
        "seconds": elapsed,
        "mib_s": nbytes / elapsed / MIB,
        "receiver_cpu": self_cpu() - cpu0,
        "sender_cpu": _child_cpu(before),
    }


def tcp_copy_trio(nbytes: int) -> dict[str, float]:
    """Receive *nbytes* with Trio (``receive_some`` of 256 KiB) from a Trio sender process."""

    async def main() -> dict[str, float]:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        listener = listeners[0]
        port = listener.socket.getsockname()[1]
        cpu0 = self_cpu()
        proc = await trio.lowlevel.open_process(
            child_command("_limits", "send-trio", port, nbytes), cwd=ROOT
        )
        stream = await listener.accept()
        await listener.aclose()
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER)
        got = 0
        start = time.perf_counter()
        while got < nbytes:
            data = await stream.receive_some(TRIO_READ)
            if not data:
                raise RuntimeError(f"sender closed after {got} of {nbytes} bytes")
            got += len(data)
        elapsed = time.perf_counter() - start
        await stream.aclose()
        await proc.wait()
        return {
            "bytes": nbytes,
            "seconds": elapsed,
            "mib_s": nbytes / elapsed / MIB,
            "receiver_cpu": self_cpu() - cpu0,
        }

    return trio.run(main)


def ping_pong(count: int) -> dict[str, float]:
    """Round trips of 8 bytes to an echoing process, blocking sockets with TCP_NODELAY."""
    listener = _listener()
    proc = _spawn("echo", listener.getsockname()[1])
    conn, _ = listener.accept()
    listener.close()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = b"\x00" * PING
    samples: list[float] = []
    try:
        for _ in range(count):
            t0 = time.perf_counter()
            conn.sendall(payload)
            got = 0
            while got < PING:
                chunk = conn.recv(PING - got)
                if not chunk:
                    raise RuntimeError("echo process closed the connection")
                got += len(chunk)
            samples.append(time.perf_counter() - t0)
    finally:
        conn.close()
        proc.wait()
    return _latency(samples)


def ping_pong_trio(count: int) -> dict[str, float]:
    """The same round trips with a Trio client (what a Trio broker's socket IO adds)."""

    async def main() -> dict[str, float]:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        listener = listeners[0]
        port = listener.socket.getsockname()[1]
        proc = await trio.lowlevel.open_process(child_command("_limits", "echo", port), cwd=ROOT)
        stream = await listener.accept()
        await listener.aclose()
        payload = b"\x00" * PING
        samples: list[float] = []
        for _ in range(count):
            t0 = time.perf_counter()
            await stream.send_all(payload)
            got = 0
            while got < PING:
                chunk = await stream.receive_some(PING - got)
                if not chunk:
                    raise RuntimeError("echo process closed the connection")
                got += len(chunk)
            samples.append(time.perf_counter() - t0)
        await stream.aclose()
        await proc.wait()
        return _latency(samples)

    return trio.run(main)


def _latency(samples: list[float]) -> dict[str, float]:
    return {
        "count": len(samples),
        "p50_us": percentile(samples, 0.5) * 1e6,
        "p99_us": percentile(samples, 0.99) * 1e6,
        "p999_us": percentile(samples, 0.999) * 1e6,
    }


def file_append(
    directory: Path, *, nbytes: int, chunk: int, fsync: bool, max_seconds: float
) -> dict[str, float]:
    """Sequential ``pwrite`` of *chunk*-byte writes, each followed by fdatasync if *fsync*."""
    path = directory / f"append-{chunk}-{int(fsync)}.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    data = os.urandom(chunk)
    samples: list[float] = []
    written = 0
    start = time.perf_counter()
    try:
        while written < nbytes and time.perf_counter() - start < max_seconds:
            t0 = time.perf_counter()
            os.pwrite(fd, data, written)
            if fsync:
                os.fdatasync(fd)
            samples.append(time.perf_counter() - t0)
            written += chunk
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()
    out = {
        "chunk": chunk,
        "bytes": written,
        "seconds": elapsed,
        "mib_s": written / elapsed / MIB,
        "ops_s": len(samples) / elapsed,
    }
    if fsync:
        out.update(_latency(samples))
    return out


def measure(directory: Path, *, quick: bool) -> dict[str, Any]:
    """All limits; the loopback copy is run three times and the median kept."""
    copy_bytes = (256 if quick else 1024) * MIB
    runs = [tcp_copy(copy_bytes) for _ in range(1 if quick else 3)]
    runs.sort(key=lambda r: r["mib_s"])
    tcp = runs[len(runs) // 2]
    tcp["runs_mib_s"] = [r["mib_s"] for r in runs]  # type: ignore[assignment]
    pings = 3000 if quick else 20000
    return {
        "tcp": tcp,
        "tcp_trio": tcp_copy_trio(copy_bytes),
        "tcp_to_file": tcp_copy(copy_bytes, to_file=directory / "tcp-copy.bin"),
        "ping": ping_pong(pings),
        "ping_trio": ping_pong_trio(pings),
        "append": file_append(
            directory, nbytes=copy_bytes, chunk=MIB, fsync=False, max_seconds=3.0
        ),
        "append_fsync_1m": file_append(
            directory, nbytes=copy_bytes, chunk=MIB, fsync=True, max_seconds=1.0 if quick else 2.0
        ),
        "append_fsync_4k": file_append(
            directory,
            nbytes=copy_bytes,
            chunk=4 * KIB,
            fsync=True,
            max_seconds=1.0 if quick else 2.0,
        ),
    }


# --- the far ends (run as a script) --------------------------------------------------------------


def _send(port: int, nbytes: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER)
    data = memoryview(os.urandom(CHUNK))
    sent = 0
    while sent < nbytes:
        n = min(CHUNK, nbytes - sent)
        sock.sendall(data[:n])
        sent += n
    sock.close()


async def _send_trio(port: int, nbytes: int) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    stream.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER)
    data = memoryview(os.urandom(CHUNK))
    sent = 0
    while sent < nbytes:
        n = min(CHUNK, nbytes - sent)
        await stream.send_all(data[:n])
        sent += n
    await stream.aclose()


def _echo(port: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        data = sock.recv(4096)
        if not data:
            break
        sock.sendall(data)
    sock.close()


def main(argv: list[str]) -> None:
    role, port = argv[0], int(argv[1])
    if role == "send":
        _send(port, int(argv[2]))
    elif role == "send-trio":
        trio.run(_send_trio, port, int(argv[2]))
    elif role == "echo":
        _echo(port)
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
