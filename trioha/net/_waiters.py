"""Tasks parked until the log reaches an offset, each with its own timeout (group commit).

The sync put paths of RocketMQ's ``GroupTransferService`` and ``GroupCommitService``
(docs/rocketmq-protocol.md §5.1): many puts wait for "the slave (or the disk) holds everything up to
my end"; one ack or one fsync releases every put it covers. Measured on the sync put path, a
``trio.Event`` and a ``move_on_after`` scope per put, kept in a heap of ordered attrs instances,
cost more master CPU than the put itself. Here a waiting put is a parked task
(``wait_task_rescheduled``) in a heap of plain tuples, and the timeouts of all of them are kept by
one task, :meth:`OffsetWaiters.expire`.

Every waiter gets the same timeout, so the order of arrival is the order of deadlines: a deque,
not a second heap, and the expiring task sleeps until the oldest pending deadline.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math
from collections.abc import Callable
from typing import Generic, NoReturn, TypeVar

import trio
from outcome import Error, Value

from trioha.net._wakeup import Wakeup

T = TypeVar("T")


class _Waiter:
    """One parked task; ``done`` once it has been answered (or cancelled)."""

    __slots__ = ("deadline", "done", "start", "task")

    def __init__(self, task: trio.lowlevel.Task, start: int, deadline: float) -> None:
        self.task = task
        self.start = start
        self.deadline = deadline
        self.done = False


class OffsetWaiters(Generic[T]):
    """Tasks waiting until an offset is covered, answered *covered* or, after *timeout*, *expired*.

    ``wait(end)`` parks the calling task; ``release(upto)`` answers every waiter whose end is at
    most *upto* (in end order, so one call costs the waiters it releases plus a log factor);
    :meth:`expire` must be running for waits to time out, and a wait refuses to park without it
    rather than hang.
    """

    def __init__(self, timeout: float, *, covered: T, expired: T) -> None:
        self.timeout = timeout
        self._covered = covered
        self._expired = expired
        self._by_end: list[tuple[int, int, _Waiter]] = []
        self._by_deadline: collections.deque[_Waiter] = collections.deque()
        self._seq = itertools.count()
        self._pending = 0
        self._expiring = 0
        self._arrived = Wakeup()

    def __len__(self) -> int:
        """How many tasks are waiting."""
        return self._pending

    @property
    def lowest_end(self) -> float:
        """No waiter needs less than this (``math.inf`` when none waits): a release below it
        answers nobody. Answered waiters still in the heap may make it lower, never higher."""
        return self._by_end[0][0] if self._pending else math.inf

    async def wait(self, end: int, *, start: int = 0) -> T:
        """Park until ``release`` covers *end* (and, if asked, *start*), or the timeout passes."""
        if not self._expiring:
            raise RuntimeError("OffsetWaiters.expire() is not running; a wait would never time out")
        waiter = _Waiter(trio.lowlevel.current_task(), start, trio.current_time() + self.timeout)
        heapq.heappush(self._by_end, (end, next(self._seq), waiter))
        self._by_deadline.append(waiter)
        self._pending += 1
        if len(self._by_deadline) == 1:
            self._arrived.notify()

        def abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
            self._answered(waiter)
            return trio.lowlevel.Abort.SUCCEEDED

        result: T = await trio.lowlevel.wait_task_rescheduled(abort)
        return result

    def release(self, upto: int, holds: Callable[[int, int], bool] | None = None) -> int:
        """Answer every waiter with ``end <= upto``; how many were answered.

        With *holds*, a waiter is answered only if ``holds(start, end)``; the others stay (until a
        later release or their timeout).
        """
        heap, kept, released = self._by_end, [], 0
        value = self._covered
        while heap and heap[0][0] <= upto:
            entry = heapq.heappop(heap)
            waiter = entry[2]
            if waiter.done:
                continue
            if holds is not None and not holds(waiter.start, entry[0]):
                kept.append(entry)
                continue
            waiter.done = True
            trio.lowlevel.reschedule(waiter.task, Value(value))  # an outcome is used once
            released += 1
        self._pending -= released
        for entry in kept:
            heapq.heappush(heap, entry)
        by_deadline = self._by_deadline
        while by_deadline and by_deadline[0].done:
            by_deadline.popleft()
        return released

    def fail_all(self, value: T) -> int:
        """Answer every waiter with *value* now; how many were answered."""
        answered = 0
        for _end, _seq, waiter in self._by_end:
            if not waiter.done:
                waiter.done = True
                answered += 1
                trio.lowlevel.reschedule(waiter.task, Value(value))
        self._pending -= answered
        self._by_end.clear()
        self._by_deadline.clear()
        return answered

    async def expire(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> NoReturn:
        """Answer *expired* to every waiter whose timeout has passed; runs until cancelled.

        Start it with ``nursery.start``: waits are accepted once it has started.
        """
        self._expiring += 1
        task_status.started()
        try:
            by_deadline = self._by_deadline
            while True:
                while by_deadline and by_deadline[0].done:
                    by_deadline.popleft()
                if not by_deadline:
                    await self._arrived.wait()
                    continue
                # Later arrivals have later deadlines: nothing can need answering sooner.
                await trio.sleep_until(by_deadline[0].deadline)
                now = trio.current_time()
                while by_deadline and by_deadline[0].deadline <= now:
                    waiter = by_deadline.popleft()
                    if not waiter.done:
                        self._answered(waiter)
                        trio.lowlevel.reschedule(waiter.task, Value(self._expired))
        finally:
            self._expiring -= 1
            if not self._expiring:
                self._abandon()

    def _abandon(self) -> None:
        """The last expiring task stopped: nobody would ever time the parked waiters out.

        Each of them gets an error now instead of waiting forever (its put's outcome is
        unknown to it: the caller decides, as for a wait refused up front).
        """
        for waiter in self._by_deadline:
            if not waiter.done:
                waiter.done = True
                self._pending -= 1
                stopped = RuntimeError("OffsetWaiters.expire() stopped while this wait was parked")
                trio.lowlevel.reschedule(waiter.task, Error(stopped))
        self._by_deadline.clear()
        self._by_end.clear()

    def _answered(self, waiter: _Waiter) -> None:
        """*waiter* leaves before ``release`` reached it (timed out, or cancelled)."""
        waiter.done = True
        self._pending -= 1
        # Answered waiters are dropped lazily when they reach the top of the heap; one whose end
        # is never acked (a hung slave) would stay forever, so compact once they dominate.
        heap = self._by_end
        if len(heap) > 64 and len(heap) > 2 * self._pending:
            heap[:] = [entry for entry in heap if not entry[2].done]
            heapq.heapify(heap)
