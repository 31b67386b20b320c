"""The test suite's autojump clock waits for worker threads (see ``tests/clock.py``)."""

from __future__ import annotations

import time

import trio
import trio.testing

from tests.clock import thread_aware_autojump_clock


def _slow_fsync() -> str:
    time.sleep(0.2)
    return "flushed"


def test_time_still_jumps_when_trio_is_idle() -> None:
    async def main() -> float:
        await trio.sleep(3600)
        return trio.current_time()

    started = time.monotonic()
    assert trio.run(main, clock=thread_aware_autojump_clock()) >= 3600
    assert time.monotonic() - started < 60


def test_time_does_not_jump_while_a_worker_thread_runs() -> None:
    # A timer 20 s out, as a master's housekeeping would be, must not expire during one real
    # fsync; under pytest-trio's plain autojump clock it does.
    async def main() -> float:
        await trio.to_thread.run_sync(_slow_fsync)
        return trio.current_time()

    async def with_a_timer() -> float:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep, 20)
            now = await main()
            nursery.cancel_scope.cancel()
        return now

    assert trio.run(with_a_timer, clock=trio.testing.MockClock(autojump_threshold=0)) >= 20
    assert trio.run(with_a_timer, clock=thread_aware_autojump_clock()) < 20
