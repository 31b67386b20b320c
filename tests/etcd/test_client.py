"""The client against one real etcd member: calls, endpoints, unknown outcomes, watches that
survive a restart, a dropped connection and a paused member, and a compacted history.

The key semantics themselves (revisions, compares, leases, watch order) are the contract in
``tests/failover/test_etcd_contract.py``, which runs this client too.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from tests.etcd._harness import closed_port, open_proxy, running_etcd
from trioha._errors import EtcdCompactedError, EtcdOutcomeUnknownError, EtcdUnavailableError
from trioha.etcd import EtcdClient, EtcdCluster, EtcdWatch, open_etcd_client
from trioha.failover import (
    DeleteRange,
    DeleteRangeResponse,
    EventType,
    LeaseKeepAlive,
    Put,
    PutResponse,
    Range,
    RangeResponse,
    Txn,
    TxnResponse,
    WatchEvent,
)


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """One member for the tests that leave its process alone."""
    with running_etcd(tmp_path_factory.mktemp("etcd")) as cluster:
        yield cluster


@pytest.fixture
def own_etcd(tmp_path: Path) -> Iterator[EtcdCluster]:
    """A member of the test's own, for tests that restart, pause or compact it."""
    with running_etcd(tmp_path / "etcd") as cluster:
        yield cluster


@pytest.fixture
def prefix() -> bytes:
    return f"/client/{uuid.uuid4().hex}/".encode()


async def put(client: EtcdClient, key: bytes, value: bytes) -> int:
    response = await client.request(Txn((), (Put(key, value),)))
    assert isinstance(response, TxnResponse), response
    return response.revision


async def collect(watch: EtcdWatch, count: int) -> list[WatchEvent]:
    events: list[WatchEvent] = []
    with trio.fail_after(60):
        async for batch in watch:
            events.extend(batch)
            if len(events) >= count:
                break
    return events


async def test_a_bare_put_and_delete_and_the_statistics(etcd: EtcdCluster, prefix: bytes) -> None:
    async with open_etcd_client(etcd.endpoints) as client:
        written = await client.request(Put(prefix + b"k", b"v"))
        assert isinstance(written, PutResponse)
        read = await client.request(Range(prefix + b"k"))
        assert isinstance(read, RangeResponse)
        (kv,) = read.kvs
        assert (kv.value, kv.mod_revision) == (b"v", written.revision)
        deleted = await client.request(DeleteRange(prefix, prefix + b"\xff"))
        assert deleted == DeleteRangeResponse(written.revision + 1, 1)
        stats = client.statistics()
    assert (stats.requests, stats.failures, stats.retries, stats.last_error) == (3, 0, 0, "")
    assert stats.endpoint == etcd.endpoints[0]


async def test_the_client_moves_past_an_endpoint_that_refuses(
    etcd: EtcdCluster, prefix: bytes
) -> None:
    dead = f"http://127.0.0.1:{closed_port()}"
    async with open_etcd_client([dead, *etcd.endpoints]) as client:
        await put(client, prefix + b"a", b"1")
        first = client.statistics()
        await put(client, prefix + b"b", b"2")
        second = client.statistics()
    assert first.endpoint == second.endpoint == etcd.endpoints[0]
    assert first.retries == second.retries == 1  # the second call went straight to etcd
    assert (second.requests, second.failures) == (2, 0)


async def test_a_paused_member_leaves_a_write_unknown_and_a_read_unavailable(
    own_etcd: EtcdCluster, prefix: bytes
) -> None:
    (member,) = own_etcd.members
    async with open_etcd_client(own_etcd.endpoints, request_timeout=0.5, retry_for=0.5) as client:
        await put(client, prefix + b"k", b"1")
        member.pause()
        try:
            with pytest.raises(EtcdOutcomeUnknownError) as unknown:
                await client.request(Txn((), (Put(prefix + b"k", b"2"),)))
            with pytest.raises(EtcdUnavailableError) as unavailable:
                await client.request(Range(prefix + b"k"))
            with pytest.raises(EtcdUnavailableError):
                await client.request(LeaseKeepAlive(1))
        finally:
            member.resume()
        # Once it answers again, so does the client.
        assert isinstance(await client.request(Range(prefix + b"k")), RangeResponse)
        stats = client.statistics()
    endpoint = own_etcd.endpoints[0]
    assert str(unknown.value).startswith(f"etcd at {endpoint} gave no answer within 0.5 s")
    assert "may or may not have been applied" in str(unknown.value)
    assert endpoint in str(unavailable.value)
    assert "gave no answer within 0.5 s" in str(unavailable.value)
    assert stats.failures == 3
    assert stats.last_error.startswith("etcd unavailable for POST /v3/lease/keepalive")


