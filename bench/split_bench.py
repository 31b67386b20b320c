"""A second process for the client port, measured: one process against a front + a store.

    PYTHONPATH=. .venv/bin/python bench/split_bench.py [--seconds 5] [--rounds 2] [--tasks 8]

What would a front process (decoding the client port, answering it) handing batches of
records to the store's process buy, on this machine, beside today's one process? Both
modes run the same work on the same pre-encoded requests (SEND_MESSAGE as the C++ client
sends them, 1 KiB bodies, ``--burst`` sends per read, ``--tasks`` reads in flight, as from
that many connections):

* **one**: everything in this process, as the broker does it today: decode, the
  processor's checks, records, one append per read, the wait, responses encoded
  (``bench/send_path.py``'s loop, on ``--tasks`` concurrent tasks);
* **two**: this process is the front: it decodes, reads the header fields a record needs
  and the properties (WAIT dropped, CLUSTER added, as the processor does), and sends each
  read's records as one ``marshal`` message over a Unix socket to the store process, which
  encodes and appends them (``LogCore.prepare``, ``Broker.append_each``), waits, and answers
  each record's msgId and queue offset; the front then encodes the responses.

The store is a real broker (ASYNC_MASTER, ASYNC_FLUSH, its consume-queue builder running;
no slave: the wait is one checkpoint) in both modes. It is a prototype of the hand-over
only: topic checks stay in the store (the front would need the topic table), and the
client sockets are left out in both modes (the front would carry them). Printed per mode:
msgs/s, CPU per message of each process (``/proc``), and the load average.
"""

from __future__ import annotations

import argparse
import marshal
import os
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import proc_sample
from bench.send_path import send_request
from trioha._config import BrokerConfig, BrokerRole
from trioha.broker import Broker, open_broker
from trioha.broker._send import PROPERTY_CLUSTER
from trioha.broker._sendheader import SendMessageHeader
from trioha.remoting import (
    FrameDecoder,
    RemotingCommand,
    encode,
    encode_response,
)
from trioha.store import (
    PROPERTY_WAIT_STORE_MSG_OK,
    HostAddress,
    NewMessage,
    string_to_properties,
)

_LEN = struct.Struct(">I")
_PEER = ("127.0.0.1", 40000)
_CLUSTER = "DefaultCluster"


def _config(root: str) -> BrokerConfig:
    return BrokerConfig(
        broker_role=BrokerRole.ASYNC_MASTER,
        store_path_root_dir=root,
        listen_port=0,
        ha_listen_port=0,
        ha_listen_host="127.0.0.1",
        namesrv_addr="127.0.0.1:1",
    )


def _bursts(burst: int) -> list[bytes]:
    body = os.urandom(1024)
    return [
        b"".join(encode(send_request(k * burst + i, body)) for i in range(burst)) for k in range(64)
    ]


async def _read_frame(stream: trio.abc.Stream, buf: bytearray) -> bytes | None:
    while len(buf) < 4 or len(buf) < 4 + _LEN.unpack_from(buf)[0]:
        data = await stream.receive_some(1 << 20)
        if not data:
            return None
        buf += data
    (n,) = _LEN.unpack_from(buf)
    frame = bytes(buf[4 : 4 + n])
    del buf[: 4 + n]
    return frame


async def _send_frame(stream: trio.abc.Stream, payload: bytes) -> None:
    await stream.send_all(_LEN.pack(len(payload)) + payload)


# --- the store process ----------------------------------------------------------------------


async def _serve_store(path: str) -> None:
    """The store's side: append each batch of records, wait, answer (msgId, queueOffset)s."""
    with tempfile.TemporaryDirectory(prefix="split-store-") as root:
        async with open_broker(_config(root)) as broker:
            listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
            await listener.bind(path)
            listener.listen(64)
            print("ready", flush=True)

            async def handler(stream: trio.SocketStream) -> None:
                await _store_connection(broker, stream)

            await trio.serve_listeners(handler, [trio.SocketListener(listener)])


async def _store_connection(broker: Broker, stream: trio.abc.Stream) -> None:
    host = HostAddress(*_PEER)
    buf = bytearray()
    while (frame := await _read_frame(stream, buf)) is not None:
        batch: list[tuple[Any, ...]] = marshal.loads(frame)
        records = [
            NewMessage(
                topic=topic,
                body=body,
                queue_id=queue_id,
                flag=flag,
                sysflag=sysflag,
                born_timestamp=born,
                born_host=host,
                reconsume_times=reconsume,
                properties=props,
            )
            for topic, queue_id, flag, sysflag, born, reconsume, props, body in batch
        ]
        results = broker.append_each([[record] for record in records])
        await broker.wait_stored(results[0].offset, results[-1].end_offset)
        answer = [(r.msg_id, r.queue_offset) for r in results]
        await _send_frame(stream, marshal.dumps(answer))


# --- the front ------------------------------------------------------------------------------


def _front_record(request: RemotingCommand) -> tuple[Any, ...]:
    """What the processor reads of a send before the store (SendMessageProcessor._accept)."""
    header = SendMessageHeader.from_command(request)
    properties = dict(string_to_properties(header.properties))
    properties.pop(PROPERTY_WAIT_STORE_MSG_OK, None)
    properties[PROPERTY_CLUSTER] = _CLUSTER
    return (
        header.topic,
        header.queue_id,
        header.flag,
        header.sys_flag,
        header.born_timestamp or int(time.time() * 1000),
        header.reconsume_times,
        properties,
        request.body,
    )


