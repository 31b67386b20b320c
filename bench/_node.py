"""One broker in its own process for the benchmark, driven by JSON lines on stdout.

``python -m bench._node master --store DIR ...`` or ``... slave --store DIR --master HOST:PORT``
runs either

* a whole broker (:func:`trioha.broker.open_broker`: store, HA, flushing, consume queues and the
  client port), or, with ``--bare``,
* the replication path alone: the store, ``HAService`` or ``HAClient`` and the flusher, with no
  consume queues and no client port; what the HA code itself costs.

It prints:

* ``{"event": "ready", ...}`` once it runs (a master adds its HA address);
* ``{"event": "progress", ...}`` every ``--interval`` seconds: the log's end, the time it last
  grew, and for a master every slave's ack;
* ``{"event": "connected", ...}`` (master) when a slave's first report arrives;
* ``{"event": "reached", "t": ...}`` the moment the log end (slave) or a slave's ack (master)
  reaches ``--until``;
* ``{"event": "exit", ...}`` with its CPU seconds and peak RSS when SIGTERM stops it.

With ``--counted`` (and ``--until``) it is the measured side of ``bench/instructions.py``: it
runs on a Trio clock that stands still once it is ready, prints ``ready`` inside its measured
window (:func:`bench._icount.window`), closes the window once a slave's log reaches ``--until``
and its consume queues cover it (a whole broker), or once a master's slave has acked
``--until``, prints ``{"event": "counted", ...}`` and exits.

Times are ``time.monotonic()``, which on Linux is one clock for every process, so the parent can
subtract them from its own.
"""

from __future__ import annotations

import argparse
import logging
import math
import resource
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import attrs
import trio
from trio.testing import MockClock

from bench._common import KIB, AckWatch, emit, self_cpu
from bench._icount import make_deterministic, window
from trioha._config import BrokerConfig, BrokerRole
from trioha._tuning import tune_gc_for_serving
from trioha.broker import open_broker
from trioha.net import HAClient, HAService, Wakeup
from trioha.store import CommitLog, open_store


@attrs.define
class Node:
    """What the watchers need of a running broker or bare HA path."""

    commitlog: CommitLog
    grew: Wakeup
    service: HAService | None = None
    client: HAClient | None = None
    address: tuple[str, int] | None = None
    #: A whole broker: returns once its consume queues cover the offset given.
    dispatched: Callable[[int], Awaitable[None]] | None = None

    async def wait_log_grew(self, beyond: int) -> None:
        while self.commitlog.max_offset <= beyond:
            await self.grew.wait()


@asynccontextmanager
async def open_node(config: BrokerConfig, *, bare: bool, follow: bool) -> AsyncIterator[Node]:
    """A broker (or the bare HA path); *follow* relays every log growth to ``Node.grew``.

    Following costs a task switch per append, which would show in per-put figures: a slave
    serving puts does not follow.
    """
    if not bare:
        async with open_broker(config) as broker:
            node = Node(
                broker.store.commitlog,
                Wakeup(),
                broker.ha_service,
                broker.ha_client,
                broker.ha_address,
            )
            if broker.client_side is not None:
                node.dispatched = broker.client_side.reput.wait_dispatched

            async def relay() -> None:  # the broker's own growth signal, as a Wakeup
                while True:
                    await broker.wait_log_grew(node.commitlog.max_offset)
                    node.grew.notify()

            async with trio.open_nursery() as nursery:
                if follow:
                    nursery.start_soon(relay)
                yield node
                nursery.cancel_scope.cancel()
        return
    store = await trio.to_thread.run_sync(
        lambda: open_store(config.store_root, segment_size=config.mapped_file_size_commit_log)
    )
    try:
        node = Node(store.commitlog, Wakeup())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_flusher, store.commitlog, config.flush_interval_commit_log / 1000)
            if config.broker_role.is_master:
                node.service = HAService(config, store.commitlog)
                node.address = await nursery.start(node.service.serve)
            else:
                grew = node.grew.notify if follow else None
                node.client = HAClient(config, store.commitlog, on_appended=grew)
                await nursery.start(node.client.run)
            yield node
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(store.close)


async def _flusher(commitlog: CommitLog, interval: float) -> None:
    """The broker's ASYNC_FLUSH loop (``FlushRealTimeService``), for the bare path."""
    while True:
        await trio.sleep(interval)
        if commitlog.max_offset > commitlog.flushed_offset:
            await trio.to_thread.run_sync(commitlog.flush)


async def _watch_slave(node: Node, until: int | None, interval: float, follow_growth: bool) -> None:
    commitlog = node.commitlog
    state = {"grew_at": time.monotonic(), "end": commitlog.max_offset}

    async def follow() -> None:
        while True:
            end = commitlog.max_offset
            if end != state["end"]:
                state["end"], state["grew_at"] = end, time.monotonic()
            if until is not None and end >= until:
                emit(event="reached", t=time.monotonic(), offset=end, cpu=self_cpu())
                return
            await node.wait_log_grew(end)

    async def report() -> None:
        while True:
            client = node.client
            emit(
                event="progress",
                t=time.monotonic(),
                min_offset=commitlog.min_offset,
                max_offset=commitlog.max_offset,
                grew_at=state["grew_at"],
                connected=bool(client and client.connected),
                cpu=self_cpu(),
            )
            await trio.sleep(interval)

    if not follow_growth:
        await report()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(report)
        await follow()
        nursery.cancel_scope.cancel()
    await trio.sleep_forever()


