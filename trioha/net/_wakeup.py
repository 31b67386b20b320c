"""A broadcast "something changed" signal for tasks that wait on a condition or a deadline."""

from __future__ import annotations

import math

import trio


class Wakeup:
    """Tasks park on it; ``notify`` wakes them all at once.

    A waiter checks its condition, then waits; Trio runs one task at a time and nothing awaits
    between the check and the park, so no notification can fall in between (unlike RocketMQ's
    ``WaitNotifyObject``, whose unregistered threads miss wakeups, docs/rocketmq-protocol.md §2.5).
    """

    def __init__(self) -> None:
        self._lot = trio.lowlevel.ParkingLot()

    def notify(self) -> None:
        if self._lot:  # called on every put: skip the parking lot's work when nobody waits
            self._lot.unpark_all()

    async def wait(self, deadline: float = math.inf) -> None:
        """Return at the next ``notify`` or at *deadline* (Trio clock), whichever is first."""
        if deadline == math.inf:
            await self._lot.park()
            return
        with trio.move_on_at(deadline):
            await self._lot.park()
