"""Puts on a master in this process, replicated to a slave in another: sync cost and async lag.

The master runs here (producers are Trio tasks calling ``Broker.put``, as a broker's request
handlers would), the slave in a child process (or a foreign slave that connects to the address
given). Both replication modes use the *same* master, slave and connection: the put policy is
read from ``Broker.role`` on every put (``Broker._wait_policies``), so switching it between
SYNC_MASTER and ASYNC_MASTER from one measurement to the next compares the two modes over the
same link, log and warm caches, which matters on a noisy shared machine.

Messages per ack counts puts completed per ack the master received in the window: how many puts
one 8-byte report releases (group commit).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from bench._common import (
    MIB,
    AckWatch,
    PeakTracker,
    open_child,
    percentile,
    proc_sample,
    self_cpu,
)
from trioha._config import BrokerConfig, BrokerRole
from trioha._status import PutStatus
from trioha.broker import Broker, open_broker
from trioha.store import NewMessage

TOPIC = "BenchTopic"
CONNECT_TIMEOUT = 30.0
PEER_TIMEOUT = 600.0
DRAIN_TIMEOUT = 60.0


@attrs.define
class Pair:
    """The master broker here and what is known of its slave."""

    master: Broker
    acks: AckWatch
    slave_pid: int | None = None
    connected_at: float = 0.0  # time.perf_counter() when the slave's first report arrived


@asynccontextmanager
async def open_pair(
    work: Path, *, root: Path, segment_size: int, peer_slave: str | None
) -> AsyncIterator[Pair]:
    """A SYNC_MASTER on store *root* with one slave streaming from it (ours, or the peer's).

    A slave reporting 0 is served from the oldest offset, so a peer slave starting empty
    copies whatever *root* already holds (see :func:`peer_catch_up`).
    """
    host, port = "127.0.0.1", 0
    if peer_slave is not None:
        host, _, p = peer_slave.rpartition(":")
        port = int(p)
    config = BrokerConfig(
        broker_role=BrokerRole.SYNC_MASTER,
        store_path_root_dir=str(root),
        mapped_file_size_commit_log=segment_size,
        ha_listen_host=host,
        ha_listen_port=port,
        listen_port=0,  # the client port: any free one
        ha_sync_from_oldest=True,
    )
    async with open_broker(config) as master:
        assert master.ha_service is not None and master.ha_address is not None
        service = master.ha_service
        pair = Pair(master, AckWatch(service))
        if peer_slave is not None:
            print(
                f"  waiting up to {PEER_TIMEOUT:g} s for the peer slave to connect to "
                f"{peer_slave} (it must start empty)",
                flush=True,
            )
            if not await service.wait_connections(1, trio.current_time() + PEER_TIMEOUT):
                raise RuntimeError(f"no slave connected to {peer_slave}")
            pair.connected_at = time.perf_counter()
            yield pair
            return
        mhost, mport = master.ha_address
        args = [
            "slave",
            "--store",
            str(work / "put-slave"),
            "--segment-size",
            str(segment_size),
            "--master",
            f"{mhost}:{mport}",
            "--interval",
            "3600",
            "--no-follow",
        ]
        async with open_child("_node", args, "slave") as slave:
            await slave.next_event("ready")
            if not await service.wait_connections(1, trio.current_time() + CONNECT_TIMEOUT):
                raise RuntimeError("our slave did not connect")
            pair.connected_at = time.perf_counter()
            pair.slave_pid = slave.pid
            yield pair


async def peer_catch_up(pair: Pair) -> dict[str, Any]:
    """Time from the slave's first report until it acks the master's end (a foreign slave)."""
    end = pair.master.store.commitlog.max_offset
    first = max(0, pair.acks.best)
    cpu0 = self_cpu()
    with trio.fail_after(PEER_TIMEOUT):
        await pair.acks.wait_acked(end)
    seconds = time.perf_counter() - pair.connected_at
    return {
        "bytes": end - first,
        "seconds": seconds,
        "mib_s": (end - first) / seconds / MIB,
        "master_cpu": self_cpu() - cpu0,
        "note": "from the peer slave's first report to its ack of the master's end",
    }


def _slave_cpu(pair: Pair) -> float:
    return proc_sample(pair.slave_pid).cpu if pair.slave_pid is not None else 0.0


async def put_cell(
    pair: Pair, *, mode: BrokerRole, producers: int, body_size: int, seconds: float, warmup: float
) -> dict[str, Any]:
    """*producers* tasks putting *body_size*-byte messages for *seconds* (after *warmup*)."""
    master = pair.master
    master.role = mode
    body = bytes(i % 251 for i in range(body_size))
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    measuring = False
    stop = False

    async def producer(queue_id: int) -> None:
        put = master.put
        perf = time.perf_counter
        checkpoint = trio.lowlevel.checkpoint
        while not stop:
            t0 = perf()
            result = await put(NewMessage(TOPIC, body, queue_id=queue_id))
            # An ASYNC put returns without yielding to Trio; a real handler reads its next
            # request from a socket, which does. Without this the loop would starve every task.
            await checkpoint()
            if measuring:
                latencies.append(perf() - t0)
                statuses[result.status.value] = statuses.get(result.status.value, 0) + 1

    async with trio.open_nursery() as nursery:
        for i in range(producers):
            nursery.start_soon(producer, i % 8)
        await trio.sleep(warmup)
        measuring = True
        acks0, cpu0, scpu0 = pair.acks.count, self_cpu(), _slave_cpu(pair)
        t0 = time.perf_counter()
        await trio.sleep(seconds)
        measuring = False
        elapsed = time.perf_counter() - t0
        acks, cpu = pair.acks.count - acks0, self_cpu() - cpu0
        scpu = _slave_cpu(pair) - scpu0
        stop = True
    # Let the slave hold everything, so one cell's backlog never slows the next.
    with trio.move_on_after(DRAIN_TIMEOUT):
        await pair.acks.wait_acked(master.store.commitlog.max_offset)
    puts = len(latencies)
    ok = statuses.get(PutStatus.PUT_OK.value, 0)
    return {
        "mode": mode.value,
        "producers": producers,
        "body": body_size,
        "puts": puts,
        "puts_s": puts / elapsed,
        "mib_s": puts * body_size / elapsed / MIB,
        "p50_ms": percentile(latencies, 0.5) * 1e3,
        "p99_ms": percentile(latencies, 0.99) * 1e3,
        "p999_ms": percentile(latencies, 0.999) * 1e3,
        "acks": acks,
        "msgs_per_ack": puts / acks if acks else None,
        "not_ok": puts - ok,
        "statuses": statuses,
        "master_cpu_pct": cpu / elapsed * 100,
        "slave_cpu_pct": scpu / elapsed * 100 if pair.slave_pid is not None else None,
        "master_cpu_us": cpu / max(1, puts) * 1e6,
        "slave_cpu_us": scpu / max(1, puts) * 1e6 if pair.slave_pid is not None else None,
    }


async def lag_under_load(
    pair: Pair, *, producers: int, body_size: int, seconds: float, sample_every: float = 0.005
) -> dict[str, Any]:
    """ASYNC_MASTER with producers at full speed; the slave's ack lag in bytes and in time.

    Lag in time for an ack of offset A seen at t: t minus the moment the master's log first
    reached A (from the master's own end-offset samples, so resolution is ``sample_every``).
    """
    master = pair.master
    master.role = BrokerRole.ASYNC_MASTER
    commitlog = master.store.commitlog
    body = bytes(i % 251 for i in range(body_size))
    ends_t: list[float] = []
    ends: list[int] = []
    samples: list[tuple[float, int, float]] = []  # (t, lag bytes, lag seconds)
    puts = 0
    stop = False

    async def producer(queue_id: int) -> None:
        nonlocal puts
        while not stop:
            await master.put(NewMessage(topic=TOPIC, body=body, queue_id=queue_id))
            await trio.lowlevel.checkpoint()  # see put_cell
            puts += 1

    def sample(t0: float) -> None:
        now = time.perf_counter()
        end = commitlog.max_offset
        if not ends or end > ends[-1]:
            ends_t.append(now)
            ends.append(end)
        ack = pair.acks.best
        i = bisect.bisect_left(ends, ack)
        behind_s = now - ends_t[i] if i < len(ends) else 0.0
        samples.append((now - t0, end - ack, behind_s))

    t0 = time.perf_counter()
    cpu0, scpu0 = self_cpu(), _slave_cpu(pair)
    tracker = PeakTracker(pair.slave_pid, 0.1) if pair.slave_pid is not None else None
    start_end = commitlog.max_offset

    async def sampler() -> None:
        while True:
            sample(t0)
            await trio.sleep(sample_every)

    async with trio.open_nursery() as nursery:
        if tracker is not None:
            nursery.start_soon(tracker.run)
        for i in range(producers):
            nursery.start_soon(producer, i % 8)
        nursery.start_soon(sampler)
        await trio.sleep(seconds)
        stop = True
        loaded = time.perf_counter() - t0
        produced = commitlog.max_offset - start_end
        # Drain, still sampling, until the slave holds everything.
        with trio.move_on_after(DRAIN_TIMEOUT):
            await pair.acks.wait_acked(commitlog.max_offset)
        drained = time.perf_counter() - t0 - loaded
        sample(t0)
        nursery.cancel_scope.cancel()
    cpu, scpu = self_cpu() - cpu0, _slave_cpu(pair) - scpu0
    under_load = [s for s in samples if s[0] <= loaded]
    lag_bytes = [float(s[1]) for s in under_load]
    lag_s = [s[2] for s in under_load]
    return {
        "producers": producers,
        "body": body_size,
        "seconds": loaded,
        "puts_s": puts / loaded,
        "produced_mib_s": produced / loaded / MIB,
        "lag_bytes_p50": percentile(lag_bytes, 0.5),
        "lag_bytes_p99": percentile(lag_bytes, 0.99),
        "lag_bytes_max": max(lag_bytes, default=0.0),
        "lag_ms_p50": percentile(lag_s, 0.5) * 1e3,
        "lag_ms_p99": percentile(lag_s, 0.99) * 1e3,
        "drain_seconds": drained,
        "master_cpu_pct": cpu / (loaded + drained) * 100,
        "slave_cpu_pct": scpu / (loaded + drained) * 100 if pair.slave_pid is not None else None,
        "slave_peak_rss": tracker.peak_rss if tracker is not None else None,
        "series": _thin(samples, 400),
    }


def _thin(samples: list[tuple[float, int, float]], keep: int) -> list[tuple[float, int, float]]:
    step = max(1, len(samples) // keep)
    return samples[::step]


Progress = Callable[[str], None]


async def sync_grid(
    pair: Pair,
    *,
    producers: list[int],
    bodies: list[int],
    seconds: float,
    warmup: float,
    repeat: int,
    progress: Progress,
) -> list[dict[str, Any]]:
    """Every (body, producers) cell, SYNC_MASTER and ASYNC_MASTER back to back, *repeat* times.

    Each mode keeps its best repetition (highest puts/s): on a shared machine the best run is
    the one least disturbed by others, and both modes get the same treatment.
    """
    cells: list[dict[str, Any]] = []
    total = 2 * len(bodies) * len(producers)  # cells reported: two modes of each
    for body in bodies:
        for n in producers:
            best: dict[BrokerRole, dict[str, Any]] = {}
            runs: dict[BrokerRole, list[float]] = {}
            for _ in range(repeat):
                for mode in (BrokerRole.SYNC_MASTER, BrokerRole.ASYNC_MASTER):
                    cell = await put_cell(
                        pair, mode=mode, producers=n, body_size=body, seconds=seconds, warmup=warmup
                    )
                    runs.setdefault(mode, []).append(cell["puts_s"])
                    if mode not in best or cell["puts_s"] > best[mode]["puts_s"]:
                        best[mode] = cell
            for mode, cell in best.items():
                cell["runs_puts_s"] = runs[mode]
                progress(
                    f"[{len(cells) + 1}/{total}] "
                    f"{mode.value:<12} {body:>5} B x {n:>3}: {cell['puts_s']:>9,.0f} puts/s"
                    f"  p99 {cell['p99_ms']:.2f} ms  ({cell['master_cpu_us']:.0f} us CPU"
                    " per put on the master)"
                )
                cells.append(cell)
    return cells
