"""How fast the Spark pipeline reads and audits a commit log, next to plain Python.

    .venv/bin/python bench/pipeline_bench.py [--size-gib 1] [--segment-mib 1024] [--quick]

It generates a log (1 KiB bodies by default) in a temporary directory, then prints:

* the reference: the store's own ``iter_messages`` over the same files, one process;
* the ``commitlog`` data source scanning all of it with ``local[1]``, ``local[2]`` and
  ``local[*]``, as MB/s, messages/s and the ratio to the reference;
* the same scan yielding Python rows instead of Arrow batches (``arrow=false``);
* a replica audit of the log against a byte-identical copy.

Scans go to Spark's ``noop`` sink, so every column of every row reaches the JVM and nothing
else is measured. The generated data is removed at the end. Figures move with the machine's
load: compare the ratios printed by one run, not absolute numbers between runs.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import struct
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trioha.store import HostAddress, decode_record, encode_blank, encode_message
from trioha.store._store import open_store

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
    key, and a random body with its CRC (docs/rocketmq-protocol.md §4.1 positions, IPv4 hosts).
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


def scan(spark: SparkSession, root: Path, *, arrow: bool = True, repeat: int = 1) -> float:
    """The best of *repeat* full scans into Spark's ``noop`` sink."""
    df = spark.read.format("commitlog").option("arrow", str(arrow).lower()).load(str(root))
    return min(
        timed(lambda: df.write.format("noop").mode("overwrite").save()) for _ in range(repeat)
    )


def warm(spark: SparkSession, root: Path) -> None:
    """Start the Python workers and warm the JVM's JIT before timing (the first 256 MiB)."""
    df = spark.read.format("commitlog").option("endOffset", str(256 * MIB)).load(str(root))
    df.write.format("noop").mode("overwrite").save()


def rate(nbytes: int, count: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e6:8.1f} MB/s {count / seconds:11,.0f} msg/s ({seconds:6.2f} s)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-gib", type=float, default=1.0, help="log size (default 1)")
    parser.add_argument("--segment-mib", type=int, default=1024, help="segment size (1024)")
    parser.add_argument("--body", type=int, default=1024, help="body bytes (1024)")
    parser.add_argument("--quick", action="store_true", help="128 MiB in 32 MiB segments")
    parser.add_argument("--dir", default=None, help="where to generate (default: temp dir)")
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--repeat", type=int, default=2, help="scans per setting, best kept")
    args = parser.parse_args()
    total = 128 * MIB if args.quick else int(args.size_gib * GIB)
    segment = 32 * MIB if args.quick else args.segment_mib * MIB
    repeat = 1 if args.quick else args.repeat

    from trioha.pipeline import audit_replicas, spark_session

    work = Path(tempfile.mkdtemp(prefix="trioha-pipeline-bench-", dir=args.dir))
    try:
        master = work / "master"
        t0 = time.perf_counter()
        count = make_log(master, total=total, segment_size=segment, body_size=args.body)
        nbytes = sum(p.stat().st_size for p in (master / "commitlog").iterdir())
        print(
            f"log: {nbytes / GIB:.2f} GiB in {nbytes // segment} segment(s) of "
            f"{segment // MIB} MiB, {count:,} messages of {args.body}-byte bodies "
            f"(generated in {time.perf_counter() - t0:.1f} s)"
        )
        ref = 0.0
        if not args.skip_reference:
            ref, seen = reference(master)
            assert seen == count, (seen, count)
            print(f"reference  store iter_messages, 1 process  {rate(nbytes, count, ref)}")
        results: dict[str, float] = {}
        for master_url in ("local[1]", "local[2]", "local[*]"):
            spark = spark_session(master_url, app_name="trioha-bench")
            try:
                warm(spark, master)
                results[master_url] = scan(spark, master, repeat=repeat)
                if master_url == "local[*]":
                    results["rows"] = scan(spark, master, arrow=False)
                    slave = work / "slave"
                    shutil.copytree(master / "commitlog", slave / "commitlog")
                    results["audit"] = timed(
                        functools.partial(audit_replicas, spark, str(master), [str(slave)])
                    )
            finally:
                spark.stop()
            ratio = f"  {ref / results[master_url]:5.1f}x reference" if ref else ""
            print(
                f"datasource {master_url:<8} Arrow batches     "
                f"{rate(nbytes, count, results[master_url])}{ratio}"
            )
        print(
            f"datasource local[*] Python rows       {rate(nbytes, count, results['rows'])}  "
            f"Arrow is {results['rows'] / results['local[*]']:.1f}x faster"
        )
        print(
            f"audit      local[*] master + 1 slave  {results['audit']:.2f} s for 2 x "
            f"{nbytes / GIB:.2f} GiB ({2 * nbytes / results['audit'] / 1e6:.1f} MB/s, "
            "checksums + framing + every body CRC)"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
