"""Java-broker parity of the broker port: the VIP channel, runtime info, admin codes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.broker.test_broker_port import FULL_V2, broker_port, call
from trioha.broker._stats import BrokerStats, human_bytes, java_double, runtime_text
from trioha.remoting import (
    RemotingClientPool,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    loads_lenient,
    runtime_info,
    send_message,
    update_consumer_offset,
)
from trioha.store import DecodedMessage, decode_record

#: Every key ``AdminBrokerProcessor.getBrokerRuntimeInfo`` of RocketMQ 4.9.7 answers with
#: (without a transient store pool or delayed messages).
JAVA_RUNTIME_KEYS = {
    "bootTimestamp",
    "runtime",
    "putMessageEntireTimeMax",
    "getMessageEntireTimeMax",
    "putMessageTimesTotal",
    "putMessageFailedTimes",
    "putMessageSizeTotal",
    "putMessageAverageSize",
    "putMessageDistributeTime",
    "dispatchMaxBuffer",
    "putTps",
    "getFoundTps",
    "getMissTps",
    "getTransferedTps",
    "getTotalTps",
    "putLatency99",
    "putLatency999",
    "commitLogDiskRatio",
    "consumeQueueDiskRatio",
    "commitLogMinOffset",
    "commitLogMaxOffset",
    "brokerVersionDesc",
    "brokerVersion",
    "msgPutTotalYesterdayMorning",
    "msgPutTotalTodayMorning",
    "msgPutTotalTodayNow",
    "msgGetTotalYesterdayMorning",
    "msgGetTotalTodayMorning",
    "msgGetTotalTodayNow",
    "sendThreadPoolQueueSize",
    "sendThreadPoolQueueCapacity",
    "pullThreadPoolQueueSize",
    "pullThreadPoolQueueCapacity",
    "queryThreadPoolQueueSize",
    "queryThreadPoolQueueCapacity",
    "EndTransactionQueueSize",
    "EndTransactionThreadPoolQueueCapacity",
    "sendThreadPoolQueueHeadWaitTimeMills",
    "pullThreadPoolQueueHeadWaitTimeMills",
    "queryThreadPoolQueueHeadWaitTimeMills",
    "dispatchBehindBytes",
    "pageCacheLockTimeMills",
    "earliestMessageTimeStamp",
    "startAcceptSendRequestTimeStamp",
    "remainTransientStoreBufferNumbs",
    "remainHowManyDataToFlush",
    "commitLogDirCapacity",
}


async def test_vip_channel_is_the_broker_port_minus_two(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (_broker, side, pool):
        host, port = side.broker_addr.rsplit(":", 1)
        assert side.vip_addr == f"{host}:{int(port) - 2}"
        sent = await send_message(pool, side.vip_addr, topic="T", body=b"v", queue_id=0)
        assert sent.code == ResponseCode.SUCCESS
        # What a Java slave fetches there (BrokerOuterAPI.getAllTopicConfig).
        topics = await pool.request(
            side.vip_addr, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG)
        )
        assert "T" in loads_lenient(topics.body)["topicConfigTable"]
        # RocketMQ does not register the pull processor on the VIP channel.
        pull = await pool.request(
            side.vip_addr,
            RemotingCommand.request(
                RequestCode.PULL_MESSAGE,
                {"consumerGroup": "G", "topic": "T", "queueId": 0, "queueOffset": 0},
            ),
        )
        assert (pull.code, pull.remark) == (
            ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
            " request type 11 not supported",
        )


async def test_runtime_info_has_every_java_key_and_no_python_reprs(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (broker, side, pool):
        await send_message(pool, side.broker_addr, topic="T", body=b"x" * 10, queue_id=0)
        info = await runtime_info(pool, side.broker_addr)
        assert set(info) >= JAVA_RUNTIME_KEYS
        assert info[f"commitLogDiskRatio_{tmp_path / 'commitlog'}"] == info["commitLogDiskRatio"]
        assert 0.0 <= float(info["commitLogDiskRatio"]) <= 1.0
        assert (info["brokerVersionDesc"], info["brokerVersion"]) == ("V4_9_7", "407")
        assert info["putMessageTimesTotal"] == "1"
        assert info["putMessageSizeTotal"] == str(broker.store.commitlog.max_offset)
        assert info["sendThreadPoolQueueCapacity"] == "10000"
        first = next(broker.store.commitlog.iter_messages())
        assert info["earliestMessageTimeStamp"] == str(first.store_timestamp)
        assert info["putMessageDistributeTime"].startswith("[<=0ms]:")
        assert info["runtime"].startswith("[ 0 days, 0 hours, ")
        for key, value in info.items():
            assert "None" not in value and "<" not in value.replace("[<=0ms]", ""), (key, value)
            assert value not in {"True", "False"}, (key, value)


def test_stats_tps_windows_follow_rocketmq() -> None:
    now = [1_700_000_000_000]
    puts = [0]
    stats = BrokerStats(puts_total=lambda: puts[0], wall_ms=lambda: now[0])
    for _ in range(10):
        now[0] += 1000
        puts[0] += 5
        stats.record_get(1.0, found=True, messages=2)
        stats.sample()
    info = stats.runtime_info(put_size_total=100)
    # 10 s of samples: the 10 s window exists, the 60 s and 600 s ones do not yet.
    assert info["putTps"] == "5.0  "
    assert info["getTransferedTps"] == "2.0  "
    assert info["getTotalTps"] == "1.0 1.0 1.0"
    assert info["putMessageAverageSize"] == "2.0"
    assert info["msgPutTotalTodayNow"] == "50"
    empty = BrokerStats(puts_total=lambda: 0, wall_ms=lambda: now[0])
    assert empty.runtime_info(put_size_total=0)["putMessageTimesTotal"] == "1"


def test_java_number_and_size_formats() -> None:
    assert [java_double(v) for v in (0.0, 0.42, 12.5, 3.0, 12345678.0, 1e-4)] == [
        "0.0",
        "0.42",
        "12.5",
        "3.0",
        "1.2345678E7",
        "1.0E-4",
    ]
    assert human_bytes(512) == "512 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(3 * 2**30 // 2) == "1.5 GiB"
    assert runtime_text((2 * 86400 + 3 * 3600 + 4 * 60 + 5) * 1000) == (
        "[ 2 days, 3 hours, 4 minutes, 5 seconds ]"
    )
    assert runtime_text(1234 * 86400 * 1000).startswith("[ 1,234 days")


_MQ_KEY = re.compile(r'\{"brokerName":"[^"]*","queueId":\d+,"topic":"[^"]*"\}(?=:)')


def parse_object_keyed(body: bytes) -> Any:
    """Parse fastjson's ``{{MessageQueue}:value}`` maps: each key becomes "topic/queueId"."""

    def key(match: re.Match[str]) -> str:
        mq = json.loads(match.group(0))
        return json.dumps(f"{mq['topic']}/{mq['queueId']}")

    return json.loads(_MQ_KEY.sub(key, body.decode()))


