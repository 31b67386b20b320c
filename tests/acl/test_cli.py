"""``trioha namesrv --acl-file ... --tls-config ...``: a standalone protected name server."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from tests.cli.test_tools import running_namesrv
from trioha.acl import RequestSigner
from trioha.remoting import RemotingCommand, RequestCode, ResponseCode, open_client_pool


async def test_namesrv_command_with_acl_and_tls(tmp_path: Path, pki: dict[str, str]) -> None:
    (tmp_path / "tls.properties").write_text(
        "tls.server.mode=enforcing\n"
        f"tls.server.certPath={pki['cert']}\n"
        f"tls.server.keyPath={pki['key']}\n"
    )
    (tmp_path / "plain_acl.yml").write_text(
        "accounts:\n  - {accessKey: RocketMQ, secretKey: '12345678'}\n"
    )
    ctx = ssl.create_default_context(cafile=pki["ca"])
    ctx.check_hostname = False
    args = ["--listen", "127.0.0.1:0", "--acl-file", str(tmp_path / "plain_acl.yml")]
    args += ["--tls-config", str(tmp_path / "tls.properties")]
    async with running_namesrv(*args) as (_, address):
        route = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
        kv = RemotingCommand.request(
            RequestCode.PUT_KV_CONFIG, {"namespace": "n", "key": "k", "value": "v"}
        )
        signer = RequestSigner("RocketMQ", "12345678")
        async with open_client_pool(ssl_context=ctx, rpc_hook=signer) as pool:
            answer = await pool.request(address, route)
            assert answer.code == ResponseCode.TOPIC_NOT_EXIST  # got past the ACL
            refused = await pool.request(address, kv)
            assert refused.code == ResponseCode.SYSTEM_ERROR
            assert "Need admin permission for request code=100" in (refused.remark or "")
        async with open_client_pool(ssl_context=ctx) as pool:
            refused = await pool.request(address, route)
            assert "No accessKey is configured" in (refused.remark or "")


async def test_put_and_status_sign_and_speak_tls_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pki: dict[str, str]
) -> None:
    import io

    from trioha._config import BrokerConfig
    from trioha.broker import open_broker
    from trioha.cli._tools import broker_status, put_messages

    (tmp_path / "plain_acl.yml").write_text(
        "accounts:\n  - {accessKey: operator1, secretKey: operatorSecret, admin: true}\n"
        "  - {accessKey: RocketMQ, secretKey: '12345678', defaultTopicPerm: PUB}\n"
    )
    config = BrokerConfig(
        store_path_root_dir=str(tmp_path / "store"),
        listen_port=0,
        ha_listen_port=0,
        mapped_file_size_commit_log=1 << 20,
        namesrv_addr="127.0.0.1:0",
        embedded_namesrv=True,
        acl_enable=True,
        acl_file=str(tmp_path / "plain_acl.yml"),
        acl_access_key="operator1",
        tls_server_mode="enforcing",
        tls_server_cert_path=pki["cert"],
        tls_server_key_path=pki["key"],
        tls_enable=True,
    )
    monkeypatch.setenv("TRIOHA_TLS_TRUST", pki["ca"])
    async with open_broker(config) as broker:
        side = broker.client_side
        assert side is not None and side.namesrv_addr is not None
        namesrv = f"{side.namesrv_addr[0]}:{side.namesrv_addr[1]}"
        monkeypatch.setenv("TRIOHA_ACCESS_KEY", "RocketMQ")
        monkeypatch.setenv("TRIOHA_SECRET_KEY", "12345678")
        out = io.StringIO()
        assert await put_messages(namesrv, "Cli", count=2, size=8, out=out) == 0, out.getvalue()
        assert broker.statistics().puts == 2
        from trioha._errors import RemotingError

        with pytest.raises(ExceptionGroup) as info:  # out of the pool's nursery
            await broker_status(side.broker_addr, out=io.StringIO())
        assert info.group_contains(RemotingError, match="Need admin permission .*code=28")
        monkeypatch.setenv("TRIOHA_ACCESS_KEY", "operator1")
        monkeypatch.setenv("TRIOHA_SECRET_KEY", "operatorSecret")
        table = await broker_status(side.broker_addr, out=io.StringIO())
        assert table["aclDenied"] == "1"
