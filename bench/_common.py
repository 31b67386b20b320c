"""Small shared pieces of the HA benchmark: statistics, process figures, child processes.

Everything here is plain measurement plumbing; the scenarios live in their own modules.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from trioha._progress import Progress
from trioha.net import HAConnection, HAService, Wakeup

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent  # children run as ``python -m bench.<module>`` from here
KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def percentile(values: Sequence[float], q: float) -> float:
    """The *q*-quantile (0..1) by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))
    return ordered[rank]


# --- process figures ---------------------------------------------------------------------------


@attrs.frozen
class ProcSample:
    """One reading of a process's memory (bytes) and CPU (seconds), from ``/proc``."""

    rss: int
    rss_anon: int
    rss_file: int
    hwm: int
    cpu: float


def proc_sample(pid: int | None = None) -> ProcSample:
    """Read ``/proc/<pid>/status`` and ``/proc/<pid>/stat`` (default: this process)."""
    base = Path("/proc") / (str(pid) if pid is not None else "self")
    fields: dict[str, int] = {}
    for line in (base / "status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in {"VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"}:
            fields[key] = int(value.split()[0]) * KIB
    stat = (base / "stat").read_text()
    # The command name may contain spaces; the fields after it are fixed.
    rest = stat[stat.rindex(")") + 2 :].split()
    cpu = (int(rest[11]) + int(rest[12])) / _CLK_TCK  # utime + stime
    return ProcSample(
        rss=fields.get("VmRSS", 0),
        rss_anon=fields.get("RssAnon", 0),
        rss_file=fields.get("RssFile", 0) + fields.get("RssShmem", 0),
        hwm=fields.get("VmHWM", 0),
        cpu=cpu,
    )


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class PeakTracker:
    """Samples a process every *interval* seconds and keeps the peaks and the series."""

    def __init__(self, pid: int | None, interval: float = 0.1) -> None:
        self.pid = pid
        self.interval = interval
        self.peak_rss = 0
        self.peak_anon = 0
        self.series: list[tuple[float, int, int]] = []  # (monotonic, rss, rss_anon)
        self.first: ProcSample | None = None
        self.last: ProcSample | None = None

    def sample(self) -> ProcSample | None:
        try:
            s = proc_sample(self.pid)
        except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
            return None
        if self.first is None:
            self.first = s
        self.last = s
        self.peak_rss = max(self.peak_rss, s.rss, s.hwm if self.pid is not None else 0)
        self.peak_anon = max(self.peak_anon, s.rss_anon)
        self.series.append((time.monotonic(), s.rss, s.rss_anon))
        return s

    async def run(self) -> None:
        while True:
            self.sample()
            await trio.sleep(self.interval)

    @property
    def cpu(self) -> float:
        """CPU seconds used between the first and the last sample."""
        if self.first is None or self.last is None:
            return 0.0
        return self.last.cpu - self.first.cpu


# --- acks as a master sees them --------------------------------------------------------------


class AckWatch:
    """Counts the acks an ``HAService`` accepts and wakes waiters on each one.

    ``HAService`` announces acks to nobody outside; ``HAConnection`` calls ``listener.on_ack``
    on the service, so an instance attribute wrapping the method sees every one of them.
    """

    def __init__(self, service: HAService) -> None:
        self.service = service
        self.count = 0
        self.wakeup = Wakeup()
        on_ack = service.on_ack

        def counting_on_ack(connection: HAConnection, offset: int) -> None:
            self.count += 1
            on_ack(connection, offset)
            self.wakeup.notify()

        setattr(service, "on_ack", counting_on_ack)  # noqa: B010 (shadows the method)

    @property
    def best(self) -> int:
        """The highest ack of a live slave (-1: none)."""
        return max(self.service.live_acks(), default=-1)

    async def wait_acked(self, offset: int) -> None:
        """Return once a live slave has acked *offset*."""
        while self.best < offset:
            await self.wakeup.wait()


# --- child processes speaking JSON lines ---------------------------------------------------------


class Child:
    """A Python child process that prints one JSON object per line on stdout."""

    def __init__(self, process: trio.Process, name: str) -> None:
        self.process = process
        self.name = name
        self._buffer = bytearray()

    @property
    def pid(self) -> int:
        return self.process.pid

    async def next_event(self, kind: str | None = None) -> dict[str, Any]:
        """The next JSON line (of type *kind*, skipping others); raises if the child ends."""
        assert self.process.stdout is not None
        while True:
            newline = self._buffer.find(b"\n")
            if newline >= 0:
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                if not line.strip():
                    continue
                try:
                    event: dict[str, Any] = json.loads(line)
                except json.JSONDecodeError:
                    print(f"[{self.name}] {line.decode(errors='replace')}", file=sys.stderr)
                    continue
                if kind is None or event.get("event") == kind:
                    return event
                continue
            chunk = await self.process.stdout.receive_some(65536)
            if not chunk:
                code = await self.process.wait()
                raise RuntimeError(f"{self.name} exited with code {code} before sending {kind!r}")
            self._buffer += chunk

    async def stop(self, grace: float = 10.0) -> int:
        """SIGTERM the child, wait for it (SIGKILL after *grace* seconds), return its code."""
        if self.process.returncode is None:
            self.process.terminate()
        with trio.move_on_after(grace):
            return await self.process.wait()
        self.process.kill()
        return await self.process.wait()


def child_command(module: str, *args: str | int) -> list[str]:
    """``python -m bench.<module> args...``; run it with ``cwd=ROOT``."""
    return [sys.executable, "-m", f"bench.{module}", *map(str, args)]


@asynccontextmanager
async def open_child(
    module: str,
    args: Sequence[str],
    name: str,
    env: dict[str, str] | None = None,
    wrapper: Sequence[str] = (),
) -> AsyncIterator[Child]:
    """Run ``python -m bench.<module> args...`` for the duration of the block (under
    *wrapper*, a command such as ``valgrind --tool=callgrind``, if given)."""
    process = await trio.lowlevel.open_process(
        [*wrapper, *child_command(module, *args)],
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, **env} if env else None,
    )
    child = Child(process, name)
    try:
        yield child
    finally:
        with trio.CancelScope(shield=True):
            await child.stop()
            if process.stdout is not None:
                await process.stdout.aclose()


def emit(**event: Any) -> None:
    """A child's side of :class:`Child`: one JSON line on stdout, flushed."""
    try:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # the parent is gone; nobody is listening any more
        pass


# --- progress of a long phase ------------------------------------------------------------------

#: A bench's progress lines go to stdout beside what it says, whatever logging is set up.
_progress_log = logging.getLogger("bench.progress")
_progress_log.propagate = False
_progress_log.setLevel(logging.INFO)
if not _progress_log.handlers:
    _handler = logging.StreamHandler(sys.stdout)
    _handler.setFormatter(logging.Formatter("  %(message)s"))
    _progress_log.addHandler(_handler)


def phase_progress(
    what: str, total: float | None, *, start: float | None = None, interval: float = 2.0
) -> Progress:
    """trioha's progress report for a long phase of a bench, in bytes: a bar when stdout is a
    terminal, else a line every *interval* seconds and one at the end. *start* is when the
    phase began on ``time.monotonic()`` (one clock for every process on Linux, so a child's
    event time will do)."""
    return Progress(
        what,
        total=total,
        unit="B",
        interval=interval,
        stream=sys.stdout,
        logger=_progress_log,
        start=start,
    )
