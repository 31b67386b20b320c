"""How fast the Spark pipeline reads and audits a commit log, next to plain Python.

    .venv/bin/python bench/pipeline_bench.py [--size-gib 1] [--segment-mib 1024] [--quick]
        [--only reference,decoder,scan,jvm,rows,stream,audit,verify] [--repeat 2]

It generates a log (1 KiB bodies by default) in a temporary directory, then prints:

* the reference: the store's own ``iter_messages`` over the same files, one process;
* the project's own vectorised decoder without Spark (``_read.read_messages`` over every
  planned partition, planning included, one process), with the CPU seconds it used;
* the ``commitlog`` data source scanning all of it with ``local[1]``, ``local[2]`` and
  ``local[*]``, as MB/s, messages/s and the ratio to the reference, each scan on a freshly
  loaded DataFrame so that Spark's planning is in it too; for ``local[2]`` the CPU seconds of
  Spark's JVM and Python workers, the per-core ratio against the decoder (wall clock / 2
  cores, and CPU seconds), the same scan with 512 MiB partitions, and Spark's side alone:
  ``bench/_pipeline_replay.py`` replays decoded batches, so no decoding is in it;
* the JVM engine's scan (``read_commitlog(engine="jvm")``, part ``jvm``: records decoded in
  the executors' JVMs, no Python worker), for ``local[2]`` per core against the decoder
  (wall clock / 2 cores, and CPU seconds), as for the Python data source;
* the same scan yielding Python rows instead of Arrow batches (``arrow=false``);
* a replica audit of the log against a byte-identical copy, next to ``cmp`` of the same
  files (alternating, page cache warm for both), the same audit with ``--verify-records``,
  and an audit of a copy with one flipped body byte, which must name that byte, its record
  and the field;
* the latency from a put into a live store (appended and flushed, as a master's put) to its
  row arriving in a ``readStream`` query's ``foreachBatch`` sink, p50/p99.

Scans go to Spark's ``noop`` sink, so every column of every row reaches the JVM and nothing
else is measured. The generated data is removed at the end. Figures move with the machine's
load: compare the ratios printed by one run, not absolute numbers between runs.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trioha.store import HostAddress, decode_record, encode_blank, encode_message, open_store

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MIB = 1 << 20
GIB = 1 << 30
TOPIC = "BenchTopic"
BORN = HostAddress("10.0.0.7", 50123)
STORE = HostAddress("10.0.0.1", 10911)


def make_log(root: Path, *, total: int, segment_size: int, body_size: int) -> int:
    """Write at least *total* bytes of records into ``root/commitlog``; returns the count.

    One record is encoded by the store's codec; the rest are copies of it with their fields
    patched in place with numpy: queue id and offset, physical offset, timestamps, a tag, a
    key, and a random body with its CRC (record positions with IPv4 hosts).
    """
    template = encode_message(
        topic=TOPIC,
        body=bytes(body_size),
        born_host=BORN,
        store_host=STORE,
        properties=(("TAGS", "tagA"), ("KEYS", "key-0000000")),
    )
    size = len(template)
    body_at = 88
    tag_at = template.index(b"tagA") + 3
    key_at = template.index(b"key-0000000") + 4
    per_segment = (segment_size - 8) // size
    segments = max(1, -(-total // segment_size))
    directory = root / "commitlog"
    directory.mkdir(parents=True)
    rng = np.random.default_rng(20240601)
    row = np.frombuffer(template, dtype=np.uint8)
    chunk = max(1, (64 * MIB) // size)
    index = 0
    for s in range(segments):
        start = s * segment_size
        with open(directory / f"{start:020d}", "wb") as f:
            for first in range(0, per_segment, chunk):
                k = min(chunk, per_segment - first)
                arr = np.tile(row, (k, 1))
                idx = np.arange(index, index + k, dtype=np.int64)
                bodies = rng.integers(0, 256, size=(k, body_size), dtype=np.uint8)
                arr[:, body_at : body_at + body_size] = bodies
                crc = np.array([zlib.crc32(b) & 0x7FFFFFFF for b in bodies], dtype=">i4").view(
                    np.uint8
                )
                arr[:, 8:12] = crc.reshape(k, 4)
                arr[:, 12:16] = (idx % 8).astype(">i4").view(np.uint8).reshape(k, 4)
                arr[:, 20:28] = (idx // 8).astype(">i8").view(np.uint8).reshape(k, 8)
                phys = start + (np.arange(first, first + k, dtype=np.int64) * size)
                arr[:, 28:36] = phys.astype(">i8").view(np.uint8).reshape(k, 8)
                born = 1_717_200_000_000 + idx
                arr[:, 40:48] = born.astype(">i8").view(np.uint8).reshape(k, 8)
                arr[:, 56:64] = (born + 3).astype(">i8").view(np.uint8).reshape(k, 8)
                arr[:, tag_at] = ord("A") + idx % 4
                for d in range(7):
                    arr[:, key_at + 6 - d] = ord("0") + (idx // 10**d) % 10
                f.write(arr.tobytes())
                index += k
            f.write(encode_blank(segment_size - per_segment * size))
            f.truncate(segment_size)
    _check(directory, segment_size, per_segment, size)
    return index


def _check(directory: Path, segment_size: int, per_segment: int, size: int) -> None:
    """Decode the first and last record of every segment with the store's codec."""
    for path in sorted(directory.iterdir()):
        data = path.read_bytes()
        for pos in (0, (per_segment - 1) * size):
            rec = decode_record(data, pos, base_offset=int(path.name))
            if type(rec).__name__ != "DecodedMessage":
                raise SystemExit(f"generated log is wrong at {path.name}+{pos}: {rec}")
        if struct.unpack_from(">I", data, per_segment * size + 4)[0] != 0xCBD43194:
            raise SystemExit(f"no end-of-file marker in {path.name}")


