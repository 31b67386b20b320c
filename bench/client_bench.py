"""Sends through the broker's client port, as a RocketMQ user makes them, side by side.

    .venv/bin/python bench/client_bench.py [--start trioha,java] [--namesrv HOST:PORT]
                                           [--threads 1,64] [--clients official,trio]
                                           [--seconds 5] [--rounds 1] [--only limits,store,client]

Each cell is one producer process sending 1 KiB messages synchronously to a name server +
SYNC_MASTER + slave for ``--seconds`` (after ``--warmup``): with the official client (the C++
core of the ``rocketmq`` wheel, ``send_sync`` from THREADS threads) or with trioha's own Trio
client (THREADS concurrent tasks). It reports msgs/s, latency p50/p99/p99.9, the master's and
the slave's CPU per message (``/proc/<pid>/stat`` over the window), and, where ``perf`` can
count syscall tracepoints, messages per send-type syscall (``sendto``, ``sendmsg``, ``write``,
``writev``) of the master, and of the slave: a slave's sends are its HA acks, so that is
messages per ack.

Brokers: ``--start trioha`` runs the README's commands in child processes; ``--start java``
runs Java RocketMQ 4.9.7 from the reference directory (``TRIOHA_JAVA_ROCKETMQ``, see
``_clusters.py``). The Java processes bind 0.0.0.0, so the benchmark then re-executes itself in a
network namespace of its own (``unshare -n``, loopback up) with every process inside it; without
Java or ``unshare`` it says why and measures trioha alone. ``--namesrv HOST:PORT`` measures any
running broker instead (``--master-pid``/``--slave-pid`` for its CPU figures). With several
brokers the cells alternate between them, so a change in the machine's load hits both.

Beside the cells, in the same run: an 8-byte loopback ping-pong between two processes (blocking
and Trio) and store-level puts (``Broker.put`` from Trio tasks in this process, its slave in
another; SYNC at 1 and 64 producers, ASYNC at 64), and with ``--start java`` the same cells on
Java's ``DefaultMessageStore`` (``bench/java/StoreBench.java``: a thread per producer calling
``putMessage``, its slave store in another JVM). ``--only catchup`` (not run by default) copies a
``--backlog-gib`` backlog through whole brokers, each started broker in turn
(``_fullcatchup.py``). The load average and the share of a CPU one
busy thread gets are printed at the start and the end. Results go to ``bench/results/client-*``
(Markdown, JSON, and a plot with matplotlib).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import trio

if not __package__:  # run as ``python bench/client_bench.py``: import ``bench`` from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _clusters, _limits, _puts
from bench._backlog import make_backlog
from bench._common import BENCH_DIR, MIB, open_child, proc_sample
from bench._fullcatchup import full_catch_up
from bench._report import _table
from bench.ha_bench import _size, cpu_share
from trioha._config import BrokerRole
from trioha._tuning import tune_gc_for_serving

RESULTS = BENCH_DIR / "results"
TOPIC = "BenchClientTopic"
SEND_SYSCALLS = ("sendto", "sendmsg", "write", "writev")
CELL_TIMEOUT = 120.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--start",
        default="trioha",
        help="brokers to start: trioha, java or both (comma-separated; default trioha)",
    )
    p.add_argument(
        "--namesrv",
        metavar="HOST:PORT",
        help="measure a running broker through this name server (no --start needed)",
    )
    p.add_argument("--master-pid", type=int, help="with --namesrv: the master's PID, for CPU")
    p.add_argument("--slave-pid", type=int, help="with --namesrv: the slave's PID, for CPU")
    p.add_argument("--threads", default="1,64", help="sending threads per cell (default 1,64)")
    p.add_argument(
        "--clients",
        default="official,trio",
        help="load generators: official (C++ client), trio (trioha's own)",
    )
    p.add_argument("--body", type=_size, default=1024, help="body size (default 1K)")
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds per cell")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring")
    p.add_argument("--rounds", type=int, default=1, help="times every cell is run (alternating)")
    p.add_argument("--segment-size", type=_size, default=64 * MIB, help="commit log segments")
    p.add_argument(
        "--only",
        default="limits,store,client",
        help="sections: limits (ping-pong), store (store-level puts), client, "
        "catchup (1 GiB backlog through whole brokers; not run by default)",
    )
    p.add_argument("--backlog-gib", type=float, default=1.0, help="catch-up backlog (default 1)")
    p.add_argument("--dir", type=Path, help="work directory (default: a temporary one)")
    p.add_argument("--out", type=Path, default=RESULTS, help="where the results go")
    p.add_argument("--in-netns", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def say(text: str) -> None:
    print(text, flush=True)


def _reexec_in_netns(argv: list[str]) -> int | None:
    """Run this benchmark again inside ``unshare -n``; None when that is not possible."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return None
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        return None
    script = 'ip link set lo up && exec "$0" "$@"'
    cmd = [
        "unshare",
        "-n",
        "--",
        "sh",
        "-c",
        script,
        sys.executable,
        str(Path(__file__).resolve()),
        *argv,
        "--in-netns",
    ]
    return subprocess.run(cmd, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    starts = [s for s in args.start.split(",") if s] if not args.namesrv else []
    if "java" in starts and not args.in_netns and not _clusters.in_own_netns():
        why = _clusters.java_missing()
        if why is None:
            code = _reexec_in_netns(argv)
            if code is not None:
                return code
            why = "cannot enter a network namespace of its own (unshare -n)"
        say(f"Java RocketMQ skipped: {why}")
        starts.remove("java")
    elif "java" in starts and (why := _clusters.java_missing()) is not None:
        say(f"Java RocketMQ skipped: {why}")
        starts.remove("java")
    tune_gc_for_serving()
    sections = set(args.only.split(","))
    work = args.dir or Path(tempfile.mkdtemp(prefix="trioha-client-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results: dict[str, Any] = {
        "meta": {
            "when": stamp,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_start": os.getloadavg()[0],
            "cpu_share": {"start": cpu_share()},
            "argv": argv,
            "body": args.body,
            "seconds": args.seconds,
            "netns": args.in_netns,
        }
    }
    try:
        if "limits" in sections:
            say("limits: ping-pong ...")
            results["limits"] = {
                "ping_pong": _limits.ping_pong(20000),
                "ping_pong_trio": _limits.ping_pong_trio(20000),
            }
        if "store" in sections:
            results["store"] = []
            for round_ in range(args.rounds):  # trioha's store, then Java's, in every round
                say("store-level puts ...")
                cells = trio.run(
                    functools.partial(
                        store_puts,
                        work,
                        segment_size=args.segment_size,
                        body=args.body,
                        seconds=args.seconds,
                        warmup=min(args.warmup, 1.0),
                    )
                )
                if "java" in starts:
                    say("store-level puts, Java 4.9.7's DefaultMessageStore ...")
                    cells += java_store_puts(
                        work, body=args.body, seconds=args.seconds, warmup=min(args.warmup, 1.0)
                    )
                for cell in cells:
                    cell.setdefault("broker", "trioha")
                    cell.update(round=round_, load=os.getloadavg()[0])
                results["store"] += cells
        if "client" in sections:
            results["cells"] = trio.run(functools.partial(client_cells, args, work, starts))
        if "catchup" in sections:
            results["catch_up"] = catch_ups(args, work, starts)
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    results["meta"]["load_end"] = os.getloadavg()[0]
    results["meta"]["cpu_share"]["end"] = cpu_share()
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"client-{stamp}"
    text = render(results)
    stem.with_suffix(".json").write_text(json.dumps(results, indent=1))
    stem.with_suffix(".md").write_text(text)
    plots = plot(results, stem)
    print()
    print(text)
    print(f"\nsaved {stem}.json and .md" + "".join(f", {p.name}" for p in plots))
    return 0


# --- store-level puts ------------------------------------------------------------------------


async def store_puts(
    work: Path, *, segment_size: int, body: int, seconds: float, warmup: float
) -> list[dict[str, Any]]:
    cells = []
    async with _puts.open_pair(
        work, root=work / "store-master", segment_size=segment_size, peer_slave=None
    ) as pair:
        for mode, producers in (
            (BrokerRole.SYNC_MASTER, 1),
            (BrokerRole.SYNC_MASTER, 64),
            (BrokerRole.ASYNC_MASTER, 64),
        ):
            cell = await _puts.put_cell(
                pair, mode=mode, producers=producers, body_size=body, seconds=seconds, warmup=warmup
            )
            say(
                f"  {mode.value} x{producers}: {cell['puts_s']:,.0f} puts/s, p99 "
                f"{cell['p99_ms']:.2f} ms"
            )
            cells.append(cell)
    shutil.rmtree(work / "store-master", ignore_errors=True)
    shutil.rmtree(work / "put-slave", ignore_errors=True)
    return cells


JAVA_STORE_CELLS = "SYNC_MASTER:1,SYNC_MASTER:64,ASYNC_MASTER:64"
JAVA_FLAGS = [
    "-Xms256m",
    "-Xmx1g",
    "-XX:+UseG1GC",
    "-XX:MaxDirectMemorySize=512m",
    "--add-exports",
    "java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.nio=ALL-UNNAMED",
    "--add-opens",
    "java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.lang=ALL-UNNAMED",
    "--add-exports",
    "java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-opens",
    "java.base/jdk.internal.ref=ALL-UNNAMED",
]


def java_store_puts(
    work: Path, *, body: int, seconds: float, warmup: float
) -> list[dict[str, Any]]:
    """The same cells on Java's ``DefaultMessageStore``, a thread per producer, its slave a
    ``DefaultMessageStore`` in another JVM (``bench/java/StoreBench.java``)."""
    script = str(_clusters.JAVA_HOME_DIR / "rocketmq.sh")
    classpath = subprocess.run(
        [script, "classpath"], capture_output=True, text=True, check=True
    ).stdout.strip()
    classes = work / "java-classes"
    classes.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            "javac",
            "-d",
            str(classes),
            "-cp",
            classpath,
            str(BENCH_DIR / "java" / "StoreBench.java"),
        ],
        check=True,
    )
    quiet = classes / "logback.xml"  # the store logs at DEBUG to the console otherwise
    quiet.write_text('<configuration><root level="WARN"/></configuration>\n')
    java = [
        "java",
        *JAVA_FLAGS,
        f"-Dlogback.configurationFile={quiet}",
        "-cp",
        f"{classpath}:{classes}",
        "StoreBench",
    ]
    root = work / "java-store"
    shutil.rmtree(root, ignore_errors=True)
    ha = _clusters.free_port()
    with (work / "java-store-slave.log").open("wb") as log:
        slave = subprocess.Popen(
            [*java, "slave", str(root / "slave"), str(ha)], stdout=log, stderr=subprocess.STDOUT
        )
    try:
        done = subprocess.run(
            # at least 2 s of warm-up per cell: the JIT compiles the put path meanwhile
            [
                *java,
                "master",
                str(root / "master"),
                str(ha),
                str(body),
                str(seconds),
                str(max(warmup, 2.0)),
                JAVA_STORE_CELLS,
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        cells = []
        for line in done.stdout.splitlines():
            if line.startswith("{") and "mode" in line:
                cell = json.loads(line)
                cells.append(
                    {
                        "broker": "java",
                        "mode": cell["mode"],
                        "producers": cell["producers"],
                        "puts_s": cell["puts_s"],
                        "p50_ms": cell["p50_us"] / 1e3,
                        "p99_ms": cell["p99_us"] / 1e3,
                        "p999_ms": cell["p999_us"] / 1e3,
                        "not_ok": cell["not_ok"],
                        "master_cpu_us": None,
                        "msgs_per_ack": None,
                    }
                )
                say(
                    f"  java {cell['mode']} x{cell['producers']}: {cell['puts_s']:,.0f} puts/s,"
                    f" p99 {cell['p99_us'] / 1e3:.2f} ms"
                )
        if not cells:
            say(f"  Java store puts failed: {done.stderr[-400:]}")
        return cells
    finally:
        slave.terminate()
        slave.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


# --- catch-up through whole brokers ----------------------------------------------------------


def catch_ups(args: argparse.Namespace, work: Path, starts: list[str]) -> list[dict[str, Any]]:
    total = int(args.backlog_gib * (1 << 30))
    say(f"catch-up: building a backlog of {total // MIB} MiB (1 KiB messages) ...")
    backlog = work / "catchup-backlog"
    end = make_backlog(backlog, total=total, segment_size=args.segment_size, body_size=1024)
    runs = []
    for round_ in range(args.rounds):
        for kind in starts:  # alternate brokers run by run
            run = trio.run(
                functools.partial(
                    full_catch_up,
                    work,
                    kind=kind,
                    backlog=backlog,
                    end=end,
                    segment_size=args.segment_size,
                )
            )
            run.update(round=round_, load=os.getloadavg()[0])
            say(
                f"  {kind:6} {run['mib_s']:,.0f} MiB/s (log alone {_f(run['log_mib_s'])}), "
                f"slave {run['slave_cpu_s']:.1f} CPU-s, peak anon "
                f"{run['slave_peak_anon'] / MIB:,.0f} MiB, load {run['load']:.2f}"
            )
            runs.append(run)
    shutil.rmtree(backlog, ignore_errors=True)
    return runs


# --- client cells ----------------------------------------------------------------------------


@asynccontextmanager
async def _clusters_up(
    args: argparse.Namespace, work: Path, starts: list[str]
) -> AsyncIterator[list[_clusters.Cluster]]:
    async with AsyncExitStack() as stack:
        clusters: list[_clusters.Cluster] = []
        if args.namesrv:
            clusters.append(
                _clusters.Cluster("given", args.namesrv, args.master_pid, args.slave_pid)
            )
        for name in starts:
            opener = {"trioha": _clusters.open_trioha_cluster, "java": _clusters.open_java_cluster}[
                name
            ]
            say(f"starting {name}: name server, SYNC_MASTER, slave ...")
            clusters.append(
                await stack.enter_async_context(
                    opener(work / f"cluster-{name}", segment_size=args.segment_size)
                )
            )
        for cluster in clusters:
            await _clusters.wait_sendable(cluster, TOPIC)
            say(f"  {cluster.name} ready (name server {cluster.namesrv})")
        yield clusters


async def client_cells(
    args: argparse.Namespace, work: Path, starts: list[str]
) -> list[dict[str, Any]]:
    threads = [int(t) for t in args.threads.split(",")]
    clients = args.clients.split(",")
    if "official" in clients and importlib.util.find_spec("rocketmq") is None:
        say("official client skipped: the rocketmq wheel is not installed (pip install rocketmq)")
        clients.remove("official")
    cells = []
    async with _clusters_up(args, work, starts) as clusters:
        for round_ in range(args.rounds):
            for n in threads:
                for client in clients:
                    for cluster in clusters:  # alternate brokers cell by cell
                        cell = await run_cell(
                            cluster,
                            client=client,
                            threads=n,
                            body=args.body,
                            warmup=args.warmup,
                            seconds=args.seconds,
                            work=work,
                        )
                        cell["round"] = round_
                        say(
                            f"  {cluster.name:6} {client:8} x{n:<3} {cell['msgs_s']:>9,.0f} msgs/s"
                            f"  p50 {cell['p50_us']:,.0f} µs  master {_f(cell['master_cpu_us'])}"
                            f" µs/msg  load {cell['load']:.2f}"
                        )
                        cells.append(cell)
    return cells


async def _count_syscalls(pid: int | None, seconds: float, out: dict[str, Any], key: str) -> None:
    """Count send-type syscalls of *pid* (all threads) for *seconds* with ``perf stat``."""
    if pid is None or shutil.which("perf") is None:
        return
    events = ",".join(f"syscalls:sys_enter_{name}" for name in SEND_SYSCALLS)
    try:
        done = await trio.run_process(
            ["perf", "stat", "-x,", "-e", events, "-p", str(pid), "--", "sleep", str(seconds)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    except OSError:
        return
    counts: dict[str, int] = {}
    for line in done.stderr.decode(errors="replace").splitlines():
        parts = line.split(",")
        if len(parts) > 2 and parts[2].startswith("syscalls:sys_enter_"):
            name = parts[2].removeprefix("syscalls:sys_enter_")
            counts[name] = int(parts[0]) if parts[0].isdigit() else 0
    if counts:
        out[key] = counts


def _cpu(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        return proc_sample(pid).cpu
    except (OSError, ValueError, IndexError):
        return None


async def run_cell(
    cluster: _clusters.Cluster,
    *,
    client: str,
    threads: int,
    body: int,
    warmup: float,
    seconds: float,
    work: Path,
) -> dict[str, Any]:
    home = work / "client-home"  # the C++ client writes its logs under $HOME/logs
    home.mkdir(exist_ok=True)
    load = os.getloadavg()[0]
    syscalls: dict[str, Any] = {}
    with trio.fail_after(CELL_TIMEOUT + warmup + seconds):
        async with (
            open_child(
                "_load",
                [
                    client,
                    cluster.namesrv,
                    TOPIC,
                    str(threads),
                    str(body),
                    str(warmup),
                    str(seconds),
                ],
                f"{client} load",
                env={"HOME": str(home)},
            ) as child,
            trio.open_nursery() as nursery,
        ):
            await child.next_event("ready")
            await child.next_event("window_start")
            m0, s0, t0 = _cpu(cluster.master_pid), _cpu(cluster.slave_pid), time.perf_counter()
            nursery.start_soon(_count_syscalls, cluster.master_pid, seconds, syscalls, "master")
            nursery.start_soon(_count_syscalls, cluster.slave_pid, seconds, syscalls, "slave")
            await child.next_event("window_stop")
            m1, s1, t1 = _cpu(cluster.master_pid), _cpu(cluster.slave_pid), time.perf_counter()
            end = await child.next_event("window_end")
    count = end["count"]
    elapsed = t1 - t0
    cell: dict[str, Any] = {
        "broker": cluster.name,
        "client": client,
        "threads": threads,
        "body": body,
        "load": load,
        **{k: v for k, v in end.items() if k != "event"},
        "master_cpu_pct": (m1 - m0) / elapsed * 100 if m0 is not None and m1 is not None else None,
        "slave_cpu_pct": (s1 - s0) / elapsed * 100 if s0 is not None and s1 is not None else None,
        "master_cpu_us": (m1 - m0) / count * 1e6
        if m0 is not None and m1 is not None and count
        else None,
        "slave_cpu_us": (s1 - s0) / count * 1e6
        if s0 is not None and s1 is not None and count
        else None,
        "syscalls": syscalls,
    }
    for side in ("master", "slave"):
        sends = sum(syscalls.get(side, {}).values())
        # perf counted for `seconds`, the messages were counted over `elapsed`: scale to match.
        cell[f"msgs_per_{side}_send"] = count * seconds / elapsed / sends if sends else None
    cell["not_ok"] = count - end["statuses"].get("SEND_OK", 0)
    return cell


# --- report ----------------------------------------------------------------------------------


def _f(value: float | None, spec: str = ",.0f") -> str:
    return "–" if value is None else format(value, spec)


def render(results: dict[str, Any]) -> str:
    meta = results["meta"]
    share = meta["cpu_share"]
    out = [
        f"Machine: {meta['cpus']} CPUs, load average {meta['load_start']:.2f} at start and "
        f"{meta['load_end']:.2f} at the end; one busy thread got {share['start']:.0%} / "
        f"{share['end']:.0%} of a CPU (start / end)."
    ]
    lim = results.get("limits")
    if lim:
        rows = [
            [name, *(_f(lim[key][q], ",.0f") for q in ("p50_us", "p99_us", "p999_us"))]
            for name, key in (
                ("ping-pong 8 B, blocking", "ping_pong"),
                ("ping-pong 8 B, Trio client", "ping_pong_trio"),
            )
        ]
        out += ["", _table(["limit (this run)", "p50 µs", "p99 µs", "p99.9 µs"], rows)]
    store = results.get("store")
    if store:
        rows = [
            [
                str(c.get("round", 0) + 1),
                c.get("broker", "trioha"),
                c["mode"],
                str(c["producers"]),
                _f(c["puts_s"]),
                f"{c['p50_ms'] * 1e3:,.0f} / {c['p99_ms'] * 1e3:,.0f}",
                _f(c["master_cpu_us"]),
                _f(c["msgs_per_ack"], ".1f"),
                f"{c.get('load', 0):.2f}",
            ]
            for c in store
        ]
        out += [
            "",
            "Store level (trioha: `Broker.put` from Trio tasks in-process; Java: "
            "`DefaultMessageStore.putMessage`, a thread per producer; each slave in another "
            "process):",
            "",
            _table(
                [
                    "round",
                    "store",
                    "mode",
                    "producers",
                    "puts/s",
                    "p50 / p99 µs",
                    "master CPU µs/put",
                    "msgs per ack",
                    "load",
                ],
                rows,
            ),
        ]
    cells = results.get("cells")
    if cells:
        rows = [
            [
                c["broker"],
                c["client"],
                str(c["threads"]),
                _f(c["msgs_s"]),
                f"{_f(c['p50_us'])} / {_f(c['p99_us'])} / {_f(c['p999_us'])}",
                _f(c["master_cpu_us"]),
                _f(c["slave_cpu_us"]),
                _f(c["master_cpu_pct"]),
                _f(c["msgs_per_master_send"], ".2f"),
                _f(c["msgs_per_slave_send"], ".1f"),
                str(c["not_ok"]),
                f"{c['load']:.2f}",
            ]
            for c in cells
        ]
        out += [
            "",
            f"Client sends ({meta['body']} B bodies, sync, {meta['seconds']:g} s "
            "windows; CPU from /proc over the window):",
            "",
            _table(
                [
                    "broker",
                    "client",
                    "threads",
                    "msgs/s",
                    "p50 / p99 / p99.9 µs",
                    "master CPU µs/msg",
                    "slave CPU µs/msg",
                    "master CPU %",
                    "msgs per master send syscall",
                    "msgs per slave send (≈ per ack)",
                    "not OK",
                    "load",
                ],
                rows,
            ),
        ]
        ratios = _ratios(cells)
        if ratios:
            out += [
                "",
                _table(
                    [
                        "client",
                        "threads",
                        "trioha msgs/s",
                        "Java msgs/s",
                        "trioha / Java",
                        "p50 trioha / Java µs",
                    ],
                    ratios,
                ),
            ]
    runs = results.get("catch_up")
    if runs:
        rows = [
            [
                str(r["round"] + 1),
                r["broker"],
                _f(r["backlog"] / MIB),
                _f(r["mib_s"]),
                _f(r["log_mib_s"]),
                f"{r['slave_cpu_s']:.1f} / {r['master_cpu_s']:.1f}",
                f"{r['slave_peak_rss'] / MIB:,.0f} ({r['slave_peak_anon'] / MIB:,.0f})",
                f"{r['load']:.2f}",
            ]
            for r in runs
        ]
        out += [
            "",
            "Catch-up through whole brokers (the slave starts with the log's first message;"
            " done when its log and its consume queues reach the master's end):",
            "",
            _table(
                [
                    "round",
                    "broker",
                    "MiB",
                    "MiB/s (log + consume queues)",
                    "MiB/s (log alone)",
                    "CPU-s slave / master",
                    "slave peak RSS (anonymous) MiB",
                    "load",
                ],
                rows,
            ),
        ]
    return "\n".join(out)


def _ratios(cells: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    keys = sorted({(c["client"], c["threads"], c.get("round", 0)) for c in cells})
    for client, threads, round_ in keys:
        mine = [
            c
            for c in cells
            if (c["client"], c["threads"], c.get("round", 0)) == (client, threads, round_)
        ]
        t = next((c for c in mine if c["broker"] == "trioha"), None)
        j = next((c for c in mine if c["broker"] == "java"), None)
        if t is None or j is None or not j["msgs_s"]:
            continue
        rows.append(
            [
                client,
                str(threads),
                _f(t["msgs_s"]),
                _f(j["msgs_s"]),
                f"{t['msgs_s'] / j['msgs_s']:.2f}",
                f"{t['p50_us']:,.0f} / {j['p50_us']:,.0f}",
            ]
        )
    return rows


def plot(results: dict[str, Any], stem: Path) -> list[Path]:
    """``<stem>.png``: msgs/s and p50 by threads, one line per broker and client."""
    cells = results.get("cells")
    if not cells:
        return []
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return []
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9.0, 3.6), dpi=100)
    for broker, client in sorted({(c["broker"], c["client"]) for c in cells}):
        pts: dict[int, list[dict[str, Any]]] = {}
        for c in cells:
            if (c["broker"], c["client"]) == (broker, client):
                pts.setdefault(c["threads"], []).append(c)
        xs = sorted(pts)
        best = [max(pts[x], key=lambda c: c["msgs_s"]) for x in xs]
        style = "-o" if broker == "trioha" else "--s"
        ax1.plot(xs, [c["msgs_s"] for c in best], style, label=f"{broker}, {client} client")
        ax2.plot(xs, [c["p50_us"] / 1e3 for c in best], style, label=f"{broker}, {client}")
    for ax, label in ((ax1, "msgs/s"), (ax2, "p50 latency, ms")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sending threads")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    ax1.legend(fontsize=7)
    ax1.set_title("sync sends, SYNC_MASTER + slave", fontsize=9)
    ax2.set_title("latency", fontsize=9)
    fig.tight_layout()
    path = stem.with_suffix(".png")
    fig.savefig(path)
    plt.close(fig)
    return [path]


if __name__ == "__main__":
    raise SystemExit(main())
