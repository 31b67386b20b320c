"""A read's sends taken together on every channel, with or without ACL."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio

from tests.broker.test_broker_port import FULL_V2, broker_port
from trioha.acl import RequestSigner
from trioha.broker._clientside import ClientSide
from trioha.remoting import (
    Burst,
    FrameDecoder,
    RemotingCommand,
    RemotingConnection,
    RequestCode,
    ResponseCode,
    encode,
)

ACL = """
accounts:
  - accessKey: producer
    secretKey: producerSecret
    defaultTopicPerm: DENY
    topicPerms:
      - T=PUB
"""
SIGN = RequestSigner("producer", "producerSecret")


class _Peer:
    """What the processor reads of a connection: the peer's address."""

    peer = "127.0.0.1:40000"


def _distribute(info: dict[str, str]) -> dict[str, int]:
    """``putMessageDistributeTime``: ``[<=0ms]:n [0~10ms]:n ...`` as a mapping."""
    return {
        k: int(v) for k, v in re.findall(r"\[([^\]]+)\]:(\d+)", info["putMessageDistributeTime"])
    }


def _code(response: RemotingCommand | bytes | None) -> int:
    """The code of a burst's response, a command or its frame."""
    assert response is not None
    if isinstance(response, RemotingCommand):
        return response.code
    decoder = FrameDecoder()
    decoder.receive_data(response)
    (command,) = decoder.commands()
    return command.code


def _next_minute(side: ClientSide) -> None:
    """Move the runtime info's clock on a minute: ``putMessageDistributeTime`` reports the
    previous minute's puts."""
    stats = side.processor.ctx.stats
    later = int(time.time() * 1000) + 60_000
    stats.wall_ms = lambda: later


async def _send_in_one_write(address: str, requests: Sequence[RemotingCommand]) -> list[int]:
    """Write *requests* to *address* in one write; the response codes, in request order."""
    host, port = address.rsplit(":", 1)
    numbered = [r.with_opaque(i + 1) for i, r in enumerate(requests)]
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(b"".join(encode(r) for r in numbered))
        decoder = FrameDecoder()
        codes: dict[int, int] = {}
        while len(codes) < len(numbered):
            data = await stream.receive_some(65536)
            assert data, "the broker closed the connection"
            decoder.receive_data(data)
            codes.update((c.opaque, c.code) for c in decoder.commands())
    return [codes[r.opaque] for r in numbered]


@pytest.mark.parametrize("channel", ["broker port", "VIP channel"])
@pytest.mark.parametrize("acl", [False, True])
async def test_sends_are_taken_together_on_every_channel_with_or_without_acl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, channel: str, acl: bool
) -> None:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    overrides = {"acl_enable": True, "acl_file": str(acl_file)} if acl else {}
    async with broker_port(tmp_path / "store", **overrides) as (broker, side, _pool):
        taken: list[int] = []
        take_sends = side.processor.send.take_sends

        def spy(
            requests: Sequence[RemotingCommand], connection: RemotingConnection
        ) -> Burst | None:
            burst = take_sends(requests, connection)
            if burst is not None:
                taken.extend(request.opaque for request in burst.requests)
            return burst

        monkeypatch.setattr(side.processor.send, "take_sends", spy)
        sign = SIGN if acl else (lambda request: request)
        sends = [
            sign(RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, FULL_V2, b"m%d" % i))
            for i in range(8)
        ]
        address = side.vip_addr if channel == "VIP channel" else side.broker_addr
        codes = await _send_in_one_write(address, sends)
        assert codes == [ResponseCode.SUCCESS] * 8
        assert sorted(taken) == list(range(1, 9))  # every send went the burst way
        assert broker.puts == 8
        if acl:
            assert side.guard is not None
            unsigned = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, FULL_V2, b"no")
            before = len(taken)
            codes = await _send_in_one_write(address, [unsigned, sends[0]])
            # The refused one is answered by the guard and never taken; the other is.
            assert codes == [ResponseCode.SYSTEM_ERROR, ResponseCode.SUCCESS]
            assert len(taken) == before + 1
            assert broker.puts == 9