def diverged(spark: SparkSession, master: Path, slave: Path, count: int) -> tuple[float, str]:
    """Flip one body byte of a record in the middle of *slave* and audit: the report must
    name that byte, its record and the body; returns the time and the headline."""
    from trioha.pipeline import Verdict, audit_replicas

    seg = sorted((slave / "commitlog").iterdir())[-1]
    data = seg.read_bytes()
    size = struct.unpack_from(">i", data, 0)[0]
    rel = (count // 2 % ((len(data) - 8) // size)) * size
    byte = int(seg.name) + rel + 88 + 100
    with seg.open("r+b") as f:
        f.seek(rel + 88 + 100)
        f.write(bytes([data[rel + 88 + 100] ^ 0xFF]))
    t0 = time.perf_counter()
    report = audit_replicas(spark, str(master), [str(slave)])
    took = time.perf_counter() - t0
    (s,) = report.slaves
    d = s.divergence
    assert s.verdict is Verdict.DIVERGED and d is not None, s.render()
    assert (d.offset, d.first_byte, d.field) == (int(seg.name) + rel, byte, "body"), d
    return took, f"diverges at offset {d.offset}, byte {d.first_byte}, in the {d.field}"


def stream_latency(
    spark: SparkSession, root: Path, *, messages: int = 200, interval: float = 0.05
) -> tuple[float, float, float]:
    """Put *messages* into a live store one by one (*interval* apart, each flushed as a
    master's put is) while a ``readStream`` of it runs into a ``foreachBatch`` sink; returns
    the p50, p99 and max of put-to-row latency in seconds."""
    from trioha.pipeline import start_stream
    from trioha.store import NewMessage, open_store

    arrived: dict[int, float] = {}

    def sink(batch: object, _batch_id: int) -> None:
        now = time.perf_counter()
        for row in batch.select("physical_offset").collect():  # type: ignore[attr-defined]
            arrived[row[0]] = now

    put_at: dict[int, float] = {}
    with open_store(root, segment_size=64 * MIB) as store:
        log = store.commitlog
        log.append_batch([NewMessage(topic=TOPIC, body=b"first")])
        log.flush()
        query = start_stream(
            spark.readStream.format("commitlog")
            .load(str(root))
            .writeStream.foreachBatch(sink)
            .trigger(processingTime="0 seconds")
        )
        try:
            query.processAllAvailable()
            for i in range(messages):
                (result,) = log.append_batch(
                    [NewMessage(topic=TOPIC, body=i.to_bytes(4, "big") * 256)]
                )
                log.flush()
                put_at[result.physical_offset] = time.perf_counter()
                time.sleep(interval)
            deadline = time.perf_counter() + 120
            while not put_at.keys() <= arrived.keys() and time.perf_counter() < deadline:
                time.sleep(0.1)
        finally:
            query.stop()
    missing = put_at.keys() - arrived.keys()
    assert not missing, f"{len(missing)} messages never reached the sink"
    lat = sorted(arrived[o] - t for o, t in put_at.items())
    return lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))], lat[-1]


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def reference(root: Path) -> tuple[float, int]:
    """The store's plain iteration: every message decoded into a ``StoredMessage``."""
    with open_store(root) as store:  # recovery runs here, outside the timing
        count = body = 0
        t0 = time.perf_counter()
        for m in store.commitlog.iter_messages():
            count += 1
            body += len(m.body)
        return time.perf_counter() - t0, count


