"""Catch-up: a slave starting empty copies a master's whole backlog, in two processes.

The master serves a slave reporting 0 from its oldest offset (``ha_sync_from_oldest``), so the
slave copies everything; the clock runs from the slave's start to the moment its log ends where
the master's does, and the two commit logs are then compared byte for byte. Both processes are
sampled from ``/proc`` meanwhile: CPU seconds over the copy, peak RSS, and the anonymous part of
it (file pages of a mapped segment count in RSS too, and are the page cache, not the heap).

:func:`catch_up_from_peer` has our slave copy from another implementation's master (which must
already hold a backlog). The opposite direction, another implementation's slave copying from our
master, runs on the in-process master of :mod:`_puts`, so that the same connection then carries
the put measurements.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import trio

from bench._common import MIB, Child, PeakTracker, open_child, phase_progress, proc_sample

#: Seconds between the catching-up slave's progress events (what the progress report shows).
PROGRESS_INTERVAL = 0.5

#: How long a slave facing a foreign master must see no growth before the copy counts as done.
IDLE_DONE = 3.0
PEER_TIMEOUT = 600.0


def same_logs(master_root: Path, slave_root: Path, *, end: int, segment_size: int) -> str | None:
    """None if both commit logs hold the same bytes over ``[0, end)``, else where they differ.

    Segment files past *end* are not compared: a master whose log ends exactly at a segment
    boundary may already have created the next, still empty, file.
    """
    for start in range(0, end, segment_size):
        name = f"{start:020d}"
        length = min(segment_size, end - start)
        paths = (master_root / "commitlog" / name, slave_root / "commitlog" / name)
        missing = [str(p) for p in paths if not p.exists()]
        if missing:
            return f"missing {', '.join(missing)}"
        with paths[0].open("rb") as a, paths[1].open("rb") as b:
            pos = 0
            while pos < length:
                n = min(8 * MIB, length - pos)
                x, y = a.read(n), b.read(n)
                if x != y:
                    first = next(
                        (i for i, (u, v) in enumerate(zip(x, y, strict=False)) if u != v),
                        min(len(x), len(y)),
                    )
                    return f"{name}: first difference at byte {pos + first}"
                pos += n
    return None


def _node_args(
    kind: str, store: Path, segment_size: int, batch_size: int, bare: bool = False
) -> list[str]:
    args = [
        kind,
        "--store",
        str(store),
        "--segment-size",
        str(segment_size),
        "--batch-size",
        str(batch_size),
    ]
    return [*args, "--bare"] if bare else args


async def catch_up(
    work: Path,
    *,
    backlog: Path,
    end: int,
    segment_size: int,
    batch_size: int,
    tag: str,
    bare: bool = False,
) -> dict[str, Any]:
    """Our master (child process) on *backlog*, our slave (child process) from empty.

    *bare* runs the replication path alone in both (no consume queues, no client port).
    """
    slave_root = work / f"slave-{tag}"
    # Nothing reads the master's progress lines: keep them rare, or a full pipe would stall it.
    margs = [
        *_node_args("master", backlog, segment_size, batch_size, bare),
        "--sync-from-oldest",
        "--interval",
        "3600",
    ]
    async with open_child("_node", margs, "master") as master:
        ready = await master.next_event("ready")
        host, port = ready["ha"]
        mtrack = PeakTracker(master.pid, 0.1)
        sargs = [
            *_node_args("slave", slave_root, segment_size, batch_size, bare),
            "--master",
            f"{host}:{port}",
            "--until",
            str(end),
            "--interval",
            str(PROGRESS_INTERVAL),
        ]
        async with open_child("_node", sargs, "slave") as slave, trio.open_nursery() as nursery:
            strack = PeakTracker(slave.pid, 0.05)
            sready = await slave.next_event("ready")
            mtrack.sample()
            nursery.start_soon(strack.run)
            nursery.start_soon(mtrack.run)
            reached = await _follow_copy(slave, sready, end)
            mtrack.sample()
            strack.sample()
            nursery.cancel_scope.cancel()
            slave_hwm = proc_sample(slave.pid).hwm
            master_hwm = proc_sample(master.pid).hwm
            await slave.stop()
        await master.stop()
    seconds = reached["t"] - sready["t"]
    t0 = time.perf_counter()
    differs = same_logs(backlog, slave_root, end=end, segment_size=segment_size)
    compare_s = time.perf_counter() - t0
    return {
        "bare": bare,
        "bytes": end,
        "seconds": seconds,
        "mib_s": end / seconds / MIB,
        "identical": differs is None,
        "difference": differs,
        "compare_seconds": compare_s,
        "slave_cpu": reached["cpu"] - sready["cpu"],
        "master_cpu": mtrack.cpu,
        "slave_peak_rss": max(slave_hwm, strack.peak_rss),
        "slave_peak_anon": strack.peak_anon,
        "master_peak_rss": max(master_hwm, mtrack.peak_rss),
        "master_peak_anon": mtrack.peak_anon,
        "slave_rss_series": [(t - sready["t"], rss, anon) for t, rss, anon in strack.series],
    }


async def _follow_copy(slave: Child, ready: dict[str, Any], end: int) -> dict[str, Any]:
    """Report the slave's copy from its progress events (bytes of the backlog, rate, ETA)
    until its ``reached`` event, which is returned."""
    base = int(ready["max_offset"])
    with phase_progress("slave catch-up", end - base, start=ready["t"]) as progress:
        while True:
            event = await slave.next_event()
            if event.get("event") == "reached":
                progress.set(int(event["offset"]) - base)
                return event
            if event.get("event") == "progress":
                progress.set(int(event["max_offset"]) - base)


async def catch_up_from_peer(work: Path, *, master: str, segment_size: int) -> dict[str, Any]:
    """Our slave (child process) copies whatever a foreign master serves to an empty slave."""
    slave_root = work / "slave-peer"
    sargs = [
        *_node_args("slave", slave_root, segment_size, 32 * 1024),
        "--master",
        master,
        "--interval",
        "0.2",
    ]
    async with open_child("_node", sargs, "slave") as slave, trio.open_nursery() as nursery:
        strack = PeakTracker(slave.pid, 0.05)
        sready = await slave.next_event("ready")
        nursery.start_soon(strack.run)
        deadline = time.monotonic() + PEER_TIMEOUT
        last: dict[str, Any] = sready
        while time.monotonic() < deadline:
            last = await slave.next_event("progress")
            if last["max_offset"] > 0 and last["t"] - last["grew_at"] >= IDLE_DONE:
                break
        nursery.cancel_scope.cancel()
        hwm = proc_sample(slave.pid).hwm
    copied = last["max_offset"] - last.get("min_offset", 0)
    seconds = max(1e-9, last["grew_at"] - sready["t"])
    return {
        "peer": master,
        "bytes": copied,
        "seconds": seconds,
        "mib_s": copied / seconds / MIB,
        "slave_cpu": last["cpu"] - sready["cpu"],
        "slave_peak_rss": max(hwm, strack.peak_rss),
        "slave_peak_anon": strack.peak_anon,
        "note": "time to the last byte received; the copy counts as done after "
        f"{IDLE_DONE:g} s without growth",
    }
