"""OffsetWaiters: parked puts released in offset order, each with its own timeout."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from trioha.net._waiters import OffsetWaiters

OK, LATE = "covered", "expired"


def waiters(timeout: float = 3.0) -> OffsetWaiters[str]:
    return OffsetWaiters(timeout, covered=OK, expired=LATE)


async def test_a_wait_without_the_expiring_task_is_refused() -> None:
    refused = r"^OffsetWaiters\.expire\(\) is not running; a wait would never time out$"
    with pytest.raises(RuntimeError, match=refused):
        await waiters().wait(10)


async def test_one_release_answers_every_covered_waiter_and_no_other(
    autojump_clock: trio.abc.Clock,
) -> None:
    w = waiters()
    answers: dict[int, str] = {}

    async def put(end: int) -> None:
        answers[end] = await w.wait(end)

    async with trio.open_nursery() as nursery:
        await nursery.start(w.expire)
        for end in (30, 10, 20, 40):
            nursery.start_soon(put, end)
        await trio.testing.wait_all_tasks_blocked()
        assert len(w) == 4
        assert w.release(25) == 2
        await trio.testing.wait_all_tasks_blocked()
        assert answers == {10: OK, 20: OK}
        assert w.release(40) == 2
        await trio.testing.wait_all_tasks_blocked()
        assert answers == {10: OK, 20: OK, 30: OK, 40: OK}
        assert len(w) == 0
        nursery.cancel_scope.cancel()


async def test_holds_keeps_a_waiter_until_a_later_release(autojump_clock: trio.abc.Clock) -> None:
    w = waiters()
    answers: list[tuple[int, str]] = []

    async def put(start: int, end: int) -> None:
        answers.append((start, await w.wait(end, start=start)))

    async with trio.open_nursery() as nursery:
        await nursery.start(w.expire)
        nursery.start_soon(put, 0, 10)
        nursery.start_soon(put, 5, 10)
        await trio.testing.wait_all_tasks_blocked()
        assert w.release(10, lambda start, _end: start >= 5) == 1
        await trio.testing.wait_all_tasks_blocked()
        assert answers == [(5, OK)]
        assert w.release(10) == 1
        await trio.testing.wait_all_tasks_blocked()
        assert answers == [(5, OK), (0, OK)]
        nursery.cancel_scope.cancel()


async def test_each_waiter_times_out_after_its_own_timeout(autojump_clock: trio.abc.Clock) -> None:
    w = waiters(timeout=3.0)
    answered: list[tuple[int, str, float]] = []

    async def put(end: int) -> None:
        result = await w.wait(end)
        answered.append((end, result, trio.current_time()))

    async with trio.open_nursery() as nursery:
        await nursery.start(w.expire)
        t0 = trio.current_time()
        nursery.start_soon(put, 10)
        await trio.sleep(1.0)
        nursery.start_soon(put, 20)
        await trio.sleep(1.0)
        nursery.start_soon(put, 30)
        await trio.sleep(0.5)
        w.release(30)  # at 2.5 s: before the first one's 3 s have passed
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert sorted((end, result) for end, result, _ in answered) == [(10, OK), (20, OK), (30, OK)]
    assert all(at - t0 == pytest.approx(2.5) for _, _, at in answered)

    w = waiters(timeout=3.0)
    answered.clear()
    async with trio.open_nursery() as nursery:
        await nursery.start(w.expire)
        t0 = trio.current_time()
        nursery.start_soon(put, 10)
        await trio.sleep(1.0)
        nursery.start_soon(put, 20)
        await trio.sleep(2.5)
        assert [(end, result) for end, result, _ in answered] == [(10, LATE)]
        assert answered[0][2] - t0 == pytest.approx(3.0)
        w.release(20)
        await trio.testing.wait_all_tasks_blocked()
        assert answered[1][:2] == (20, OK)
        nursery.cancel_scope.cancel()


async def test_a_cancelled_waiter_leaves_and_is_never_answered(
    autojump_clock: trio.abc.Clock,
) -> None:
    w = waiters()
    async with trio.open_nursery() as nursery:
        await nursery.start(w.expire)
        with trio.move_on_after(1.0) as scope:
            await w.wait(10)
        assert scope.cancelled_caught
        assert len(w) == 0
        assert w.release(10) == 0
        await trio.sleep(5.0)  # past its timeout: the expiring task must skip it too
        nursery.cancel_scope.cancel()


async def test_waiters_that_are_never_covered_do_not_accumulate(
    autojump_clock: trio.abc.Clock,
) -> None:
    # A hung slave: every put times out, and no ack ever reaches their ends.
    w = waiters(timeout=0.5)
    results: list[str] = []

    async def put(end: int) -> None:
        results.append(await w.wait(end))

    async with trio.open_nursery() as nursery:
        await nursery.start(w.expire)
        for round_ in range(20):
            async with trio.open_nursery() as puts:
                for i in range(100):
                    puts.start_soon(put, 1000 + round_ * 100 + i)
        assert results == [LATE] * 2000
        assert len(w) == 0
        assert len(w._by_end) <= 200 and len(w._by_deadline) == 0
        nursery.cancel_scope.cancel()


async def test_hundreds_of_waiters_most_timed_out_lose_no_live_one(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Compaction (answered waiters dominate a heap of more than 64) keeps every live waiter."""
    w = waiters(timeout=3.0)
    answers: dict[int, str] = {}

    async def put(end: int) -> None:
        answers[end] = await w.wait(end)

    async with trio.open_nursery() as nursery:
        await nursery.start(w.expire)
        for i in range(250):  # a hung slave's puts: none is ever covered
            nursery.start_soon(put, 10_000 + i)
        await trio.sleep(1.0)
        for end in range(1, 51):
            nursery.start_soon(put, end)
        await trio.sleep(2.5)  # the 250 time out (and are compacted away); the 50 do not
        assert len(w) == 50
        assert len(w._by_end) < 250  # compacted, not merely skipped
        assert sum(1 for a in answers.values() if a == LATE) == 250
        assert w.release(25) == 25
        assert w.release(50) == 25
        await trio.testing.wait_all_tasks_blocked()
        assert [answers[end] for end in range(1, 51)] == [OK] * 50
        assert len(w) == 0
        nursery.cancel_scope.cancel()


