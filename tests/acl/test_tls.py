"""TLS on the broker port (``tls.server.mode``) and the authenticated HA port.

Certificates come from a throwaway CA made by ``trustme`` for each test.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from trioha._config import BrokerConfig
from trioha._errors import ConfigError, RemotingError
from trioha.acl import HASecurity
from trioha.broker import Broker, open_broker
from trioha.remoting import ResponseCode, open_client_pool, pull_message, send_message
from trioha.store import NewMessage


def trusting(pki: dict[str, str], ca: str = "ca") -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=pki[ca])
    ctx.check_hostname = False
    return ctx


@asynccontextmanager
async def running(config: BrokerConfig) -> AsyncIterator[Broker]:
    async with open_broker(config) as broker:
        yield broker


def broker_config(root: Path, pki: dict[str, str], mode: str, **more: Any) -> BrokerConfig:
    return BrokerConfig(
        store_path_root_dir=str(root),
        listen_port=0,
        ha_listen_port=0,
        mapped_file_size_commit_log=1 << 20,
        tls_server_mode=mode,
        tls_server_cert_path=pki["cert"],
        tls_server_key_path=pki["key"],
        **more,
    )


async def test_producer_and_consumer_over_tls(tmp_path: Path, pki: dict[str, str]) -> None:
    async with running(broker_config(tmp_path / "s", pki, "enforcing")) as broker:
        assert broker.client_side is not None
        addr = broker.client_side.broker_addr
        async with open_client_pool(ssl_context=trusting(pki)) as pool:
            for i in range(5):
                sent = await send_message(pool, addr, topic="Tls", body=b"m%d" % i, queue_id=0)
                assert sent.status == "SEND_OK"
            await broker.client_side.reput.wait_dispatched(broker.store.commitlog.max_offset)
            pulled = await pull_message(pool, addr, group="G", topic="Tls", queue_id=0, offset=0)
            assert pulled.code == ResponseCode.SUCCESS
            assert [m.body for m in pulled.messages] == [b"m%d" % i for i in range(5)]
        # Plaintext against an enforcing port: the connection is closed, nothing is served.
        async with open_client_pool() as plain:
            with pytest.raises(RemotingError, match="no response"):
                await send_message(plain, addr, topic="Tls", body=b"x", queue_id=0)
        assert broker.statistics().puts == 5


async def test_permissive_serves_tls_and_plaintext_on_one_port(
    tmp_path: Path, pki: dict[str, str]
) -> None:
    async with running(broker_config(tmp_path / "s", pki, "permissive")) as broker:
        assert broker.client_side is not None
        addr = broker.client_side.broker_addr
        async with open_client_pool(ssl_context=trusting(pki)) as tls, open_client_pool() as plain:
            for pool in (tls, plain):
                sent = await send_message(pool, addr, topic="Both", body=b"x", queue_id=0)
                assert sent.status == "SEND_OK"


async def test_a_client_that_checks_the_server_refuses_an_unknown_certificate(
    tmp_path: Path, pki: dict[str, str]
) -> None:
    config = broker_config(tmp_path / "s", pki, "enforcing").evolve(
        tls_server_cert_path=pki["stranger_cert"], tls_server_key_path=pki["stranger_key"]
    )
    async with running(config) as broker, open_client_pool(ssl_context=trusting(pki)) as pool:
        assert broker.client_side is not None
        with pytest.raises(RemotingError, match="TLS handshake"):
            await send_message(
                pool, broker.client_side.broker_addr, topic="T", body=b"x", queue_id=0
            )


def test_enforcing_without_a_certificate_is_a_start_up_error() -> None:
    from trioha.acl import TlsAcceptor

    with pytest.raises(ConfigError, match="certPath"):
        TlsAcceptor.for_config(BrokerConfig(tls_server_mode="enforcing"), what="broker port")
    with pytest.raises(ConfigError, match="tls_server_mode"):
        BrokerConfig(tls_server_mode="enforce")


async def ha_pair(
    tmp_path: Path, master_more: dict[str, Any], slave_more: dict[str, Any], wait: float = 5.0
) -> tuple[int, int, Broker]:
    """Run a master and a slave; (master end, slave end, master) once the slave has it all
    or after *wait* seconds (a refused slave gets several tries in one second)."""
    master_config = BrokerConfig(
        store_path_root_dir=str(tmp_path / "m"),
        listen_port=0,
        ha_listen_port=0,
        mapped_file_size_commit_log=1 << 20,
        **master_more,
    )
    async with running(master_config) as master:
        for i in range(3):
            await master.put(NewMessage(topic="HA", body=b"body-%d" % i))
        assert master.ha_address is not None
        slave_config = BrokerConfig(
            store_path_root_dir=str(tmp_path / "s"),
            broker_role="SLAVE",
            listen_port=0,
            mapped_file_size_commit_log=1 << 20,
            ha_master_address=f"127.0.0.1:{master.ha_address[1]}",
            **slave_more,
        )
        target = master.store.commitlog.max_offset
        async with running(slave_config) as slave:
            with trio.move_on_after(wait):
                while slave.store.commitlog.max_offset < target:  # noqa: ASYNC110
                    await trio.sleep(0.02)
            return target, slave.store.commitlog.max_offset, master


async def test_ha_pair_over_tls_with_a_shared_secret(tmp_path: Path, pki: dict[str, str]) -> None:
    tls: dict[str, Any] = {"ha_tls_enable": True, "ha_tls_trust_cert_path": pki["ca"]}
    target, got, master = await ha_pair(
        tmp_path,
        {
            **tls,
            "ha_tls_cert_path": pki["cert"],
            "ha_tls_key_path": pki["key"],
            "ha_auth_secret": "s3cret",
        },
        {**tls, "ha_auth_secret": "s3cret"},
    )
    assert got == target > 0
    assert master.ha_service is not None and master.ha_service.accept is not None


async def test_ha_port_refuses_a_wrong_secret_and_a_plain_slave(
    tmp_path: Path, pki: dict[str, str]
) -> None:
    master = {"ha_auth_secret": "s3cret"}
    target, got, _ = await ha_pair(tmp_path / "a", master, {"ha_auth_secret": "guess"}, 1)
    assert target > 0 and got == 0
    target, got, _ = await ha_pair(tmp_path / "b", master, {}, 1)  # RocketMQ-like
    assert target > 0 and got == 0


async def test_ha_client_certificate_is_checked(tmp_path: Path, pki: dict[str, str]) -> None:
    master: dict[str, Any] = {
        "ha_tls_enable": True,
        "ha_tls_cert_path": pki["cert"],
        "ha_tls_key_path": pki["key"],
        "ha_tls_trust_cert_path": pki["ca"],
        "ha_tls_need_client_auth": True,
    }
    base = {"ha_tls_enable": True, "ha_tls_trust_cert_path": pki["ca"]}
    _, got, _ = await ha_pair(tmp_path / "a", master, base, 1)  # no certificate
    assert got == 0
    _, got, _ = await ha_pair(
        tmp_path / "b",
        master,
        {**base, "ha_tls_cert_path": pki["stranger_cert"], "ha_tls_key_path": pki["stranger_key"]},
        1,
    )
    assert got == 0
    target, got, _ = await ha_pair(
        tmp_path / "c",
        master,
        {**base, "ha_tls_cert_path": pki["client_cert"], "ha_tls_key_path": pki["client_key"]},
    )
    assert got == target > 0


def test_ha_security_is_off_by_default() -> None:
    assert HASecurity.for_config(BrokerConfig(), master=True) is None


async def test_the_broker_registers_over_tls_with_a_signed_request(
    tmp_path: Path, pki: dict[str, str]
) -> None:
    """``tls.enable`` and ``aclAccessKey``: registration with an enforcing, ACL-checking
    embedded name server goes over TLS, signed with the broker's own account."""
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(
        "accounts:\n  - {accessKey: brokerAdmin, secretKey: brokerSecret1, admin: true}\n"
    )
    config = broker_config(
        tmp_path / "s",
        pki,
        "enforcing",
        namesrv_addr="127.0.0.1:0",
        embedded_namesrv=True,
        tls_enable=True,
        tls_client_auth_server=True,
        tls_client_trust_cert_path=pki["ca"],
        acl_enable=True,
        acl_file=str(acl_file),
        acl_access_key="brokerAdmin",
    )
    async with running(config) as broker:
        side = broker.client_side
        assert side is not None and side.registrar is not None and side.acl is not None
        assert side.registrar.registrations >= 1
        assert side.guard is not None and side.guard.denied == 0
        info = side.processor.extra_info()
        assert info["aclDenied"] == "0" and info["aclReloadError"] == ""


