"""The etcd behaviour the failover core relies on, as assertions any etcd must pass.

Each test talks to a *backend* through :class:`EtcdBackend` only, and runs twice: on the
in-memory double (:class:`trioha.testing.MemoryEtcd`, on a virtual clock of its own that a
backend ``sleep`` moves at once), and on a real etcd through trioha's client
(:func:`trioha.etcd.open_etcd_client`; one member for the module, started as
``tests/etcd`` starts them, skipped with the line that says what to install when there is no
etcd). Revisions are compared relative to what the backend reported, never as absolute
numbers; every test keeps its keys under a prefix of its own, and the leases a test granted
are revoked after it, so nothing of one test changes the store during the next.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Protocol

import pytest
import trio

from tests.etcd._harness import running_etcd
from trioha.etcd import EtcdClient, EtcdCluster, open_etcd_client
from trioha.failover import (
    Cmp,
    Compare,
    DeleteRange,
    ErrorCode,
    EtcdError,
    EventType,
    LeaseGrant,
    LeaseGrantResponse,
    LeaseKeepAlive,
    LeaseKeepAliveResponse,
    LeaseRevoke,
    LeaseRevokeResponse,
    Put,
    Range,
    RangeResponse,
    Request,
    Response,
    Target,
    Txn,
    TxnResponse,
    WatchEvent,
)
from trioha.testing import MemoryEtcd


class EtcdBackend(Protocol):
    """What a contract test may do with an etcd."""

    async def request(self, request: Request) -> Response: ...

    async def events(self, watched: Range, start_revision: int, count: int) -> list[WatchEvent]:
        """The first *count* events on *watched* from *start_revision* on (waiting for them)."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class MemoryBackend:
    """The double, on a virtual clock: ``sleep`` moves it and returns at once."""

    def __init__(self) -> None:
        self.now = 0.0
        self.etcd = MemoryEtcd(lambda: int(self.now * 1000))

    async def request(self, request: Request) -> Response:
        await trio.lowlevel.checkpoint()
        return self.etcd.request(request)

    async def events(self, watched: Range, start_revision: int, count: int) -> list[WatchEvent]:
        for _ in range(1200):
            found = self.etcd.events(watched, start_revision)
            if len(found) >= count:
                return found[:count]
            await self.sleep(0.05)
        raise AssertionError(f"fewer than {count} events on {watched} from {start_revision}")

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await trio.lowlevel.checkpoint()


class RealBackend:
    """A real etcd member, through trioha's client; the leases a test granted are revoked
    when it ends."""

    def __init__(self, client: EtcdClient) -> None:
        self.client = client
        self.leases: list[int] = []

    async def request(self, request: Request) -> Response:
        response = await self.client.request(request)
        if isinstance(response, LeaseGrantResponse):
            self.leases.append(response.lease)
        return response

    async def events(self, watched: Range, start_revision: int, count: int) -> list[WatchEvent]:
        found: list[WatchEvent] = []
        with trio.fail_after(60):
            async with self.client.open_watch(watched, start_revision) as watch:
                async for batch in watch:
                    found.extend(batch)
                    if len(found) >= count:
                        return found[:count]
        raise AssertionError(f"the watch on {watched} from {start_revision} ended")

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)

    async def revoke_granted(self) -> None:
        for lease in self.leases:
            await self.client.request(LeaseRevoke(lease))  # gone already: LEASE_NOT_FOUND


@pytest.fixture(scope="module", params=["memory", "etcd"])
def contract_etcd(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EtcdCluster | None]:
    """None for the double; for "etcd", one real member shared by the module's tests."""
    if request.param == "memory":
        yield None
        return
    with running_etcd(tmp_path_factory.mktemp("etcd-contract")) as cluster:
        yield cluster


@pytest.fixture
async def backend(contract_etcd: EtcdCluster | None) -> AsyncIterator[EtcdBackend]:
    if contract_etcd is None:
        yield MemoryBackend()
        return
    async with open_etcd_client(contract_etcd.endpoints) as client:
        real = RealBackend(client)
        yield real
        await real.revoke_granted()


@pytest.fixture
def prefix() -> bytes:
    return f"/contract/{uuid.uuid4().hex}/".encode()


async def txn(etcd: EtcdBackend, txn: Txn) -> TxnResponse:
    response = await etcd.request(txn)
    assert isinstance(response, TxnResponse), response
    return response


async def read(etcd: EtcdBackend, what: Range) -> RangeResponse:
    response = await etcd.request(what)
    assert isinstance(response, RangeResponse), response
    return response


async def grant(etcd: EtcdBackend, ttl: int) -> int:
    response = await etcd.request(LeaseGrant(ttl))
    assert isinstance(response, LeaseGrantResponse), response
    assert response.ttl == ttl
    return response.lease


# --- keys and revisions -----------------------------------------------------------------------


