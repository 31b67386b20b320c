"""Metadata replication to a slave (SlaveSynchronize, docs/rocketmq-protocol.md §6.1) and where
trioha does better."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from tests.broker.test_broker_port import broker_port
from trioha._config import BrokerConfig
from trioha.broker._metadata import Metadata
from trioha.broker._slavesync import SlaveSynchronize
from trioha.remoting import (
    NoBursts,
    RemotingCommand,
    RemotingConnection,
    RequestCode,
    ResponseCode,
    open_client_pool,
    send_message,
    serve_remoting,
    update_consumer_offset,
)

# A RocketMQ 4.9 master's bodies as fastjson writes them: integer map keys unquoted.
JAVA_TOPICS = (
    '{"dataVersion":{"counter":7,"timestamp":1700000000000},"topicConfigTable":{"JT":'
    '{"order":false,"perm":6,"readQueueNums":4,"topicFilterType":"SINGLE_TAG",'
    '"topicName":"JT","topicSysFlag":0,"writeQueueNums":4}}}'
)
JAVA_OFFSETS = '{"offsetTable":{"JT@JG":{0:12,1:3,2:0,3:9}}}'
JAVA_DELAY = '{"offsetTable":{1:5,2:0,3:17}}'
JAVA_GROUPS = (
    '{"dataVersion":{"counter":2,"timestamp":1700000000001},"subscriptionGroupTable":{"JG":'
    '{"brokerId":0,"consumeBroadcastEnable":true,"consumeEnable":true,'
    '"consumeFromMinEnable":true,"groupName":"JG","notifyConsumerIdsChangedEnable":true,'
    '"retryMaxTimes":16,"retryQueueNums":1,"whichBrokerWhenConsumeSlowly":1}}}'
)


class JavaMaster(NoBursts):
    """Answers the four sync requests the way a Java master's AdminBrokerProcessor does."""

    def __init__(self, fail: int | None = None) -> None:
        self.fail = fail
        self.bodies: dict[int, str] = {
            RequestCode.GET_ALL_TOPIC_CONFIG: JAVA_TOPICS,
            RequestCode.GET_ALL_CONSUMER_OFFSET: JAVA_OFFSETS,
            RequestCode.GET_ALL_DELAY_OFFSET: JAVA_DELAY,
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: JAVA_GROUPS,
        }

    async def handle_request(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand | None:
        if request.code == self.fail:
            return request.response(ResponseCode.SYSTEM_ERROR, "No topic in this broker")
        body = self.bodies.get(request.code)
        if body is None:
            return request.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "no")
        return request.response(ResponseCode.SUCCESS, body=body.encode())


async def test_slave_reads_a_java_master_and_writes_rocketmq_files(tmp_path: Path) -> None:
    meta = Metadata.load(tmp_path, BrokerConfig(broker_role="SLAVE"))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery, open_client_pool() as pool:
            host, port = await nursery.start(serve_remoting, JavaMaster(), "127.0.0.1", 0)
            sync = SlaveSynchronize(
                meta, pool, own_addr="127.0.0.1:1", master_addr=f"{host}:{port}"
            )
            assert await sync.sync_all()
            nursery.cancel_scope.cancel()
    meta.persist_all()
    assert meta.topics.select("JT") is not None
    assert meta.topics.data_version.counter == 7
    assert meta.offsets.query("JG", "JT", 0) == 12
    assert meta.groups.table["JG"].retry_max_times == 16
    config = tmp_path / "config"
    assert (config / "delayOffset.json").read_text() == JAVA_DELAY  # verbatim, as RocketMQ
    assert json.loads((config / "consumerOffset.json").read_text()) == {
        "offsetTable": {"JT@JG": {"0": 12, "1": 3, "2": 0, "3": 9}}
    }
    assert "JT" in json.loads((config / "topics.json").read_text())["topicConfigTable"]


async def test_a_failing_step_does_not_stop_the_others(tmp_path: Path) -> None:
    meta = Metadata.load(tmp_path, BrokerConfig(broker_role="SLAVE"))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery, open_client_pool() as pool:
            master = JavaMaster(fail=RequestCode.GET_ALL_CONSUMER_OFFSET)
            host, port = await nursery.start(serve_remoting, master, "127.0.0.1", 0)
            sync = SlaveSynchronize(meta, pool, own_addr="x:1", master_addr=f"{host}:{port}")
            assert not await sync.sync_all()
            assert sync.last_error is not None
            assert "No topic in this broker" in sync.last_error
            nursery.cancel_scope.cancel()
    assert meta.topics.select("JT") is not None  # the steps after the failed one ran
    assert "JG" in meta.groups.table
    assert meta.offsets.query("JG", "JT", 0) == -1


async def test_no_master_or_self_is_skipped(tmp_path: Path) -> None:
    meta = Metadata.load(tmp_path, BrokerConfig(broker_role="SLAVE"))
    async with open_client_pool() as pool:
        assert not await SlaveSynchronize(meta, pool, own_addr="a:1").sync_all()
        assert not await SlaveSynchronize(meta, pool, own_addr="a:1", master_addr="a:1").sync_all()


async def test_restarted_master_does_not_roll_the_slave_back(tmp_path: Path) -> None:
    """RocketMQ #1094: after a master restart with stale offsets, syncAll overwrote newer ones."""
    async with broker_port(tmp_path / "s", broker_role="SLAVE") as (_slave, sside, spool):
        assert sside.slave_sync is not None
        async with broker_port(tmp_path / "m") as (_master, mside, mpool):
            await send_message(mpool, mside.broker_addr, topic="T", body=b"x", queue_id=0)
            await update_consumer_offset(
                mpool, mside.broker_addr, group="G", topic="T", queue_id=0, offset=10
            )
            sside.slave_sync.master_addr = mside.broker_addr
            assert await sside.slave_sync.sync_all()
            assert sside.meta.offsets.query("G", "T", 0) == 10  # after the next sync
            assert sside.meta.topics.select("T") is not None
            master_offsets = mside.meta.offsets
        # The master is down; the consumer commits to the slave.
        await update_consumer_offset(
            spool, sside.broker_addr, group="G", topic="T", queue_id=0, offset=15
        )
        # The master comes back with stale offsets (it lost its last commits).
        master_offsets.table["T@G"][0] = 7
        master_offsets.persist()
        async with broker_port(tmp_path / "m") as (_m2, mside2, _p2):
            assert mside2.meta.offsets.query("G", "T", 0) == 7
            sside.slave_sync.master_addr = mside2.broker_addr
            assert await sside.slave_sync.sync_all()
            assert sside.meta.offsets.query("G", "T", 0) == 15  # not rolled back to 7
    saved = json.loads((tmp_path / "s" / "config" / "consumerOffset.json").read_text())
    assert saved["offsetTable"]["T@G"]["0"] == 15


async def test_slave_learns_its_master_from_the_name_server(tmp_path: Path) -> None:
    async with broker_port(tmp_path / "m", namesrv_addr="127.0.0.1:0", embedded_namesrv=True) as (
        _m,
        mside,
        _mp,
    ):
        assert mside.namesrv_addr is not None
        namesrv = f"{mside.namesrv_addr[0]}:{mside.namesrv_addr[1]}"
        async with broker_port(
            tmp_path / "s", broker_role="SLAVE", broker_id=1, namesrv_addr=namesrv
        ) as (_s, sside, _sp):
            assert sside.slave_sync is not None
            assert sside.slave_sync.master_addr == mside.broker_addr
            assert sside.registrar is not None
            assert sside.registrar.registrations == 1
