"""When the master's log reached an offset: what "seconds behind" is measured from.

A slave's byte lag says how much it misses; how *old* the oldest missing byte is says how much
an operator would lose in time if the master died now (RocketMQ reports only bytes,
``HAService.push2SlaveMaxOffset`` minus the slave's ack). The master keeps a small ring of
``(log end, when)`` samples as its log grows; the time at which the log first went past a
slave's acked offset is that of the first sample beyond it.

Bounded and cheap: one sample per ``resolution`` at most, and when the ring is full every
other sample is dropped, so it always spans the whole run with a resolution that coarsens only
for offsets acked long ago (a slave hours behind is "hours" behind, give or take minutes).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable


class LogTimeline:
    """``(end offset, monotonic time)`` samples of a growing log."""

    __slots__ = ("_clock", "_offsets", "_times", "capacity", "resolution")

    def __init__(self, end: int, *, capacity: int = 1024, resolution: float = 0.01,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if capacity < 2:
            raise ValueError("a timeline needs room for at least 2 samples")
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
            # Keep the first (start-up) sample and every other one after it.
            self._offsets = self._offsets[:1] + self._offsets[2::2]
            self._times = self._times[:1] + self._times[2::2]
        self._offsets.append(end)
        self._times.append(now)

    def seconds_behind(self, acked: int, end: int) -> float:
        """How long ago the log first went past *acked* (0 when *acked* reaches *end*)."""
        if acked >= end:
            return 0.0
        i = bisect.bisect_right(self._offsets, acked)
        when = self._times[min(i, len(self._times) - 1)]
        return max(0.0, self._clock() - when)