async def test_compaction_when_every_waiter_has_timed_out(autojump_clock: trio.abc.Clock) -> None:
    """With no live waiter left the heap empties (no division by the live count) and still works."""
    w = waiters(timeout=1.0)
    results: list[str] = []

    async def put(end: int) -> None:
        results.append(await w.wait(end))

    async with trio.open_nursery() as nursery:
        await nursery.start(w.expire)
        async with trio.open_nursery() as puts:
            for i in range(130):
                puts.start_soon(put, 100 + i)
        assert results == [LATE] * 130
        assert len(w) == 0
        assert len(w._by_end) <= 64
        nursery.start_soon(put, 5)
        await trio.testing.wait_all_tasks_blocked()
        assert w.release(5) == 1
        await trio.testing.wait_all_tasks_blocked()
        assert results[-1] == OK
        nursery.cancel_scope.cancel()


async def test_a_parked_wait_raises_when_expire_stops(autojump_clock: trio.abc.Clock) -> None:
    """Nothing would ever time it out: it raises instead of waiting forever."""
    w = waiters(timeout=3.0)
    outcomes: list[str] = []

    async def put(end: int) -> None:
        try:
            outcomes.append(await w.wait(end))
        except RuntimeError as exc:
            outcomes.append(f"raised: {exc}")

    with trio.fail_after(60):  # virtual time: without the fix the waits park forever
        await _park_two_then_stop_expiring(w, put)
    assert len(w) == 0
    assert outcomes == ["raised: OffsetWaiters.expire() stopped while this wait was parked"] * 2
    with pytest.raises(RuntimeError, match="expire"):  # and a new wait is refused
        await w.wait(30)
    assert w.release(100) == 0


