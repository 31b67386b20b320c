"""The admin codes an operator's ``mqadmin`` sends, answered as RocketMQ 4.9.7 answers them.

One test per code (or per behaviour of one), over TCP on 127.0.0.1 against the broker port;
the expected remarks and body shapes are ``AdminBrokerProcessor``'s and ``Broker2Client``'s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from tests.broker.test_broker_port import Recorder, broker_port, call, heartbeat
from trioha.broker import _clientcalls
from trioha.broker._clientcalls import version_desc
from trioha.remoting import (
    RemotingCommand,
    RemotingConnection,
    RequestCode,
    ResponseCode,
    loads_lenient,
    open_remoting_client,
    runtime_info,
    send_message,
    update_consumer_offset,
)
from trioha.store import DecodedMessage, decode_record, tags_code


class Answering(Recorder):
    """A client's side of the broker's calls: records them, answers what it is told to (or,
    told nothing, never answers)."""

    def __init__(self, answer: RemotingCommand | None = None) -> None:
        super().__init__()
        self.answer = answer

    async def handle_request(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand | None:
        await super().handle_request(request, connection)
        if self.answer is None:
            await trio.sleep_forever()
        return request.response(
            self.answer.code, self.answer.remark, self.answer.ext_fields, self.answer.body
        )


async def create_topic(pool: Any, side: Any, topic: str, queues: int) -> None:
    created = await call(
        pool,
        side,
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        topic=topic,
        readQueueNums=queues,
        writeQueueNums=queues,
        perm=6,
    )
    assert created.code == ResponseCode.SUCCESS


def reset_request(timestamp: int, force: bool) -> RemotingCommand:
    fields = {"topic": "T", "group": "G", "timestamp": timestamp, "isForce": str(force).lower()}
    return RemotingCommand.request(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, fields)


async def wait_told(member: Answering) -> RemotingCommand:
    """The RESET_CONSUMER_CLIENT_OFFSET a member got (after the group-change notice)."""
    with trio.fail_after(5):
        while True:
            told = [
                r for r in member.requests if r.code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET
            ]
            if told:
                assert len(told) == 1
                return told[0]
            await member.arrived.wait()
            member.arrived = trio.Event()


# --- INVOKE_BROKER_TO_RESET_OFFSET (222) -----------------------------------------------------


async def test_reset_offset_refusals_before_any_consumer_is_asked(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (_broker, side, pool):
        no_topic = await pool.request(side.broker_addr, reset_request(0, force=True))
        assert (no_topic.code, no_topic.remark) == (
            ResponseCode.SYSTEM_ERROR,
            "[reset-offset] reset offset failed, no topic in this broker. topic=T",
        )
        await create_topic(pool, side, "T", 2)
        no_group = await pool.request(side.broker_addr, reset_request(0, force=True))
        assert (no_group.code, no_group.remark) == (
            ResponseCode.SYSTEM_ERROR,
            "THe consumer group <G> not exist",
        )
        for queue_id in (0, 1):
            await update_consumer_offset(
                pool, side.broker_addr, group="G", topic="T", queue_id=queue_id, offset=3
            )
        # No member online: CONSUMER_NOT_ONLINE, on which mqadmin falls back to writing the
        # offsets itself (UPDATE_CONSUMER_OFFSET); the broker's offsets are untouched.
        offline = await pool.request(side.broker_addr, reset_request(0, force=True))
        assert (offline.code, offline.remark) == (
            ResponseCode.CONSUMER_NOT_ONLINE,
            "Consumer not online, so can not reset offset, Group: G Topic: T Timestamp: 0",
        )
        assert side.meta.offsets.query("G", "T", 0) == 3


async def test_reset_offset_tells_every_member_the_new_offsets(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (broker, side, pool):
        await create_topic(pool, side, "T", 2)
        for i in range(5):
            await send_message(pool, side.broker_addr, topic="T", body=b"%d" % i, queue_id=0)
        await side.reput.wait_dispatched(broker.store.commitlog.max_offset)
        await update_consumer_offset(
            pool, side.broker_addr, group="G", topic="T", queue_id=0, offset=4
        )
        await update_consumer_offset(
            pool, side.broker_addr, group="G", topic="T", queue_id=1, offset=0
        )
        member = Answering()
        async with open_remoting_client(side.broker_addr, handler=member) as client:
            assert (await client.request(heartbeat("c1", "G"))).code == ResponseCode.SUCCESS
            # -1 ("now"): each queue's end.
            answer = await pool.request(side.broker_addr, reset_request(-1, force=False))
            assert answer.code == ResponseCode.SUCCESS, answer.remark
            mq0 = '{"brokerName":"broker-a","queueId":0,"topic":"T"}'
            mq1 = '{"brokerName":"broker-a","queueId":1,"topic":"T"}'
            # Not forced: a queue moves only backwards (queue 0 keeps 4, not its end 5).
            assert answer.body == ('{"offsetTable":{' + mq0 + ":4," + mq1 + ":0}}").encode()
            told = await wait_told(member)
            assert told.is_oneway
            assert told.ext_fields == {
                "topic": "T",
                "group": "G",
                "timestamp": "-1",
                "isForce": "false",
            }
            assert told.body == answer.body
            # The broker writes no offsets itself: the consumers commit the new ones.
            assert side.meta.offsets.query("G", "T", 0) == 4


async def test_reset_offset_from_a_cpp_caller_sends_the_list_form(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (_broker, side, pool):
        await create_topic(pool, side, "T", 1)
        await update_consumer_offset(
            pool, side.broker_addr, group="G", topic="T", queue_id=0, offset=2
        )
        member = Answering()
        async with open_remoting_client(side.broker_addr, handler=member) as client:
            await client.request(heartbeat("c1", "G"))
            request = attrs.evolve(reset_request(0, force=True), language="CPP")
            answer = await pool.request(side.broker_addr, request)
            assert answer.code == ResponseCode.SUCCESS
            told = await wait_told(member)
            assert json.loads(told.body) == {
                "offsetTable": [{"brokerName": "broker-a", "offset": 0, "queueId": 0, "topic": "T"}]
            }


async def test_reset_offset_refuses_a_client_too_old_for_it(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (_broker, side, pool):
        await create_topic(pool, side, "T", 1)
        await update_consumer_offset(
            pool, side.broker_addr, group="G", topic="T", queue_id=0, offset=0
        )
        async with open_remoting_client(side.broker_addr, handler=Answering()) as client:
            await client.request(attrs.evolve(heartbeat("old", "G"), version=27))
            answer = await pool.request(side.broker_addr, reset_request(0, force=True))
            assert (answer.code, answer.remark) == (
                ResponseCode.SYSTEM_ERROR,
                "the client does not support this feature. version=V3_0_6",
            )


def test_version_names_are_mqversions() -> None:
    assert version_desc(0) == "V3_0_0_SNAPSHOT"
    assert version_desc(15) == "V3_0_0_FINAL"
    assert version_desc(28) == "V3_0_7_SNAPSHOT"
    assert version_desc(62) == "V3_1_8_SNAPSHOT"
    assert version_desc(407) == "version 407"


# --- GET_CONSUMER_RUNNING_INFO (307) ----------------------------------------------------------


async def test_running_info_is_relayed_to_the_client_and_back(tmp_path: Path) -> None:
    info = b'{"properties":{"consumeType":"CONSUME_PASSIVELY"},"subscriptionSet":[]}'
    member = Answering(RemotingCommand(code=0, remark="fine", ext_fields={"x": "1"}, body=info))
    async with (
        broker_port(tmp_path) as (_broker, side, pool),
        open_remoting_client(side.broker_addr, handler=member) as client,
    ):
        await client.request(heartbeat("c1", "G"))
        fields = {"consumerGroup": "G", "clientId": "c1", "jstackEnable": "false"}
        answer = await call(pool, side, RequestCode.GET_CONSUMER_RUNNING_INFO, **fields)
        assert (answer.code, answer.remark, answer.body) == (ResponseCode.SUCCESS, "fine", info)
        assert answer.ext_fields == {"x": "1"}
        (asked,) = [r for r in member.requests if r.code == RequestCode.GET_CONSUMER_RUNNING_INFO]
        assert asked.ext_fields == fields
        assert not asked.is_oneway
        gone = await call(
            pool, side, RequestCode.GET_CONSUMER_RUNNING_INFO, consumerGroup="G", clientId="c9"
        )
        assert (gone.code, gone.remark) == (
            ResponseCode.SYSTEM_ERROR,
            "The Consumer <G> <c9> not online",
        )


async def test_running_info_of_a_silent_or_old_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_clientcalls, "CALL_CLIENT_TIMEOUT", 0.2)
    async with (
        broker_port(tmp_path) as (_broker, side, pool),
        open_remoting_client(side.broker_addr, handler=Answering()) as silent,
        open_remoting_client(side.broker_addr, handler=Answering()) as old,
    ):
        await silent.request(heartbeat("c1", "G"))
        await old.request(attrs.evolve(heartbeat("c2", "G"), version=61))
        timeout = await call(
            pool, side, RequestCode.GET_CONSUMER_RUNNING_INFO, consumerGroup="G", clientId="c1"
        )
        assert timeout.code == ResponseCode.CONSUME_MSG_TIMEOUT
        assert (timeout.remark or "").startswith("consumer <G> <c1> Timeout: ")
        too_old = await call(
            pool, side, RequestCode.GET_CONSUMER_RUNNING_INFO, consumerGroup="G", clientId="c2"
        )
        assert (too_old.code, too_old.remark) == (
            ResponseCode.SYSTEM_ERROR,
            "The Consumer <c2> Version <V3_1_7> too low to finish, please upgrade it to "
            "V3_1_8_SNAPSHOT",
        )


# --- GET_PRODUCER_CONNECTION_LIST (204) -------------------------------------------------------


async def test_producer_connection_list(tmp_path: Path) -> None:
    async with (
        broker_port(tmp_path) as (_broker, side, pool),
        open_remoting_client(side.broker_addr) as producer,
    ):
        beat = {"clientID": "p1", "consumerDataSet": [], "producerDataSet": [{"groupName": "PG"}]}
        await producer.request(
            RemotingCommand.request(RequestCode.HEART_BEAT, body=json.dumps(beat).encode())
        )
        listing = await call(
            pool, side, RequestCode.GET_PRODUCER_CONNECTION_LIST, producerGroup="PG"
        )
        assert listing.code == ResponseCode.SUCCESS
        (connection,) = loads_lenient(listing.body)["connectionSet"]
        assert connection["clientId"] == "p1"
        assert connection["language"] == "JAVA"
        assert connection["version"] == 407
        assert connection["clientAddr"].startswith("127.0.0.1:")
        none = await call(pool, side, RequestCode.GET_PRODUCER_CONNECTION_LIST, producerGroup="X")
        assert (none.code, none.remark) == (
            ResponseCode.SYSTEM_ERROR,
            "the producer group[X] not exist",
        )


# --- DELETE_SUBSCRIPTIONGROUP (207) -----------------------------------------------------------


async def test_delete_subscription_group_and_its_offsets(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (_broker, side, pool):
        for group in ("G", "H"):
            await update_consumer_offset(
                pool, side.broker_addr, group=group, topic="T", queue_id=0, offset=7
            )
            side.meta.groups.find(group)
        kept = await call(pool, side, RequestCode.DELETE_SUBSCRIPTIONGROUP, groupName="H")
        assert kept.code == ResponseCode.SUCCESS
        assert "H" not in side.meta.groups.table
        assert side.meta.offsets.query("H", "T", 0) == 7  # removeOffset not asked
        removed = await call(
            pool, side, RequestCode.DELETE_SUBSCRIPTIONGROUP, groupName="G", removeOffset="true"
        )
        assert removed.code == ResponseCode.SUCCESS
        assert "G" not in side.meta.groups.table
        assert side.meta.offsets.query("G", "T", 0) == -1
    saved = json.loads((tmp_path / "config" / "subscriptionGroup.json").read_text())
    assert not {"G", "H"} & set(saved["subscriptionGroupTable"])


async def test_a_slave_refuses_to_delete_a_group(tmp_path: Path) -> None:
    async with broker_port(tmp_path, broker_role="SLAVE") as (_broker, side, pool):
        side.meta.groups.find("G")
        refused = await call(pool, side, RequestCode.DELETE_SUBSCRIPTIONGROUP, groupName="G")
        assert refused.code == ResponseCode.SYSTEM_ERROR
        assert "G" in side.meta.groups.table


# --- QUERY_CONSUME_QUEUE (321) ----------------------------------------------------------------


async def test_query_consume_queue(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (broker, side, pool):
        for i in range(3):
            await send_message(
                pool, side.broker_addr, topic="T", body=b"m%d" % i, queue_id=1, tags="A"
            )
        await side.reput.wait_dispatched(broker.store.commitlog.max_offset)
        messages = list(broker.store.commitlog.iter_messages())

        async def query(queue_id: int = 1, index: int = 0, count: int = 1, **more: str) -> Any:
            return await call(
                pool,
                side,
                RequestCode.QUERY_CONSUME_QUEUE,
                topic="T",
                queueId=queue_id,
                index=index,
                count=count,
                **more,
            )

        answer = await query(index=1, count=5)
        assert answer.code == ResponseCode.SUCCESS
        body = loads_lenient(answer.body)
        assert body["maxQueueIndex"] == 3 and body["minQueueIndex"] == 0
        assert body["queueData"] == [
            {
                "eval": False,
                "physicOffset": m.physical_offset,
                "physicSize": m.total_size,
                "tagsCode": tags_code("A"),
            }
            for m in messages[1:]
        ]
        assert "subscriptionData" not in body and "filterData" not in body
        offline = await query(consumerGroup="G")
        assert loads_lenient(offline.body)["filterData"] == "G@T is not online!"
        async with open_remoting_client(side.broker_addr) as client:
            await client.request(heartbeat("c1", "G"))  # subscribes T with "A || B"
            online = await query(consumerGroup="G")
        body = loads_lenient(online.body)
        assert body["subscriptionData"]["subString"] == "A || B"
        assert body["filterData"] == "null"
        beyond = await query(index=3)
        assert (beyond.code, beyond.remark, beyond.body) == (
            ResponseCode.SUCCESS,
            "Index 3 of 1@T is not exist!",
            b"",
        )
        missing = await query(queue_id=7)
        assert (missing.code, missing.remark) == (ResponseCode.SYSTEM_ERROR, "7@T is not exist!")


# --- CLEAN_UNUSED_TOPIC (316) -----------------------------------------------------------------


async def test_clean_unused_topic_drops_queues_of_topics_no_longer_known(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (broker, side, pool):
        for topic in ("Gone", "Kept"):
            await send_message(pool, side.broker_addr, topic=topic, body=b"x", queue_id=0)
        await side.reput.wait_dispatched(broker.store.commitlog.max_offset)
        side.meta.topics.delete("Gone")  # the config only, as a slave's metadata sync would
        assert side.reput.queues.get("Gone", 0) is not None
        answer = await call(pool, side, RequestCode.CLEAN_UNUSED_TOPIC)
        assert answer.code == ResponseCode.SUCCESS
        assert side.reput.queues.get("Gone", 0) is None
        assert not (tmp_path / "consumequeue" / "Gone").exists()
        assert side.reput.queues.get("Kept", 0) is not None


async def test_a_slave_keeps_a_young_topic_its_table_may_not_have_yet(tmp_path: Path) -> None:
    async with broker_port(tmp_path / "m") as (master, _mside, mpool):
        await send_message(mpool, _mside.broker_addr, topic="New", body=b"x", queue_id=0)
        async with broker_port(tmp_path / "s", broker_role="SLAVE") as (slave, side, pool):
            slave.copy_from(master)
            await side.reput.wait_dispatched(slave.store.commitlog.max_offset)
            assert side.meta.topics.select("New") is None  # not synced from the master yet
            answer = await call(pool, side, RequestCode.CLEAN_UNUSED_TOPIC)
            assert answer.code == ResponseCode.SUCCESS
            assert side.reput.queues.get("New", 0) is not None


# --- CLEAN_EXPIRED_CONSUMEQUEUE (306), DELETE_EXPIRED_COMMITLOG (329) --------------------------


@pytest.mark.parametrize(
    ("code", "hook"),
    [
        (RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE, "clean_expired_consume_queues"),
        (RequestCode.DELETE_EXPIRED_COMMITLOG, "delete_expired_commitlog"),
    ],
)
async def test_retention_codes_call_the_brokers_hook(tmp_path: Path, code: int, hook: str) -> None:
    async with broker_port(tmp_path) as (broker, side, pool):
        without = await call(pool, side, code)
        assert without.code == ResponseCode.SYSTEM_ERROR
        assert "retention is not running on this broker yet" in (without.remark or "")
        calls: list[str] = []

        def retained() -> bool:
            calls.append(hook)
            return True

        setattr(broker, hook, retained)
        done = await call(pool, side, code)
        assert (done.code, calls) == (ResponseCode.SUCCESS, [hook])


# --- UPDATE_BROKER_CONFIG (25) ----------------------------------------------------------------


def update(**settings: Any) -> RemotingCommand:
    body = "".join(f"{key}={value}\n" for key, value in settings.items())
    return RemotingCommand.request(RequestCode.UPDATE_BROKER_CONFIG, body=body.encode())


async def test_update_broker_config_applies_and_persists_a_live_key(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (broker, side, pool):
        before = await call(pool, side, RequestCode.GET_BROKER_CONFIG)
        answer = await pool.request(side.broker_addr, update(flushIntervalCommitLog=1000))
        assert (answer.code, answer.remark) == (ResponseCode.SUCCESS, None)
        assert broker.config.flush_interval_commit_log == 1000
        assert side.processor.ctx.config.flush_interval_commit_log == 1000
        after = await call(pool, side, RequestCode.GET_BROKER_CONFIG)
        assert "flushIntervalCommitLog=1000\n" in after.body.decode()
        assert after.field("version") != before.field("version")
        # No -c file: RocketMQ's place, under the store root.
        saved = tmp_path / "config" / "broker.properties"
        assert saved.read_text() == "flushIntervalCommitLog=1000\n"


async def test_update_broker_config_rewrites_only_its_keys_in_the_c_file(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("# my broker\nbrokerName = broker-a\nmaxMessageSize=4194304\n")
    async with broker_port(tmp_path / "store") as (broker, side, pool):
        broker.config_file = conf
        answer = await pool.request(side.broker_addr, update(maxMessageSize=1024))
        assert answer.code == ResponseCode.SUCCESS
        assert conf.read_text() == "# my broker\nbrokerName = broker-a\nmaxMessageSize=1024\n"
        assert (tmp_path / "broker.conf.bak").read_text().endswith("maxMessageSize=4194304\n")
        # In effect at once: the store refuses a body above the new limit.
        big = await send_message(pool, side.broker_addr, topic="T", body=b"x" * 2048, queue_id=0)
        assert big.code == ResponseCode.MESSAGE_ILLEGAL


async def test_concurrent_updates_keep_both_changes(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (broker, side, pool), trio.open_nursery() as nursery:
        for request in (update(flushIntervalCommitLog=800), update(maxMessageSize=4096)):
            nursery.start_soon(pool.request, side.broker_addr, request)
    assert (broker.config.flush_interval_commit_log, broker.config.max_message_size) == (800, 4096)
    saved = (tmp_path / "config" / "broker.properties").read_text().splitlines()
    assert sorted(saved) == ["flushIntervalCommitLog=800", "maxMessageSize=4096"]


async def test_update_broker_config_refuses_what_cannot_change_live(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (broker, side, pool):
        config = broker.config
        cases = {
            "brokerName": update(flushIntervalCommitLog=900, brokerName="b"),
            "unknown key 'flushIntervalCommitlog'; did you mean 'flushIntervalCommitLog'": update(
                flushIntervalCommitlog=900
            ),
            "brokerIP2 is a RocketMQ setting trioha has no use for": update(brokerIP2="10.0.0.2"),
            "deleteWhen='4;25': '25' is not an hour of the day": update(deleteWhen="4;25"),
            "flushIntervalCommitLog='soon' is not valid": update(flushIntervalCommitLog="soon"),
            "flush_interval_commit_log must be positive": update(flushIntervalCommitLog=0),
        }
        for expected, request in cases.items():
            answer = await pool.request(side.broker_addr, request)
            assert answer.code == ResponseCode.SYSTEM_ERROR
            assert expected in (answer.remark or ""), answer.remark
        refused = await pool.request(side.broker_addr, update(brokerName="b"))
        assert (refused.remark or "").startswith(
            "updateBrokerConfig: brokerName cannot be changed while the broker runs; set it in "
            "the broker's config file and restart it (changed at run time: autoCreateTopicEnable,"
        )
        assert broker.config is config  # nothing changed, nothing written
        assert not (tmp_path / "config" / "broker.properties").exists()


async def test_auto_create_topic_turned_off_live(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (_broker, side, pool):
        off = await pool.request(side.broker_addr, update(autoCreateTopicEnable="false"))
        assert off.code == ResponseCode.SUCCESS
        refused = await send_message(pool, side.broker_addr, topic="Fresh", body=b"x", queue_id=0)
        assert refused.code == ResponseCode.TOPIC_NOT_EXIST


async def test_update_broker_config_that_cannot_be_written(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (broker, side, pool):
        broker.config_file = tmp_path / "missing-dir" / "file" / "broker.conf"
        (tmp_path / "missing-dir").write_text("a file where a directory should be")
        answer = await pool.request(side.broker_addr, update(flushIntervalCommitLog=700))
        assert answer.code == ResponseCode.SYSTEM_ERROR
        assert (answer.remark or "").startswith("flushIntervalCommitLog=700 in effect, but not ")
        assert "lost at the next restart" in (answer.remark or "")
        assert broker.config.flush_interval_commit_log == 700


# --- the pull pool's figures and retried messages ---------------------------------------------


async def test_a_held_pull_is_not_counted_as_queued(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (_broker, side, pool):
        await create_topic(pool, side, "T", 1)
        pull = RemotingCommand.request(
            RequestCode.PULL_MESSAGE,
            {
                "consumerGroup": "G",
                "topic": "T",
                "queueId": 0,
                "queueOffset": 0,
                "sysFlag": 2 | 4,  # suspend, subscription in the request
                "subscription": "*",
                "suspendTimeoutMillis": 30_000,
            },
        )
        async with trio.open_nursery() as nursery:
            answers: list[RemotingCommand] = []

            async def long_poll() -> None:
                answers.append(await pool.request(side.broker_addr, pull))

            nursery.start_soon(long_poll)
            with trio.fail_after(5):
                while ("T", 0) not in side.reput._arrivals:  # noqa: ASYNC110 - until it is held
                    await trio.sleep(0.01)
            info = await runtime_info(pool, side.broker_addr)
            assert info["pullThreadPoolQueueSize"] == "0"
            assert info["pullThreadPoolQueueHeadWaitTimeMills"] == "0"
            await send_message(pool, side.broker_addr, topic="T", body=b"wake", queue_id=0)
        assert answers[0].code == ResponseCode.SUCCESS
        assert side.processor.ctx.in_flight["pull"] == {}


async def test_a_retried_message_keeps_the_offset_message_id_as_its_origin(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (broker, side, pool):
        sent = await send_message(pool, side.broker_addr, topic="T", body=b"x", queue_id=0)
        first = next(broker.store.commitlog.iter_messages())
        back = await call(
            pool,
            side,
            RequestCode.CONSUMER_SEND_MSG_BACK,
            offset=first.physical_offset,
            group="G",
            delayLevel=0,
            originMsgId=first.get_property("UNIQ_KEY"),  # what the Java client sends
        )
        assert back.code == ResponseCode.SUCCESS
        retried = list(broker.store.commitlog.iter_messages())[-1]
        assert retried.get_property("ORIGIN_MESSAGE_ID") == first.msg_id == sent.msg_id
        # Sent back again: still the first delivery's id.
        again = await call(
            pool,
            side,
            RequestCode.CONSUMER_SEND_MSG_BACK,
            offset=retried.physical_offset,
            group="G",
            delayLevel=0,
        )
        assert again.code == ResponseCode.SUCCESS
        last = list(broker.store.commitlog.iter_messages())[-1]
        assert last.get_property("ORIGIN_MESSAGE_ID") == first.msg_id
        viewed = await call(
            pool, side, RequestCode.VIEW_MESSAGE_BY_ID, offset=int(first.msg_id[-16:], 16)
        )
        decoded = decode_record(viewed.body, 0)
        assert isinstance(decoded, DecodedMessage) and decoded.message.body == b"x"