def scan(
    spark: SparkSession,
    root: Path,
    *,
    arrow: bool = True,
    partition_mib: int = 0,
    engine: str = "python",
) -> float:
    """One full scan into Spark's ``noop`` sink, of a DataFrame loaded for it.

    Spark plans a Python data source once per DataFrame and reuses the partitions for later
    actions on it, and the JVM engine's partitions are planned when the DataFrame is made,
    so the DataFrame is made inside the timing: every timed scan includes the planning (the
    driver's walk of the record chain), as :func:`decoder` does."""
    from trioha.pipeline import read_commitlog

    options: dict[str, object] = {"arrow": arrow}
    if partition_mib:
        options["partitionBytes"] = partition_mib * MIB

    def run() -> None:
        df = read_commitlog(spark, str(root), engine=engine, **options)
        df.write.format("noop").mode("overwrite").save()

    return timed(run)


def warm(spark: SparkSession, root: Path, engine: str = "python") -> None:
    """Start the Python workers and warm the JVM's JIT before timing: one full scan."""
    scan(spark, root, engine=engine)


def replayed(spark: SparkSession, root: Path, repeat: int) -> tuple[float, float, dict[str, float]]:
    """The best of *repeat* scans of ``commitlog_replay`` (``bench/_pipeline_replay.py``):
    the rows of every partition, from one decoded batch replayed, so the tasks only hand
    batches to the JVM. Planned and warmed by one untimed scan, then rescanned."""
    from bench._pipeline_replay import ReplaySource

    spark.dataSource.register(ReplaySource)
    df = spark.read.format("commitlog_replay").load(str(root))
    rescan = functools.partial(df.write.format("noop").mode("overwrite").save)
    rescan()
    return min(cpu_of(rescan) for _ in range(repeat))


def decoder(root: Path) -> tuple[float, int]:
    """The pipeline's decoder without Spark: every planned partition read in this process."""
    from trioha.pipeline import plan_partitions, read_layout
    from trioha.pipeline._read import read_messages

    t0 = time.perf_counter()
    count = 0
    for part in plan_partitions(read_layout(root)):
        for batch in read_messages(part):
            count += batch.num_rows
    return time.perf_counter() - t0, count


def cmp_files(a: Path, b: Path) -> float:
    """``cmp`` of every segment of two commit logs (the byte-compare baseline)."""
    t0 = time.perf_counter()
    for seg in sorted((a / "commitlog").iterdir()):
        subprocess.run(["cmp", "-s", str(seg), str(b / "commitlog" / seg.name)], check=True)
    return time.perf_counter() - t0


def rate(nbytes: int, count: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e6:8.1f} MB/s {count / seconds:11,.0f} msg/s ({seconds:6.2f} s)"


