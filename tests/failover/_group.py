"""A broker group's control cores wired to the in-memory etcd, stepped by hand.

Requests wait in :attr:`Group.inbox` until :meth:`Group.deliver` (or a test) hands them to
etcd, replies in :attr:`Group.outbox` until they are fed back; watches deliver the store's
events from the revision each core asked for. The data plane is not here: a test feeds the
facts it wants (:class:`~trioha.failover.LogChanged`, :class:`~trioha.failover.ReplicaAcked`)
and reads the actions each core returned in :attr:`Group.log`.
"""

from __future__ import annotations

from typing import Any, TypeVar

import attrs

from trioha.failover import (
    Action,
    Event,
    FailoverOptions,
    GroupKeys,
    Phase,
    Purpose,
    Range,
    ReplicaState,
    Replied,
    Request,
    Response,
    SendRequest,
    StartWatch,
    Tick,
    Watched,
    failover_step,
)
from trioha.testing import MemoryEtcd

KEYS = GroupKeys.of("DefaultCluster", "broker-a")
A = TypeVar("A")


@attrs.define
class Pending:
    broker: int
    request_id: int
    purpose: Purpose
    request: Request


class Group:
    """Brokers 1..n (``cores[i]`` is broker ``i``; index 0 unused)."""

    def __init__(self, n: int, **options: Any) -> None:
        self.now = 0
        self.etcd = MemoryEtcd(lambda: self.now)
        self.options = [
            FailoverOptions(
                max(i, 1), KEYS, broker_addr=f"h{i}:10911", ha_addr=f"h{i}:10912", **options
            )
            for i in range(n + 1)
        ]
        self.cores = [ReplicaState() for _ in range(n + 1)]
        self.inbox: list[Pending] = []
        self.outbox: list[tuple[int, int, Response]] = []
        self.watches: dict[int, tuple[Range, int]] = {}
        self.log: list[tuple[int, Action]] = []

    @property
    def brokers(self) -> range:
        return range(1, len(self.cores))

    def phase(self, i: int) -> Phase:
        return self.cores[i].phase

    def feed(self, i: int, event: Event) -> tuple[Action, ...]:
        self.cores[i], actions = failover_step(self.cores[i], event, self.now, self.options[i])
        for action in actions:
            self.log.append((i, action))
            if isinstance(action, SendRequest):
                self.inbox.append(Pending(i, action.request_id, action.purpose, action.request))
            elif isinstance(action, StartWatch):
                self.watches[i] = (action.watched, action.start_revision)
        return actions

    def actions(self, i: int, kind: type[A]) -> list[A]:
        return [a for b, a in self.log if b == i and isinstance(a, kind)]

    def tick(self, ms: int = 0, *brokers: int) -> None:
        self.now += ms
        for i in brokers or self.brokers:
            self.feed(i, Tick())

    def take(self, purpose: Purpose, broker: int | None = None) -> Pending:
        """Remove the first waiting request of *purpose* (from *broker*) without sending it."""
        for p in self.inbox:
            if p.purpose is purpose and broker in (None, p.broker):
                self.inbox.remove(p)
                return p
        raise AssertionError(f"no {purpose.value} request waiting: {self.inbox}")

    def apply(self, pending: Pending) -> Response:
        response = self.etcd.request(pending.request)
        self.outbox.append((pending.broker, pending.request_id, response))
        return response

    def watch(self, i: int) -> None:
        if i not in self.watches:
            return
        watched, start = self.watches[i]
        events = self.etcd.events(watched, start)
        if events:
            self.watches[i] = (watched, events[-1].revision + 1)
            self.feed(i, Watched(tuple(events)))

    def deliver(
        self, *, skip: tuple[int, ...] = (), hold: tuple[Purpose, ...] = (), rounds: int = 50
    ) -> None:
        """Send, answer and watch until nothing is left (brokers in *skip* are cut off,
        requests for a purpose in *hold* stay in the inbox)."""
        for _ in range(rounds):
            progress = False
            for p in [p for p in self.inbox if p.broker not in skip and p.purpose not in hold]:
                self.inbox.remove(p)
                self.apply(p)
                progress = True
            for item in [o for o in self.outbox if o[0] not in skip]:
                self.outbox.remove(item)
                self.feed(item[0], Replied(item[1], item[2]))
                progress = True
            for i in self.brokers:
                if i not in skip:
                    before = self.watches.get(i)
                    self.watch(i)
                    progress = progress or self.watches.get(i) != before
            if not progress:
                return
        raise AssertionError("the group did not settle")

    def start(self) -> None:
        """Every broker starts; broker 1 first, so it becomes the group's first master."""
        self.tick(0, 1)
        self.deliver()
        self.tick(0, *self.brokers[1:])
        self.deliver()
