"""What sending the HA stream without copying it would save the master, per replicated MiB.

    PYTHONPATH=. .venv/bin/python bench/zero_copy.py [--mib 256] [--rounds 3] [--batch 32768]
    PYTHONPATH=. .venv/bin/python bench/zero_copy.py --count      # instructions, under callgrind

The master's HA writer (``net/_connection.py``) sends a catch-up as frames of a 12-byte header
and up to ``ha_transfer_batch_size`` (32 KiB) of commit log, gathered into writes of about
1 MiB, and today joins each write's headers and mapped bodies into one buffer first. This
sends the same frames over loopback TCP from a real commit log (``commitlog.read`` views of
the mapped segment) to a reader in another process that discards them, three ways:

* **join**: ``b"".join(parts)`` and ``send_all`` (what the writer does today);
* **sendmsg**: the same parts handed to ``socket.sendmsg`` as they are, looping on partial
  sends (no copy in this process; the kernel reads the mapped pages);
* **sendfile**: each header with ``send(MSG_MORE)`` and each body with ``os.sendfile`` from the
  segment's file descriptor (the kernel copies from the page cache; the mapping is not touched).

It prints, per mode, the sending thread's CPU per MiB (user and system, from
``RUSAGE_THREAD``), MiB/s and syscalls per MiB; rounds alternate the modes and the median is
kept. With ``--count`` each mode runs once under callgrind and the instructions per MiB of the
sending process are printed (user space only: what the kernel does for a syscall is not
counted, which is why the CPU figures are printed too).
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from trio.testing import MockClock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import MIB, ROOT
from bench._icount import run_counted, valgrind_missing, window
from trioha.proto import encode_header
from trioha.store import FileCommitLog, open_store

MODES = ("join", "sendmsg", "sendfile")
WRITE_BATCH = 1024 * 1024  # net/_connection.py's

_SINK = """
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
buf = bytearray(1 << 20)
while s.recv_into(buf):
    pass
"""


def fill_log(root: Path, total: int) -> FileCommitLog:
    """A commit log of *total* bytes (one segment, the content does not matter here)."""
    store = open_store(root, segment_size=max(total, 1 << 20))
    log = store.commitlog
    assert isinstance(log, FileCommitLog)
    chunk = bytes(range(256)) * 4096  # 1 MiB
    while log.max_offset < total:
        log.append_raw(log.max_offset, chunk[: total - log.max_offset])
    log.flush()
    return log


def _frames(log: FileCommitLog, batch: int) -> list[tuple[int, int]]:
    """(offset, size) of each frame a catch-up of the whole log sends."""
    out = []
    offset = log.min_offset
    while offset < log.max_offset:
        size = min(batch, log.max_offset - offset)
        out.append((offset, size))
        offset += size
    return out


def _writes(frames: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """The frames grouped into writes of about ``WRITE_BATCH`` bytes, as the writer groups them."""
    out: list[list[tuple[int, int]]] = []
    current: list[tuple[int, int]] = []
    pending = 0
    for frame in frames:
        current.append(frame)
        pending += 12 + frame[1]
        if pending >= WRITE_BATCH:
            out.append(current)
            current, pending = [], 0
    if current:
        out.append(current)
    return out


async def _send_all_msg(sock: trio.socket.SocketType, parts: list[bytes | memoryview]) -> int:
    """``sendmsg`` until every part is sent; returns the number of calls."""
    calls = 0
    views = [memoryview(p) for p in parts]
    while views:
        sent = await sock.sendmsg(views)
        calls += 1
        while sent:
            first = views[0]
            if sent >= first.nbytes:
                sent -= first.nbytes
                views.pop(0)
            else:
                views[0] = first[sent:]
                sent = 0
    return calls


async def _sendfile(sock: trio.socket.SocketType, fd: int, offset: int, size: int) -> int:
    """``os.sendfile`` [offset, offset + size) of *fd*; returns the number of calls."""
    calls = 0
    out = sock.fileno()
    while size:
        try:
            n = os.sendfile(out, fd, offset, size)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
            continue
        calls += 1
        offset += n
        size -= n
    return calls


async def send_log(
    mode: str, log: FileCommitLog, batch: int, clock: MockClock | None
) -> dict[str, Any]:
    """Send the whole log once in *mode* to a sink process; the sending thread's figures."""
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    sink = await trio.lowlevel.open_process([sys.executable, "-c", _SINK, str(port)])
    sock, _ = await listener.accept()
    listener.close()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    stream = trio.SocketStream(sock)
    writes = _writes(_frames(log, batch))
    segment = log._segments[0]  # the one segment's file descriptor, for sendfile
    calls = 0
    cpu0 = resource.getrusage(resource.RUSAGE_THREAD)
    t0 = time.perf_counter()
    with window(clock):
        for frames in writes:
            if mode == "sendfile":
                for offset, size in frames:
                    header = memoryview(encode_header(offset, size))
                    while header:
                        header = header[await sock.send(header, socket.MSG_MORE) :]
                        calls += 1
                    calls += await _sendfile(sock, segment.fd, offset - segment.start, size)
                continue
            parts: list[bytes | memoryview] = []
            for offset, size in frames:
                parts.append(encode_header(offset, size))
                parts.append(log.read(offset, size))
            if mode == "join":
                await stream.send_all(b"".join(parts))
                calls += 1
            else:
                calls += await _send_all_msg(sock, parts)
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_THREAD)
    await stream.aclose()
    with trio.fail_after(60):
        await sink.wait()
    mib = log.max_offset / MIB
    return {
        "mode": mode,
        "mib_s": mib / wall,
        "user_us_per_mib": (cpu1.ru_utime - cpu0.ru_utime) / mib * 1e6,
        "sys_us_per_mib": (cpu1.ru_stime - cpu0.ru_stime) / mib * 1e6,
        "calls_per_mib": calls / mib,
    }


