"""The replica manager (``trioha.broker._failover``) on a virtual clock against the in-memory
etcd: what it carries out, in which order and when, to the millisecond.

The real etcd and real brokers are in ``test_failover.py``; here a fake data plane records
every call with the time it came, so that the fencing arithmetic is checked exactly: a
master stops acknowledging no later than 4/5 of a TTL after the send of its last successful
keepalive, and a successor acknowledges only after that.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import attrs
import trio

from trioha._errors import EtcdUnavailableError
from trioha._status import PutStatus
from trioha.broker._failover import (
    TICK,
    ReplicaManager,
    failover_options,
    run_replica_manager,
)
from trioha.etcd import EtcdClientStatistics
from trioha.failover import MasterRecord, Range, Request, Response, WatchEvent
from trioha.testing import MemoryEtcd

TTL = 2
FENCE_MS = TTL * 1000 * 4 // 5


def now_ms() -> int:
    return int(trio.current_time() * 1000)


class MemoryClient:
    """One broker's way to the in-memory etcd; :attr:`cut` makes every call fail."""

    endpoint = "memory"

    def __init__(self, etcd: MemoryEtcd) -> None:
        self.etcd = etcd
        self.cut = False

    def statistics(self) -> EtcdClientStatistics:
        return EtcdClientStatistics("memory", ("memory",), 0, 0, 0, "", 0, 0)

    async def _unreachable(self) -> None:
        # As trioha's client does, take some time before saying that nothing answered.
        await trio.sleep(0.2)
        raise EtcdUnavailableError("memory etcd: cut off")

    async def request(self, request: Request) -> Response:
        await trio.lowlevel.checkpoint()
        if self.cut:
            await self._unreachable()
        return self.etcd.request(request)

    @asynccontextmanager
    async def open_watch(
        self, watched: Range, start_revision: int
    ) -> AsyncIterator[AsyncIterator[tuple[WatchEvent, ...]]]:
        yield self._events(watched, start_revision)

    async def _events(self, watched: Range, revision: int) -> AsyncIterator[tuple[WatchEvent, ...]]:
        while True:
            if self.cut:
                await self._unreachable()
            found = self.etcd.events(watched, revision)
            if found:
                revision = found[-1].revision + 1
                yield tuple(found)
            await trio.sleep(0.01)


@attrs.define
class FakePlane:
    """A data plane that records what it was told, with the time (ms)."""

    calls: list[tuple[int, str, Any]] = attrs.field(factory=list)
    end: int = 0
    epoch: int = 0
    acks: dict[int, int] = attrs.field(factory=dict)

    def _note(self, what: str, value: Any) -> None:
        self.calls.append((now_ms(), what, value))

    def log_facts(self) -> tuple[int, int, int]:
        return self.end, self.epoch, self.end

    def replica_acks(self) -> dict[int, int]:
        return dict(self.acks)

    def fence(self, reason: str) -> None:
        self._note("fence", reason)

    def unfence(self, until_ms: int) -> None:
        self._note("unfence", until_ms)

    def fail_in_flight(self, status: PutStatus) -> None:
        self._note("fail", status)

    def set_sync_state_set(self, members: frozenset[int]) -> None:
        self._note("sss", members)

    async def become_master(self, epoch: int, members: frozenset[int]) -> None:
        await trio.lowlevel.checkpoint()
        self.epoch = epoch
        self._note("master", epoch)

    async def become_slave(self, master: MasterRecord) -> None:
        await trio.lowlevel.checkpoint()
        self._note("slave", (master.broker_id, master.epoch))

    def times(self, what: str) -> list[int]:
        return [t for t, name, _ in self.calls if name == what]

    def values(self, what: str) -> list[Any]:
        return [v for _, name, v in self.calls if name == what]