def tree_cpu() -> dict[str, float]:
    """CPU seconds (user + system) used so far by this process and its descendants, by
    program (``java``: Spark's JVM; ``python``: this process and Spark's Python workers).

    Read from ``/proc`` (Linux only; empty elsewhere). On a machine shared with other work
    the wall-clock figures move with the load; the CPU a scan consumes much less so.
    """
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    used: dict[int, tuple[str, float]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        close = stat.rfind(")")
        fields = stat[close + 2 :].split()
        name = stat[stat.find("(") + 1 : close]
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        # utime, stime, and what waited-for children used (a reused worker's never ends)
        used[int(entry.name)] = (name, sum(int(f) for f in fields[11:15]) / tick)
    total: dict[str, float] = {}
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        if pid in used:
            name, seconds = used[pid]
            total[name] = total.get(name, 0.0) + seconds
        todo.extend(children.get(pid, []))
    return total


def cpu_of(fn: Callable[[], object]) -> tuple[float, float, dict[str, float]]:
    """Run *fn*: wall seconds, CPU seconds of this process tree, CPU seconds by program."""
    before = tree_cpu()
    took = timed(fn)
    after = tree_cpu()
    spent = {k: after[k] - before.get(k, 0.0) for k in after if after[k] > before.get(k, 0.0)}
    return took, sum(spent.values()), spent


def cpu_text(spent: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in sorted(spent.items(), key=lambda kv: -kv[1]))


PARTS = ("reference", "decoder", "scan", "jvm", "rows", "stream", "audit", "verify")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-gib", type=float, default=1.0, help="log size (default 1)")
    parser.add_argument("--segment-mib", type=int, default=1024, help="segment size (1024)")
    parser.add_argument("--body", type=int, default=1024, help="body bytes (1024)")
    parser.add_argument("--quick", action="store_true", help="128 MiB in 32 MiB segments")
    parser.add_argument("--dir", default=None, help="where to generate (default: temp dir)")
    parser.add_argument("--skip-reference", action="store_true", help="same as --only without it")
    parser.add_argument("--repeat", type=int, default=2, help="runs per setting, best kept")
    parser.add_argument(
        "--only",
        default=",".join(PARTS),
        help=f"comma-separated parts to run, of {','.join(PARTS)} (default: all)",
    )
    args = parser.parse_args()
    total = 128 * MIB if args.quick else int(args.size_gib * GIB)
    segment = 32 * MIB if args.quick else args.segment_mib * MIB
    repeat = 1 if args.quick else args.repeat
    parts = {p.strip() for p in args.only.split(",") if p.strip()}
    if parts - set(PARTS):
        parser.error(f"unknown part(s) {', '.join(sorted(parts - set(PARTS)))}")
    if args.skip_reference:
        parts.discard("reference")
    if parts & {"scan", "jvm"}:
        parts.add("decoder")  # the per-core ratio is against it

    from trioha.pipeline import spark_session

    work = Path(tempfile.mkdtemp(prefix="trioha-pipeline-bench-", dir=args.dir))
    try:
        master = work / "master"
        t0 = time.perf_counter()
        count = make_log(master, total=total, segment_size=segment, body_size=args.body)
        nbytes = sum(p.stat().st_size for p in (master / "commitlog").iterdir())
        print(
            f"log: {nbytes / GIB:.2f} GiB in {nbytes // segment} segment(s) of "
            f"{segment // MIB} MiB, {count:,} messages of {args.body}-byte bodies "
            f"(generated in {time.perf_counter() - t0:.1f} s); load average "
            f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}"
        )
        ref = 0.0
        if "reference" in parts:
            ref, seen = reference(master)
            assert seen == count, (seen, count)
            print(f"reference  store iter_messages, 1 process  {rate(nbytes, count, ref)}")
        if "decoder" in parts:
            decoded = [cpu_of(lambda: decoder(master)) for _ in range(repeat)]
            dec, dec_cpu, _ = min(decoded)
            print(
                f"decoder    no Spark, 1 process        {rate(nbytes, count, dec)}  "
                f"CPU {dec_cpu:.2f} s"
            )
        masters = []
        if parts & {"scan", "jvm", "rows", "stream", "audit", "verify"}:
            masters.append("local[2]")
        if "scan" in parts:
            masters = ["local[1]", "local[2]", "local[*]"]
        for master_url in masters:
            spark = spark_session(master_url, app_name="trioha-bench")
            try:
                if "scan" in parts or (master_url == "local[*]" and "rows" in parts):
                    warm(spark, master)
                if "scan" in parts:
                    runs = [cpu_of(functools.partial(scan, spark, master)) for _ in range(repeat)]
                    took, spent, by = min(runs)
                    ratio = f"  {ref / took:5.1f}x reference" if ref else ""
                    print(
                        f"datasource {master_url:<8} Arrow batches     "
                        f"{rate(nbytes, count, took)}{ratio}"
                    )
                    if master_url == "local[2]":
                        # per core: the scan's rate over its 2 cores against the decoder's
                        # rate on its one; and the same counted in CPU seconds consumed
                        print(
                            f"           local[2] per core is {dec / (2 * took):.2f}x the "
                            f"decoder (wall clock / 2 cores); in CPU seconds "
                            f"{dec_cpu / spent:.2f}x ({spent:.2f} s: {cpu_text(by)}; "
                            f"decoder {dec_cpu:.2f} s)"
                        )
                        big = [
                            cpu_of(functools.partial(scan, spark, master, partition_mib=512))
                            for _ in range(repeat)
                        ]
                        took, spent, by = min(big)
                        print(
                            f"           local[2] partitionBytes 512 MiB "
                            f"{rate(nbytes, count, took)}  per core {dec / (2 * took):.2f}x "
                            f"the decoder; in CPU seconds {dec_cpu / spent:.2f}x ({spent:.2f} s: "
                            f"{cpu_text(by)})"
                        )
                        replay, replay_cpu, replay_by = replayed(spark, master, repeat)
                        print(
                            f"           local[2] Spark's side alone   "
                            f"{rate(nbytes, count, replay)}  CPU {replay_cpu:.2f} s "
                            f"({cpu_text(replay_by)}): the same rows from decoded batches "
                            f"replayed, no decoding; per core {dec / (2 * replay):.2f}x "
                            "the decoder at best"
                        )
                if "jvm" in parts and (master_url == "local[2]" or "scan" in parts):
                    bench_jvm(
                        spark,
                        master,
                        master_url,
                        nbytes=nbytes,
                        count=count,
                        repeat=repeat,
                        dec=dec,
                        dec_cpu=dec_cpu,
                    )
                if master_url == "local[2]" and "stream" in parts:
                    p50, p99, worst = stream_latency(spark, work / "live")
                    print(
                        f"stream     local[2] put -> sink row   p50 {p50 * 1000:.0f} ms, p99 "
                        f"{p99 * 1000:.0f} ms, max {worst * 1000:.0f} ms (200 puts 50 ms "
                        "apart, foreachBatch, processingTime 0)"
                    )
                if master_url == masters[-1] and "rows" in parts:
                    rows = scan(spark, master, arrow=False)
                    print(f"datasource {master_url} Python rows       {rate(nbytes, count, rows)}")
                if master_url == masters[-1] and parts & {"audit", "verify"}:
                    bench_audit(
                        spark, master, work / "slave", count, repeat, verify="verify" in parts
                    )
            finally:
                spark.stop()
        print(f"load average at the end {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def bench_jvm(
    spark: SparkSession,
    root: Path,
    master_url: str,
    *,
    nbytes: int,
    count: int,
    repeat: int,
    dec: float,
    dec_cpu: float,
) -> None:
    """The JVM engine's scan (``read_commitlog(engine="jvm")``): records decoded in the
    executors' JVMs, no Python worker; for ``local[2]`` per core against the decoder."""
    from trioha.pipeline._jvm import jvm_loaded

    if not jvm_loaded(spark):
        print(f"jvm engine {master_url:<8} not in this session (no JDK?): skipped")
        return
    warm(spark, root, engine="jvm")
    runs = [cpu_of(functools.partial(scan, spark, root, engine="jvm")) for _ in range(repeat)]
    took, spent, by = min(runs)
    print(f"jvm engine {master_url:<8} columnar batches  {rate(nbytes, count, took)}")
    if master_url == "local[2]":
        print(
            f"           local[2] JVM engine per core is {dec / (2 * took):.2f}x the decoder "
            f"(wall clock / 2 cores); in CPU seconds {dec_cpu / spent:.2f}x ({spent:.2f} s: "
            f"{cpu_text(by)}; decoder {dec_cpu:.2f} s)"
        )