async def test_a_changed_certificate_is_used_for_new_connections(
    tmp_path: Path, pki: dict[str, str]
) -> None:
    import shutil

    from trioha.acl import TlsAcceptor
    from trioha.remoting import RemotingCommand, serve_remoting
    from trioha.remoting._connection import RejectAllRequests

    cert, key = tmp_path / "live.pem", tmp_path / "live.key"
    shutil.copy(pki["cert"], cert)
    shutil.copy(pki["key"], key)
    config = BrokerConfig(
        tls_server_mode="enforcing", tls_server_cert_path=str(cert), tls_server_key_path=str(key)
    )
    acceptor = TlsAcceptor.for_config(config, what="test port")
    assert acceptor is not None
    ping = RemotingCommand.request(999)
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(
            lambda task_status: serve_remoting(
                RejectAllRequests(),
                "127.0.0.1",
                0,
                wrap_stream=acceptor,
                task_status=task_status,
            )
        )
        address = f"{host}:{port}"
        async with open_client_pool(ssl_context=trusting(pki)) as pool:
            answer = await pool.request(address, ping)
            assert answer.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        cert.write_text("not a certificate")  # a broken edit: the old context stays
        assert not acceptor.reload_if_changed()
        shutil.copy(pki["stranger_cert"], cert)
        shutil.copy(pki["stranger_key"], key)
        assert acceptor.reload_if_changed() and acceptor.reloads == 1
        async with open_client_pool(ssl_context=trusting(pki, "stranger_ca")) as pool:
            answer = await pool.request(address, ping)
            assert answer.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        async with open_client_pool(ssl_context=trusting(pki)) as pool:
            with pytest.raises(RemotingError, match="TLS handshake"):
                await pool.request(address, ping)
        nursery.cancel_scope.cancel()


