"""The broker port's processors, driven by trioha's own client over TCP on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.broker.fakes import FakeBroker, open_fake_broker
from trioha._config import BrokerConfig
from trioha._errors import RemotingError
from trioha.broker._batch import BatchItem, encode_batch
from trioha.broker._clientside import ClientSide, serve_client_side
from trioha.remoting import (
    NoBursts,
    RemotingClientPool,
    RemotingCommand,
    RemotingConnection,
    RequestCode,
    ResponseCode,
    get_route,
    loads_lenient,
    open_client_pool,
    open_remoting_client,
    pull_message,
    query_consumer_offset,
    runtime_info,
    send_message,
    update_consumer_offset,
)
from trioha.store import DecodedMessage, decode_record

#: SEND_MESSAGE_V2's header as a Java producer sends it (SendMessageRequestHeaderV2).
FULL_V2 = {"a": "PG", "b": "T", "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 1, "h": 0}
#: SEND_MESSAGE's header as the C++ client sends it (SendMessageRequestHeader).
FULL_V1 = {
    "producerGroup": "PG",
    "topic": "T",
    "defaultTopic": "TBW102",
    "defaultTopicQueueNums": 4,
    "queueId": 0,
    "sysFlag": 0,
    "bornTimestamp": 1,
    "flag": 0,
}


#: Sends lacking a required header field, and how the refusal names the first one missing.
MISSING_REQUIRED: list[tuple[int, dict[str, object], str]] = [
    (RequestCode.SEND_MESSAGE, {"topic": "T"}, "<producerGroup>"),
    (RequestCode.SEND_MESSAGE, {k: v for k, v in FULL_V1.items() if k != "flag"}, "<flag>"),
    (RequestCode.SEND_MESSAGE_V2, {"b": "T"}, "<a> (producerGroup)"),
    (
        RequestCode.SEND_MESSAGE_V2,
        {k: v for k, v in FULL_V2.items() if k != "g"},
        "<g> (bornTimestamp)",
    ),
    (RequestCode.SEND_BATCH_MESSAGE, {"b": "T", "e": 0}, "<a> (producerGroup)"),
    (RequestCode.SEND_BATCH_MESSAGE, {"topic": "T"}, "<producerGroup>"),  # long header
]


@asynccontextmanager
async def broker_port(
    root: Path, **overrides: Any
) -> AsyncIterator[tuple[FakeBroker, ClientSide, RemotingClientPool]]:
    config = BrokerConfig(
        store_path_root_dir=str(root),
        listen_port=0,
        mapped_file_size_commit_log=1 << 20,
        **overrides,
    )
    with trio.fail_after(30):
        async with (
            open_fake_broker(root, config) as broker,
            open_client_pool() as pool,
            trio.open_nursery() as nursery,
        ):
            side: ClientSide = await nursery.start(serve_client_side, broker)
            yield broker, side, pool
            nursery.cancel_scope.cancel()


async def call(
    pool: RemotingClientPool, side: ClientSide, code: int, **fields: Any
) -> RemotingCommand:
    return await pool.request(side.broker_addr, RemotingCommand.request(code, fields))


async def test_send_then_pull_in_stored_format(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (broker, side, pool):
        results = [
            await send_message(
                pool,
                side.broker_addr,
                topic="T",
                body=b"hello %d" % i,
                queue_id=1,
                tags="A" if i % 2 else "B",
                keys=f"k{i}",
            )
            for i in range(5)
        ]
        assert [r.status for r in results] == ["SEND_OK"] * 5
        assert [r.queue_offset for r in results] == [0, 1, 2, 3, 4]
        assert results[0].msg_id == broker.store.commitlog.iter_messages().__next__().msg_id
        await side.reput.wait_dispatched(broker.store.commitlog.max_offset)
        pulled = await pull_message(
            pool, side.broker_addr, group="G", topic="T", queue_id=1, offset=0
        )
        assert pulled.code == ResponseCode.SUCCESS
        assert [m.body for m in pulled.messages] == [b"hello %d" % i for i in range(5)]
        assert [m.queue_offset for m in pulled.messages] == [0, 1, 2, 3, 4]
        assert pulled.messages[1].keys == "k1"
        assert pulled.messages[0].get_property("CLUSTER") == "DefaultCluster"
        assert pulled.messages[0].get_property("WAIT") is None  # not stored (RocketMQ #2883)
        assert (pulled.next_begin_offset, pulled.min_offset, pulled.max_offset) == (5, 0, 5)
        tagged = await pull_message(
            pool, side.broker_addr, group="G", topic="T", queue_id=1, offset=0, subscription="A"
        )
        assert [m.body for m in tagged.messages] == [b"hello 1", b"hello 3"]


async def test_pull_statuses(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (broker, side, pool):
        await send_message(pool, side.broker_addr, topic="T", body=b"x", queue_id=0, tags="A")
        await side.reput.wait_dispatched(broker.store.commitlog.max_offset)

        async def pull(offset: int, **kw: Any) -> Any:
            return await pull_message(
                pool, side.broker_addr, group="G", topic="T", queue_id=0, offset=offset, **kw
            )

        at_end = await pull(1)
        assert (at_end.code, at_end.remark, at_end.next_begin_offset) == (
            ResponseCode.PULL_NOT_FOUND,
            "OFFSET_OVERFLOW_ONE",
            1,
        )
        beyond = await pull(9)
        assert (beyond.code, beyond.remark, beyond.next_begin_offset) == (
            ResponseCode.PULL_OFFSET_MOVED,
            "OFFSET_OVERFLOW_BADLY",
            0,
        )
        unmatched = await pull(0, subscription="B")
        assert (unmatched.code, unmatched.next_begin_offset) == (
            ResponseCode.PULL_RETRY_IMMEDIATELY,
            1,
        )
        empty_queue = await pull_message(
            pool, side.broker_addr, group="G", topic="T", queue_id=3, offset=0
        )
        assert empty_queue.code == ResponseCode.PULL_NOT_FOUND
        missing = await pull_message(
            pool, side.broker_addr, group="G", topic="NOPE", queue_id=0, offset=0
        )
        assert (missing.code, missing.remark) == (
            ResponseCode.TOPIC_NOT_EXIST,
            "topic[NOPE] not exist, apply first please!",
        )
        bad_queue = await pull_message(
            pool, side.broker_addr, group="G", topic="T", queue_id=99, offset=0
        )
        assert bad_queue.code == ResponseCode.SYSTEM_ERROR
        # Long polling: a held pull is answered by the message that arrives meanwhile.
        async with trio.open_nursery() as nursery:
            held: list[Any] = []

            async def long_poll() -> None:
                held.append(await pull(1, suspend_ms=10_000))

            nursery.start_soon(long_poll)
            await trio.sleep(0.2)
            assert held == []
            await send_message(pool, side.broker_addr, topic="T", body=b"late", queue_id=0)
        assert [m.body for m in held[0].messages] == [b"late"]
        # ... and an empty one times out with PULL_NOT_FOUND.
        with trio.fail_after(5):
            timed_out = await pull(2, suspend_ms=200)
        assert timed_out.code == ResponseCode.PULL_NOT_FOUND


async def test_no_auto_create_means_topic_not_exist(tmp_path: Path) -> None:
    async with broker_port(tmp_path, auto_create_topic_enable=False) as (_b, side, pool):
        result = await send_message(pool, side.broker_addr, topic="T", body=b"x", queue_id=0)
        assert (result.code, result.remark) == (
            ResponseCode.TOPIC_NOT_EXIST,
            "topic[T] not exist, apply first please!",
        )
        created = await call(
            pool,
            side,
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            topic="T",
            readQueueNums=2,
            writeQueueNums=2,
            perm=6,
        )
        assert created.code == ResponseCode.SUCCESS
        again = await send_message(pool, side.broker_addr, topic="T", body=b"x", queue_id=1)
        assert again.status == "SEND_OK"
        illegal = await send_message(pool, side.broker_addr, topic="T", body=b"x", queue_id=5)
        assert illegal.code == ResponseCode.SYSTEM_ERROR
        bad_name = await send_message(pool, side.broker_addr, topic="a b", body=b"x", queue_id=0)
        assert "illegal characters" in (bad_name.remark or "")


async def test_slave_refuses_writes_and_serves_reads(tmp_path: Path) -> None:
    async with broker_port(tmp_path / "m") as (master, mside, mpool):
        for i in range(3):
            await send_message(mpool, mside.broker_addr, topic="T", body=b"%d" % i, queue_id=0)
        async with broker_port(tmp_path / "s", broker_role="SLAVE") as (slave, side, pool):
            refused = await send_message(pool, side.broker_addr, topic="T", body=b"x", queue_id=0)
            assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE
            assert "messages are put to the slave" in (refused.remark or "")
            assert side.meta.topics.select("T") is None  # nothing auto-created on a slave
            # The slave has the topic from its master (metadata sync) and the bytes (HA).
            assert side.slave_sync is not None
            side.slave_sync.master_addr = mside.broker_addr
            assert await side.slave_sync.sync_all()
            slave.copy_from(master)
            await side.reput.wait_dispatched(slave.store.commitlog.max_offset)
            pulled = await pull_message(
                pool, side.broker_addr, group="G", topic="T", queue_id=0, offset=0
            )
            assert [m.body for m in pulled.messages] == [b"0", b"1", b"2"]
            # A slave does not correct offsets: it may just be behind its master.
            ahead = await pull_message(
                pool, side.broker_addr, group="G", topic="T", queue_id=0, offset=7
            )
            assert (ahead.code, ahead.next_begin_offset) == (ResponseCode.PULL_RETRY_IMMEDIATELY, 7)


async def test_consumer_offsets_query_update_and_file(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (_broker, side, pool):
        addr = side.broker_addr
        await send_message(pool, addr, topic="T", body=b"x", queue_id=0)
        # A new group on a queue that starts at 0 starts at 0 (ConsumerManageProcessor).
        assert await query_consumer_offset(pool, addr, group="G", topic="T", queue_id=0) == 0
        await update_consumer_offset(pool, addr, group="G", topic="T", queue_id=0, offset=1)
        assert await query_consumer_offset(pool, addr, group="G", topic="T", queue_id=0) == 1
    saved = json.loads((tmp_path / "config" / "consumerOffset.json").read_text())
    assert saved == {"offsetTable": {"T@G": {"0": 1}}}


class Recorder(NoBursts):
    def __init__(self) -> None:
        self.requests: list[RemotingCommand] = []
        self.arrived = trio.Event()

    async def handle_request(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand | None:
        self.requests.append(request)
        self.arrived.set()
        return None


def heartbeat(client_id: str, group: str) -> RemotingCommand:
    body = {
        "clientID": client_id,
        "consumerDataSet": [
            {
                "groupName": group,
                "consumeType": 1,
                "messageModel": 1,
                "consumeFromWhere": 0,
                "subscriptionDataSet": [{"topic": "T", "subString": "A || B", "subVersion": "5"}],
            }
        ],
        "producerDataSet": [],
    }
    return RemotingCommand.request(RequestCode.HEART_BEAT, body=json.dumps(body).encode())


async def test_heartbeats_membership_and_notification(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (_broker, side, _pool):
        first_seen = Recorder()
        async with (
            open_remoting_client(side.broker_addr, handler=first_seen) as first,
            open_remoting_client(side.broker_addr) as second,
        ):
            assert (await first.request(heartbeat("c1", "G"))).code == ResponseCode.SUCCESS
            assert (await second.request(heartbeat("c2", "G"))).code == ResponseCode.SUCCESS
            listing = await first.request(
                RemotingCommand.request(
                    RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"}
                )
            )
            assert sorted(loads_lenient(listing.body)["consumerIdList"]) == ["c1", "c2"]
            with trio.fail_after(5):
                await first_seen.arrived.wait()
            notice = first_seen.requests[0]
            assert notice.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
            assert notice.is_oneway
            assert notice.ext_fields == {"consumerGroup": "G"}
            # The heartbeat made the retry topic and the subscription group (ClientManageProcessor).
            assert side.meta.topics.select("%RETRY%G") is not None
            assert "G" in side.meta.groups.table
            sub = side.processor.clients.find_subscription("G", "T")
            assert sub is not None
            assert sub.tags == frozenset({"A", "B"})
        # Both connections closed: the group is empty.
        with trio.fail_after(5):
            # The broker notices the closes in its own tasks; poll (bounded) for the effect.
            while side.processor.clients.consumer_ids("G"):  # noqa: ASYNC110
                await trio.sleep(0.01)


async def test_admin_reads_and_runtime_info(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (broker, side, pool):
        await send_message(pool, side.broker_addr, topic="T", body=b"x", queue_id=0)
        await update_consumer_offset(
            pool, side.broker_addr, group="G", topic="T", queue_id=0, offset=1
        )
        topics = loads_lenient((await call(pool, side, RequestCode.GET_ALL_TOPIC_CONFIG)).body)
        assert set(topics["topicConfigTable"]) >= {"T", "TBW102"}
        offsets = loads_lenient((await call(pool, side, RequestCode.GET_ALL_CONSUMER_OFFSET)).body)
        assert offsets == {"offsetTable": {"T@G": {"0": 1}}}
        delay = loads_lenient((await call(pool, side, RequestCode.GET_ALL_DELAY_OFFSET)).body)
        assert delay == {"offsetTable": {}}
        groups = loads_lenient(
            (await call(pool, side, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)).body
        )
        assert "dataVersion" in groups
        info = await runtime_info(pool, side.broker_addr)
        assert info["brokerRole"] == "ASYNC_MASTER"
        assert info["commitLogMaxOffset"] == str(broker.store.commitlog.max_offset)
        assert info["stats.puts"] == "1"
        unknown = await call(pool, side, 9999)
        assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


async def test_queue_offsets_timestamps_and_view(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (broker, side, pool):
        for i in range(4):
            await send_message(pool, side.broker_addr, topic="T", body=b"%d" % i, queue_id=2)
        await side.reput.wait_dispatched(broker.store.commitlog.max_offset)
        maximum = await call(pool, side, RequestCode.GET_MAX_OFFSET, topic="T", queueId=2)
        minimum = await call(pool, side, RequestCode.GET_MIN_OFFSET, topic="T", queueId=2)
        assert (maximum.int_field("offset"), minimum.int_field("offset")) == (4, 0)
        messages = list(broker.store.commitlog.iter_messages())
        earliest = await call(
            pool, side, RequestCode.GET_EARLIEST_MSG_STORETIME, topic="T", queueId=2
        )
        assert earliest.int_field("timestamp") == messages[0].store_timestamp
        search = await call(
            pool,
            side,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
            topic="T",
            queueId=2,
            timestamp=messages[0].store_timestamp + 10**6,
        )
        assert search.int_field("offset") == 4
        view = await call(
            pool, side, RequestCode.VIEW_MESSAGE_BY_ID, offset=messages[2].physical_offset
        )
        assert view.body == messages[2].encode()


async def test_a_unit_whose_message_is_not_in_the_log_is_never_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``DefaultMessageStore.getMessage`` skips a unit it cannot select; here also one whose
    record does not name the unit's offset, queue and queue offset (a unit left pointing at
    a message the log lost): the consumer gets MESSAGE_WAS_REMOVING and moves past it, and
    the broker says so once per queue. A read by offset of something that is no message
    finds nothing."""
    async with broker_port(tmp_path) as (broker, side, pool):
        for i in range(3):
            await send_message(pool, side.broker_addr, topic="T", body=b"q0-%d" % i, queue_id=0)
        await send_message(pool, side.broker_addr, topic="T", body=b"q1", queue_id=1)
        await side.reput.wait_dispatched(broker.store.commitlog.max_offset)
        messages = list(broker.store.commitlog.iter_messages())
        other, inside = messages[3], messages[1]
        queue = side.reput.queues.get("T", 0)
        assert queue is not None
        # Units 3..5: another queue's message, the middle of a record, past the log's end.
        queue.put(3, other.physical_offset, other.total_size, 0)
        queue.put(4, inside.physical_offset + 8, inside.total_size, 0)
        queue.put(5, broker.store.commitlog.max_offset - 4, inside.total_size, 0)

        async def pull(offset: int) -> Any:
            return await pull_message(
                pool, side.broker_addr, group="G", topic="T", queue_id=0, offset=offset
            )

        first = await pull(0)
        assert [m.body for m in first.messages] == [b"q0-0", b"q0-1", b"q0-2"]
        assert first.next_begin_offset == 6  # past the units skipped
        rest = await pull(3)
        assert (rest.code, rest.remark, rest.next_begin_offset, rest.messages) == (
            ResponseCode.PULL_RETRY_IMMEDIATELY,
            "MESSAGE_WAS_REMOVING",
            6,
            (),
        )
        await pull(4)
        view = await call(
            pool, side, RequestCode.VIEW_MESSAGE_BY_ID, offset=inside.physical_offset + 8
        )
        assert view.code == ResponseCode.SYSTEM_ERROR
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [
        f"consume queue T/0: unit 3 points at commit log offset {other.physical_offset} "
        f"({other.total_size} bytes), which holds no such message; skipped (as are any others "
        "of this queue, logged once)"
    ]


