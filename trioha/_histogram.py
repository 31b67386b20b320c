"""A latency histogram cheap enough for the put path, exported by ``trioha.metrics``.

Observing is one ``bisect`` and two additions: no locks (everything runs on the Trio thread),
no allocation. The buckets are Prometheus's cumulative ``le`` buckets once exported; here each
count is per bucket, so an observation touches one slot.
"""

from __future__ import annotations

import bisect
from typing import Final

import attrs

#: Upper bounds in seconds: 50 µs to 10 s, roughly ×2.5 apart (a sync put on loopback takes
#: 100-300 µs; a FLUSH_SLAVE_TIMEOUT takes ``slave_timeout``, 3 s by default).
LATENCY_BUCKETS: Final = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


@attrs.frozen
class HistogramSnapshot:
    """Cumulative counts per upper bound (the last bound is +Inf), their sum and total."""

    buckets: tuple[tuple[float, int], ...]
    count: int
    sum: float


class LatencyHistogram:
    """Counts of observations per latency bucket, their sum and how many."""

    __slots__ = ("_bounds", "_counts", "count", "sum")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError("bucket bounds must be strictly increasing")
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)  # the last slot is +Inf
        self.count = 0
        self.sum = 0.0

    def observe(self, seconds: float, times: int = 1) -> None:
        """Count *times* observations of *seconds* (a burst answered by one wait)."""
        self._counts[bisect.bisect_left(self._bounds, seconds)] += times
        self.count += times
        self.sum += seconds * times

    def snapshot(self) -> HistogramSnapshot:
        cumulative = []
        total = 0
        for bound, n in zip((*self._bounds, float("inf")), self._counts, strict=True):
            total += n
            cumulative.append((bound, total))
        return HistogramSnapshot(tuple(cumulative), self.count, self.sum)