async def test_the_sniffer_on_memory_streams(
    pki: dict[str, str], autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """First byte 0x00: plaintext (kept in permissive, refused in enforcing, logged once);
    silence: given up after the idle limit; a ClientHello: a TLS stream."""
    from trioha.acl import TlsAcceptor
    from trioha.acl._tls import FIRST_BYTE_TIMEOUT

    config = broker_config(Path("."), pki, "enforcing")
    enforcing = TlsAcceptor.for_config(config, what="port")
    permissive = TlsAcceptor.for_config(config.evolve(tls_server_mode="permissive"), what="port")
    assert enforcing is not None and permissive is not None
    frame = b"\x00\x00\x00\x10rest-of-a-frame"
    for _ in range(2):
        client, server = trio.testing.memory_stream_pair()
        await client.send_all(frame)
        assert await enforcing(server) is None  # type: ignore[arg-type]
    assert enforcing.refused == 2
    assert sum("plaintext connection" in r.message for r in caplog.records) == 1
    client, server = trio.testing.memory_stream_pair()
    await client.send_all(frame)
    kept = await permissive(server)  # type: ignore[arg-type]
    assert kept is not None and await kept.receive_some() == frame
    client, server = trio.testing.memory_stream_pair()
    start = trio.current_time()
    assert await permissive(server) is None  # type: ignore[arg-type]
    assert trio.current_time() - start == pytest.approx(FIRST_BYTE_TIMEOUT)

    async def hello() -> None:
        tls = trio.SSLStream(client, trusting(pki), server_hostname="127.0.0.1")
        await tls.do_handshake()
        await tls.send_all(b"over tls")

    client, server = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(hello)
        wrapped = await enforcing(server)  # type: ignore[arg-type]
        assert isinstance(wrapped, trio.SSLStream)
        assert await wrapped.receive_some() == b"over tls"


async def test_ha_secret_exchange_on_memory_streams() -> None:
    """Both sides prove the secret and the HA protocol's bytes flow after the exchange; a wrong
    secret is refused by the master before it proves anything."""
    master = HASecurity(BrokerConfig(ha_auth_secret="s3cret"), master=True)
    slave = HASecurity(BrokerConfig(ha_auth_secret="s3cret"), master=False)
    impostor = HASecurity(BrokerConfig(ha_auth_secret="guess"), master=False)

    async def pipe(_host: str, _port: int) -> trio.abc.Stream:
        return slave_end

    slave_end, master_end = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:

        async def slave_side() -> None:
            stream = await slave.connector(pipe)("m", 1)
            await stream.send_all(b"REPORT!!")  # the HA protocol's first 8 bytes

        nursery.start_soon(slave_side)
        accepted = await master.accept(master_end, "127.0.0.1:1")
        assert accepted is not None
        data = b""
        while len(data) < 8:
            data += await accepted.receive_some()
        assert data == b"REPORT!!"

    slave_end, master_end = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:

        async def impostor_side() -> None:
            with pytest.raises(ConnectionError, match="closed"):
                await impostor.connector(pipe)("m", 1)

        nursery.start_soon(impostor_side)
        assert await master.accept(master_end, "127.0.0.1:2") is None
        await master_end.aclose()
    assert master.refused == 1
