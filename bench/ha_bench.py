"""Replication throughput and sync-put latency, each next to this machine's limits.

    .venv/bin/python bench/ha_bench.py [--quick] [--backlog-gib 1] [--segment-size 64M]
                                       [--peer-master HOST:PORT] [--peer-slave HOST:PORT]

One command measures, in this order and in the same run:

1. the limits: loopback TCP between two Python processes (blocking, and with Trio), the same
   into a file, an 8-byte ping-pong, sequential file appends with and without fdatasync;
2. catch-up: a master process holding a backlog of 1 KiB messages and an empty slave process
   (``ha_sync_from_oldest``), at two backlog sizes (so the slave's memory can be compared) and
   once more with the replication path alone (store and HA, no consume queues);
3. puts on a master in this process with its slave in another: SYNC_MASTER and ASYNC_MASTER at
   1..256 concurrent producers and three body sizes;
4. async replication under load: producers at full speed, the slave's lag over time.

With ``--peer-master`` our slave also copies from that (foreign) master; with ``--peer-slave`` our
master also listens there with the backlog, a foreign slave (started empty) copies it, and the
put scenarios run again over that connection. Figures are printed as Markdown tables with ratios
to the limits, saved as JSON (and two PNG plots if matplotlib is installed) under
``bench/results/``. Expect about 5 minutes, or under one with ``--quick``. The machine is shared:
read the ratios and the CPU seconds, and the CPU share line, before the absolute figures.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

if not __package__:  # run as ``python bench/ha_bench.py``: import ``bench`` from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _catchup, _limits, _puts, _report
from bench._backlog import make_backlog
from bench._common import BENCH_DIR, GIB, MIB
from trioha._tuning import tune_gc_for_serving

RESULTS = BENCH_DIR / "results"


def cpu_share(seconds: float = 0.3) -> float:
    """The fraction of a CPU one busy thread gets right now (1.0 on an idle machine)."""
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    x = 0
    while time.perf_counter() - wall0 < seconds:
        x += 1
    return (time.thread_time() - cpu0) / (time.perf_counter() - wall0)


def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower().removesuffix("ib").removesuffix("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller and shorter (under a minute)")
    p.add_argument(
        "--backlog-gib",
        type=float,
        default=None,
        help="catch-up backlog (default 1, quick 0.25); a quarter of it is run too",
    )
    p.add_argument(
        "--segment-size",
        type=_size,
        default=64 * MIB,
        help="commit log segment size (default 64M, as in docs/rocketmq-protocol.md §11.1)",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="measured seconds per put cell (default 1.5, quick 1)",
    )
    p.add_argument(
        "--repeat", type=int, default=None, help="runs per put cell, best kept (default 2, quick 1)"
    )
    p.add_argument(
        "--peer-master",
        metavar="HOST:PORT",
        help="also copy from this foreign master's HA port with our slave",
    )
    p.add_argument(
        "--peer-slave",
        metavar="HOST:PORT",
        help="also serve the backlog on this address to a foreign slave, then run "
        "the put scenarios over that connection",
    )
    p.add_argument(
        "--only",
        default="limits,catchup,puts,lag",
        help="comma-separated sections to run (default: all)",
    )
    p.add_argument("--dir", type=Path, help="work directory (default: a temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--out", type=Path, default=RESULTS, help="where JSON and plots go")
    return p.parse_args(argv)


def say(text: str) -> None:
    print(text, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tune_gc_for_serving()  # the put scenarios' master runs here; the CLI tunes the same way
    quick = args.quick
    sections = set(args.only.split(","))
    backlog_total = int((args.backlog_gib or (0.25 if quick else 1.0)) * GIB)
    seg = args.segment_size
    seconds = args.seconds or (1.0 if quick else 1.5)
    producers = [1, 16, 64] if quick else [1, 4, 16, 64, 256]
    bodies = [1024] if quick else [128, 1024, 4096]
    work = args.dir or Path(tempfile.mkdtemp(prefix="trioha-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results: dict[str, Any] = {
        "meta": {
            "when": stamp,
            "quick": quick,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_start": os.getloadavg()[0],
            "cpu_share": {"start": cpu_share()},
            "segment_size": seg,
            "backlog": backlog_total,
            "argv": sys.argv[1:],
        }
    }
    try:
        if "limits" in sections:
            say("limits ...")
            results["limits"] = _limits.measure(work, quick=quick)
        backlog = small = None
        if "catchup" in sections:
            say(f"building a backlog of {backlog_total // 4 // MIB} MiB (1 KiB messages) ...")
            small = work / "backlog-small"
            small_end = make_backlog(
                small, total=backlog_total // 4, segment_size=seg, body_size=1024
            )
        if "catchup" in sections or args.peer_slave:
            say(f"building a backlog of {backlog_total // MIB} MiB (1 KiB messages) ...")
            backlog = work / "backlog"
            end = make_backlog(backlog, total=backlog_total, segment_size=seg, body_size=1024)
        if "catchup" in sections:
            assert backlog is not None and small is not None
            runs: list[dict[str, Any]] = []
            for label, root, stop, bare in (
                (f"broker, {small_end // MIB} MiB", small, small_end, False),
                (f"broker, {end // MIB} MiB", backlog, end, False),
                (f"replication path alone, {end // MIB} MiB", backlog, end, True),
            ):
                say(f"catch-up: {label} ...")
                tag = str(len(runs))
                run = trio.run(
                    functools.partial(
                        _catchup.catch_up,
                        work,
                        backlog=root,
                        end=stop,
                        segment_size=seg,
                        batch_size=32 * 1024,
                        tag=tag,
                        bare=bare,
                    )
                )
                run["label"] = label
                say(f"  {run['mib_s']:,.0f} MiB/s, identical: {run['identical']}")
                runs.append(run)
                shutil.rmtree(work / f"slave-{tag}", ignore_errors=True)
            results["catch_up"] = runs
        if args.peer_master:
            say(f"catch-up from the peer master {args.peer_master} ...")
            run = trio.run(
                lambda: _catchup.catch_up_from_peer(work, master=args.peer_master, segment_size=seg)
            )
            run["label"] = f"our slave from peer master {args.peer_master}"
            results.setdefault("catch_up", []).append(run)
        plan: dict[str, Any] = {
            "producers": producers,
            "bodies": bodies,
            "seconds": seconds,
            "sections": sections,
        }
        if "puts" in sections or "lag" in sections:
            results.update(
                trio.run(
                    functools.partial(
                        _put_scenarios,
                        args,
                        work,
                        root=work / "put-master",
                        peer=None,
                        who="own",
                        **plan,
                    )
                )
            )
        if args.peer_slave:
            assert backlog is not None
            results.update(
                trio.run(
                    functools.partial(
                        _put_scenarios,
                        args,
                        work,
                        root=backlog,
                        peer=args.peer_slave,
                        who="peer",
                        **plan,
                    )
                )
            )
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    results["meta"]["load_end"] = os.getloadavg()[0]
    results["meta"]["cpu_share"]["end"] = cpu_share()
    results["targets"] = targets(results)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"ha-{stamp}"
    text = render(results)
    stem.with_suffix(".json").write_text(json.dumps(results, indent=1))
    stem.with_suffix(".md").write_text(text)
    plots = _report.plot(results, stem)
    print()
    print(text)
    print(f"\nsaved {stem}.json and .md" + "".join(f", {p.name}" for p in plots))
    return 0


async def _put_scenarios(
    args: argparse.Namespace,
    work: Path,
    *,
    root: Path,
    peer: str | None,
    producers: list[int],
    bodies: list[int],
    seconds: float,
    sections: set[str],
    who: str,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    seg = args.segment_size
    async with _puts.open_pair(work, root=root, segment_size=seg, peer_slave=peer) as pair:
        if peer is not None:
            say("  the peer slave is copying the backlog ...")
            run = await _puts.peer_catch_up(pair)
            run["label"] = f"peer slave {peer} from our master"
            out["catch_up_peer"] = [run]
        if "puts" in sections:
            say(f"puts ({who} slave) ...")
            out["puts"] = {
                who: await _puts.sync_grid(
                    pair,
                    producers=producers,
                    bodies=bodies,
                    seconds=seconds,
                    warmup=0.3,
                    repeat=args.repeat or (1 if args.quick else 2),
                    progress=lambda line: say("  " + line),
                )
            }
        if "lag" in sections:
            say(f"async replication under load ({who} slave) ...")
            lag = await _puts.lag_under_load(
                pair, producers=16, body_size=1024, seconds=3.0 if args.quick else 8.0
            )
            lag["label"] = f"16 producers, 1 KiB, {who} slave"
            out["lag"] = [lag]
    if who == "peer":
        return {f"{k}_peer" if k != "catch_up_peer" else k: v for k, v in out.items()}
    return out


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The goals of docs/performance.md, judged on this run's own figures."""
    out: list[dict[str, Any]] = []
    lim = results.get("limits")
    catch_up = [r for r in results.get("catch_up", []) if "identical" in r]
    if lim and catch_up:
        biggest = max((r for r in catch_up if not r["bare"]), key=lambda r: r["bytes"])
        ratio = biggest["mib_s"] / lim["tcp"]["mib_s"]
        bare = next((r for r in catch_up if r["bare"]), None)
        alone = (
            (
                f"; replication path alone {bare['mib_s'] / lim['tcp']['mib_s']:.0%} "
                f"({bare['mib_s']:,.0f} MiB/s)"
            )
            if bare
            else ""
        )
        out.append(
            {
                "target": "catch-up ≥ 50% of the raw Python loopback copy",
                "figure": f"{ratio:.1%} ({biggest['mib_s']:,.0f} of "
                f"{lim['tcp']['mib_s']:,.0f} MiB/s){alone}",
                "met": ratio >= 0.5,
            }
        )
    if catch_up:
        worst = max(r["slave_peak_rss"] for r in catch_up)
        anon = max(r["slave_peak_anon"] for r in catch_up)
        alone_rss = max((r["slave_peak_rss"] for r in catch_up if r["bare"]), default=0)
        out.append(
            {
                "target": "slave RSS < 100 MiB whatever the backlog",
                "figure": f"peak RSS {worst / MIB:,.0f} MiB, of which anonymous "
                f"{anon / MIB:,.0f} MiB; replication path alone "
                f"{alone_rss / MIB:,.0f} MiB",
                "met": worst < 100 * MIB,
            }
        )
    cells = results.get("puts", {}).get("own", [])

    def cell(mode: str, n: int, body: int = 1024) -> dict[str, Any] | None:
        return next(
            (c for c in cells if c["mode"] == mode and c["producers"] == n and c["body"] == body),
            None,
        )

    s64, a64 = cell("SYNC_MASTER", 64), cell("ASYNC_MASTER", 64)
    if s64 and a64:
        ratio = s64["puts_s"] / a64["puts_s"]
        cpu = a64["master_cpu_us"] / s64["master_cpu_us"]
        out.append(
            {
                "target": "sync puts with 64 producers ≥ 90% of async (1 KiB)",
                "figure": f"{ratio:.0%} ({s64['puts_s']:,.0f} / {a64['puts_s']:,.0f} puts/s); "
                f"by master CPU per put {cpu:.0%} ({a64['master_cpu_us']:.0f} / "
                f"{s64['master_cpu_us']:.0f} µs)",
                "met": ratio >= 0.9,
            }
        )
    s1 = cell("SYNC_MASTER", 1)
    if s1 and lim:
        ratio = s1["p99_ms"] * 1e3 / lim["ping"]["p99_us"]
        out.append(
            {
                "target": "single-producer sync p99 ≤ 3× loopback ping-pong p99",
                "figure": f"{ratio:,.0f}× ({s1['p99_ms'] * 1e3:,.0f} µs vs "
                f"{lim['ping']['p99_us']:.0f} µs; p50 {s1['p50_ms'] * 1e3:,.0f} µs "
                f"vs {lim['ping']['p50_us']:.0f} µs)",
                "met": ratio <= 3,
            }
        )
    return out


