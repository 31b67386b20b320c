"""A slave pointed at something that is not an HA port says so (a common typo: 10911 for 10912).

Over real sockets on 127.0.0.1: a broker's remoting port, a name server, a server that answers
with a RocketMQ remoting frame, and one that answers with bytes that are no HA frame.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from trioha._config import BrokerConfig, BrokerRole
from trioha.namesrv import serve_namesrv
from trioha.net._client import HAClient, not_ha_sign
from trioha.remoting import RemotingCommand, encode, serve_remoting
from trioha.remoting._connection import RejectAllRequests
from trioha.store import MemoryCommitLog, NewMessage

MESSAGE = (
    "does not speak RocketMQ HA (is that the broker port? the HA port is usually listenPort+1)"
)


def test_signs() -> None:
    reply = encode(RemotingCommand.request(0, {}).response(1, "x"))
    assert not_ha_sign(reply, protocol_error=True, closed_by_peer=False, seconds=0.0) == (
        "it answered with a RocketMQ remoting frame"
    )
    assert "are not an HA frame" in str(
        not_ha_sign(b"GET / HTTP/1.1\r\n", protocol_error=True, closed_by_peer=False, seconds=0)
    )
    assert not_ha_sign(
        b"", protocol_error=False, closed_by_peer=True, seconds=0.01, offset=123
    ) == (
        "it closed the connection at once without sending anything (if it is the HA port, it "
        "refused this slave's offset 123, or it runs the AutoSwitch (epoch) protocol, "
        "enableControllerMode=true, which this slave (enableControllerMode=false) does not "
        "speak: its log says which)"
    )
    # An epoch-mode slave sends a handshake, which is what a master refuses then.
    assert not_ha_sign(
        b"", protocol_error=False, closed_by_peer=True, seconds=0.01, offset=0, epoch_mode=True
    ) == (
        "it closed the connection at once without sending anything (if it is the HA port, it "
        "refused this slave's handshake: its log says which)"
    )
    # A master that closes after a while, or a network break, is no sign.
    assert not_ha_sign(b"", protocol_error=False, closed_by_peer=True, seconds=30) is None
    assert not_ha_sign(b"", protocol_error=False, closed_by_peer=False, seconds=0.01) is None
    # An HA frame (offset 2**32, empty body) is not mistaken for a remoting reply.
    assert (
        not_ha_sign(
            (1 << 32).to_bytes(8, "big") + bytes(4),
            protocol_error=False,
            closed_by_peer=True,
            seconds=0.01,
        )
        is None
    )


async def serve_raw(reply: bytes, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """A server that answers every connection with *reply* and closes it."""

    async def handler(stream: trio.SocketStream) -> None:
        await stream.receive_some(8)
        await stream.send_all(reply)
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[:2])
    await trio.serve_listeners(handler, listeners)


Server = Callable[..., Awaitable[Any]]


def remoting_port(task_status: Any) -> Awaitable[Any]:
    return serve_remoting(RejectAllRequests(), "127.0.0.1", 0, task_status=task_status)


def name_server(task_status: Any) -> Awaitable[Any]:
    return serve_namesrv("127.0.0.1", 0, task_status=task_status)


def remoting_reply(task_status: Any) -> Awaitable[Any]:
    reply = encode(RemotingCommand.request(0, {}).response(1, "not supported"))
    return serve_raw(reply, task_status=task_status)


def garbage(task_status: Any) -> Awaitable[Any]:
    return serve_raw(b"HTTP/1.1 400 Bad Request\r\n\r\n", task_status=task_status)


@pytest.mark.parametrize(
    ("server", "sign"),
    [
        (remoting_port, "closed the connection at once"),
        (name_server, "closed the connection at once"),
        (remoting_reply, "RocketMQ remoting frame"),
        (garbage, "are not an HA frame"),
    ],
)
async def test_a_slave_pointed_at_a_non_ha_port_says_so_and_backs_off(
    server: Server, sign: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(server)
        config = BrokerConfig(
            broker_role=BrokerRole.SLAVE,
            ha_master_address=f"{host}:{port}",
            ha_reconnect_backoff_max=400,
        )
        client = HAClient(config, MemoryCommitLog(segment_size=1 << 20))
        nursery.start_soon(client.run)
        await trio.sleep(1.5)
        nursery.cancel_scope.cancel()
    said = [r for r in caplog.records if MESSAGE in r.getMessage()]
    assert said, [r.getMessage() for r in caplog.records]
    assert f"the master at {host}:{port} {MESSAGE}: " in said[0].getMessage()
    assert sign in said[0].getMessage()
    assert said[0].levelno == logging.WARNING
    assert all(r.levelno == logging.ERROR for r in said[1:])  # it keeps saying so, louder
    # Backoff (100 ms doubling to 400 ms), not a hot loop: a handful of attempts in 1.5 s.
    assert 2 <= client.connects <= 8


async def test_a_diverged_slave_is_not_mistaken_for_a_wrong_port(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A real master refusing a slave's history is an HA master: the slave must say diverged
    (at ERROR) and not "does not speak RocketMQ HA"; the master's side is at WARNING or above."""
    from tests.test_broker import master_config
    from trioha.broker import open_broker

    caplog.set_level(logging.INFO)
    async with open_broker(master_config(tmp_path / "m")) as master, trio.open_nursery() as n:
        assert master.ha_address is not None
        host, port = master.ha_address
        slave_log = MemoryCommitLog(segment_size=1 << 20)
        slave_log.append(NewMessage(topic="T", body=b"only on the slave"))
        config = BrokerConfig(
            broker_role=BrokerRole.SLAVE,
            ha_master_address=f"{host}:{port}",
            ha_reconnect_backoff_max=400,
        )
        client = HAClient(config, slave_log)
        n.start_soon(client.run)
        with trio.fail_after(5):
            await client.wait_diverged()
        n.cancel_scope.cancel()
    master_side = [r for r in caplog.records if "diverged history" in r.getMessage()]
    assert master_side and all(r.levelno >= logging.WARNING for r in master_side)
    assert not [r for r in caplog.records if MESSAGE in r.getMessage()]


