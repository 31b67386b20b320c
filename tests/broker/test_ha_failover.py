"""Failover with the official client over trioha's real brokers (HA replication included).

A name server, a master and a slave (``trioha.broker.open_broker`` with the client side
served next to it), all on 127.0.0.1 with OS-chosen ports; the official C++ client in a
subprocess. The master is killed (its tasks cancelled, its connections dropped): consumers
go on from the slave, with the offsets the slave got by metadata sync; a restarted master
with stale offsets does not roll the slave's back.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.broker.test_official_client import official
from trioha._config import BrokerConfig
from trioha.broker import Broker, open_broker
from trioha.broker._clientside import ClientSide
from trioha.broker._types import BrokerLike
from trioha.namesrv import serve_namesrv
from trioha.remoting import open_client_pool, runtime_info

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("rocketmq") is None,
    reason="the official client (pip install rocketmq) is not installed",
)


@asynccontextmanager
async def running(config: BrokerConfig) -> AsyncIterator[tuple[Broker, ClientSide]]:
    async with open_broker(config) as broker:
        assert broker.client_side is not None
        yield broker, broker.client_side


def configs(root: Path, namesrv: str, **master: Any) -> tuple[BrokerConfig, dict[str, Any]]:
    common: dict[str, Any] = {
        "namesrv_addr": namesrv,
        "mapped_file_size_commit_log": 1 << 20,
        "listen_port": 0,
    }
    return (
        BrokerConfig(
            store_path_root_dir=str(root / "master"), ha_listen_port=0, **common, **master
        ),
        {
            "store_path_root_dir": str(root / "slave"),
            "broker_role": "SLAVE",
            "broker_id": 1,
            **common,
        },
    )


async def wait_replicated(master: Broker, slave: Broker, slave_side: ClientSide) -> None:
    """Until the slave holds the master's whole log and has indexed it."""
    target = master.store.commitlog.max_offset
    with trio.fail_after(30):
        while slave.store.commitlog.max_offset < target:  # noqa: ASYNC110 (HA runs elsewhere)
            await trio.sleep(0.05)
        await slave_side.reput.wait_dispatched(target)


def total(side: ClientSide, group: str, topic: str) -> int:
    return sum(max(0, side.meta.offsets.query(group, topic, q)) for q in range(16))


async def test_consumers_go_on_from_the_slave_and_keep_their_offsets(tmp_path: Path) -> None:
    async with trio.open_nursery() as outer:
        host, port = await outer.start(serve_namesrv, "127.0.0.1", 0)
        namesrv = f"{host}:{port}"
        master_config, slave_overrides = configs(tmp_path, namesrv)
        master_scope = trio.CancelScope()
        master_ready: list[tuple[Broker, ClientSide]] = []
        master_started, master_stopped = trio.Event(), trio.Event()

        async def run_master(config: BrokerConfig) -> None:
            with master_scope:
                async with running(config) as pair:
                    master_ready.append(pair)
                    master_started.set()
                    await trio.sleep_forever()
            master_stopped.set()

        outer.start_soon(run_master, master_config)
        await master_started.wait()
        master, master_side = master_ready[0]
        assert master.ha_address is not None
        ha = f"127.0.0.1:{master.ha_address[1]}"
        slave_config = BrokerConfig(ha_master_address=ha, **slave_overrides)
        async with running(slave_config) as (slave, slave_side):
            assert slave_side.slave_sync is not None
            # Phase 1: produce to the master, consume from the master.
            sent = await official(tmp_path, "produce", namesrv, "HA", "100", "one")
            assert sent["statuses"] == ["OK"] * 100
            got = await official(tmp_path, "push", namesrv, "HA", "G", "100", "30")
            assert Counter(got["bodies"]) == Counter(f"one-{i}" for i in range(100))
            assert total(master_side, "G", "HA") == 100
            async with open_client_pool() as pool:  # what `trioha status` shows
                info = await runtime_info(pool, master_side.broker_addr)
                slave_info = await runtime_info(pool, slave_side.broker_addr)
            assert info["brokerRole"] == "ASYNC_MASTER"
            assert int(info["stats.ha.slaves.0.ack_offset"]) > 0
            assert "stats.ha.slaves.0.lag" in info
            assert slave_info["brokerRole"] == "SLAVE"
            assert slave_info["masterAddr"] == master_side.broker_addr
            assert slave_info["stats.client.connected"] == "true"
            # Phase 2: more messages, replicated; the slave syncs the master's metadata.
            sent = await official(tmp_path, "produce", namesrv, "HA", "60", "two")
            assert sent["statuses"] == ["OK"] * 60
            await wait_replicated(master, slave, slave_side)
            assert slave_side.slave_sync.master_addr == master_side.broker_addr  # via namesrv
            assert await slave_side.slave_sync.sync_all()
            assert total(slave_side, "G", "HA") == 100  # committed on the master, now on the slave
            # The master dies.
            master_scope.cancel()
            with trio.fail_after(10):
                await master_stopped.wait()
            # The consumer group comes back: only the slave is left, and it has the offsets.
            got = await official(tmp_path, "push", namesrv, "HA", "G", "60", "40")
            assert Counter(got["bodies"]) == Counter(f"two-{i}" for i in range(60))
            assert total(slave_side, "G", "HA") == 160  # committed to the slave
            # The master restarts (same ports) with its stale offsets (100): the slave keeps 160.
            restarted = master_config.evolve(
                listen_port=int(master_side.broker_addr.rsplit(":", 1)[1]),
                ha_listen_port=master.ha_address[1],
            )
            async with running(restarted) as (_again, again_side):
                assert again_side.broker_addr == master_side.broker_addr
                assert total(again_side, "G", "HA") == 100
                assert await slave_side.slave_sync.sync_all()
                assert total(slave_side, "G", "HA") == 160
        outer.cancel_scope.cancel()