async def test_batch_code_and_send_back(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (broker, side, pool):
        body = encode_batch([BatchItem(0, b"b%d" % i, "TAGS\x01X") for i in range(3)])
        response = await pool.request(
            side.broker_addr,
            RemotingCommand.request(
                RequestCode.SEND_BATCH_MESSAGE,
                {**FULL_V2, "i": ""},
                body,
            ),
        )
        assert (response.code, response.int_field("queueOffset")) == (ResponseCode.SUCCESS, 0)
        assert broker.puts == 3
        bad = await pool.request(
            side.broker_addr,
            RemotingCommand.request(
                RequestCode.SEND_BATCH_MESSAGE,
                FULL_V2,
                b"\x00\x00",
            ),
        )
        assert bad.code == ResponseCode.MESSAGE_ILLEGAL
        first = next(broker.store.commitlog.iter_messages())
        back = await call(
            pool,
            side,
            RequestCode.CONSUMER_SEND_MSG_BACK,
            offset=first.physical_offset,
            group="G",
            delayLevel=0,
        )
        assert back.code == ResponseCode.SUCCESS
        retried = list(broker.store.commitlog.iter_messages())[-1]
        # Parked at delay level 3 (3 + reconsume times) until due, then to %RETRY%G.
        assert (retried.topic, retried.queue_id) == ("SCHEDULE_TOPIC_XXXX", 2)
        assert (retried.body, retried.reconsume_times) == (b"b0", 1)
        assert retried.get_property("REAL_TOPIC") == "%RETRY%G"
        assert retried.get_property("DELAY") == "3"
        assert retried.get_property("RETRY_TOPIC") == "T"


async def test_hostile_client_does_not_hurt_the_broker(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (_broker, side, pool):
        host, port = side.broker_addr.rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        await stream.send_all(struct.pack(">ii", 2**31 - 1, 0))
        assert await stream.receive_some(10) == b""
        await stream.aclose()
        ok = await send_message(pool, side.broker_addr, topic="T", body=b"x", queue_id=0)
        assert ok.status == "SEND_OK"
        garbage = await pool.request(
            side.broker_addr, RemotingCommand.request(RequestCode.HEART_BEAT, body=b"{not json")
        )
        assert garbage.code == ResponseCode.SYSTEM_ERROR
        missing = await call(pool, side, RequestCode.QUERY_CONSUMER_OFFSET, topic="T")
        assert (missing.code, missing.remark) == (
            ResponseCode.SYSTEM_ERROR,
            "the custom field <consumerGroup> is null",
        )


async def test_a_send_without_a_required_header_field_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    """SendMessageRequestHeader's @CFNotNull fields: a 4.9.7 broker fails such a send with
    SYSTEM_ERROR (a NullPointerException after the decoder logged the field); trioha answers
    the same code and names the field. Nothing is stored, no topic created."""
    async with broker_port(tmp_path) as (broker, side, pool):
        for code, fields, named in MISSING_REQUIRED:
            response = await pool.request(
                side.broker_addr, RemotingCommand.request(code, fields, b"x")
            )
            assert (response.code, response.remark) == (
                ResponseCode.SYSTEM_ERROR,
                f"the custom field {named} is null",
            )
        assert broker.puts == 0
        assert side.meta.topics.select("T") is None
        for code, fields in [
            (RequestCode.SEND_MESSAGE, FULL_V1),
            (RequestCode.SEND_MESSAGE_V2, FULL_V2),
        ]:
            ok = await pool.request(side.broker_addr, RemotingCommand.request(code, fields, b"x"))
            assert ok.code == ResponseCode.SUCCESS
        assert broker.puts == 2


async def test_a_body_above_max_message_size_is_refused_naming_the_limit(
    tmp_path: Path,
) -> None:
    async with broker_port(tmp_path, max_message_size=1000) as (broker, side, pool):
        single = await send_message(pool, side.broker_addr, topic="T", body=b"x" * 1001, queue_id=0)
        assert (single.code, single.remark) == (
            ResponseCode.MESSAGE_ILLEGAL,
            "the message is illegal: its body is 1001 bytes, more than maxMessageSize 1000 bytes",
        )
        batch = encode_batch([BatchItem(0, b"x" * 1001, "")])
        refused = await pool.request(
            side.broker_addr,
            RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, {**FULL_V2, "i": ""}, batch),
        )
        assert refused.code == ResponseCode.MESSAGE_ILLEGAL
        assert "msg body length limit 1000 bytes (maxMessageSize)" in (refused.remark or "")
        assert "128k" not in (refused.remark or "")
        assert broker.puts == 0
        fits = await send_message(pool, side.broker_addr, topic="T", body=b"x" * 1000, queue_id=0)
        assert fits.status == "SEND_OK"


async def test_registration_and_route(tmp_path: Path) -> None:
    async with broker_port(
        tmp_path,
        namesrv_addr="127.0.0.1:0",
        embedded_namesrv=True,
        register_name_server_period=10_000,
    ) as (_broker, side, pool):
        assert side.namesrv_addr is not None
        namesrv = f"{side.namesrv_addr[0]}:{side.namesrv_addr[1]}"
        before = await pool.request(
            namesrv, RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "NEW"})
        )
        assert before.code == ResponseCode.TOPIC_NOT_EXIST
        await send_message(pool, side.broker_addr, topic="NEW", body=b"x", queue_id=0)
        with trio.fail_after(5):  # auto-creation re-registers at once
            while True:
                try:
                    route = await get_route(pool, namesrv, "NEW")
                    break
                except RemotingError:
                    await trio.sleep(0.01)
        assert route.brokers[0].master == side.broker_addr
        assert route.brokers[0].write_queue_nums == 4


