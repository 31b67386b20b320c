"""The benchmark's results as Markdown tables (printed, and pasted into docs/performance.md)
and as two plots (matplotlib, only if it is installed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._common import GIB, MIB

#: RocketMQ 4.9.7 on this kind of machine (docs/rocketmq-protocol.md §11.1), measured in other runs:
#: for orientation
#: only, never for a verdict.
JAVA = {
    "catch_up_mib_s": 259,
    "sync_puts_s": {1: 7_000, 16: 61_000, 64: 112_000, 256: 137_000},
    "async_puts_s": "177k-190k",
}


def _f(value: float | None, spec: str = ",.0f") -> str:
    return "–" if value is None else format(value, spec)


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or not b:
        return "–"
    return f"{a / b:.0%}" if a / b < 10 else f"{a / b:.1f}×"


def _get(record: dict[str, Any] | None, key: str) -> float | None:
    return None if record is None else record[key]


def _mib(n: float | None) -> str:
    return "–" if n is None else f"{n / MIB:,.0f} MiB"


def limits_table(lim: dict[str, Any]) -> str:
    tcp, trio_, tofile = lim["tcp"], lim["tcp_trio"], lim["tcp_to_file"]
    ping, ping_t = lim["ping"], lim["ping_trio"]
    rows = [
        (
            "loopback TCP, two Python processes, blocking, 4 MiB buffers",
            f"{tcp['mib_s']:,.0f} MiB/s (runs: "
            + " / ".join(f"{x:,.0f}" for x in tcp.get("runs_mib_s", [tcp["mib_s"]]))
            + ")",
        ),
        ("loopback TCP, Trio on both ends (256 KiB reads)", f"{trio_['mib_s']:,.0f} MiB/s"),
        ("loopback TCP into a file (receiver `pwrite`s)", f"{tofile['mib_s']:,.0f} MiB/s"),
        (
            "ping-pong 8 B, blocking, p50 / p99 / p99.9",
            f"{ping['p50_us']:.0f} / {ping['p99_us']:.0f} / {ping['p999_us']:.0f} µs",
        ),
        (
            "ping-pong 8 B, Trio client, p50 / p99 / p99.9",
            f"{ping_t['p50_us']:.0f} / {ping_t['p99_us']:.0f} / {ping_t['p999_us']:.0f} µs",
        ),
        ("file append, 1 MiB writes, no fsync", f"{lim['append']['mib_s']:,.0f} MiB/s"),
        (
            "file append, 1 MiB writes + fdatasync each",
            f"{lim['append_fsync_1m']['mib_s']:,.0f} MiB/s",
        ),
        (
            "file append, 4 KiB writes + fdatasync each",
            f"{lim['append_fsync_4k']['ops_s']:,.0f} writes/s, "
            f"p99 {lim['append_fsync_4k']['p99_us']:.0f} µs",
        ),
    ]
    return _table(["limit (this run)", "figure"], rows)


def machine_line(meta: dict[str, Any]) -> str:
    share = meta.get("cpu_share", {})
    return (
        f"Machine: {meta['cpus']} CPUs, load average {meta['load_start']:.1f} at start and "
        f"{meta.get('load_end', float('nan')):.1f} at the end; one busy thread got "
        f"{share.get('start', 0):.0%} / {share.get('end', 0):.0%} of a CPU "
        "(start / end; below 100% means other processes competed)."
    )


def catch_up_table(runs: list[dict[str, Any]], lim: dict[str, Any] | None) -> str:
    tcp = lim["tcp"]["mib_s"] if lim else None
    tofile = lim["tcp_to_file"]["mib_s"] if lim else None
    rows = []
    for r in runs:
        gib = r["bytes"] / GIB
        rows.append(
            (
                r["label"],
                f"{r['mib_s']:,.0f}",
                _ratio(r["mib_s"], tcp),
                _ratio(r["mib_s"], tofile),
                _f(r.get("slave_cpu", None) and r["slave_cpu"] / gib, ".2f"),
                _f(r.get("master_cpu", None) and r["master_cpu"] / gib, ".2f"),
                f"{_mib(r.get('slave_peak_rss'))} ({_mib(r.get('slave_peak_anon'))})"
                if r.get("slave_peak_rss")
                else "–",
                f"{_mib(r.get('master_peak_rss'))} ({_mib(r.get('master_peak_anon'))})"
                if r.get("master_peak_rss")
                else "–",
                {True: "yes", False: "**NO**"}.get(r.get("identical"), "–"),  # type: ignore[arg-type]
            )
        )
    rows.append(
        (
            "RocketMQ 4.9.7, 1 GiB (docs/rocketmq-protocol.md §11.1; another run)",
            f"{JAVA['catch_up_mib_s']}",
            "–",
            "–",
            "–",
            "–",
            "–",
            "–",
            "–",
        )
    )
    return _table(
        [
            "catch-up",
            "MiB/s",
            "÷ loopback",
            "÷ loopback→file",
            "slave CPU-s/GiB",
            "master CPU-s/GiB",
            "slave peak RSS (anon)",
            "master peak RSS (anon)",
            "identical",
        ],
        rows,
    )


def puts_table(cells: list[dict[str, Any]]) -> str:
    by_key: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
    for c in cells:
        by_key.setdefault((c["body"], c["producers"]), {})[c["mode"]] = c
    rows = []
    for (body, n), modes in sorted(by_key.items()):
        s, a = modes.get("SYNC_MASTER"), modes.get("ASYNC_MASTER")
        rows.append(
            (
                f"{body:,} B",
                str(n),
                _f(_get(s, "puts_s")),
                _f(_get(a, "puts_s")),
                _ratio(_get(s, "puts_s"), _get(a, "puts_s")),
                f"{s['p50_ms']:.2f} / {s['p99_ms']:.2f} / {s['p999_ms']:.2f}" if s else "–",
                f"{a['p50_ms']:.2f} / {a['p99_ms']:.2f}" if a else "–",
                _f(_get(s, "msgs_per_ack"), ".1f"),
                f"{_f(_get(s, 'master_cpu_us'))} / {_f(_get(a, 'master_cpu_us'))}",
                f"{_f(_get(s, 'slave_cpu_us'))} / {_f(_get(a, 'slave_cpu_us'))}",
                str(s["not_ok"]) if s else "–",
            )
        )
    return _table(
        [
            "body",
            "producers",
            "sync puts/s",
            "async puts/s",
            "sync ÷ async",
            "sync p50 / p99 / p99.9 ms",
            "async p50 / p99 ms",
            "msgs per ack",
            "master CPU µs/put sync / async",
            "slave CPU µs/put sync / async",
            "not PUT_OK",
        ],
        rows,
    )


def lag_table(runs: list[dict[str, Any]]) -> str:
    rows = []
    for r in runs:
        rows.append(
            (
                r["label"],
                f"{r['puts_s']:,.0f}",
                f"{r['produced_mib_s']:.1f}",
                f"{r['lag_bytes_p50'] / 1024:,.0f} / {r['lag_bytes_p99'] / 1024:,.0f} / "
                f"{r['lag_bytes_max'] / 1024:,.0f}",
                f"{r['lag_ms_p50']:.1f} / {r['lag_ms_p99']:.1f}",
                f"{r['drain_seconds'] * 1e3:.0f}",
                f"{r['master_cpu_pct']:.0f} / {_f(r['slave_cpu_pct'])}",
            )
        )
    return _table(
        [
            "async under load",
            "puts/s",
            "MiB/s written",
            "slave lag KiB p50 / p99 / max",
            "lag ms p50 / p99",
            "drain ms",
            "CPU % master / slave",
        ],
        rows,
    )


def targets_table(targets: list[dict[str, Any]]) -> str:
    rows = [
        (t["target"], t["figure"], {True: "met", False: "**missed**"}[t["met"]]) for t in targets
    ]
    return _table(["target", "this run", "verdict"], rows)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# --- plots ------------------------------------------------------------------------------------


def plot(results: dict[str, Any], stem: Path) -> list[Path]:
    """Write ``<stem>-puts.png`` and ``<stem>-lag.png``; nothing (and say so) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (pip install matplotlib)")
        return []
    written = []
    cells = results.get("puts", {}).get("own", [])
    if cells:
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
        bodies = sorted({c["body"] for c in cells})
        for body in bodies:
            for mode, style in (("SYNC_MASTER", "-o"), ("ASYNC_MASTER", "--s")):
                pts = sorted(
                    (c["producers"], c["puts_s"])
                    for c in cells
                    if c["body"] == body and c["mode"] == mode
                )
                if pts:
                    ax.plot(
                        [p for p, _ in pts],
                        [v for _, v in pts],
                        style,
                        label=f"{'sync' if mode == 'SYNC_MASTER' else 'async'} {body} B",
                    )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent producers")
        ax.set_ylabel("puts/s")
        ax.set_title("trioha puts, slave in another process")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        path = stem.with_name(stem.name + "-puts.png")
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    lag = results.get("lag", [])
    if lag and lag[0].get("series"):
        fig, ax1 = plt.subplots(figsize=(6.4, 3.6), dpi=100)
        series = lag[0]["series"]
        t = [s[0] for s in series]
        ax1.plot(t, [s[1] / 1024 for s in series], lw=0.8, label="lag (KiB)")
        ax1.set_xlabel("seconds")
        ax1.set_ylabel("slave lag, KiB")
        ax2 = ax1.twinx()
        ax2.plot(t, [s[2] * 1e3 for s in series], lw=0.8, color="tab:red", label="lag (ms)")
        ax2.set_ylabel("slave lag, ms", color="tab:red")
        ax1.axvline(lag[0]["seconds"], color="grey", ls=":", lw=0.8)
        ax1.set_title(f"async replication, {lag[0]['producers']} producers at full speed")
        ax1.grid(True, alpha=0.3)
        fig.tight_layout()
        path = stem.with_name(stem.name + "-lag.png")
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written