async def test_a_write_makes_one_revision_and_keys_remember_theirs(
    backend: EtcdBackend, prefix: bytes
) -> None:
    a, b = prefix + b"a", prefix + b"b"
    first = await txn(backend, Txn((), (Put(a, b"1"), Put(b, b"2"))))
    assert first.succeeded
    second = await txn(backend, Txn((), (Put(a, b"3"),)))
    assert second.revision == first.revision + 1
    got = {kv.key: kv for kv in (await read(backend, Range.prefix(prefix))).kvs}
    assert (got[a].create_revision, got[a].mod_revision, got[a].version) == (
        first.revision,
        second.revision,
        2,
    )
    assert (got[b].create_revision, got[b].mod_revision, got[b].version) == (
        first.revision,
        first.revision,
        1,
    )
    assert got[a].value == b"3"


async def test_a_request_that_writes_nothing_leaves_the_revision_alone(
    backend: EtcdBackend, prefix: bytes
) -> None:
    wrote = await txn(backend, Txn((), (Put(prefix + b"k", b"v"),)))
    reading = await txn(backend, Txn((), (Range.prefix(prefix),)))
    deleting_nothing = await txn(backend, Txn((), (DeleteRange(prefix + b"absent"),)))
    after = await read(backend, Range(prefix + b"k"))
    assert reading.revision == deleting_nothing.revision == after.revision == wrote.revision


async def test_a_range_on_a_prefix_returns_its_keys_in_order(
    backend: EtcdBackend, prefix: bytes
) -> None:
    for key in (b"c", b"a", b"b/x"):
        await txn(backend, Txn((), (Put(prefix + key, key),)))
    await txn(backend, Txn((), (Put(prefix[:-1] + b"-outside", b"x"),)))
    kvs = (await read(backend, Range.prefix(prefix))).kvs
    assert [kv.key for kv in kvs] == [prefix + b"a", prefix + b"b/x", prefix + b"c"]
    assert (await read(backend, Range(prefix + b"absent"))).kvs == ()


# --- transactions -----------------------------------------------------------------------------


async def test_create_revision_zero_means_absent_and_the_failure_branch_reads(
    backend: EtcdBackend, prefix: bytes
) -> None:
    key = prefix + b"master"
    campaign = Txn((Compare.absent(key),), (Put(key, b"me"),), (Range.prefix(prefix),))
    won = await txn(backend, campaign)
    assert won.succeeded
    lost = await txn(backend, attrs_evolve_value(campaign, b"you"))
    assert not lost.succeeded
    assert lost.revision == won.revision  # the failure branch only read
    (seen,) = lost.responses
    assert isinstance(seen, RangeResponse)
    (kv,) = seen.kvs
    assert (kv.value, kv.create_revision) == (b"me", won.revision)


def attrs_evolve_value(campaign: Txn, value: bytes) -> Txn:
    (put,) = campaign.success
    assert isinstance(put, Put)
    return Txn(campaign.compare, (Put(put.key, value),), campaign.failure)


async def test_a_compare_on_a_stale_mod_revision_fails(backend: EtcdBackend, prefix: bytes) -> None:
    key = prefix + b"sss"
    first = await txn(backend, Txn((), (Put(key, b"1"),)))
    second = await txn(backend, Txn((Compare.modified_at(key, first.revision),), (Put(key, b"2"),)))
    assert second.succeeded
    stale = await txn(backend, Txn((Compare.modified_at(key, first.revision),), (Put(key, b"3"),)))
    assert not stale.succeeded
    (kv,) = (await read(backend, Range(key))).kvs
    assert kv.value == b"2"


async def test_compares_on_a_missing_key(backend: EtcdBackend, prefix: bytes) -> None:
    key = prefix + b"absent"

    async def holds(compare: Compare) -> bool:
        return (await txn(backend, Txn((compare,), ()))).succeeded

    assert await holds(Compare(key, Target.CREATE, Cmp.EQUAL, 0))
    assert await holds(Compare(key, Target.MOD, Cmp.EQUAL, 0))
    assert await holds(Compare(key, Target.VERSION, Cmp.EQUAL, 0))
    assert await holds(Compare(key, Target.LEASE, Cmp.EQUAL, 0))
    # A value compare on a missing key never holds, whatever the operator.
    assert not await holds(Compare(key, Target.VALUE, Cmp.EQUAL, b""))
    assert not await holds(Compare(key, Target.VALUE, Cmp.NOT_EQUAL, b"x"))