def bench_audit(
    spark: SparkSession,
    master: Path,
    slave: Path,
    count: int,
    repeat: int,
    *,
    verify: bool,
) -> None:
    """An identical pair against ``cmp`` (alternating, best of *repeat* each), the same
    audit with ``--verify-records`` (with *verify*), and a pair differing in one body byte."""
    from trioha.pipeline import audit_replicas

    shutil.copytree(master / "commitlog", slave / "commitlog")
    audit = functools.partial(audit_replicas, spark, str(master), [str(slave)])
    audit()  # warm: the page cache holds both copies for cmp and the audit
    cmps, audits = [], []
    for _ in range(max(repeat, 2)):
        cmps.append(cmp_files(master, slave))
        audits.append(timed(audit))
    best_cmp, best_audit = min(cmps), min(audits)
    nbytes = sum(p.stat().st_size for p in (master / "commitlog").iterdir())
    print(f"cmp        the two copies             {best_cmp:6.2f} s for 2 x {nbytes / GIB:.2f} GiB")
    print(
        f"audit      {spark.sparkContext.master:<8} identical pair    {best_audit:6.2f} s  "
        f"{best_audit / best_cmp:.1f}x cmp (each best of {len(cmps)}, alternating)"
    )
    if verify:
        took = timed(functools.partial(audit, verify_records=True))
        print(
            f"audit      --verify-records           {took:6.2f} s  "
            f"{took / best_cmp:.1f}x cmp (framing + every body CRC too)"
        )
    took, where = diverged(spark, master, slave, count)
    print(f"audit      one flipped body byte      {took:6.2f} s  {where}")


if __name__ == "__main__":
    main()
