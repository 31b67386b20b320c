"""The name server (RouteInfoManager, DefaultRequestProcessor), one test per behaviour."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.test_broker import master_config
from trioha._config import NamesrvConfig
from trioha._errors import ConfigError
from trioha.broker import open_broker
from trioha.namesrv import REGISTRATION_PERIOD, NamesrvProcessor, check_idle_timeout, serve_namesrv
from trioha.namesrv._routes import BROKER_CHANNEL_EXPIRED_TIME, RouteInfoManager
from trioha.remoting import (
    RemotingCommand,
    RequestCode,
    ResponseCode,
    get_route,
    loads_lenient,
    open_client_pool,
    open_remoting_client,
    send_message,
)


def wrapper(counter: int, **topics: int) -> dict[str, Any]:
    return {
        "dataVersion": {"counter": counter, "timestamp": 1000},
        "topicConfigTable": {
            name: {"topicName": name, "readQueueNums": n, "writeQueueNums": n, "perm": 6}
            for name, n in topics.items()
        },
    }


def register(
    routes: RouteInfoManager, broker_id: int, addr: str, now: int = 0, **topics: int
) -> Any:
    return routes.register_broker(
        cluster="DefaultCluster",
        broker_addr=addr,
        broker_name="broker-a",
        broker_id=broker_id,
        ha_server_addr=addr.replace("10911", "10912"),
        topic_config=wrapper(1, **topics),
        channel=addr,
        now=now,
    )


def test_route_lists_master_and_slave_addresses() -> None:
    routes = RouteInfoManager()
    register(routes, 0, "m:10911", T=4)
    result = register(routes, 1, "s:10911", T=4)
    # RegisterBrokerResult for a slave: the master's HA address and broker address.
    assert (result.ha_server_addr, result.master_addr) == ("m:10912", "m:10911")
    route = routes.route("T")
    assert route == {
        "brokerDatas": [
            {
                "brokerAddrs": {"0": "m:10911", "1": "s:10911"},
                "brokerName": "broker-a",
                "cluster": "DefaultCluster",
            }
        ],
        "filterServerTable": {},
        "queueDatas": [
            {
                "brokerName": "broker-a",
                "perm": 6,
                "readQueueNums": 4,
                "topicSysFlag": 0,
                "writeQueueNums": 4,
            }
        ],
    }


def test_only_a_master_defines_topic_queues() -> None:
    routes = RouteInfoManager()
    register(routes, 1, "s:10911", T=4)
    assert routes.route("T") is None


def test_a_master_result_has_no_master_address() -> None:
    routes = RouteInfoManager()
    assert register(routes, 0, "m:10911", T=1).master_addr is None


def test_master_gone_leaves_the_slave_in_the_route() -> None:
    routes = RouteInfoManager()
    register(routes, 0, "m:10911", T=4)
    register(routes, 1, "s:10911", T=4)
    assert routes.on_channel_destroy("m:10911") == ["m:10911"]
    route = routes.route("T")
    assert route is not None
    assert route["brokerDatas"][0]["brokerAddrs"] == {"1": "s:10911"}
    assert route["queueDatas"][0]["readQueueNums"] == 4


def test_last_broker_gone_removes_the_topics() -> None:
    routes = RouteInfoManager()
    register(routes, 0, "m:10911", T=4)
    routes.unregister_broker(
        cluster="DefaultCluster", broker_addr="m:10911", broker_name="broker-a", broker_id=0
    )
    assert routes.route("T") is None
    assert routes.cluster_info() == {"brokerAddrTable": {}, "clusterAddrTable": {}}


def test_broker_not_reregistered_within_120_s_expires() -> None:
    routes = RouteInfoManager()
    register(routes, 0, "m:10911", now=0, T=4)
    register(routes, 1, "s:10911", now=60_000, T=4)
    assert routes.scan_not_active(BROKER_CHANNEL_EXPIRED_TIME) == []
    assert routes.scan_not_active(BROKER_CHANNEL_EXPIRED_TIME + 1) == ["m:10911"]
    register(routes, 1, "s:10911", now=150_000, T=4)  # the slave keeps re-registering
    assert routes.scan_not_active(200_000) == []
    route = routes.route("T")
    assert route is not None
    assert route["brokerDatas"][0]["brokerAddrs"] == {"1": "s:10911"}


def test_new_data_version_updates_queue_data() -> None:
    routes = RouteInfoManager()
    register(routes, 0, "m:10911", T=4)
    routes.register_broker(
        cluster="DefaultCluster",
        broker_addr="m:10911",
        broker_name="broker-a",
        broker_id=0,
        ha_server_addr="",
        topic_config=wrapper(2, T=8, U=1),
        channel=None,
        now=1,
    )
    assert routes.route("T")["queueDatas"][0]["writeQueueNums"] == 8  # type: ignore[index]
    assert routes.route("U") is not None
    assert routes.topic_list() == {"topicList": ["T", "U"]}


def test_slave_switched_to_master_replaces_its_old_id() -> None:
    routes = RouteInfoManager()
    register(routes, 1, "s:10911", T=4)
    register(routes, 0, "s:10911", T=4)
    assert routes.brokers["broker-a"].broker_addrs == {0: "s:10911"}


def register_request(broker_id: int, addr: str, **topics: int) -> RemotingCommand:
    body = json.dumps({"topicConfigSerializeWrapper": wrapper(1, **topics), "filterServerList": []})
    return RemotingCommand.request(
        RequestCode.REGISTER_BROKER,
        {
            "brokerName": "broker-a",
            "brokerAddr": addr,
            "clusterName": "DefaultCluster",
            "haServerAddr": addr + "-ha",
            "brokerId": broker_id,
            "compressed": "false",
        },
        body.encode(),
    )


async def test_name_server_over_tcp_and_connection_close_unregisters() -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(serve_namesrv, "127.0.0.1", 0)
            async with open_remoting_client(address) as client:
                async with open_remoting_client(address) as master:
                    reply = await master.request(register_request(0, "m:1", T=2))
                    assert reply.code == ResponseCode.SUCCESS
                    reply = await client.request(register_request(1, "s:1", T=2))
                    assert reply.ext_fields == {"haServerAddr": "m:1-ha", "masterAddr": "m:1"}
                    route = await client.request(
                        RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
                    )
                    assert route.code == ResponseCode.SUCCESS
                    assert loads_lenient(route.body)["brokerDatas"][0]["brokerAddrs"] == {
                        "0": "m:1",
                        "1": "s:1",
                    }
                # The master's connection closed: BrokerHousekeepingService drops it at once.
                with trio.fail_after(5):
                    while True:
                        route = await client.request(
                            RemotingCommand.request(
                                RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}
                            )
                        )
                        addrs = loads_lenient(route.body)["brokerDatas"][0]["brokerAddrs"]
                        if addrs == {"1": "s:1"}:
                            break
                        await trio.sleep(0.01)
                missing = await client.request(
                    RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "nope"})
                )
                assert missing.code == ResponseCode.TOPIC_NOT_EXIST
                assert missing.remark == "No topic route info in name server for the topic: nope"
                cluster = await client.request(
                    RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
                )
                assert loads_lenient(cluster.body)["clusterAddrTable"] == {
                    "DefaultCluster": ["broker-a"]
                }
                unknown = await client.request(RemotingCommand.request(9999))
                assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
            nursery.cancel_scope.cancel()


async def test_register_with_bad_crc_is_refused() -> None:
    processor = NamesrvProcessor()
    request = register_request(0, "m:1", T=1)
    bad = RemotingCommand.request(
        request.code, {**request.ext_fields, "bodyCrc32": "12345"}, request.body
    )
    reply = await processor.handle_request(bad, None)  # type: ignore[arg-type]
    assert reply is not None
    assert reply.code == ResponseCode.SYSTEM_ERROR
    assert "crc32 not match" in (reply.remark or "")
    assert processor.routes.route("T") is None


async def test_kv_config_round_trip() -> None:
    processor = NamesrvProcessor()

    async def call(code: int, **fields: str) -> RemotingCommand:
        reply = await processor.handle_request(
            RemotingCommand.request(code, fields),
            None,  # type: ignore[arg-type]
        )
        assert reply is not None
        return reply

    missing = await call(RequestCode.GET_KV_CONFIG, namespace="ORDER_TOPIC_CONFIG", key="T")
    assert missing.code == ResponseCode.QUERY_NOT_FOUND
    await call(RequestCode.PUT_KV_CONFIG, namespace="ORDER_TOPIC_CONFIG", key="T", value="a:4")
    found = await call(RequestCode.GET_KV_CONFIG, namespace="ORDER_TOPIC_CONFIG", key="T")
    assert found.ext_fields == {"value": "a:4"}
    register_reply = await processor.handle_request(register_request(0, "m:1", T=4), None)  # type: ignore[arg-type]
    assert register_reply is not None
    assert loads_lenient(register_reply.body) == {"table": {"T": "a:4"}}
    assert processor.routes.route("T")["orderTopicConf"] == "a:4"  # type: ignore[index]


@pytest.mark.parametrize("header_missing", ["brokerName", "brokerAddr", "clusterName"])
async def test_register_without_mandatory_field_names_it(header_missing: str) -> None:
    request = register_request(0, "m:1", T=1)
    fields = {k: v for k, v in request.ext_fields.items() if k != header_missing}
    processor = NamesrvProcessor()
    with pytest.raises(ValueError, match=f"<{header_missing}> is null"):
        await processor.handle_request(
            RemotingCommand.request(request.code, fields, request.body),
            None,  # type: ignore[arg-type]
        )


async def test_delete_topic_in_namesrv() -> None:
    """mqadmin deleteTopic: each master drops the topic (215), then each name server (216)."""
    processor = NamesrvProcessor()
    await processor.handle_request(register_request(0, "m:1", T=4, U=2), None)  # type: ignore[arg-type]
    reply = await processor.handle_request(
        RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "T"}),
        None,  # type: ignore[arg-type]
    )
    assert reply is not None and reply.code == ResponseCode.SUCCESS
    assert processor.routes.route("T") is None
    assert processor.routes.route("U") is not None


async def test_routes_carry_the_order_config_only_with_order_message_enable() -> None:
    """``DefaultRequestProcessor.getRouteInfoByTopic``: ``orderTopicConf`` only when
    ``orderMessageEnable`` (false by default)."""
    for enabled in (False, True):
        processor = NamesrvProcessor(order_message_enable=enabled)
        processor.routes.kv["ORDER_TOPIC_CONFIG"] = {"T": "broker-a:4"}
        await processor.handle_request(register_request(0, "m:1", T=4), None)  # type: ignore[arg-type]
        reply = await processor.handle_request(
            RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}),
            None,  # type: ignore[arg-type]
        )
        assert reply is not None and reply.code == ResponseCode.SUCCESS
        assert loads_lenient(reply.body).get("orderTopicConf") == (
            "broker-a:4" if enabled else None
        )


def test_an_idle_timeout_that_drops_brokers_between_registrations_is_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    for idle in (10, 29, 30):
        with pytest.raises(ConfigError, match="not above the brokers' registration period"):
            check_idle_timeout(
                NamesrvConfig(server_channel_max_idle_time_seconds=idle), REGISTRATION_PERIOD
            )
    check_idle_timeout(NamesrvConfig(server_channel_max_idle_time_seconds=45), 30)
    assert [r.getMessage() for r in caplog.records] == [
        "serverChannelMaxIdleTimeSeconds=45 on the name server leaves less than one "
        "registration period (30 s) of slack: a broker whose registration comes 15 s late "
        "loses its routes until the next one"
    ]
    caplog.clear()
    check_idle_timeout(NamesrvConfig(server_channel_max_idle_time_seconds=60), 30)
    check_idle_timeout(NamesrvConfig(), 60)  # 120 s: enough for a broker registering every 60 s
    assert caplog.records == []
    with pytest.raises(ConfigError, match="registration period \\(60 s\\)"):
        check_idle_timeout(NamesrvConfig(server_channel_max_idle_time_seconds=60), 60)


async def test_serve_namesrv_refuses_such_an_idle_timeout_before_listening() -> None:
    config = NamesrvConfig(server_channel_max_idle_time_seconds=20)
    async with trio.open_nursery() as nursery:
        with pytest.raises(ConfigError, match="serverChannelMaxIdleTimeSeconds=20"):
            await nursery.start(lambda task_status: serve_namesrv(config=config, port=0))


async def test_an_embedded_name_server_keeps_its_own_idle_timeout(tmp_path: Path) -> None:
    """The broker port closes idle clients after 1 s; its embedded name server keeps the name
    server default (120 s), so the broker's registration connection stays and its route with
    it (it used to be dropped between registrations)."""
    config = master_config(
        tmp_path,
        listen_port=0,
        embedded_namesrv=True,
        namesrv_addr="127.0.0.1:0",
        server_channel_max_idle_time_seconds=1,
    )
    async with open_broker(config) as broker, open_client_pool() as pool:
        side = broker.client_side
        assert side is not None and side.namesrv_addr is not None
        namesrv = f"{side.namesrv_addr[0]}:{side.namesrv_addr[1]}"
        await send_message(pool, side.broker_addr, topic="T", body=b"x", queue_id=0)
        await trio.sleep(3)  # three idle timeouts of the broker port
        assert side.connections.idle_closed >= 1  # the pool's connection to the broker port
        route = await get_route(pool, namesrv, "T")
        assert route.brokers[0].master == side.broker_addr


async def test_an_embedded_name_server_reads_its_own_file(tmp_path: Path) -> None:
    short = tmp_path / "short.properties"
    short.write_text("serverChannelMaxIdleTimeSeconds=30\n")
    elsewhere = tmp_path / "elsewhere.properties"
    elsewhere.write_text("listenPort=19876\n")
    good = tmp_path / "namesrv.properties"
    good.write_text("serverChannelMaxIdleTimeSeconds=300\nserverMaxConnections=77\n")
    for path, message in [
        (short, "serverChannelMaxIdleTimeSeconds=30 on the name server is not above"),
        (elsewhere, "listens on the first namesrvAddr entry"),
    ]:
        config = master_config(
            tmp_path / path.stem,
            listen_port=0,
            embedded_namesrv=True,
            namesrv_addr="127.0.0.1:0",
            embedded_namesrv_config=str(path),
        )
        with pytest.raises(BaseException) as info:  # noqa: PT011 - a group from the nursery
            async with open_broker(config):
                pass
        assert message in str(_leaf(info.value))
    config = master_config(
        tmp_path / "good",
        listen_port=0,
        embedded_namesrv=True,
        namesrv_addr="127.0.0.1:0",
        embedded_namesrv_config=str(good),
    )
    async with open_broker(config) as broker:
        assert broker.client_side is not None and broker.client_side.namesrv_addr is not None


def _leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


def perms(routes: RouteInfoManager, topic: str) -> dict[str, int]:
    route = routes.route(topic)
    assert route is not None
    return {q["brokerName"]: q["perm"] for q in route["queueDatas"]}


def register_master(
    routes: RouteInfoManager, name: str, counter: int, now: int = 0, **topics: int
) -> None:
    """A master named *name* registers with topic data version *counter*."""
    routes.register_broker(
        cluster="DefaultCluster",
        broker_addr=f"{name}:10911",
        broker_name=name,
        broker_id=0,
        ha_server_addr="",
        topic_config=wrapper(counter, **topics),
        channel=None,
        now=now,
    )


def test_wipe_and_add_write_perm_of_one_broker() -> None:
    """``mqadmin wipeWritePerm`` drains a broker: producers skip queues without the write bit."""
    routes = RouteInfoManager()
    register_master(routes, "broker-a", 1, T=4, U=2)
    register_master(routes, "broker-b", 1, T=4)
    assert routes.wipe_write_perm("broker-a") == 2
    assert perms(routes, "T") == {"broker-a": 4, "broker-b": 6}
    assert perms(routes, "U") == {"broker-a": 4}
    # A registration with the same data version leaves the wipe in place (RocketMQ rewrites
    # the queues only when the broker's topic table changed).
    register_master(routes, "broker-a", 1, now=1, T=4, U=2)
    assert perms(routes, "T")["broker-a"] == 4
    assert routes.wipe_write_perm("nobody") == 0
    assert routes.add_write_perm("broker-a") == 2
    assert perms(routes, "T") == {"broker-a": 6, "broker-b": 6}
    routes.wipe_write_perm("broker-a")
    register_master(routes, "broker-a", 2, now=2, T=4, U=2)
    assert perms(routes, "U") == {"broker-a": 6}  # a new topic table rewrites them


async def test_write_perm_and_config_codes_over_tcp() -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            # A processor of its own, as `trioha namesrv` passes: the server fills in its settings.
            address = await nursery.start(
                partial(serve_namesrv, "127.0.0.1", 0, processor=NamesrvProcessor())
            )
            async with open_remoting_client(address) as client:

                async def call(code: int, body: bytes = b"", **fields: str) -> RemotingCommand:
                    return await client.request(RemotingCommand.request(code, fields, body))

                await client.request(register_request(0, "m:1", T=2, U=1))
                wiped = await call(RequestCode.WIPE_WRITE_PERM_OF_BROKER, brokerName="broker-a")
                assert (wiped.code, wiped.ext_fields) == (
                    ResponseCode.SUCCESS,
                    {"wipeTopicCount": "2"},
                )
                route = loads_lenient(
                    (await call(RequestCode.GET_ROUTEINFO_BY_TOPIC, topic="T")).body
                )
                assert route["queueDatas"][0]["perm"] == 4
                added = await call(RequestCode.ADD_WRITE_PERM_OF_BROKER, brokerName="broker-a")
                assert (added.code, added.ext_fields) == (
                    ResponseCode.SUCCESS,
                    {"addTopicCount": "2"},
                )
                config = await call(RequestCode.GET_NAMESRV_CONFIG)
                assert config.code == ResponseCode.SUCCESS
                lines = dict(line.split("=", 1) for line in config.body.decode().splitlines())
                # The settings it runs with (a NamesrvConfig's), the address as bound.
                assert lines["listenHost"] == "127.0.0.1"
                assert lines["listenPort"] == str(address[1])
                assert lines["serverChannelMaxIdleTimeSeconds"] == "120"
                assert lines["orderMessageEnable"] == "false"
                path = await call(RequestCode.UPDATE_NAMESRV_CONFIG, b"kvConfigPath=/tmp/x\n")
                assert (path.code, path.remark) == (
                    ResponseCode.NO_PERMISSION,
                    "Can not update config path",
                )
                other = await call(RequestCode.UPDATE_NAMESRV_CONFIG, b"listenPort=1\n")
                assert other.code == ResponseCode.SYSTEM_ERROR
                assert (other.remark or "").startswith("updateNamesrvConfig: listenPort cannot be")
                empty = await call(RequestCode.UPDATE_NAMESRV_CONFIG)
                assert empty.code == ResponseCode.SUCCESS
            nursery.cancel_scope.cancel()