def render(results: dict[str, Any]) -> str:
    meta = results["meta"]
    parts = [
        f"# trioha HA benchmark, {meta['when']}" + (" (quick)" if meta["quick"] else ""),
        "",
        _report.machine_line(meta),
    ]
    lim = results.get("limits")
    if lim:
        parts += ["", _report.limits_table(lim)]
    runs = results.get("catch_up", []) + results.get("catch_up_peer", [])
    if runs:
        parts += [
            "",
            f"Catch-up: 1 KiB messages, {meta['segment_size'] // MIB} MiB segments, "
            "master and slave in separate processes, the slave starting empty. RSS is "
            "VmHWM; anonymous memory (the heap) in brackets.",
            "",
            _report.catch_up_table(runs, lim),
        ]
    for key, title in (("puts", "own"), ("puts_peer", "peer")):
        cells = results.get(key, {}).get(title)
        if cells:
            parts += [
                "",
                f"Puts ({title} slave in another process; producers are Trio tasks "
                "calling `Broker.put` in the master's process):",
                "",
                _report.puts_table(cells),
            ]
    lag = results.get("lag", []) + results.get("lag_peer", [])
    if lag:
        parts += ["", _report.lag_table(lag)]
    if results.get("targets"):
        parts += ["", _report.targets_table(results["targets"])]
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    sys.exit(main())