def test_the_signs_read_exact_bytes_and_times() -> None:
    # The serialize-type byte is the fifth: a remoting frame whose header is longer than
    # 128 KiB (the header length's high byte is then 2) is still one...
    big_header = (1 << 20).to_bytes(4, "big") + b"\x00" + (0x020010).to_bytes(3, "big") + b'{"a'
    assert not_ha_sign(big_header, protocol_error=False, closed_by_peer=False, seconds=5) == (
        "it answered with a RocketMQ remoting frame"
    )
    # ... and bytes whose fifth is no serialize type are not, whatever follows.
    not_remoting = bytes(4) + b"\x02\x00\x00\x10" + b'{"a'
    assert not_ha_sign(not_remoting, protocol_error=False, closed_by_peer=False, seconds=5) is None
    assert not_ha_sign(
        b"GET / HTTP/1.1\r\n", protocol_error=True, closed_by_peer=True, seconds=0
    ) == ("its first bytes (47 45 54 20 2f 20 48 54 54 50 2f 31) are not an HA frame")
    # A close a whole second after connecting is no longer "at once".
    assert not_ha_sign(b"", protocol_error=False, closed_by_peer=True, seconds=1.0) is None
    assert not_ha_sign(b"", protocol_error=False, closed_by_peer=True, seconds=0.99) == (
        "it closed the connection at once without sending anything (if it is the HA port, it "
        "refused this slave's offset, or it runs the AutoSwitch (epoch) protocol, "
        "enableControllerMode=true, which this slave (enableControllerMode=false) does not "
        "speak: its log says which)"
    )


@pytest.mark.parametrize("slave_epoch_mode", [True, False])
async def test_a_master_in_the_other_mode_is_named_by_enable_controller_mode(
    slave_epoch_mode: bool, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Both sides must set enableControllerMode alike; the slave's line says so."""
    from tests.test_broker import master_config
    from trioha.broker import open_broker
    from trioha.store import EpochFile

    caplog.set_level(logging.INFO)
    master = master_config(tmp_path / "m", enable_controller_mode=not slave_epoch_mode)
    async with open_broker(master) as broker, trio.open_nursery() as nursery:
        await broker.put(NewMessage(topic="T", body=b"x"))
        assert broker.ha_address is not None
        host, port = broker.ha_address
        config = BrokerConfig(
            broker_role=BrokerRole.SLAVE,
            ha_master_address=f"{host}:{port}",
            ha_reconnect_backoff_max=400,
            enable_controller_mode=slave_epoch_mode,
        )
        epochs = EpochFile.open(tmp_path / "epochs") if slave_epoch_mode else None
        client = HAClient(config, MemoryCommitLog(segment_size=1 << 20), epoch_file=epochs)
        nursery.start_soon(client.run)
        await trio.sleep(1.0)
        nursery.cancel_scope.cancel()
    said = [
        r.getMessage()
        for r in caplog.records
        if r.name == "trioha.ha" and f"the master at {host}:{port} " in r.getMessage()
    ]
    assert said, [r.getMessage() for r in caplog.records]
    if slave_epoch_mode:
        assert said[0] == (
            f"the master at {host}:{port} speaks classic HA, not the AutoSwitch (epoch) "
            "protocol: its first frame carries state 0, where a handshake carries 1. Both sides "
            "must set enableControllerMode alike (this slave: true, the master: false)"
        )
    else:
        assert said[0].endswith(
            "it runs the AutoSwitch (epoch) protocol, enableControllerMode=true, which this "
            "slave (enableControllerMode=false) does not speak: its log says which)"
        )
    assert client.connects >= 2  # and it keeps trying, backing off