async def _watch_master(
    node: Node, until: int | None, interval: float, follow_growth: bool
) -> None:
    assert node.service is not None
    acks = AckWatch(node.service)
    reached = until is None
    connected = False
    next_report = -math.inf
    while True:
        now = time.monotonic()
        best = acks.best
        if best >= 0 and not connected:
            emit(event="connected", t=now, offset=best)
            connected = True
        if not reached and until is not None and best >= until:
            emit(event="reached", t=now, offset=best)
            reached = True
        if now >= next_report:
            emit(
                event="progress",
                t=now,
                max_offset=node.commitlog.max_offset,
                acks=node.service.live_acks(),
            )
            next_report = now + interval
        with trio.move_on_after(max(0.0, next_report - now)):
            await acks.wakeup.wait()


async def _counted(node: Node, until: int, clock: MockClock) -> None:
    """The measured window of ``--counted``: from ready until *until* is copied (and indexed)."""
    acks = AckWatch(node.service) if node.service is not None else None
    with window(clock):
        emit(event="ready", t=time.monotonic(), ha=list(node.address or ()), max_offset=0, cpu=0)
        if acks is not None:
            await acks.wait_acked(until)
        else:
            while node.commitlog.max_offset < until:
                await node.wait_log_grew(node.commitlog.max_offset)
            if node.dispatched is not None:
                await node.dispatched(until)
    emit(event="counted", offset=node.commitlog.max_offset)


async def run(args: argparse.Namespace, clock: MockClock | None = None) -> None:
    role = BrokerRole(args.role)
    config = BrokerConfig(
        broker_role=role,
        store_path_root_dir=str(args.store),
        mapped_file_size_commit_log=args.segment_size,
        ha_listen_host=args.listen_host,
        ha_listen_port=args.listen_port,
        listen_port=0,  # the client port: any free one
        ha_master_address=args.master,
        ha_sync_from_oldest=args.sync_from_oldest,
        ha_transfer_batch_size=args.batch_size,
        flush_interval_commit_log=args.flush_interval,
    )
    max_offset = -1
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        follow = not args.no_follow
        async with (
            open_node(config, bare=args.bare, follow=follow) as node,
            trio.open_nursery() as nursery,
        ):
            if clock is not None:
                await _counted(node, args.until, clock)
                return
            emit(
                event="ready",
                t=time.monotonic(),
                ha=list(node.address or ()),
                max_offset=node.commitlog.max_offset,
                cpu=self_cpu(),
            )
            watch = _watch_master if role.is_master else _watch_slave
            nursery.start_soon(watch, node, args.until, args.interval, follow)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break
            max_offset = node.commitlog.max_offset
    usage = resource.getrusage(resource.RUSAGE_SELF)
    emit(
        event="exit",
        cpu=usage.ru_utime + usage.ru_stime,
        maxrss=usage.ru_maxrss * KIB,
        max_offset=max_offset,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=["master", "slave"])
    parser.add_argument("--store", required=True)
    parser.add_argument("--segment-size", type=int, required=True)
    parser.add_argument("--role", default=None, help="master: ASYNC_MASTER or SYNC_MASTER")
    parser.add_argument("--listen-host", default="127.0.0.1")
    parser.add_argument("--listen-port", type=int, default=0)
    parser.add_argument("--master", default=None, help="slave: the master's HA HOST:PORT")
    parser.add_argument("--sync-from-oldest", action="store_true")
    parser.add_argument("--batch-size", type=int, default=32 * KIB)
    parser.add_argument("--bare", action="store_true", help="the replication path alone")
    parser.add_argument("--flush-interval", type=int, default=500, help="ASYNC_FLUSH period, ms")
    parser.add_argument("--until", type=int, default=None)
    parser.add_argument(
        "--no-follow",
        action="store_true",
        help="slave: do not watch every append (no 'reached', no 'grew_at')",
    )
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument(
        "--counted", action="store_true", help="bench/instructions.py's measured side (--until)"
    )
    args = parser.parse_args()
    if args.counted and args.until is None:
        parser.error("--counted needs --until")
    if args.kind == "slave":
        args.role = "SLAVE"
    elif args.role is None:
        args.role = "ASYNC_MASTER"
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    tune_gc_for_serving()  # as `python -m trioha master|slave` does
    if args.counted:
        make_deterministic()
        clock = MockClock(rate=1.0)
        trio.run(run, args, clock, clock=clock)
    else:
        trio.run(run, args)


if __name__ == "__main__":
    main()