@asynccontextmanager
async def managers(
    etcd: MemoryEtcd, count: int
) -> AsyncIterator[list[tuple[ReplicaManager, FakePlane, MemoryClient]]]:
    async with AsyncExitStack() as stack:
        out = []
        for bid in range(1, count + 1):
            options = failover_options(
                broker_id=bid,
                cluster="C",
                broker_name="b",
                root="/trioha",
                broker_addr=f"127.0.0.1:{10911 + 10 * bid}",
                ha_addr=f"127.0.0.1:{10912 + 10 * bid}",
                lease_ttl=TTL,
                ha_max_time_slave_not_catchup=15_000,
                enable_elect_unclean_master=False,
            )
            plane, client = FakePlane(), MemoryClient(etcd)
            manager = await stack.enter_async_context(run_replica_manager(options, plane, client))
            out.append((manager, plane, client))
        yield out


async def wait_until(what: str, check: Any, seconds: float = 30.0) -> None:
    with trio.move_on_after(seconds):
        while not check():  # noqa: ASYNC110 (a fake's records)
            await trio.sleep(0.01)
        return
    raise AssertionError(f"not within {seconds} s (virtual): {what}")


async def test_a_lone_broker_becomes_master_and_acks_until_its_deadline(
    autojump_clock: trio.abc.Clock,
) -> None:
    etcd = MemoryEtcd(now_ms)
    async with managers(etcd, 1) as [(manager, plane, _client)]:
        await wait_until("master", lambda: plane.values("master"))
        assert plane.values("master") == [1]
        assert plane.values("sss")[0] == frozenset({1})
        await wait_until("unfenced", lambda: plane.values("unfence"))
        at, until = plane.times("unfence")[0], plane.values("unfence")[0]
        assert at < until <= at + FENCE_MS
        await trio.sleep(5 * TTL)  # keepalives every TTL/3 keep it unfenced
        assert plane.values("fence") == []
        assert plane.values("unfence")[-1] > now_ms()
        assert manager.statistics().phase == "MASTER"
    # A clean stop fences and gives the lease back: the master key is gone at once.
    assert plane.values("fence")[-1].startswith("shutting down")
    assert not [kv for kv in etcd.kvs() if kv.key.endswith(b"/master")]


async def test_a_master_cut_off_fences_at_its_deadline_and_a_successor_acks_only_after(
    autojump_clock: trio.abc.Clock,
) -> None:
    etcd = MemoryEtcd(now_ms)
    async with managers(etcd, 2) as group:
        await wait_until("a master", lambda: any(plane.values("master") for _, plane, _ in group))
        first = next(i for i, (_, plane, _) in enumerate(group) if plane.values("master"))
        (m1, plane1, client1), (_m2, plane2, _client2) = group[first], group[1 - first]
        id1, id2 = first + 1, 2 - first
        assert plane1.values("master") == [1]
        plane1.acks = {id2: 0}  # the other streams and holds everything: it joins the set
        await wait_until(
            "the other in etcd's set", lambda: m1.statistics().sync_state_set == (1, 2)
        )
        await wait_until("the other follows", lambda: plane2.values("slave") == [(id1, 1)])
        client1.cut = True
        cut_at = now_ms()
        deadline = plane1.values("unfence")[-1]
        assert deadline <= cut_at + FENCE_MS
        await wait_until("the master fences", lambda: plane1.values("fence"))
        fenced_at = plane1.times("fence")[0]
        assert deadline <= fenced_at <= deadline + int(TICK * 1000) + 1
        # Every put waiting for replicas is failed in the same step, right after.
        step = [what for t, what, _value in plane1.calls if t == fenced_at]
        assert step[step.index("fence") + 1] == "fail"
        assert plane1.values("fail")[0] is PutStatus.FLUSH_SLAVE_TIMEOUT
        await wait_until("the other becomes master", lambda: plane2.values("master") == [2])
        # One acknowledging master at a time, on one clock: the successor acks only after the
        # old master stopped, and after etcd let the old lease expire (a full TTL after its
        # last keepalive arrived, which was before the cut).
        assert plane2.times("unfence")[0] >= fenced_at
        assert plane2.times("master")[0] >= cut_at + FENCE_MS
        client1.cut = False
        await wait_until("the old master follows", lambda: plane1.values("slave") == [(id2, 2)])
