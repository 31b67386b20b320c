"""How fast the commit log appends and reads, next to raw syscalls on the same bytes.

    .venv/bin/python bench/store_bench.py [--quick] [--dir PATH]

For 128 B, 1 KiB and 16 KiB bodies it measures:

* appends with ASYNC_FLUSH (a thread calls ``flush()`` every 500 ms, as FlushRealTimeService
  does), with SYNC_FLUSH after every append, and with SYNC_FLUSH once per group of 64 appends
  (GroupCommitService);
* sequential reads through ``read()`` in 32 KiB pieces (haTransferBatchSize, what the HA
  master sends) and through ``iter_messages()`` (full decoding).

Each figure is printed next to a reference measured in the same run on the same record bytes:
``os.pwrite`` of each record in turn into a preallocated file (no fsync, fsync per record, fsync
per 64 records) and ``os.pread`` of 32 KiB pieces. The ratio column is store / reference. Files
live in a temporary directory (``--dir`` to choose where) that is removed at the end. Absolute
numbers move with the machine's load; compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trioha.store import FileCommitLog, HostAddress, NewMessage

MIB = 1 << 20
SEGMENT = 1 << 30
READ_CHUNK = 32 * 1024
GROUP = 64
BORN = HostAddress("10.0.0.7", 51234)


class Row:
    def __init__(self, case: str, seconds: float, nbytes: int, count: int) -> None:
        self.case = case
        self.mbps = nbytes / MIB / seconds if seconds else 0.0
        self.per_s = count / seconds if seconds else 0.0


def timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@contextmanager
def periodic_flusher(log: FileCommitLog, interval: float) -> Iterator[None]:
    """ASYNC_FLUSH: a worker thread flushing while the caller appends."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(interval):
            log.flush()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def new_log(base: Path, name: str) -> FileCommitLog:
    return FileCommitLog.open(base / name / "commitlog", segment_size=SEGMENT)


def append_n(log: FileCommitLog, body: bytes, n: int, *, sync_every: int = 0) -> None:
    append = log.append
    for i in range(n):
        append(
            NewMessage(
                "BenchTopic",
                body,
                queue_id=i & 3,
                born_host=BORN,
                properties={"KEYS": f"k{i}", "TAGS": "bench"},
            )
        )
        if sync_every and (i + 1) % sync_every == 0:
            log.flush()
    log.flush()


def records_of(log: FileCommitLog) -> list[bytes]:
    """The record bytes the store wrote, for the raw references to write again."""
    data = bytes(log.read(0, log.max_offset))
    out = []
    for m in log.iter_messages():
        out.append(data[m.physical_offset : m.end_offset])
    return out


