"""``trioha namesrv --acl-file ... --tls-config ...``: a standalone protected name server."""

from __future__ import annotations

import re
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from trioha.acl import RequestSigner
from trioha.remoting import RemotingCommand, RequestCode, ResponseCode
from trioha.remoting._client import open_client_pool

trustme = pytest.importorskip("trustme")


async def test_namesrv_command_with_acl_and_tls(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    (tmp_path / "tls.properties").write_text(
        "tls.server.mode=enforcing\n"
        f"tls.server.certPath={tmp_path / 'cert.pem'}\n"
        f"tls.server.keyPath={tmp_path / 'key.pem'}\n"
    )
    (tmp_path / "plain_acl.yml").write_text(
        "accounts:\n  - {accessKey: RocketMQ, secretKey: '12345678'}\n"
    )
    command = [
        sys.executable, "-m", "trioha", "namesrv", "--listen", "127.0.0.1:0",
        "--acl-file", str(tmp_path / "plain_acl.yml"),
        "--tls-config", str(tmp_path / "tls.properties"),
    ]
    ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    ctx.check_hostname = False
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:

            async def run(task_status: trio.TaskStatus[trio.Process]) -> None:
                await trio.run_process(
                    command, stderr=subprocess.PIPE, check=False, task_status=task_status
                )

            process: trio.Process = await nursery.start(run)
            assert process.stderr is not None
            seen = b""
            while (found := re.search(rb"name server listening on [\d.]+:(\d+)", seen)) is None:
                chunk = await process.stderr.receive_some(4096)
                assert chunk, seen
                seen += chunk
            address = f"127.0.0.1:{int(found.group(1))}"
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
            process.terminate()
        assert process.returncode == 0