async def test_mqadmin_admin_codes(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (broker, side, pool):
        for i in range(3):
            await send_message(pool, side.broker_addr, topic="T", body=b"%d" % i, queue_id=1)
        await side.reput.wait_dispatched(broker.store.commitlog.max_offset)
        stored = list(broker.store.commitlog.iter_messages())

        # 26 GET_BROKER_CONFIG: key=value lines and the configuration's data version.
        config = await call(pool, side, RequestCode.GET_BROKER_CONFIG)
        lines = dict(line.split("=", 1) for line in config.body.decode().splitlines())
        assert lines["brokerIP1"] == "127.0.0.1"
        assert lines["brokerRole"] == "ASYNC_MASTER"
        assert lines["autoCreateTopicEnable"] == "true"
        assert set(json.loads(config.require("version"))) == {"counter", "timestamp"}

        # 200 UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, as mqadmin updateSubGroup sends it.
        group = {"groupName": "G", "retryMaxTimes": 3, "retryQueueNums": 1, "brokerId": 0}
        created = await pool.request(
            side.broker_addr,
            RemotingCommand.request(
                RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, json.dumps(group).encode()
            ),
        )
        assert created.code == ResponseCode.SUCCESS
        groups = loads_lenient(
            (await call(pool, side, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)).body
        )
        assert groups["subscriptionGroupTable"]["G"]["retryMaxTimes"] == 3

        # 202 GET_TOPIC_STATS_INFO: one entry per write queue.
        stats = await call(pool, side, RequestCode.GET_TOPIC_STATS_INFO, topic="T")
        assert stats.body.startswith(b'{"offsetTable":{{"brokerName":')
        table = parse_object_keyed(stats.body)["offsetTable"]
        assert len(table) == side.meta.topics.select("T").write_queue_nums  # type: ignore[union-attr]
        assert table["T/1"] == {
            "lastUpdateTimestamp": stored[2].store_timestamp,
            "maxOffset": 3,
            "minOffset": 0,
        }
        assert table["T/0"] == {"lastUpdateTimestamp": 0, "maxOffset": 0, "minOffset": 0}
        missing = await call(pool, side, RequestCode.GET_TOPIC_STATS_INFO, topic="Nope")
        assert (missing.code, missing.remark) == (
            ResponseCode.TOPIC_NOT_EXIST,
            "topic[Nope] not exist",
        )

        # 208 GET_CONSUME_STATS, by topic and for every topic with offsets.
        await update_consumer_offset(
            pool, side.broker_addr, group="G", topic="T", queue_id=1, offset=1
        )
        for fields in ({"consumerGroup": "G", "topic": "T"}, {"consumerGroup": "G"}):
            consume = await call(pool, side, RequestCode.GET_CONSUME_STATS, **fields)
            parsed = parse_object_keyed(consume.body)
            assert parsed["consumeTps"] == 0.0
            assert parsed["offsetTable"]["T/1"] == {
                "brokerOffset": 3,
                "consumerOffset": 1,
                "lastTimestamp": stored[0].store_timestamp,
            }

        # 300 QUERY_TOPIC_CONSUME_BY_WHO and 203 GET_CONSUMER_CONNECTION_LIST.
        who = await call(pool, side, RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, topic="T")
        assert json.loads(who.body) == {"groupList": ["G"]}
        offline = await call(
            pool, side, RequestCode.GET_CONSUMER_CONNECTION_LIST, consumerGroup="G"
        )
        assert (offline.code, offline.remark) == (
            ResponseCode.CONSUMER_NOT_ONLINE,
            "the consumer group[G] not online",
        )

        # 317 GET_BROKER_CONSUME_STATS.
        every = await call(pool, side, RequestCode.GET_BROKER_CONSUME_STATS, isOrder="false")
        parsed = parse_object_keyed(every.body)
        assert parsed["brokerAddr"] == side.broker_addr
        assert parsed["totalDiff"] == 2
        by_group = {name: v for item in parsed["consumeStatsList"] for name, v in item.items()}
        assert by_group["G"][0]["offsetTable"]["T/1"]["consumerOffset"] == 1
        ordered = await call(pool, side, RequestCode.GET_BROKER_CONSUME_STATS, isOrder="true")
        assert parse_object_keyed(ordered.body)["totalDiff"] == 0

        # 215 DELETE_TOPIC_IN_BROKER.
        system = await call(pool, side, RequestCode.DELETE_TOPIC_IN_BROKER, topic="TBW102")
        assert system.code == ResponseCode.SYSTEM_ERROR
        assert system.remark == "The topic[TBW102] is conflict with system topic."
        deleted = await call(pool, side, RequestCode.DELETE_TOPIC_IN_BROKER, topic="T")
        assert deleted.code == ResponseCode.SUCCESS
        assert side.meta.topics.select("T") is None
        assert not (tmp_path / "consumequeue" / "T").exists()
        assert side.reput.queues.get("T", 1) is None


async def test_slave_refuses_table_changes(tmp_path: Path) -> None:
    async with broker_port(tmp_path, broker_role="SLAVE") as (_broker, side, pool):
        for code, fields, body in (
            (RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "T"}, b""),
            (RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, b'{"groupName":"G"}'),
        ):
            response = await pool.request(
                side.broker_addr, RemotingCommand.request(code, fields, body)
            )
            assert response.code == ResponseCode.SYSTEM_ERROR
            assert (response.remark or "").startswith("Can't modify topic or subscription group")


