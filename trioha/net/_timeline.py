"""When the master's log reached an offset: what "seconds behind" is measured from.

A slave's byte lag says how much it misses; how *old* the oldest missing byte is says how much
an operator would lose in time if the master died now (RocketMQ reports only bytes,
``HAService.push2SlaveMaxOffset`` minus the slave's ack). The master keeps a small ring of
``(log end, when)`` samples as its log grows; the time at which the log first went past a
slave's acked offset is that of the first sample beyond it.

Bounded and cheap: one sample per ``resolution`` at most (growth within it moves the last
sample's offset), samples every slave has acked past are dropped (:meth:`acked`), so a healthy
slave keeps the ring short; should it fill anyway (a slave far behind), neighbouring samples
are merged pairwise keeping the earlier time, so the answer may grow coarse for offsets acked
long ago, off by at most the spacing of the samples around it.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable


class LogTimeline:
    """``(end offset, monotonic time)`` samples of a growing log."""

    __slots__ = ("_clock", "_offsets", "_times", "capacity", "resolution")

    def __init__(
        self,
        end: int,
        *,
        capacity: int = 1024,
        resolution: float = 0.01,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 3:
            # The start-up sample is kept and the rest merged in pairs: with 2 samples there
            # is no pair to merge, and the ring would hold one more than its capacity.
            raise ValueError("a timeline needs room for at least 3 samples")
        self.capacity = capacity
        self.resolution = resolution
        self._clock = clock
        # The log already ended at *end* when we started: those bytes are at least this old.
        self._offsets = [end]
        self._times = [clock()]

    def grew(self, end: int) -> None:
        """The log now ends at *end*."""
        if end <= self._offsets[-1]:
            return
        now = self._clock()
        if now - self._times[-1] < self.resolution and len(self._offsets) > 1:
            self._offsets[-1] = end  # same instant, as far as we measure
            return
        if len(self._offsets) >= self.capacity:
            self._merge_pairs()
        self._offsets.append(end)
        self._times.append(now)

    def _merge_pairs(self) -> None:
        """Halve the ring: each pair after the start-up sample becomes its later offset with
        its earlier time (the bytes of both may be as old as the earlier)."""
        offsets, times = self._offsets, self._times
        self._offsets = (
            [offsets[0]] + offsets[2::2] + ([offsets[-1]] if len(offsets) % 2 == 0 else [])
        )
        self._times = [times[0]] + times[1:-1:2] + ([times[-1]] if len(times) % 2 == 0 else [])

    def acked(self, offset: int) -> None:
        """Every slave holds the log up to *offset*: forget what lies before it (one sample at
        or below it stays, the anchor of the next one's range)."""
        i = bisect.bisect_right(self._offsets, offset)
        if i > 1:
            del self._offsets[: i - 1]
            del self._times[: i - 1]

    def __len__(self) -> int:
        return len(self._offsets)

    def seconds_behind(self, acked: int, end: int) -> float:
        """How long ago the log first went past *acked* (0 when *acked* reaches *end*)."""
        if acked >= end:
            return 0.0
        i = bisect.bisect_right(self._offsets, acked)
        when = self._times[min(i, len(self._times) - 1)]
        return max(0.0, self._clock() - when)
