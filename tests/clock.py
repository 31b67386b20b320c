"""An autojump MockClock that never jumps while a Trio worker thread is still running.

pytest-trio's ``autojump_clock`` jumps to the next deadline as soon as every task is blocked,
and a task waiting in ``trio.to_thread.run_sync`` counts as blocked (python-trio/trio#456).
The broker hands every fsync, epoch-file write and truncation to a worker thread, so under
the plain clock a test could see twenty virtual seconds pass during one real fsync: a
master's housekeeping timeout fired while its slave was still flushing before its first
report, and the pair reconnected forever. Whether it happened depended on how fast the
thread ran, which is what made such tests flaky.

This clock skips the jump while ``trio.testing.active_thread_count()`` is non-zero; the run
loop then polls again at once, and the jump happens once the thread's result is in. Time
still moves only when Trio itself is idle, so tests stay deterministic.

``MockClock`` cannot be subclassed, and the run loop calls its ``_autojump`` when it has been
idle for the threshold; the clock made here wraps that one method on the instance.
``tests/test_clock.py`` pins the behaviour, so a Trio release that changes the hook fails
there by name rather than as flaky timeouts elsewhere.
"""

from __future__ import annotations

import trio
import trio.testing


def thread_aware_autojump_clock() -> trio.testing.MockClock:
    """``MockClock(autojump_threshold=0)`` that waits for worker threads before jumping."""
    clock = trio.testing.MockClock(autojump_threshold=0)
    jump = clock._autojump

    def autojump_unless_a_thread_runs() -> None:
        if not trio.testing.active_thread_count():
            jump()

    clock._autojump = autojump_unless_a_thread_runs  # type: ignore[method-assign]
    return clock