async def query(
    pool: RemotingClientPool,
    addr: str,
    topic: str,
    key: str,
    *,
    unique: bool = False,
    max_num: int = 64,
) -> RemotingCommand:
    fields: dict[str, Any] = {
        "topic": topic,
        "key": key,
        "maxNum": max_num,
        "beginTimestamp": 0,
        "endTimestamp": 2**63 - 1,
    }
    if unique:
        fields["_UNIQUE_KEY_QUERY"] = "true"
    return await pool.request(addr, RemotingCommand.request(RequestCode.QUERY_MESSAGE, fields))


def decoded(body: bytes) -> list[Any]:
    out, pos = [], 0
    while pos < len(body):
        record = decode_record(body, pos, check_crc=True, base_offset=0)
        assert isinstance(record, DecodedMessage)
        out.append(record.message)
        pos += record.message.total_size
    return out


async def test_query_message_by_key_and_unique_key(tmp_path: Path) -> None:
    small = {"max_hash_slot_num": 97, "max_index_num": 40}
    async with broker_port(tmp_path, **small) as (broker, side, pool):
        sent = []
        for i in range(14):
            sent.append(
                await send_message(
                    pool,
                    side.broker_addr,
                    topic="T",
                    body=b"%d" % i,
                    queue_id=0,
                    keys=f"order-{i % 3} all",
                )
            )
        await side.reput.wait_dispatched(broker.store.commitlog.max_offset)
        found = await query(pool, side.broker_addr, "T", "order-1")
        assert found.code == ResponseCode.SUCCESS
        assert [m.body for m in decoded(found.body)] == [b"1", b"4", b"7", b"10", b"13"]
        assert found.int_field("indexLastUpdatePhyoffset") == max(
            m.physical_offset for m in broker.store.commitlog.iter_messages()
        )
        assert len(decoded((await query(pool, side.broker_addr, "T", "all", max_num=5)).body)) == 5
        stored = list(broker.store.commitlog.iter_messages())
        uniq = stored[5].get_property("UNIQ_KEY")
        assert uniq is not None
        by_id = await query(pool, side.vip_addr, "T", uniq, unique=True, max_num=1)
        assert [m.body for m in decoded(by_id.body)] == [b"5"]
        missing = await query(pool, side.broker_addr, "T", "order-9")
        assert (missing.code, missing.remark) == (
            ResponseCode.QUERY_NOT_FOUND,
            "can not find message, maybe time range not correct",
        )
        other_topic = await query(pool, side.broker_addr, "U", "order-1")
        assert other_topic.code == ResponseCode.QUERY_NOT_FOUND
        assert sent[0].msg_id  # the offset id VIEW_MESSAGE_BY_ID is asked with
        view = await call(
            pool, side, RequestCode.VIEW_MESSAGE_BY_ID, offset=stored[3].physical_offset
        )
        assert view.body == stored[3].encode()
        bad = await call(pool, side, RequestCode.VIEW_MESSAGE_BY_ID, offset=10**12)
        assert bad.code == ResponseCode.SYSTEM_ERROR
        files = sorted((tmp_path / "index").iterdir())
        assert len(files) == 2  # 42 keys, 39 entries per file
        assert files[0].stat().st_size == 40 + 4 * 97 + 20 * 40

    # Recovered on restart: the same answers, nothing indexed twice.
    async with broker_port(tmp_path, **small) as (broker, side, pool):
        await side.reput.wait_dispatched(broker.store.commitlog.max_offset)
        again = await query(pool, side.broker_addr, "T", "order-1")
        assert [m.body for m in decoded(again.body)] == [b"1", b"4", b"7", b"10", b"13"]
        assert len(sorted((tmp_path / "index").iterdir())) == 2


