"""Process-wide settings for a process whose main job is serving a broker.

CPython's cyclic garbage collector runs a young-generation pass every 700 net allocations and
walks every live container object in the older ones now and then. A broker allocates a few
objects per message and keeps many alive (a parked task and its coroutine frames per waiting
put), so with the default thresholds collections cost it a measurable share of each put: with
64 producers of 1 KiB sync puts, 5-7% of throughput on the machine ``docs/performance.md``
describes. :func:`tune_gc_for_serving` moves what start-up allocated out of the collector's
sight (``gc.freeze``) and collects the young generation every 50,000 allocations instead; the
collector still runs, so cyclic garbage is still reclaimed, only in larger steps.

It changes the whole process, so the library never calls it by itself: ``python -m trioha
master|slave`` and the benchmarks do; an application embedding a broker decides for itself.
"""

from __future__ import annotations

import gc
from typing import Final

YOUNG_THRESHOLD: Final = 50_000
OLDER_THRESHOLDS: Final = (20, 100)


def tune_gc_for_serving() -> None:
    """Freeze what exists now and collect in larger steps (see the module note)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
