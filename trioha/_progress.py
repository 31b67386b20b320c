"""Progress of long work: a bar on a terminal, a periodic log line otherwise.

Catching up gigabytes, scanning a store on open, auditing or exporting a log can take minutes;
an operator wants to see how far it is, how fast it goes and when it ends. On a terminal
:class:`Progress` draws a ``tqdm`` bar (tqdm is a dependency of trioha); anywhere else (a service's
journal, a container's log) it logs one line every ``interval`` seconds::

    slave catch-up: 512.0 MiB of 1.0 GiB (50%), 310.2 MiB/s, ETA 1.7 s

The caller says how much is done (:meth:`Progress.update` or :meth:`Progress.set`); the time
comes from a clock the caller may replace, so tests need no sleeping.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from tqdm import tqdm

log = logging.getLogger("trioha.progress")


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def _amount(n: float, unit: str) -> str:
    return human_bytes(n) if unit == "B" else f"{n:,.0f} {unit}"


class Progress:
    """How far a piece of work is: ``done`` of ``total`` (None when unknown) ``unit``s."""

    def __init__(
        self,
        what: str,
        *,
        total: float | None = None,
        unit: str = "B",
        interval: float = 10.0,
        stream: TextIO | None = None,
        terminal: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger = log,
        start: float | None = None,
    ) -> None:
        self.what = what
        self.total = total
        self.unit = unit
        self.done: float = 0
        self.interval = interval
        self._clock = clock
        self._log = logger
        #: When the work began (*start*, on *clock*'s time; default now).
        self._start = clock() if start is None else start
        self._last_line = self._start
        stream = stream if stream is not None else sys.stderr
        if terminal is None:
            terminal = bool(getattr(stream, "isatty", lambda: False)())
        self._bar: tqdm[Any] | None = None
        self._closed = False
        if terminal:
            scale = unit == "B"
            self._bar = tqdm(
                total=total,
                desc=what,
                unit=unit,
                unit_scale=scale,
                unit_divisor=1024 if scale else 1000,
                file=stream,
                leave=True,
            )

    def update(self, amount: float) -> None:
        """``amount`` more is done."""
        self.set(self.done + amount)

    def set(self, done: float, total: float | None = None) -> None:
        """Now ``done`` is done (and, if given, the total changed: a growing log)."""
        if total is not None:
            self.total = total
            if self._bar is not None:
                self._bar.total = total
        if self._bar is not None:
            self._bar.update(done - self.done)
        self.done = done
        now = self._clock()
        if self._bar is None and now - self._last_line >= self.interval:
            self._last_line = now
            self._log.info("%s", self.line(now))

    def rate(self, now: float | None = None) -> float:
        elapsed = (self._clock() if now is None else now) - self._start
        return self.done / elapsed if elapsed > 0 else 0.0

    def line(self, now: float | None = None) -> str:
        """``what: done of total (pct), rate/s, ETA t``: what a log line says."""
        now = self._clock() if now is None else now
        rate = self.rate(now)
        parts = [f"{self.what}: {_amount(self.done, self.unit)}"]
        if self.total:
            pct = 100 * self.done / self.total
            parts[0] += f" of {_amount(self.total, self.unit)} ({pct:.0f}%)"
        text = parts[0] + f", {_amount(rate, self.unit)}/s"
        if self.total and rate > 0 and self.done < self.total:
            text += f", ETA {(self.total - self.done) / rate:.1f} s"
        return text

    def finish(self, done: float, *, stopped: bool = False) -> None:
        """The work ended with *done* done: the final line (or bar) says so, and no periodic
        line comes just before it."""
        if self._bar is not None:
            self._bar.update(done - self.done)
        self.done = done
        self.close(stopped=stopped)

    def close(self, *, stopped: bool = False) -> None:
        """The work ended (*stopped*: by an error or an interrupt, before it was done):
        close the bar, or log the final line."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._closed:
            return
        else:
            outcome = "stopped after" if stopped else "done in"
            self._log.info("%s (%s %.1f s)", self.line(), outcome, self._clock() - self._start)
        self._closed = True

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self.close(stopped=kind is not None)