async def test_a_watch_resumes_after_the_member_restarts(
    own_etcd: EtcdCluster, prefix: bytes
) -> None:
    (member,) = own_etcd.members
    async with open_etcd_client(own_etcd.endpoints, probe_interval=0.5) as client:
        first = await put(client, prefix + b"k", b"1")
        async with client.open_watch(Range.prefix(prefix), first) as watch:
            before = await collect(watch, 1)
            await trio.to_thread.run_sync(member.restart)
            await put(client, prefix + b"k", b"2")
            await put(client, prefix + b"j", b"3")
            after = await collect(watch, 2)
        stats = client.statistics()
    events = before + after
    assert [(e.kv.key, e.kv.value) for e in events] == [
        (prefix + b"k", b"1"),
        (prefix + b"k", b"2"),
        (prefix + b"j", b"3"),
    ]
    assert [e.revision for e in events] == [first, first + 1, first + 2]
    assert watch.reconnects >= 1
    assert stats.watch_reconnects >= 1
    assert stats.watches == 0


async def test_a_watch_resumes_after_its_connection_drops(etcd: EtcdCluster, prefix: bytes) -> None:
    (member,) = etcd.members
    async with (
        open_proxy((member.host, member.client_port)) as proxy,
        open_etcd_client(etcd.endpoints) as direct,
        open_etcd_client(f"http://127.0.0.1:{proxy.port}") as proxied,
    ):
        first = await put(direct, prefix + b"a", b"1")
        async with proxied.open_watch(Range.prefix(prefix), first) as watch:
            assert [e.kv.value for e in await collect(watch, 1)] == [b"1"]
            # Cut the stream; what is written meanwhile must still arrive, once, in order.
            for round_ in range(3):
                assert proxy.cut() >= 1
                await put(direct, prefix + b"a", b"%d" % (round_ + 2))
                await put(direct, prefix + b"b", b"x%d" % round_)
                got = await collect(watch, 2)
                assert [(e.kv.key[-1:], e.kv.value) for e in got] == [
                    (b"a", b"%d" % (round_ + 2)),
                    (b"b", b"x%d" % round_),
                ]
            assert watch.next_revision == first + 7
    assert watch.reconnects >= 3


async def test_a_watch_notices_a_paused_member_and_resumes_after_it(
    own_etcd: EtcdCluster, prefix: bytes
) -> None:
    (member,) = own_etcd.members
    async with open_etcd_client(
        own_etcd.endpoints, request_timeout=0.5, probe_interval=0.2
    ) as client:
        first = await put(client, prefix + b"k", b"1")
        async with client.open_watch(Range.prefix(prefix), first) as watch:
            await collect(watch, 1)
            member.pause()
            try:
                # The probe gives up on the silent stream; without it nothing would end it.
                with trio.fail_after(60):
                    while watch.reconnects == 0:  # noqa: ASYNC110 - a counter, not an event
                        await trio.sleep(0.1)
            finally:
                member.resume()
            await put(client, prefix + b"k", b"2")
            (event,) = await collect(watch, 1)
    assert (event.kv.value, event.revision) == (b"2", first + 1)


async def test_a_watch_from_a_compacted_revision_says_to_read_again(
    own_etcd: EtcdCluster, prefix: bytes
) -> None:
    async with open_etcd_client(own_etcd.endpoints) as client:
        first = await put(client, prefix + b"k", b"1")
        last = await put(client, prefix + b"k", b"2")
        async with httpx.AsyncClient(trust_env=False) as http:
            compacted = await http.post(
                own_etcd.endpoints[0] + "/v3/kv/compaction",
                json={"revision": str(last), "physical": True},
            )
        assert compacted.status_code == 200, compacted.text
        async with client.open_watch(Range.prefix(prefix), first) as watch:
            with pytest.raises(EtcdCompactedError) as raised, trio.fail_after(60):
                await collect(watch, 1)
        # From the revision etcd still has, the watch works.
        async with client.open_watch(Range.prefix(prefix), last) as watch:
            (event,) = await collect(watch, 1)
    assert raised.value.compact_revision == last
    assert "read the keys again" in str(raised.value)
    assert (event.type, event.kv.value) == (EventType.PUT, b"2")
