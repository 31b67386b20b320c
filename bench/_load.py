"""Producers for the client-port benchmark, each in a process of its own.

``python -m bench._load official NAMESRV TOPIC THREADS BODY WARMUP SECONDS`` drives the official
RocketMQ client (the C++ core of the ``rocketmq`` wheel): THREADS threads each calling
``Producer.send_sync`` in a loop, as a Java ``DefaultMQProducer`` user's sending threads would
(the ctypes call releases the GIL, so the C++ client runs them in parallel).

``python -m bench._load trio NAMESRV TOPIC TASKS BODY WARMUP SECONDS`` does the same with
trioha's own Trio client (``trioha.remoting._mqclient.send_message``), TASKS concurrent tasks
over one connection, queues taken round-robin.

Both print JSON lines (see :class:`bench._common.Child`): ``ready`` once connected,
``window_start`` after the warm-up, then ``window_end`` with the count, the latencies'
percentiles and the send results by status, and finally ``exit``. The parent reads the brokers'
CPU at ``window_start`` and ``window_end``.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from typing import Any

import trio

from bench._common import emit, percentile, self_cpu


def _summary(
    latencies: list[float], elapsed: float, statuses: dict[str, int], errors: list[str]
) -> dict[str, Any]:
    return {
        "count": len(latencies),
        "seconds": elapsed,
        "msgs_s": len(latencies) / elapsed if elapsed else 0.0,
        "p50_us": percentile(latencies, 0.5) * 1e6,
        "p99_us": percentile(latencies, 0.99) * 1e6,
        "p999_us": percentile(latencies, 0.999) * 1e6,
        "statuses": statuses,
        "errors": errors[:5],
        "client_cpu": self_cpu(),
    }


def official(
    namesrv: str, topic: str, threads: int, *, body_size: int, warmup: float, seconds: float
) -> None:
    from rocketmq.client import (  # type: ignore[import-untyped,import-not-found,unused-ignore]
        Message,
        Producer,
    )

    producer = Producer(f"bench-{threads}-{time.monotonic_ns()}")
    producer.set_namesrv_addr(namesrv)
    producer.set_timeout(10000)
    producer.start()
    body = bytes(65 + i % 26 for i in range(body_size))  # no NUL: the C API takes C strings
    # A first send resolves the route (and lets the broker create the topic) before timing.
    first = Message(topic)
    first.set_body(body)
    producer.send_sync(first)
    emit(event="ready")
    lock = threading.Lock()
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    errors: list[str] = []
    state = {"measuring": False, "stop": False}

    def sender() -> None:
        mine: list[float] = []
        mine_statuses: dict[str, int] = {}
        mine_errors: list[str] = []
        perf = time.perf_counter
        while not state["stop"]:
            message = Message(topic)
            message.set_body(body)
            t0 = perf()
            try:
                result = producer.send_sync(message)
                # SendStatus.OK is the Java client's SEND_OK; one name for both loads
                status = "SEND_OK" if result.status.name == "OK" else result.status.name
            except Exception as exc:  # a failed send counts, with its reason
                status = "EXCEPTION"
                if len(mine_errors) < 5:
                    mine_errors.append(repr(exc)[:200])
            t1 = perf()
            if state["measuring"]:
                mine.append(t1 - t0)
                mine_statuses[status] = mine_statuses.get(status, 0) + 1
        with lock:
            latencies.extend(mine)
            errors.extend(mine_errors)
            for key, value in mine_statuses.items():
                statuses[key] = statuses.get(key, 0) + value

    workers = [threading.Thread(target=sender, daemon=True) for _ in range(threads)]
    for worker in workers:
        worker.start()
    time.sleep(warmup)
    emit(event="window_start", t=time.monotonic())
    state["measuring"] = True
    t0 = time.perf_counter()
    time.sleep(seconds)
    state["measuring"] = False
    elapsed = time.perf_counter() - t0
    emit(event="window_stop", t=time.monotonic())
    state["stop"] = True
    for worker in workers:
        worker.join(timeout=30)
    emit(event="window_end", **_summary(latencies, elapsed, statuses, errors))
    producer.shutdown()
    emit(event="exit")


async def trio_client(
    namesrv: str, topic: str, tasks: int, *, body_size: int, warmup: float, seconds: float
) -> None:
    from trioha.remoting import get_route, open_client_pool, send_message

    body = bytes(65 + i % 26 for i in range(body_size))  # no NUL: the C API takes C strings
    async with open_client_pool() as pool:
        route = await get_route(pool, namesrv, topic)
        chosen = next(b for b in route.brokers if b.master)
        broker = chosen.master
        assert broker is not None
        queues = max(1, chosen.write_queue_nums)
        emit(event="ready")
        latencies: list[float] = []
        statuses: dict[str, int] = {}
        errors: list[str] = []
        measuring = False
        stop = False

        async def sender(i: int) -> None:
            perf = time.perf_counter
            n = i
            while not stop:
                t0 = perf()
                try:
                    result = await send_message(
                        pool,
                        broker,
                        topic=topic,
                        body=body,
                        queue_id=n % queues,
                        producer_group="bench",
                    )
                    status = result.status
                except Exception as exc:
                    status = "EXCEPTION"
                    if len(errors) < 5:
                        errors.append(repr(exc)[:200])
                t1 = perf()
                n += 1
                if measuring:
                    latencies.append(t1 - t0)
                    statuses[status] = statuses.get(status, 0) + 1

        async with trio.open_nursery() as nursery:
            for i in range(tasks):
                nursery.start_soon(sender, i)
            await trio.sleep(warmup)
            emit(event="window_start", t=time.monotonic())
            measuring = True
            t0 = time.perf_counter()
            await trio.sleep(seconds)
            measuring = False
            elapsed = time.perf_counter() - t0
            emit(event="window_stop", t=time.monotonic())
            stop = True
        emit(event="window_end", **_summary(latencies, elapsed, statuses, errors))
    emit(event="exit")


def main(argv: list[str]) -> None:
    kind, namesrv, topic, n, body, warmup, seconds = argv
    if kind == "official":
        official(
            namesrv,
            topic,
            int(n),
            body_size=int(body),
            warmup=float(warmup),
            seconds=float(seconds),
        )
    elif kind == "trio":
        trio.run(
            functools.partial(
                trio_client,
                namesrv,
                topic,
                int(n),
                body_size=int(body),
                warmup=float(warmup),
                seconds=float(seconds),
            )
        )
    else:
        raise SystemExit(f"unknown load {kind!r}: official or trio")


if __name__ == "__main__":
    main(sys.argv[1:])
