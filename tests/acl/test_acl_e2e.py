"""The ACL end to end: the official client against an ACL-enabled SYNC_MASTER + slave.

A name server with the ACL on, a master and a slave (``open_broker``) that sign their own
registration and metadata sync with the ``brokerAdmin`` account, all on 127.0.0.1 with
OS-chosen ports; the official C++ client in a subprocess (``tests/broker/official_client.py``)
with ``set_session_credentials``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.broker.test_official_client import official
from trioha._config import BrokerConfig
from trioha.acl import PlainAcl, RequestSigner
from trioha.broker import Broker, open_broker
from trioha.broker._clientside import ClientSide
from trioha.namesrv import NamesrvProcessor, serve_namesrv
from trioha.remoting import (
    RemotingCommand,
    RequestCode,
    ResponseCode,
    dumps_bytes,
    open_client_pool,
)

ACL = """
accounts:
  - accessKey: brokerAdmin
    secretKey: brokerSecret1
    admin: true
  - accessKey: RocketMQ
    secretKey: "12345678"
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - AclTopic=PUB|SUB
    groupPerms:
      - AclGroup=SUB
  - accessKey: readOnly1
    secretKey: readOnly1secret
    topicPerms:
      - AclTopic=SUB
"""

needs_client = pytest.mark.skipif(
    importlib.util.find_spec("rocketmq") is None,
    reason="the official client (pip install rocketmq) is not installed",
)


async def start_namesrv(nursery: trio.Nursery, acl_file: Path, processor: NamesrvProcessor) -> str:
    """A name server with the ACL of *acl_file* on a free port; its address."""
    host, port = await nursery.start(
        lambda task_status: serve_namesrv(
            "127.0.0.1",
            0,
            processor=processor,
            acl=PlainAcl.load(acl_file),
            task_status=task_status,
        )
    )
    return f"{host}:{port}"


@asynccontextmanager
async def running(config: BrokerConfig) -> AsyncIterator[tuple[Broker, ClientSide]]:
    async with open_broker(config) as broker:
        assert broker.client_side is not None
        yield broker, broker.client_side


@asynccontextmanager
async def acl_cluster(
    tmp_path: Path,
) -> AsyncIterator[tuple[str, NamesrvProcessor, Broker, ClientSide, Broker, ClientSide]]:
    acl_file = tmp_path / "conf" / "plain_acl.yml"
    acl_file.parent.mkdir()
    acl_file.write_text(ACL)
    processor = NamesrvProcessor()
    async with trio.open_nursery() as outer:
        namesrv = await start_namesrv(outer, acl_file, processor)
        common: dict[str, Any] = {
            "namesrv_addr": namesrv,
            "mapped_file_size_commit_log": 1 << 20,
            "listen_port": 0,
            "acl_enable": True,
            "acl_file": str(acl_file),
            "acl_access_key": "brokerAdmin",
        }
        master_config = BrokerConfig(
            store_path_root_dir=str(tmp_path / "master"),
            broker_role="SYNC_MASTER",
            ha_listen_port=0,
            **common,
        )
        async with running(master_config) as (master, master_side):
            assert master.ha_address is not None
            slave_config = BrokerConfig(
                store_path_root_dir=str(tmp_path / "slave"),
                broker_role="SLAVE",
                ha_master_address=f"127.0.0.1:{master.ha_address[1]}",
                **common,
            )
            async with running(slave_config) as (slave, slave_side):
                assert master.ha_service is not None
                with trio.fail_after(10):
                    assert await master.ha_service.wait_connections(1)
                yield namesrv, processor, master, master_side, slave, slave_side
        outer.cancel_scope.cancel()


@needs_client
@pytest.mark.slow
async def test_official_client_with_credentials_against_sync_master_and_slave(
    tmp_path: Path,
) -> None:
    async with acl_cluster(tmp_path) as (namesrv, processor, master, side, slave, slave_side):
        # Both brokers registered, signed with their admin account.
        assert side.registrar is not None and side.registrar.registrations >= 1
        assert slave_side.registrar is not None and slave_side.registrar.registrations >= 1
        assert len(processor.routes.live) == 2

        good = ("RocketMQ", "12345678")
        sent = await official(
            tmp_path, "produce", namesrv, "AclTopic", "20", "ok", credentials=good
        )
        assert sent["errors"] == [] and sent["statuses"] == ["OK"] * 20
        # SEND_OK from a SYNC_MASTER: the slave holds every message.
        assert slave.store.commitlog.max_offset >= master.store.commitlog.max_offset > 0
        got = await official(
            tmp_path, "push", namesrv, "AclTopic", "AclGroup", "20", "30", credentials=good
        )
        assert sorted(set(got["bodies"])) == sorted(f"ok-{i}" for i in range(20))

        # The slave's metadata sync is signed: it got the master's topic and offsets.
        assert slave_side.slave_sync is not None
        with trio.fail_after(20):
            while not await slave_side.slave_sync.sync_all():  # noqa: ASYNC110
                await trio.sleep(0.2)
        assert "AclTopic" in slave_side.meta.topics.wrapper()["topicConfigTable"]

        assert side.guard is not None
        puts = master.statistics().puts
        cases = [
            # (credentials, refused by the broker itself): a wrong secret and no credentials
            # are refused by the name server already (the route lookup); the account without
            # PUB gets its route (reads need any valid signature) and the broker refuses it.
            (("RocketMQ", "wrong-secret"), False),
            (("readOnly1", "readOnly1secret"), True),
            (None, False),
        ]
        for creds, by_broker in cases:
            refused = side.guard.denied
            bad = await official(
                tmp_path, "produce", namesrv, "AclTopic", "1", "bad", credentials=creds
            )
            assert bad["statuses"] == [] and len(bad["errors"]) == 1, creds
            assert (side.guard.denied > refused) is by_broker, creds
        assert master.statistics().puts == puts  # nothing stored


async def test_unsigned_registration_and_kv_writes_are_refused(tmp_path: Path) -> None:
    """A stranger cannot add a broker to a route, remove the real one, or write KV config."""
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    processor = NamesrvProcessor()
    admin = RequestSigner("brokerAdmin", "brokerSecret1")

    def register(addr: str, name: str, code: int = RequestCode.REGISTER_BROKER) -> RemotingCommand:
        wrapper = {
            "topicConfigTable": {
                "RealTopic": {
                    "topicName": "RealTopic",
                    "readQueueNums": 4,
                    "writeQueueNums": 4,
                    "perm": 6,
                }
            }
        }
        body = dumps_bytes({"topicConfigSerializeWrapper": wrapper, "filterServerList": []})
        fields = {
            "brokerAddr": addr,
            "brokerId": 0,
            "brokerName": name,
            "clusterName": "DefaultCluster",
            "haServerAddr": addr,
        }
        return RemotingCommand.request(code, fields, body if code == 103 else b"")

    async with trio.open_nursery() as nursery:
        namesrv = await start_namesrv(nursery, acl_file, processor)
        async with open_client_pool() as stranger, open_client_pool(rpc_hook=admin) as broker:
            ok = await broker.request(namesrv, register("127.0.0.1:10911", "broker-a"))
            assert ok.code == ResponseCode.SUCCESS
            before = processor.routes.route("RealTopic")
            attacks = [
                register("6.6.6.6:10911", "evil"),
                register("127.0.0.1:10911", "broker-a", RequestCode.UNREGISTER_BROKER),
                RemotingCommand.request(
                    RequestCode.PUT_KV_CONFIG, {"namespace": "n", "key": "k", "value": "v"}
                ),
            ]
            for attack in attacks:
                response = await stranger.request(namesrv, attack)
                assert response.code == ResponseCode.SYSTEM_ERROR
                assert response.remark is not None
                assert response.remark.startswith(
                    "org.apache.rocketmq.acl.common.AclException: No accessKey is configured"
                )
            async with open_client_pool(rpc_hook=RequestSigner("RocketMQ", "12345678")) as ordinary:
                response = await ordinary.request(namesrv, attacks[0])
                assert "Need admin permission for request code=103" in (response.remark or "")
                # Reads are open to any valid account.
                route = await ordinary.request(
                    namesrv,
                    RemotingCommand.request(
                        RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "RealTopic"}
                    ),
                )
                assert route.code == ResponseCode.SUCCESS
            assert processor.routes.route("RealTopic") == before
            assert set(processor.routes.live) == {"127.0.0.1:10911"}
            assert processor.routes.kv == {}
        nursery.cancel_scope.cancel()