async def test_slave_builds_its_own_index(tmp_path: Path) -> None:
    async with broker_port(tmp_path / "m") as (master, mside, mpool):
        for i in range(3):
            await send_message(
                mpool, mside.broker_addr, topic="T", body=b"%d" % i, queue_id=0, keys=f"k{i}"
            )
        async with broker_port(tmp_path / "s", broker_role="SLAVE") as (slave, side, pool):
            slave.copy_from(master)
            await side.reput.wait_dispatched(slave.store.commitlog.max_offset)
            found = await query(pool, side.broker_addr, "T", "k2")
            assert [m.body for m in decoded(found.body)] == [b"2"]
        assert (tmp_path / "s" / "index").is_dir()


async def test_index_can_be_disabled(tmp_path: Path) -> None:
    async with broker_port(tmp_path, message_index_enable=False) as (broker, side, pool):
        await send_message(pool, side.broker_addr, topic="T", body=b"x", queue_id=0, keys="k")
        await side.reput.wait_dispatched(broker.store.commitlog.max_offset)
        assert (await query(pool, side.broker_addr, "T", "k")).code == ResponseCode.QUERY_NOT_FOUND
        assert not (tmp_path / "index").exists()


async def test_delayed_send_is_parked_and_reported(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (broker, side, pool):
        response = await pool.request(
            side.broker_addr,
            RemotingCommand.request(
                RequestCode.SEND_MESSAGE_V2,
                {**FULL_V2, "e": 1, "i": "DELAY\x012\x02TAGS\x01x"},
                b"later",
            ),
        )
        assert response.code == ResponseCode.SUCCESS
        stored = next(broker.store.commitlog.iter_messages())
        assert (stored.topic, stored.queue_id) == ("SCHEDULE_TOPIC_XXXX", 1)
        assert (stored.get_property("REAL_TOPIC"), stored.get_property("REAL_QID")) == ("T", "1")
        await side.reput.wait_dispatched(broker.store.commitlog.max_offset)
        side.meta.delay.set_offset(2, 0)
        info = await runtime_info(pool, side.broker_addr)
        assert info["scheduleMessageOffset_2"] == "0,1"
        delay = await call(pool, side, RequestCode.GET_ALL_DELAY_OFFSET)
        assert delay.body == b'{"offsetTable":{2:0}}'
        bad = await pool.request(
            side.broker_addr,
            RemotingCommand.request(
                RequestCode.SEND_MESSAGE_V2,
                {**FULL_V2, "e": 1, "i": "DELAY\x01soon"},
                b"?",
            ),
        )
        # Refused (RocketMQ fails the put on the bad number), nothing stored.
        assert bad.code in (ResponseCode.MESSAGE_ILLEGAL, ResponseCode.SYSTEM_ERROR)
        assert len(list(broker.store.commitlog.iter_messages())) == 1


async def test_delayed_message_is_stored_as_rocketmq_stores_it(tmp_path: Path) -> None:
    """The properties of a delayed message come out in Java's HashMap order, WAIT included."""
    props = (
        "DELAY\x013\x02KEYS\x01k1\x02UNIQ_KEY\x017F0000010BB818B4AAC2583E68D10000"
        "\x02WAIT\x01true\x02TAGS\x01TagA"
    )
    async with broker_port(tmp_path) as (broker, side, pool):
        response = await pool.request(
            side.broker_addr,
            RemotingCommand.request(
                RequestCode.SEND_MESSAGE_V2,
                {**FULL_V2, "b": "TopicA", "e": 1, "i": props},
                b"later",
            ),
        )
        assert response.code == ResponseCode.SUCCESS
        stored = next(broker.store.commitlog.iter_messages())
        text = "\x02".join(f"{k}\x01{v}" for k, v in stored.properties)
        assert text.replace("\x01", "=").replace("\x02", "|") == (
            "REAL_TOPIC=TopicA|KEYS=k1|UNIQ_KEY=7F0000010BB818B4AAC2583E68D10000|"
            "CLUSTER=DefaultCluster|DELAY=3|WAIT=true|TAGS=TagA|REAL_QID=1"
        )
        assert len(text) == 129