async def _park_two_then_stop_expiring(
    w: OffsetWaiters[str], put: Callable[[int], Awaitable[None]]
) -> None:
    async with trio.open_nursery() as outer, trio.open_nursery() as expiring:
        await expiring.start(w.expire)
        outer.start_soon(put, 10)
        outer.start_soon(put, 20)
        await trio.testing.wait_all_tasks_blocked()
        assert len(w) == 2
        expiring.cancel_scope.cancel()


async def test_waits_work_again_once_expire_restarts(autojump_clock: trio.abc.Clock) -> None:
    w = waiters(timeout=3.0)
    async with trio.open_nursery() as first:
        await first.start(w.expire)
        first.cancel_scope.cancel()
    async with trio.open_nursery() as second:
        await second.start(w.expire)
        t0 = trio.current_time()
        assert await w.wait(10) == LATE
        assert trio.current_time() - t0 == pytest.approx(3.0)
        second.cancel_scope.cancel()


async def test_the_heap_stays_within_twice_the_live_waiters(autojump_clock: trio.abc.Clock) -> None:
    """After every answer the heap holds at most max(64, 2 x live) entries: 65 waiters time out
    one by one, and the heap is compacted the moment 33 of them are gone."""
    w = waiters(timeout=1.0)
    sizes: list[tuple[int, int]] = []

    async def put(end: int) -> None:
        await w.wait(end)

    async with trio.open_nursery() as nursery:
        await nursery.start(w.expire)
        for i in range(65):
            nursery.start_soon(put, 1000 + i)
            await trio.sleep(0.01)
        while len(w):
            await trio.sleep(0.01)
            sizes.append((len(w._by_end), len(w)))
        nursery.cancel_scope.cancel()
    assert all(heap <= max(64, 2 * live) for heap, live in sizes), sizes
    assert (32, 32) in sizes  # compacted as soon as answered waiters outnumber live ones


async def test_a_timed_out_waiter_below_live_ones_does_not_stop_a_release(
    autojump_clock: trio.abc.Clock,
) -> None:
    w = waiters(timeout=1.0)
    answers: dict[int, str] = {}

    async def put(end: int) -> None:
        answers[end] = await w.wait(end)

    async with trio.open_nursery() as nursery:
        await nursery.start(w.expire)
        nursery.start_soon(put, 5)
        await trio.sleep(0.5)
        for end in range(6, 11):
            nursery.start_soon(put, end)
        await trio.sleep(0.6)  # the first one timed out; it is still at the top of the heap
        assert answers == {5: LATE}
        assert w.release(10) == 5
        assert len(w._by_deadline) == 0  # answered waiters leave the deadline queue at once
        await trio.testing.wait_all_tasks_blocked()
        assert answers == {5: LATE, 6: OK, 7: OK, 8: OK, 9: OK, 10: OK}
        nursery.cancel_scope.cancel()


async def test_a_wait_without_a_start_counts_from_zero(autojump_clock: trio.abc.Clock) -> None:
    w = waiters()
    seen: list[tuple[int, int]] = []

    def holds(start: int, end: int) -> bool:
        seen.append((start, end))
        return True

    async with trio.open_nursery() as nursery:
        await nursery.start(w.expire)
        nursery.start_soon(w.wait, 10)
        await trio.testing.wait_all_tasks_blocked()
        assert w.lowest_end == 10
        assert w.release(10, holds) == 1
        assert seen == [(0, 10)]
        assert w.lowest_end == float("inf")
        nursery.cancel_scope.cancel()


async def test_a_waiter_held_back_does_not_hold_back_the_ones_behind_it(
    autojump_clock: trio.abc.Clock,
) -> None:
    """``holds`` refuses the lowest end; a higher one it accepts is still answered."""
    w = waiters()
    answers: dict[int, str] = {}

    async def put(start: int, end: int) -> None:
        answers[end] = await w.wait(end, start=start)

    async with trio.open_nursery() as nursery:
        await nursery.start(w.expire)
        nursery.start_soon(put, 0, 10)
        nursery.start_soon(put, 5, 20)
        await trio.testing.wait_all_tasks_blocked()
        assert w.release(20, lambda start, _end: start >= 5) == 1
        await trio.testing.wait_all_tasks_blocked()
        assert answers == {20: OK}
        assert len(w) == 1 and w.lowest_end == 10
        nursery.cancel_scope.cancel()