@pytest.mark.slow
async def test_a_running_consumer_goes_on_from_the_slave_when_the_master_dies(
    tmp_path: Path,
) -> None:
    """The consumer is slow: when the master dies, most messages are still to be pulled.

    The official client finds the master gone (its pulls fail, the name server's route lists
    only the slave) and pulls the rest from the slave, each message once.
    """
    count = 6000
    async with trio.open_nursery() as outer:
        host, port = await outer.start(serve_namesrv, "127.0.0.1", 0)
        namesrv = f"{host}:{port}"
        master_config, slave_overrides = configs(tmp_path, namesrv)
        master_scope = trio.CancelScope()
        started, stopped = trio.Event(), trio.Event()
        box: list[tuple[Broker, ClientSide]] = []

        async def run_master() -> None:
            with master_scope:
                async with running(master_config) as pair:
                    box.append(pair)
                    started.set()
                    await trio.sleep_forever()
            stopped.set()

        outer.start_soon(run_master)
        await started.wait()
        master, _master_side = box[0]
        assert master.ha_address is not None
        slave_config = BrokerConfig(
            ha_master_address=f"127.0.0.1:{master.ha_address[1]}", **slave_overrides
        )
        async with running(slave_config) as (slave, slave_side):
            sent = await official(tmp_path, "produce", namesrv, "FO", str(count), "fo")
            assert sent["statuses"] == ["OK"] * count
            await wait_replicated(master, slave, slave_side)
            results: dict[str, Any] = {}

            async def consume() -> None:
                results.update(
                    await official(tmp_path, "push", namesrv, "FO", "G", str(count), "80", "0.002")
                )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(consume)
                await trio.sleep(3)  # consuming from the master, a few hundred messages in
                master_scope.cancel()
                await stopped.wait()
            assert Counter(results["bodies"]) == Counter(f"fo-{i}" for i in range(count))
            served = slave_side.processor.served
            assert served["PULL_MESSAGE.0"] > 0  # the rest came from the slave
            assert total(slave_side, "G", "FO") == count  # and was committed there
        outer.cancel_scope.cancel()


async def test_sync_master_statuses_reach_the_official_producer(tmp_path: Path) -> None:
    """SYNC_MASTER without a slave answers SLAVE_NOT_AVAILABLE (11): the message is stored.

    The C++ client (``DefaultMQProducer::sendDefaultImpl``) treats any status but SEND_OK as
    a failure in sync sends: it sends again (3 attempts, each stored, as against a Java
    broker) and then raises. With the slave connected, sends are OK.
    """
    async with trio.open_nursery() as outer:
        host, port = await outer.start(serve_namesrv, "127.0.0.1", 0)
        namesrv = f"{host}:{port}"
        master_config, slave_overrides = configs(tmp_path, namesrv, broker_role="SYNC_MASTER")
        async with running(master_config) as (master, side):
            alone = await official(tmp_path, "produce", namesrv, "S", "2", "alone")
            assert alone["statuses"] == []
            assert len(alone["errors"]) == 2
            assert side.processor.served["SEND_MESSAGE.11"] == 6  # 3 attempts per message
            bodies = [m.body for m in master.store.commitlog.iter_messages() if m.topic == "S"]
            assert sorted(bodies) == [b"alone-0"] * 3 + [b"alone-1"] * 3
            assert master.ha_address is not None
            slave_config = BrokerConfig(
                ha_master_address=f"127.0.0.1:{master.ha_address[1]}", **slave_overrides
            )
            async with running(slave_config) as (slave, slave_side):
                await wait_replicated(master, slave, slave_side)  # the slave is connected
                paired = await official(tmp_path, "produce", namesrv, "S", "3", "paired")
                assert paired["statuses"] == ["OK"] * 3
        outer.cancel_scope.cancel()


def test_the_real_broker_is_broker_like() -> None:
    """mypy checks this assignment: ``trioha.broker.Broker`` satisfies ``BrokerLike``."""
    broker_like: type[BrokerLike] = Broker
    assert broker_like is Broker