async def test_compares_on_a_present_key(backend: EtcdBackend, prefix: bytes) -> None:
    key = prefix + b"k"
    put = await txn(backend, Txn((), (Put(key, b"b"),)))

    async def holds(compare: Compare) -> bool:
        return (await txn(backend, Txn((compare,), ()))).succeeded

    assert await holds(Compare(key, Target.VALUE, Cmp.EQUAL, b"b"))
    assert await holds(Compare(key, Target.VALUE, Cmp.GREATER, b"a"))
    assert await holds(Compare(key, Target.VALUE, Cmp.LESS, b"c"))
    assert await holds(Compare(key, Target.VERSION, Cmp.EQUAL, 1))
    assert await holds(Compare(key, Target.CREATE, Cmp.EQUAL, put.revision))
    assert await holds(Compare(key, Target.MOD, Cmp.GREATER, put.revision - 1))
    assert not await holds(Compare(key, Target.CREATE, Cmp.NOT_EQUAL, put.revision))


# --- leases -----------------------------------------------------------------------------------


async def test_a_key_bound_to_a_lease_goes_when_the_lease_expires(
    backend: EtcdBackend, prefix: bytes
) -> None:
    key = prefix + b"master"
    lease = await grant(backend, 2)
    put = await txn(backend, Txn((), (Put(key, b"me", lease),)))
    (kv,) = (await read(backend, Range(key))).kvs
    assert kv.lease == lease
    alive = await backend.request(LeaseKeepAlive(lease))
    assert isinstance(alive, LeaseKeepAliveResponse)
    assert alive.ttl == 2
    assert alive.alive
    await backend.sleep(5)
    assert (await read(backend, Range(key))).kvs == ()
    (created, deleted) = await backend.events(Range(key), put.revision, 2)
    assert created.type is EventType.PUT
    assert deleted.type is EventType.DELETE
    assert deleted.kv.key == key
    assert deleted.revision > put.revision
    gone = await backend.request(LeaseKeepAlive(lease))
    assert isinstance(gone, LeaseKeepAliveResponse)
    assert not gone.alive


async def test_keepalives_keep_a_lease_alive(backend: EtcdBackend, prefix: bytes) -> None:
    key = prefix + b"reg"
    lease = await grant(backend, 2)
    await txn(backend, Txn((), (Put(key, b"me", lease),)))
    for _ in range(6):
        await backend.sleep(0.5)
        response = await backend.request(LeaseKeepAlive(lease))
        assert isinstance(response, LeaseKeepAliveResponse)
        assert response.alive
    assert len((await read(backend, Range(key))).kvs) == 1


async def test_a_put_with_a_missing_lease_fails_whole(backend: EtcdBackend, prefix: bytes) -> None:
    before = await txn(backend, Txn((), (Put(prefix + b"x", b"1"),)))
    lease = await grant(backend, 5)
    revoked = await backend.request(LeaseRevoke(lease))
    assert isinstance(revoked, LeaseRevokeResponse)
    response = await backend.request(
        Txn((), (Put(prefix + b"x", b"2"), Put(prefix + b"y", b"3", lease)))
    )
    assert isinstance(response, EtcdError)
    assert response.code is ErrorCode.LEASE_NOT_FOUND
    kvs = (await read(backend, Range.prefix(prefix))).kvs
    assert [(kv.key, kv.value, kv.mod_revision) for kv in kvs] == [
        (prefix + b"x", b"1", before.revision)
    ]


async def test_a_revoke_deletes_every_key_of_the_lease_in_one_revision(
    backend: EtcdBackend, prefix: bytes
) -> None:
    lease = await grant(backend, 30)
    put = await txn(
        backend, Txn((), (Put(prefix + b"a", b"1", lease), Put(prefix + b"b", b"2", lease)))
    )
    revoked = await backend.request(LeaseRevoke(lease))
    assert isinstance(revoked, LeaseRevokeResponse)
    assert revoked.revision == put.revision + 1
    events = await backend.events(Range.prefix(prefix), put.revision + 1, 2)
    assert {(e.type, e.kv.key, e.revision) for e in events} == {
        (EventType.DELETE, prefix + b"a", revoked.revision),
        (EventType.DELETE, prefix + b"b", revoked.revision),
    }
    again = await backend.request(LeaseRevoke(lease))
    assert isinstance(again, EtcdError)
    assert again.code is ErrorCode.LEASE_NOT_FOUND


# --- watches ----------------------------------------------------------------------------------


async def test_a_watch_from_a_revision_sees_every_later_event_in_order(
    backend: EtcdBackend, prefix: bytes
) -> None:
    key = prefix + b"k"
    first = await txn(backend, Txn((), (Put(key, b"1"),)))
    second = await txn(backend, Txn((), (Put(key, b"2"),)))
    deleted = await txn(backend, Txn((), (DeleteRange(key),)))
    events = await backend.events(Range.prefix(prefix), first.revision + 1, 2)
    assert [(e.type, e.revision) for e in events] == [
        (EventType.PUT, second.revision),
        (EventType.DELETE, deleted.revision),
    ]
    assert events[0].kv.value == b"2"
    assert events[0].kv.create_revision == first.revision
    everything = await backend.events(Range.prefix(prefix), first.revision, 3)
    assert [e.revision for e in everything] == [first.revision, second.revision, deleted.revision]
