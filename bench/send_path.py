"""The master's CPU per client send, in-process: decode, checks, append, wait, encode.

    PYTHONPATH=. .venv/bin/python bench/send_path.py [--burst 32] [--seconds 5 | --bursts N]
        [--acl] [--profile F]

A real broker (ASYNC_MASTER, ASYNC_FLUSH, no slave: the wait is one checkpoint) is opened on
a temporary store; bursts of ``--burst`` SEND_MESSAGE requests, encoded as the official C++
client encodes them (long header names, ``WAIT`` and ``UNIQ_KEY`` properties, 1 KiB bodies),
go through what the client port does with one read: :class:`FrameDecoder`, the port's
handler's ``take_burst`` (checks and one append), the burst's ``finish`` (the wait, the
responses) and the responses' encoding; requests the handler does not take are answered one
task each, as the connection answers them. The consume-queue builder and the flusher run as
in a broker, and the loop yields once per burst so they keep pace. No sockets: this is the
Python work on a message, the part that a profile of the whole broker spreads over many
frames.

With ``--acl`` the broker checks every request against an ACL file (``aclEnable``) and the
requests are signed as ``AclClientRPCHook`` signs them, so the port's handler is the
:class:`~trioha.acl.AclGuard`.

It prints the process's CPU time per message (all threads; the Trio thread's alone in
brackets) and wall time per message;
``--profile F`` writes a cProfile of the measured window to F (``python -m pstats F``).
``--bursts N`` measures exactly N bursts instead of ``--seconds``, with the random draws seeded
and the body fixed, so the window is the same work every run: ``bench/instructions.py`` counts
its instructions under callgrind (the window is :func:`bench._icount.window`).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import random
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import trio
from trio.testing import MockClock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._icount import make_deterministic, window
from trioha._config import BrokerConfig, BrokerRole
from trioha.acl import RequestSigner
from trioha.broker import open_broker
from trioha.remoting import FrameDecoder, RemotingCommand, RequestCode, encode
from trioha.store import properties_to_string

TOPIC = "SendPathTopic"
#: With ``--acl``: an account that may publish to the topic, and its requests' signer.
ACL = f"""
accounts:
  - accessKey: benchProducer
    secretKey: benchSecret1
    defaultTopicPerm: DENY
    topicPerms:
      - {TOPIC}=PUB
"""
SIGNER = RequestSigner("benchProducer", "benchSecret1")


class _Peer:
    """What the processor reads of a connection: the peer's address."""

    peer = "127.0.0.1:40000"


def send_request(opaque: int, body: bytes) -> RemotingCommand:
    """A SEND_MESSAGE as the C++ client sends one (``SendMessageRequestHeader``)."""
    props = {"WAIT": "true", "UNIQ_KEY": f"{random.getrandbits(128):032X}"}
    return RemotingCommand(
        code=RequestCode.SEND_MESSAGE,
        opaque=opaque,
        ext_fields={
            "producerGroup": "bench_group",
            "topic": TOPIC,
            "defaultTopic": "TBW102",
            "defaultTopicQueueNums": "4",
            "queueId": str(opaque % 4),
            "sysFlag": "0",
            "bornTimestamp": str(int(time.time() * 1000)),
            "flag": "0",
            "properties": properties_to_string(props),
            "reconsumeTimes": "0",
            "unitMode": "false",
            "batch": "false",
        },
        body=body,
        language="CPP",
    )


async def run(
    burst: int,
    seconds: float,
    bursts: int | None,
    profile: str | None,
    *,
    role: BrokerRole,
    acl: bool,
    clock: MockClock | None = None,
) -> None:
    if bursts is not None:
        make_deterministic()
    body = os.urandom(1024) if bursts is None else bytes(i % 251 for i in range(1024))
    sign = SIGNER if acl else (lambda request: request)
    frames = [
        b"".join(encode(sign(send_request(k * burst + i, body))) for i in range(burst))
        for k in range(64)
    ]
    with tempfile.TemporaryDirectory(prefix="send-path-") as tmp:
        acl_file = Path(tmp) / "plain_acl.yml"
        acl_file.write_text(ACL)
        config = BrokerConfig(
            broker_role=role,
            store_path_root_dir=str(Path(tmp) / "store"),
            listen_port=0,
            ha_listen_port=0,
            ha_listen_host="127.0.0.1",
            namesrv_addr="127.0.0.1:1",
            acl_enable=acl,
            acl_file=str(acl_file),
        )
        async with open_broker(config) as broker:
            side = broker.client_side
            assert side is not None
            handler = side.guard or side.processor  # what the broker port serves
            peer = _Peer()
            decoder = FrameDecoder()

            async def answer(request: RemotingCommand, out: list[bytes]) -> None:
                response = await handler.handle_request(request, peer)  # type: ignore[arg-type]
                if response is not None:
                    out.append(encode(response))

            async def one(k: int) -> int:
                decoder.receive_data(frames[k % len(frames)])
                requests = list(decoder.commands())
                taken = handler.take_burst(requests, peer)  # type: ignore[arg-type]
                out: list[bytes] = []
                if taken is not None:
                    responses = await taken.finish()
                    out.extend(  # as RemotingConnection._serve_burst writes them
                        r if isinstance(r, bytes) else encode(r) for r in responses if r is not None
                    )
                    ids = {id(request) for request in taken.requests}
                    requests = [request for request in requests if id(request) not in ids]
                if requests:  # one task each, as RemotingConnection._dispatch starts them
                    async with trio.open_nursery() as nursery:
                        for request in requests:
                            nursery.start_soon(answer, request, out)
                assert len(out) == burst
                await trio.lowlevel.checkpoint()
                return sum(map(len, out))

            for k in range(200):  # warm-up: topic created, caches warm
                await one(k)
            prof = cProfile.Profile() if profile else None
            cpu0, wall0, own0 = time.process_time(), time.perf_counter(), time.thread_time()
            if prof is not None:
                prof.enable()
            n = 0
            with window(clock):
                while n < bursts if bursts is not None else time.perf_counter() - wall0 < seconds:
                    await one(n)
                    n += 1
            if prof is not None:
                prof.disable()
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            own = time.thread_time() - own0
            messages = n * burst
            print(
                f"{role.value}{', ACL' if acl else ''}, bursts of {burst}: "
                f"{messages} messages in {wall:.2f} s, "
                f"CPU {cpu / messages * 1e6:.1f} us/msg "
                f"(Trio thread {own / messages * 1e6:.1f}), "
                f"wall {wall / messages * 1e6:.1f} us/msg, "
                f"load {os.getloadavg()[0]:.2f}"
            )
            if prof is not None and profile is not None:
                prof.dump_stats(profile)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--burst", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--bursts", type=int, default=None, help="measure this many bursts, seeded (not --seconds)"
    )
    parser.add_argument("--acl", action="store_true", help="ACL on, requests signed")
    parser.add_argument("--profile", default=None, help="write a cProfile here")
    parser.add_argument("--role", default="ASYNC_MASTER", help="ASYNC_MASTER (no slave)")
    args = parser.parse_args()
    # A fixed count runs on a clock that stands still in the window (bench._icount.window).
    clock = MockClock(rate=1.0) if args.bursts is not None else None
    trio.run(
        partial(run, role=BrokerRole(args.role), acl=args.acl, clock=clock),
        args.burst,
        args.seconds,
        args.bursts,
        args.profile,
        clock=clock,
    )


if __name__ == "__main__":
    main()
