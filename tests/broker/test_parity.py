"""Java-broker parity of the broker port: the VIP channel, runtime info, admin codes."""

from __future__ import annotations

from pathlib import Path

from tests.broker.test_broker_port import broker_port
from trioha.broker._stats import BrokerStats, human_bytes, java_double, runtime_text
from trioha.remoting._codec import RemotingCommand
from trioha.remoting._codes import RequestCode, ResponseCode
from trioha.remoting._json import loads_lenient
from trioha.remoting._mqclient import runtime_info, send_message

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
