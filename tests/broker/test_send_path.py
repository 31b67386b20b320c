"""One send path: a read's sends taken together on every channel, and counted in one place."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio
import trio.testing

from tests.broker.test_broker_port import FULL_V1, FULL_V2, broker_port
from trioha._status import PutStatus
from trioha.acl import RequestSigner
from trioha.broker._batch import BatchItem, encode_batch
from trioha.broker._clientside import ClientSide
from trioha.remoting import (
    Burst,
    FrameDecoder,
    RemotingCommand,
    RemotingConnection,
    RequestCode,
    ResponseCode,
    encode,
    loads_lenient,
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
    """Move the runtime info's wall clock on a minute: ``putMessageDistributeTime`` reports
    the previous minute's puts."""
    stats = side.processor.ctx.stats
    later = int(time.time() * 1000) + 60_000
    stats.wall_ms = lambda: later


async def _runtime_info(side: ClientSide) -> dict[str, str]:
    """GET_BROKER_RUNTIME_INFO as the broker port answers it."""
    request = RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
    response = await side.processor.handle_request(request, _Peer())  # type: ignore[arg-type]
    assert response is not None and response.code == ResponseCode.SUCCESS
    return {str(k): str(v) for k, v in loads_lenient(response.body)["table"].items()}


async def test_sends_alone_in_a_read_and_in_a_batch_all_count_in_the_runtime_info(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with broker_port(tmp_path) as (broker, side, _pool):
        wait_stored = broker.wait_stored

        async def slow_flush(start: int, end: int) -> PutStatus:
            await trio.sleep(0.3)  # the Trio clock's 300 ms: every answer waits for it
            return await wait_stored(start, end)

        broker.wait_stored = slow_flush  # type: ignore[method-assign]
        processor = side.processor
        peer = _Peer()
        read = [
            RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, FULL_V2, b"a"),
            RemotingCommand.request(RequestCode.SEND_MESSAGE, FULL_V1, b"b"),
            RemotingCommand.request(
                RequestCode.SEND_BATCH_MESSAGE,
                FULL_V2,
                encode_batch([BatchItem(0, b"c1", ""), BatchItem(0, b"c2", "")]),
            ),
            RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"b": "T"}, b"refused"),
        ]
        burst = processor.take_burst(read, peer)  # type: ignore[arg-type]
        assert burst is not None and list(burst.requests) == read
        responses = await burst.finish()
        alone = await processor.handle_request(
            RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, FULL_V2, b"d"),
            peer,  # type: ignore[arg-type]
        )
        assert alone is not None and alone.code == ResponseCode.SUCCESS
        codes = [_code(r) for r in responses]
        assert codes == [ResponseCode.SUCCESS] * 3 + [ResponseCode.SYSTEM_ERROR]
        assert broker.puts == 5  # two sends, a batch of two, one send alone
        _next_minute(side)
        info = await _runtime_info(side)
        # Five send requests answered after the 300 ms wait: the read's four (one refused
        # before the store) and the one handed over alone.
        assert _distribute(info)["200~500ms"] == 5
        assert sum(_distribute(info).values()) == 5
        assert info["putMessageEntireTimeMax"] == "300"
        assert info["putMessageFailedTimes"] == "1"
        assert side.processor.served["SEND_MESSAGE_V2.0"] == 2
        assert side.processor.served["SEND_MESSAGE_V2.1"] == 1
        assert side.processor.served["SEND_MESSAGE.0"] == 1
        assert side.processor.served["SEND_BATCH_MESSAGE.0"] == 1
        assert broker.answered == {"PUT_OK": 5}


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