def raw_write(
    path: Path, records: list[bytes], *, sync_every: int, sync_interval: float = 0.0
) -> float:
    """pwrite each record in turn into a preallocated file; fdatasync every ``sync_every``
    records, or from a thread every ``sync_interval`` seconds; always once at the end."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.ftruncate(fd, SEGMENT)
    stop = threading.Event()

    def flusher() -> None:
        while not stop.wait(sync_interval):
            os.fdatasync(fd)

    def run() -> None:
        pos = 0
        for i, rec in enumerate(records):
            os.pwrite(fd, rec, pos)
            pos += len(rec)
            if sync_every and (i + 1) % sync_every == 0:
                os.fdatasync(fd)
        os.fdatasync(fd)

    thread = threading.Thread(target=flusher, daemon=True) if sync_interval else None
    try:
        if thread:
            thread.start()
        return timed(run)
    finally:
        stop.set()
        if thread:
            thread.join()
        os.close(fd)
        path.unlink()


def raw_read(path: Path, end: int) -> float:
    fd = os.open(path, os.O_RDONLY)
    try:

        def run() -> None:
            pos = 0
            while pos < end:
                pos += len(os.pread(fd, min(READ_CHUNK, end - pos), pos))

        return timed(run)
    finally:
        os.close(fd)


def bench_body(base: Path, size: int, quick: bool) -> list[tuple[Row, Row]]:
    body = bytes(i % 251 for i in range(size))
    target = (16 if quick else 96) * MIB
    n_async = max(200, target // (size + 160))
    n_sync = 100 if quick else 1000
    n_group = GROUP * (20 if quick else 150)
    rows: list[tuple[Row, Row]] = []

    # Appends alone: one flush at the end, nothing in between.
    log = new_log(base, f"plain{size}")
    t = timed(lambda: append_n(log, body, n_async))
    nbytes = log.max_offset
    records = records_of(log)
    ref = raw_write(base / "raw", records, sync_every=0)
    rows.append(
        (
            Row(f"{size:>5} B append, flush at end", t, nbytes, n_async),
            Row("pwrite", ref, nbytes, n_async),
        )
    )
    log.close()
    shutil.rmtree(base / f"plain{size}")

    # ASYNC_FLUSH: flushed from a thread every 500 ms while appending.
    log = new_log(base, f"async{size}")
    with periodic_flusher(log, 0.5):
        t = timed(lambda: append_n(log, body, n_async))
    nbytes = log.max_offset
    ref = raw_write(base / "raw", records, sync_every=0, sync_interval=0.5)
    rows.append(
        (
            Row(f"{size:>5} B append ASYNC_FLUSH", t, nbytes, n_async),
            Row("pwrite+fsync/500ms", ref, nbytes, n_async),
        )
    )

    # Reads over the ASYNC log (warm page cache for both sides).
    end = log.max_offset

    def read_all() -> None:
        pos = 0
        while pos < end:
            pos += len(log.read(pos, READ_CHUNK))

    t_read = timed(read_all)
    first_segment = base / f"async{size}" / "commitlog" / f"{0:020d}"
    ref_read = raw_read(first_segment, end)
    rows.append(
        (
            Row(f"{size:>5} B read() 32 KiB", t_read, end, n_async),
            Row("pread 32 KiB", ref_read, end, n_async),
        )
    )
    count = 0

    def iterate() -> None:
        nonlocal count
        for _ in log.iter_messages():
            count += 1

    t_iter = timed(iterate)
    assert count == n_async
    rows.append(
        (
            Row(f"{size:>5} B iter_messages()", t_iter, end, n_async),
            Row("pread 32 KiB", ref_read, end, n_async),
        )
    )
    log.close()
    shutil.rmtree(base / f"async{size}")

    # SYNC_FLUSH per append
    log = new_log(base, f"sync{size}")
    t = timed(lambda: append_n(log, body, n_sync, sync_every=1))
    nbytes = log.max_offset
    ref = raw_write(base / "raw", records_of(log), sync_every=1)
    rows.append(
        (
            Row(f"{size:>5} B append SYNC each", t, nbytes, n_sync),
            Row("pwrite+fsync each", ref, nbytes, n_sync),
        )
    )
    log.close()
    shutil.rmtree(base / f"sync{size}")

    # SYNC_FLUSH per group of 64
    log = new_log(base, f"group{size}")
    t = timed(lambda: append_n(log, body, n_group, sync_every=GROUP))
    nbytes = log.max_offset
    ref = raw_write(base / "raw", records_of(log), sync_every=GROUP)
    rows.append(
        (
            Row(f"{size:>5} B append SYNC per {GROUP}", t, nbytes, n_group),
            Row(f"pwrite+fsync per {GROUP}", ref, nbytes, n_group),
        )
    )
    log.close()
    shutil.rmtree(base / f"group{size}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer messages (a smoke run)")
    parser.add_argument("--dir", type=Path, default=None, help="where to put the temporary files")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="trioha-store-bench-", dir=args.dir) as tmp:
        base = Path(tmp)
        results: list[tuple[Row, Row]] = []
        for size in (128, 1024, 16 * 1024):
            results += bench_body(base, size, args.quick)
    header = (
        f"{'case':<30} {'MB/s':>9} {'msgs/s':>10}   {'reference':<20} "
        f"{'MB/s':>9} {'msgs/s':>10} {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    for store, ref in results:
        ratio = store.mbps / ref.mbps if ref.mbps else 0.0
        print(
            f"{store.case:<30} {store.mbps:>9.1f} {store.per_s:>10.0f}   {ref.case:<20} "
            f"{ref.mbps:>9.1f} {ref.per_s:>10.0f} {ratio:>6.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