async def test_waits_go_on_while_one_of_two_expiring_tasks_remains(
    autojump_clock: trio.abc.Clock,
) -> None:
    w = waiters(timeout=3.0)
    async with trio.open_nursery() as nursery:
        async with trio.open_nursery() as first:
            await first.start(w.expire)
            await nursery.start(w.expire)
            nursery.start_soon(w.wait, 10)
            await trio.testing.wait_all_tasks_blocked()
            first.cancel_scope.cancel()  # one stops; the other still times waits out
        await trio.testing.wait_all_tasks_blocked()
        assert len(w) == 1
        t0 = trio.current_time()
        assert await w.wait(20) == LATE
        assert trio.current_time() - t0 == pytest.approx(3.0)
        nursery.cancel_scope.cancel()


async def test_released_waiters_left_in_the_deadline_queue_are_skipped(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Released waiters stay queued by deadline until reached: never answered twice."""
    w = waiters(timeout=3.0)
    answers: dict[int, tuple[str, float]] = {}

    async def put(end: int) -> None:
        outcome = await w.wait(end)
        answers[end] = (outcome, trio.current_time())

    async with trio.open_nursery() as nursery:
        await nursery.start(w.expire)
        t0 = trio.current_time()
        nursery.start_soon(put, 30)  # A: expires at t0 + 3
        nursery.start_soon(put, 10)  # B: released; its deadline (t0 + 3) is reached with A's
        await trio.sleep(0.5)
        nursery.start_soon(put, 11)  # D: released; at the head of the queue after A and B
        await trio.sleep(0.1)
        nursery.start_soon(put, 40)  # C: expires at t0 + 3.6
        await trio.sleep(0.4)
        assert w.release(12) == 2
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(5)
        assert {end: outcome for end, (outcome, _) in answers.items()} == {
            10: OK,
            11: OK,
            30: LATE,
            40: LATE,
        }
        assert answers[30][1] - t0 == pytest.approx(3.0)
        assert answers[40][1] - t0 == pytest.approx(3.6)
        assert len(w) == 0
        nursery.cancel_scope.cancel()


async def test_stopping_expire_skips_waiters_already_released(
    autojump_clock: trio.abc.Clock,
) -> None:
    w = waiters(timeout=3.0)
    outcomes: dict[int, str] = {}

    async def put(end: int) -> None:
        try:
            outcomes[end] = await w.wait(end)
        except RuntimeError as exc:
            outcomes[end] = f"raised: {exc}"

    async with trio.open_nursery() as outer, trio.open_nursery() as expiring:
        await expiring.start(w.expire)
        outer.start_soon(put, 5)
        outer.start_soon(put, 50)
        await trio.testing.wait_all_tasks_blocked()
        assert w.release(6) == 1
        await trio.testing.wait_all_tasks_blocked()
        expiring.cancel_scope.cancel()
    assert outcomes == {
        5: OK,
        50: "raised: OffsetWaiters.expire() stopped while this wait was parked",
    }


async def test_fail_all_answers_every_waiter_at_once(autojump_clock: trio.abc.Clock) -> None:
    w = waiters()
    answers: dict[int, str] = {}

    async def put(end: int) -> None:
        answers[end] = await w.wait(end)

    async with trio.open_nursery() as nursery:
        await nursery.start(w.expire)
        for end in (10, 20, 30):
            nursery.start_soon(put, end)
        await trio.testing.wait_all_tasks_blocked()
        assert w.fail_all("failed") == 3
        await trio.testing.wait_all_tasks_blocked()
        assert answers == {10: "failed", 20: "failed", 30: "failed"}
        assert len(w) == 0
        assert w.release(100) == 0  # nothing left to cover, and nothing answered twice
        nursery.cancel_scope.cancel()