async def test_retry_topic_send_past_max_goes_to_dead_letters(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (broker, side, pool):
        response = await pool.request(
            side.broker_addr,
            RemotingCommand.request(
                RequestCode.SEND_MESSAGE_V2,
                {**FULL_V2, "b": "%RETRY%G", "i": "", "j": 16, "l": 16},
                b"dead",
            ),
        )
        assert response.code == ResponseCode.SUCCESS
        stored = list(broker.store.commitlog.iter_messages())[-1]
        assert (stored.topic, stored.body) == ("%DLQ%G", b"dead")
        too_big = await send_message(
            pool, side.broker_addr, topic="T", body=b"x" * (4 * 1024 * 1024 + 1), queue_id=0
        )
        assert too_big.code == ResponseCode.MESSAGE_ILLEGAL
        assert too_big.remark == (
            "the message is illegal: its body is 4194305 bytes, more than maxMessageSize "
            "4194304 bytes"
        )


async def test_pull_with_the_heartbeat_subscription(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (broker, side, pool):
        for tags in ("A", "C", "B"):
            await send_message(
                pool, side.broker_addr, topic="T", body=tags.encode(), queue_id=0, tags=tags
            )
        await side.reput.wait_dispatched(broker.store.commitlog.max_offset)
        pull = RemotingCommand.request(
            RequestCode.PULL_MESSAGE,
            {"consumerGroup": "G", "topic": "T", "queueId": 0, "queueOffset": 0, "sysFlag": 0},
        )
        async with open_remoting_client(side.broker_addr) as client:
            unknown = await client.request(pull)
            assert unknown.code == ResponseCode.SUBSCRIPTION_NOT_EXIST
            await client.request(heartbeat("c1", "G"))  # subscribes T with "A || B"
            found = await client.request(pull)
            assert found.code == ResponseCode.SUCCESS
            assert found.int_field("nextBeginOffset") == 3
            found_tags: list[str | None] = []
            pos = 0
            while pos < len(found.body):
                decoded = decode_record(found.body, pos)
                assert isinstance(decoded, DecodedMessage)
                found_tags.append(decoded.message.tags)
                pos += decoded.size
            assert found_tags == ["A", "B"]  # C was filtered out by its tag hash
            gone = await client.request(
                RemotingCommand.request(
                    RequestCode.UNREGISTER_CLIENT, {"clientID": "c1", "consumerGroup": "G"}
                )
            )
            assert gone.code == ResponseCode.SUCCESS
            assert side.processor.clients.consumer_ids("G") == []


async def test_orderly_queue_locks(tmp_path: Path) -> None:
    async with broker_port(tmp_path) as (_broker, side, pool):
        queues = [{"topic": "T", "brokerName": "broker-a", "queueId": q} for q in range(3)]

        async def lock(client: str, code: int = RequestCode.LOCK_BATCH_MQ) -> list[int]:
            body = json.dumps({"consumerGroup": "G", "clientId": client, "mqSet": queues})
            response = await pool.request(
                side.broker_addr, RemotingCommand.request(code, body=body.encode())
            )
            assert response.code == ResponseCode.SUCCESS
            if code != RequestCode.LOCK_BATCH_MQ:
                return []
            return [mq["queueId"] for mq in loads_lenient(response.body)["lockOKMQSet"]]

        assert await lock("c1") == [0, 1, 2]
        assert await lock("c2") == []  # held by c1
        assert await lock("c1") == [0, 1, 2]  # renewed
        await lock("c1", RequestCode.UNLOCK_BATCH_MQ)
        assert await lock("c2") == [0, 1, 2]
