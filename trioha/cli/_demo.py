"""``python -m trioha demo``: a SYNC_MASTER and a slave on loopback, a workload, a verdict.

The README's main job. It starts both brokers in this process on OS-chosen loopback ports,
puts a sync workload through the master with a progress line, waits for the slave to catch
up, compares the two commit logs byte for byte and prints the figures.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from trioha._config import BrokerConfig, BrokerRole
from trioha._status import PutStatus
from trioha.cli._shared import size

if TYPE_CHECKING:
    from trioha.broker import Broker


def register_commands(sub: Any) -> None:
    """Add ``demo`` to the ``trioha`` command."""
    demo = sub.add_parser("demo", help="run a master and a slave on loopback with a sync workload")
    demo.add_argument("--messages", type=int, default=20000, help="messages to put (default 20000)")
    demo.add_argument("--size", type=size, default=1024, help="body size (default 1K)")
    demo.add_argument("--producers", type=int, default=16, help="concurrent producers")
    demo.add_argument(
        "--mapped-file-size",
        type=size,
        default=8 << 20,
        help="segment size (default 8M, so the workload spans segments)",
    )
    demo.add_argument("--dir", type=Path, help="keep the stores here instead of a temp dir")
    demo.set_defaults(handler=lambda args: trio.run(run_demo, args))


def compare_logs(master: Broker, slave: Broker, chunk: int = 1 << 20) -> int | None:
    """The first offset where the two logs differ over the master's range, or None."""
    mlog, slog = master.store.commitlog, slave.store.commitlog
    if slog.min_offset != mlog.min_offset or slog.max_offset != mlog.max_offset:
        return max(mlog.min_offset, min(mlog.max_offset, slog.max_offset))
    offset = mlog.min_offset
    while offset < mlog.max_offset:
        a = bytes(mlog.read(offset, chunk))
        b = bytes(slog.read(offset, chunk))
        if a != b:
            for i, (x, y) in enumerate(zip(a, b, strict=False)):
                if x != y:
                    return offset + i
            return offset + min(len(a), len(b))
        offset += len(a)
    return None


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_demo(args: argparse.Namespace) -> int:
    base = args.dir or Path(tempfile.mkdtemp(prefix="trioha-demo-"))
    try:
        return await _demo(args, base)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


async def _demo(args: argparse.Namespace, base: Path) -> int:
    from trioha.broker import open_broker  # the broker loads when a demo runs, not for --help

    out = sys.stdout
    common = {
        "mapped_file_size_commit_log": args.mapped_file_size,
        "ha_listen_port": 0,
        "listen_port": 0,
    }
    master_cfg = BrokerConfig(
        broker_role=BrokerRole.SYNC_MASTER, store_path_root_dir=str(base / "master"), **common
    )
    print(f"trioha demo: stores under {base}", file=out)
    async with open_broker(master_cfg) as master:
        assert master.ha_address is not None and master.ha_service is not None
        host, port = master.ha_address
        slave_cfg = BrokerConfig(
            broker_role=BrokerRole.SLAVE,
            store_path_root_dir=str(base / "slave"),
            ha_master_address=f"{host}:{port}",
            **common,
        )
        async with open_broker(slave_cfg) as slave:
            print(f"master (SYNC_MASTER) HA on {host}:{port}; slave connecting", file=out)
            if not await master.ha_service.wait_connections(1, trio.current_time() + 10):
                print("the slave did not connect within 10 s", file=out)
                return 1
            statuses: Counter[PutStatus] = Counter()
            latencies: list[float] = []
            body = bytes(range(256)) * (args.size // 256) + bytes(args.size % 256)
            remaining = iter(range(args.messages))

            async def producer(pid: int) -> None:
                for i in remaining:
                    t0 = time.perf_counter()
                    result = await master.put(
                        topic="TriohaDemo",
                        body=body,
                        tags=f"T{i % 4}",
                        keys=f"k{i}",
                        queue_id=pid % 4,
                    )
                    latencies.append(time.perf_counter() - t0)
                    statuses[result.status] += 1

            async def progress() -> None:
                while True:
                    await trio.sleep(0.5)
                    done = sum(statuses.values())
                    lag = master.store.commitlog.max_offset - slave.store.commitlog.max_offset
                    print(
                        f"\r  {done:>8}/{args.messages} puts, slave behind by {lag:>9} bytes",
                        end="",
                        file=out,
                        flush=True,
                    )

            start = time.perf_counter()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(progress)
                async with trio.open_nursery() as producers:
                    for pid in range(args.producers):
                        producers.start_soon(producer, pid)
                elapsed = time.perf_counter() - start
                with trio.move_on_after(30):
                    mlog, slog = master.store.commitlog, slave.store.commitlog
                    while (seen := slog.max_offset) < mlog.max_offset:
                        await slave.wait_log_grew(seen)
                nursery.cancel_scope.cancel()
            print(file=out)
            differs = compare_logs(master, slave)
            mstats = master.statistics()
            segments = len(list((base / "master" / "commitlog").iterdir()))
            total = mstats.max_offset - mstats.min_offset
            print(
                f"puts: {args.messages} x {args.size} B by {args.producers} producers "
                f"in {elapsed:.2f} s = {args.messages / elapsed:,.0f} puts/s, "
                f"{total / elapsed / (1 << 20):.1f} MiB/s",
                file=out,
            )
            print("statuses: " + ", ".join(f"{s.value} {n}" for s, n in statuses.items()), file=out)
            print(
                f"sync put latency: p50 {_percentile(latencies, 0.5) * 1e3:.2f} ms, "
                f"p99 {_percentile(latencies, 0.99) * 1e3:.2f} ms",
                file=out,
            )
            print(
                f"commit log: {total:,} bytes in {segments} segment(s) of "
                f"{args.mapped_file_size:,} bytes",
                file=out,
            )
            if differs is None:
                print(
                    "verdict: the slave's commit log is byte-for-byte identical to the master's",
                    file=out,
                )
            else:
                print(f"verdict: the logs DIFFER from offset {differs}", file=out)
            ok = differs is None and statuses[PutStatus.PUT_OK] == args.messages
            return 0 if ok else 1