async def _front_task(
    path: str, bursts: Sequence[bytes], deadline: float, counts: list[int]
) -> None:
    stream = await trio.open_unix_socket(path)
    decoder = FrameDecoder()
    buf = bytearray()
    k = 0
    async with stream:
        while time.perf_counter() < deadline:
            decoder.receive_data(bursts[k % len(bursts)])
            k += 1
            requests = list(decoder.commands())
            await _send_frame(stream, marshal.dumps([_front_record(r) for r in requests]))
            frame = await _read_frame(stream, buf)
            assert frame is not None
            answers = marshal.loads(frame)
            out = b"".join(
                encode_response(
                    request,
                    0,
                    {
                        "msgId": msg_id,
                        "queueId": request.ext_fields["queueId"],
                        "queueOffset": str(queue_offset),
                        "MSG_REGION": "DefaultRegion",
                        "TRACE_ON": "true",
                    },
                )
                for request, (msg_id, queue_offset) in zip(requests, answers, strict=True)
            )
            assert out
            counts[0] += len(requests)


async def run_two(
    bursts: Sequence[bytes], seconds: float, warmup: float, tasks: int
) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="split-") as tmp:
        path = os.path.join(tmp, "store.sock")
        store = subprocess.Popen(  # noqa: ASYNC220 - started once, before measuring
            [sys.executable, __file__, "--store-at", path],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert store.stdout is not None
            line = await trio.to_thread.run_sync(store.stdout.readline)
            if line.strip() != "ready":
                raise RuntimeError(f"store process did not start: {line!r}")
            counts = [0]
            async with trio.open_nursery() as nursery:
                end = time.perf_counter() + warmup
                for _ in range(tasks):
                    nursery.start_soon(_front_task, path, bursts, end, counts)
            front0, store0 = proc_sample(), proc_sample(store.pid)
            counts = [0]
            started = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(tasks):
                    nursery.start_soon(_front_task, path, bursts, started + seconds, counts)
            wall = time.perf_counter() - started
            front1, store1 = proc_sample(), proc_sample(store.pid)
        finally:
            store.terminate()
            store.wait()
    n = counts[0]
    return {
        "msgs": n / wall,
        "front_us": (front1.cpu - front0.cpu) / n * 1e6,
        "store_us": (store1.cpu - store0.cpu) / n * 1e6,
        "front_share": (front1.cpu - front0.cpu) / wall,
        "store_share": (store1.cpu - store0.cpu) / wall,
    }


# --- one process, as today ------------------------------------------------------------------


class _Peer:
    peer = f"{_PEER[0]}:{_PEER[1]}"


async def run_one(
    bursts: Sequence[bytes], seconds: float, warmup: float, tasks: int
) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="split-one-") as root:
        async with open_broker(_config(root)) as broker:
            assert broker.client_side is not None
            processor = broker.client_side.processor
            counts = [0]

            async def one(deadline: float) -> None:
                decoder = FrameDecoder()
                k = 0
                while time.perf_counter() < deadline:
                    decoder.receive_data(bursts[k % len(bursts)])
                    k += 1
                    requests = list(decoder.commands())
                    taken = processor.take_burst(requests, _Peer())  # type: ignore[arg-type]
                    assert taken is not None
                    responses = await taken.finish()
                    out = b"".join(
                        r if isinstance(r, bytes) else encode(r) for r in responses if r is not None
                    )
                    assert out
                    await trio.lowlevel.checkpoint()  # as a connection reads again
                    counts[0] += len(requests)

            async with trio.open_nursery() as nursery:
                for _ in range(tasks):
                    nursery.start_soon(one, time.perf_counter() + warmup)
            cpu0 = proc_sample()
            counts[0] = 0
            started = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(tasks):
                    nursery.start_soon(one, started + seconds)
            wall = time.perf_counter() - started
            cpu1 = proc_sample()
    n = counts[0]
    return {
        "msgs": n / wall,
        "cpu_us": (cpu1.cpu - cpu0.cpu) / n * 1e6,
        "share": (cpu1.cpu - cpu0.cpu) / wall,
    }


async def main(args: argparse.Namespace) -> None:
    bursts = _bursts(args.burst)
    print(
        f"load average {os.getloadavg()[0]:.2f} at the start; "
        f"bursts of {args.burst}, {args.tasks} in flight"
    )
    for r in range(1, args.rounds + 1):
        one = await run_one(bursts, args.seconds, args.warmup, args.tasks)
        print(
            f"round {r} one process: {one['msgs']:,.0f} msgs/s, {one['cpu_us']:.1f} us CPU/msg, "
            f"{one['share'] * 100:.0f}% of a CPU, load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        two = await run_two(bursts, args.seconds, args.warmup, args.tasks)
        print(
            f"round {r} front + store: {two['msgs']:,.0f} msgs/s "
            f"({two['msgs'] / one['msgs']:.2f}x), front {two['front_us']:.1f} + store "
            f"{two['store_us']:.1f} = {two['front_us'] + two['store_us']:.1f} us CPU/msg, "
            f"{two['front_share'] * 100:.0f}% + {two['store_share'] * 100:.0f}% of a CPU, "
            f"load {os.getloadavg()[0]:.2f}",
            flush=True,
        )


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--burst", type=int, default=16, help="sends per read")
    parser.add_argument("--tasks", type=int, default=8, help="reads in flight")
    parser.add_argument("--store-at", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.store_at is not None:
        trio.run(_serve_store, args.store_at)
    else:
        trio.run(main, args)


if __name__ == "__main__":
    cli()
