"""Instruction counts under callgrind: the measured window, and running a command to count it.

Wall-clock figures on a shared machine follow whatever else runs; the number of instructions a
process executes for a fixed piece of work does not. :func:`run_counted` runs a command under
``valgrind --tool=callgrind`` and returns the instructions executed (all threads) between the
command's :func:`window` start and end, so start-up, imports and warm-up are left out without
subtracting anything.

The window's edges are two libc calls nothing else in the process makes, ``getpgrp`` and
``getsid``: callgrind zeroes its counters before the first and writes them out before the
second (``--zero-before``, ``--dump-before``), so no compiled helper is needed. Outside
callgrind the two calls cost a syscall each.

For a count that repeats run to run, the work must be the same: a fixed number of messages or
bytes, the same random draws (:func:`make_deterministic`, ``PYTHONHASHSEED=0`` in the
environment :func:`run_counted` gives), the same Trio scheduling order. What still depends on
time (timers that fire during the window) is small beside the work and shows as the spread
between two runs, which :mod:`bench.instructions` prints.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trio.testing import MockClock

_ZERO_AT = "getpgrp"
_DUMP_AT = "getsid"
#: What a counted process's environment adds: the same string hashes every run.
DETERMINISTIC_ENV = {"PYTHONHASHSEED": "0"}


@contextmanager
def window(clock: MockClock | None = None) -> Iterator[None]:
    """The instructions :func:`run_counted` counts are those executed inside this block.

    With *clock* (the :class:`~trio.testing.MockClock` the run was started with, running at
    rate 1 until now) Trio's time stands still inside the block: periodic work (persisting
    offsets, flushing on an interval, statistics) does not fire in the window however slowly
    callgrind runs it, so the count is the work done for the measured messages alone.
    """
    rate = clock.rate if clock is not None else 0.0
    if clock is not None:
        clock.rate = 0.0
    os.getpgrp()
    try:
        yield
    finally:
        os.getsid(0)
        if clock is not None:
            clock.rate = rate


def make_deterministic(seed: int = 0) -> None:
    """Seed :mod:`random` and Trio's scheduler, and keep Trio's idle worker threads alive.

    Trio shuffles a batch of ready tasks with its own :class:`random.Random`, and its worker
    threads exit after 10 s idle (real time, which under callgrind passes 50 times slower than
    the work, so an exit would land in a window in one run and not in the next). Both are
    private attributes, which a benchmark may set.
    """
    random.seed(seed)
    import trio

    scheduler_random = getattr(trio._core._run, "_r", None)
    if isinstance(scheduler_random, random.Random):
        scheduler_random.seed(seed)
    thread_cache = getattr(trio._core, "_thread_cache", None)
    if thread_cache is not None and hasattr(thread_cache, "IDLE_TIMEOUT"):
        thread_cache.IDLE_TIMEOUT = 24 * 3600


def valgrind_missing() -> str | None:
    """Why :func:`run_counted` cannot run here, or None."""
    if shutil.which("valgrind") is None:
        return "valgrind is not installed (apt-get install valgrind)"
    return None


def callgrind_command(out: Path) -> list[str]:
    """The command prefix that counts a process's window into *out* (``out.1-NN``, a file per
    thread that ran in it)."""
    return [
        "valgrind",
        "--quiet",
        "--tool=callgrind",
        "--separate-threads=yes",
        f"--zero-before={_ZERO_AT}",
        f"--dump-before={_DUMP_AT}",
        f"--callgrind-out-file={out}",
    ]


def read_window(out: Path, *, keep: Path | None = None) -> int:
    """The instructions counted in the window of the process that wrote *out* (all threads).

    Raises :class:`RuntimeError` if it never closed its window. *keep*: a path prefix where
    the window's profiles are copied (``callgrind_annotate`` reads them).
    """
    parts = sorted(out.parent.glob(f"{out.name}.1-*"))
    if not parts:
        raise RuntimeError(f"no measured window in {out}.1-*: the process never closed it")
    total = 0
    for part in parts:
        found = re.search(r"^summary:\s+(\d+)", part.read_text(), re.M)
        if found is None:
            raise RuntimeError(f"no summary line in {part}")
        total += int(found.group(1))
        if keep is not None:
            shutil.copy(part, f"{keep}{part.name.removeprefix(out.name + '.1')}")
    return total


def run_counted(
    command: Sequence[str],
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    keep: Path | None = None,
) -> tuple[int, str]:
    """Run *command* under callgrind; (instructions in its window, its stdout).

    Raises :class:`RuntimeError` if it fails or never closes its window; *keep* as for
    :func:`read_window`.
    """
    with tempfile.TemporaryDirectory(prefix="icount-") as tmp:
        out = Path(tmp) / "callgrind.out"
        result = subprocess.run(
            [*callgrind_command(out), *command],
            cwd=cwd,
            env={**os.environ, **DETERMINISTIC_ENV, **(env or {})},
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(command)} failed under callgrind ({result.returncode}):\n"
                + result.stderr[-3000:]
            )
        return read_window(out, keep=keep), result.stdout