def _one(mode: str, mib: int, batch: int, counted: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="zero-copy-") as tmp:
        log = fill_log(Path(tmp), mib * MIB)
        try:
            clock = MockClock(rate=1.0) if counted else None
            return trio.run(send_log, mode, log, batch, clock, clock=clock)
        finally:
            log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="bytes of log sent per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32 * 1024, help="ha_transfer_batch_size")
    parser.add_argument("--count", action="store_true", help="instructions under callgrind")
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one counted run
    args = parser.parse_args()
    if args.mode is not None:
        _one(args.mode, args.mib, args.batch, counted=True)
        return
    if args.count:
        missing = valgrind_missing()
        if missing:
            sys.exit(f"zero_copy: {missing}")
        print("| mode | instructions per MiB sent (sending process, user space) |")
        print("|---|---|")
        for mode in MODES:
            command = [sys.executable, "bench/zero_copy.py", "--mode", mode]
            total, _ = run_counted(
                [*command, "--mib", str(args.mib), "--batch", str(args.batch)], cwd=ROOT
            )
            print(f"| {mode} | {total / args.mib:,.0f} |", flush=True)
        return
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for k in range(args.rounds):
        for mode in MODES if k % 2 == 0 else tuple(reversed(MODES)):
            runs[mode].append(_one(mode, args.mib, args.batch, counted=False))
    print(f"{args.mib} MiB per run, frames of {args.batch} bytes, load {os.getloadavg()[0]:.1f}")
    print("| mode | MiB/s | user µs/MiB | system µs/MiB | CPU µs/MiB | syscalls/MiB |")
    print("|---|---|---|---|---|---|")
    for mode, rs in runs.items():

        def med(key: str, rs: list[dict[str, Any]] = rs) -> float:
            return float(statistics.median(r[key] for r in rs))

        cpu = statistics.median(r["user_us_per_mib"] + r["sys_us_per_mib"] for r in rs)
        print(
            f"| {mode} | {med('mib_s'):,.0f} | {med('user_us_per_mib'):,.0f} "
            f"| {med('sys_us_per_mib'):,.0f} | {cpu:,.0f} | {med('calls_per_mib'):.1f} |"
        )


if __name__ == "__main__":
    main()
