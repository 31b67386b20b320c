"""Automatic failover through a real etcd: one group of three brokers elects its master, the
master fences itself when it cannot keep its lease, a slave takes over and takes sends, and
the old master follows the new one without a restart (docs/failover.md).

etcd members are real processes on free loopback ports with data under the test's tmp dir
(``tests/etcd/_harness.py``); each broker reaches etcd through a proxy of its own, so a test
can cut one broker off from etcd. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.etcd._harness import TcpProxy, open_proxy, running_etcd
from tests.test_broker import FAST
from trioha._config import BrokerConfig, BrokerRole
from trioha._errors import ConfigError
from trioha._status import PutStatus
from trioha.broker import Broker, open_broker, producer_properties
from trioha.cli._tools import failover_state
from trioha.etcd import EtcdCluster
from trioha.remoting import open_client_pool, pull_message
from trioha.store import NewMessage

#: Seconds: the lease's TTL in these tests (a master acks for 0.8 of it after a keepalive).
TTL = 2
#: Bounds for the waits below (real seconds; a loaded machine is slow, never this slow).
WAIT = 30.0


def failover_config(root: Path, endpoint: str, broker_id: int, **extra: Any) -> BrokerConfig:
    settings: dict[str, Any] = {
        **FAST,
        "slave_timeout": 3000,
        # A loaded machine must not drop a connection for a late heartbeat: a slave that
        # reconnects vouches only for what it is sent anew, and a put waiting meanwhile
        # would time out.
        "ha_send_heartbeat_interval": 500,
        "ha_housekeeping_interval": 5000,
        "enable_controller_mode": True,
        "failover_etcd_endpoints": endpoint,
        "failover_broker_id": broker_id,
        "failover_lease_ttl": TTL,
        "ha_max_time_slave_not_catchup": 5000,
        **extra,
    }
    return BrokerConfig(
        broker_role=BrokerRole.SLAVE, store_path_root_dir=str(root / f"b{broker_id}"), **settings
    )


class Group:
    """Three brokers of one group, each behind its own proxy to etcd."""

    def __init__(self, proxies: Sequence[TcpProxy]) -> None:
        self.proxies = list(proxies)
        self.brokers: dict[int, Broker] = {}
        self.stops: dict[int, trio.CancelScope] = {}

    def masters(self) -> list[Broker]:
        return [b for b in self.brokers.values() if b.role.is_master and b._acking()]

    async def wait_for(self, what: str, check: Callable[[], Any]) -> Any:
        with trio.move_on_after(WAIT):
            while not (found := check()):  # noqa: ASYNC110 (state of several brokers)
                await trio.sleep(0.05)
            return found
        raise AssertionError(f"not within {WAIT} s: {what}")

    async def master(self, *, other_than: Broker | None = None) -> Broker:
        def one() -> Broker | None:
            masters = [m for m in self.masters() if m is not other_than]
            assert len(masters) <= 1, "two acknowledging masters"
            return masters[0] if masters else None

        found: Broker = await self.wait_for("a master that acknowledges", one)
        return found

    def id_of(self, broker: Broker) -> int:
        return next(bid for bid, b in self.brokers.items() if b is broker)


async def _run_broker(
    config: BrokerConfig, group: Group, broker_id: int, task_status: trio.TaskStatus[None]
) -> None:
    with trio.CancelScope() as scope:
        group.stops[broker_id] = scope
        async with open_broker(config) as broker:
            group.brokers[broker_id] = broker
            task_status.started()
            await trio.sleep_forever()
    group.brokers.pop(broker_id, None)


@contextlib.asynccontextmanager
async def running_group(tmp_path: Path, cluster: EtcdCluster, **extra: Any) -> AsyncIterator[Group]:
    host, port = cluster.endpoints[0].removeprefix("http://").split(":")
    async with contextlib.AsyncExitStack() as stack:
        proxies = [await stack.enter_async_context(open_proxy((host, int(port)))) for _ in "abc"]
        group = Group(proxies)
        async with trio.open_nursery() as nursery:
            for bid, proxy in enumerate(proxies, start=1):
                endpoint = f"http://127.0.0.1:{proxy.port}"
                config = failover_config(tmp_path, endpoint, bid, **extra)
                await nursery.start(_run_broker, config, group, bid)
            yield group
            nursery.cancel_scope.cancel()


async def put(broker: Broker, i: int) -> tuple[PutStatus, int, int]:
    result = await broker.put(
        NewMessage(
            topic="FailoverTopic",
            body=b"m%06d" % i,
            properties=producer_properties({}, keys=f"k{i}"),
        )
    )
    return result.status, result.offset, result.end_offset


async def wait_in_sync(group: Group, master: Broker, size: int) -> None:
    def full() -> bool:
        stats = master.replica_manager.statistics() if master.replica_manager else None
        return stats is not None and len(stats.sync_state_set) >= size

    await group.wait_for(f"a SyncStateSet of {size}", full)


def read_log(broker: Broker, start: int, end: int) -> bytes:
    out = b""
    while start + len(out) < end:
        chunk = bytes(broker.store.commitlog.read(start + len(out), end - start - len(out)))
        assert chunk, f"broker log ends at {broker.store.commitlog.max_offset}, before {end}"
        out += chunk
    return out


@pytest.fixture
def etcd(tmp_path: Path) -> Any:
    with running_etcd(tmp_path / "etcd") as cluster:
        yield cluster


async def test_a_group_elects_one_master_whose_acks_every_member_holds(
    tmp_path: Path, etcd: EtcdCluster
) -> None:
    async with running_group(tmp_path, etcd) as group:
        master, end = await acked_by_all(group, 40)
        assert master.config.broker_id == 0  # registered as the master
        assert master.master_epoch >= 1
        expected = read_log(master, 0, end)
        for broker in group.brokers.values():
            if broker is not master:
                assert not broker.role.is_master
                assert (await put(broker, 999))[0] is PutStatus.SERVICE_NOT_AVAILABLE
                # Acknowledged means flushed on every member already.
                assert broker.store.commitlog.flushed_offset >= end
                assert read_log(broker, 0, end) == expected
        stats = master.statistics().failover
        assert stats is not None and stats.phase == "MASTER"
        assert stats.sync_state_set == (1, 2, 3)
        assert stats.lease_deadline_in is not None and stats.lease_deadline_in > 0
        assert stats.elections == 1 and stats.epoch == master.master_epoch
        assert master.client_side is not None
        info = master.client_side.processor.extra_info()
        assert info["failoverPhase"] == "MASTER"
        assert info["failoverSyncStateSet"] == "1,2,3"
        assert info["failoverEpoch"] == str(master.master_epoch)
        # What `python -m trioha failover-state -c broker.conf` prints.
        lines = await failover_state(master.config, out=io.StringIO())
        master_id = group.id_of(master)
        assert lines[1].startswith(f"master: broker {master_id}, epoch {master.master_epoch}, ")
        assert lines[2] == f"epoch counter: {master.master_epoch}"
        assert lines[3].startswith("SyncStateSet: [1, 2, 3], version ")
        assert lines[4] == "brokers registered (alive): 3"
        assert lines[4 + master_id].startswith(f"  broker {master_id}: epoch ")


def test_failover_state_needs_the_etcd_endpoints() -> None:
    with pytest.raises(ConfigError, match="failover-state needs failoverEtcdEndpoints"):
        trio.run(failover_state, BrokerConfig())


async def test_the_failover_state_is_in_the_metrics(tmp_path: Path, etcd: EtcdCluster) -> None:
    pytest.importorskip("prometheus_client")
    from trioha.metrics import BrokerCollector

    async with running_group(tmp_path, etcd) as group:
        master = await group.master()
        await wait_in_sync(group, master, 3)
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in BrokerCollector(master).collect()
            for s in family.samples
        }
        assert samples[("trioha_failover_phase_info", (("phase", "MASTER"),))] == 1
        assert samples[("trioha_failover_epoch", ())] == master.master_epoch
        assert samples[("trioha_failover_sync_state_set_size", ())] == 3
        assert samples[("trioha_failover_elections_total", ())] == 1
        assert samples[("trioha_failover_lease_deadline_seconds", ())] > 0
        slave = next(b for b in group.brokers.values() if b is not master)
        slave_samples = {
            (s.name, tuple(sorted(s.labels.items())))
            for family in BrokerCollector(slave).collect()
            for s in family.samples
        }
        assert ("trioha_failover_phase_info", (("phase", "FOLLOWER"),)) in slave_samples


async def acked_by_all(group: Group, count: int) -> tuple[Broker, int]:
    """The master, once every broker is in its SyncStateSet, and the end of *count* puts
    it acknowledged (each must be PUT_OK)."""
    master = await group.master()
    await wait_in_sync(group, master, 3)
    results = [await put(master, i) for i in range(count)]
    assert {status for status, _, _ in results} == {PutStatus.PUT_OK}
    return master, max(end for _, _, end in results)


async def test_a_master_that_stops_hands_over_and_the_new_one_holds_every_ack(
    tmp_path: Path, etcd: EtcdCluster
) -> None:
    async with running_group(tmp_path, etcd) as group:
        old, end = await acked_by_all(group, 30)
        expected = read_log(old, 0, end)
        old_id = group.id_of(old)
        group.stops[old_id].cancel()  # a clean stop gives the lease back at once
        new = await group.master(other_than=old)
        assert group.id_of(new) != old_id
        assert read_log(new, 0, end) == expected
        assert (await put(new, 100))[0] is PutStatus.PUT_OK
        assert new.master_epoch > 1


async def test_a_master_cut_off_from_etcd_stops_acking_and_rejoins_as_a_slave(
    tmp_path: Path, etcd: EtcdCluster
) -> None:
    async with running_group(tmp_path, etcd) as group:
        old, _end = await acked_by_all(group, 10)
        old_epoch = old.master_epoch
        group.proxies[group.id_of(old) - 1].block()
        cut_at = trio.current_time()
        # The master acknowledges until 0.8 TTL after its last successful keepalive was sent,
        # which was before the cut: never later than that after the cut.
        assert old._ack_until <= cut_at + 0.8 * TTL
        await group.wait_for("the cut-off master fences", lambda: not old._acking())
        await group.wait_for(
            "the fence reported",
            lambda: old.replica_manager is not None and old.replica_manager.fences >= 1,
        )
        status, _, _ = await put(old, 500)
        assert status is not PutStatus.PUT_OK
        # No route names it master while it is fenced: it registers under its stable id.
        assert old.registered_id == group.id_of(old)
        new = await group.master(other_than=old)
        assert new.registered_id == 0
        assert new.master_epoch > old_epoch
        acked = [await put(new, 1000 + i) for i in range(10)]
        assert {s for s, _, _ in acked} == {PutStatus.PUT_OK}
        # What a put stored on the cut-off master and never acknowledged leaves behind: bytes
        # no other broker has (written past the fence, as a put in flight would have been).
        stray = old.store.commitlog.append_batch(
            [NewMessage(topic="FailoverTopic", body=b"never acknowledged")]
        )
        stray_end = stray[-1].end_offset
        assert old.store.commitlog.max_offset == stray_end
        group.proxies[group.id_of(old) - 1].unblock()
        await group.wait_for(
            "the old master follows the new one",
            lambda: (
                not old.role.is_master and old.ha_client is not None and old.ha_client.connected
            ),
        )
        end = max(e for _, _, e in acked)
        await group.wait_for(
            "the old master caught up", lambda: old.store.commitlog.max_offset >= end
        )
        assert read_log(old, 0, end) == read_log(new, 0, end)
        assert old.config.broker_id == group.id_of(old)
        client = old.ha_client
        assert client is not None
        # Cut back to the consistent point through the epoch protocol, the stray bytes gone.
        assert [before for before, _to in client.truncations] == [stray_end]
        assert old.epoch_file is not None and old.epoch_file.history.last_epoch == new.master_epoch


async def test_without_etcd_the_master_stops_acking_and_slaves_still_serve_pulls(
    tmp_path: Path, etcd: EtcdCluster
) -> None:
    async with running_group(tmp_path, etcd) as group, open_client_pool() as pool:
        master, _end = await acked_by_all(group, 10)
        slave = next(b for b in group.brokers.values() if b is not master)
        assert slave.client_side is not None
        member = etcd.members[0]
        await trio.to_thread.run_sync(member.pause)
        try:
            paused_at = trio.current_time()
            assert master._ack_until <= paused_at + 0.8 * TTL
            await group.wait_for("the master fences", lambda: not master._acking())
            assert (await put(master, 99))[0] is not PutStatus.PUT_OK
            assert group.masters() == []

            async def pulled() -> int:
                result = await pull_message(
                    pool,
                    slave.client_side.broker_addr,  # type: ignore[union-attr]
                    group="readers",
                    topic="FailoverTopic",
                    queue_id=0,
                    offset=0,
                )
                return len(result.messages)

            with trio.fail_after(WAIT):
                while await pulled() < 10:  # noqa: ASYNC110 (another broker's queues)
                    await trio.sleep(0.05)
        finally:
            await trio.to_thread.run_sync(member.resume)
        again = await group.master()
        assert (await put(again, 200))[0] is PutStatus.PUT_OK
