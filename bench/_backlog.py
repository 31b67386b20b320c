"""A master store holding a large backlog, made in seconds rather than minutes.

The first segment is written through the store (``append_batch``), so its records are exactly what a
broker writes. Every later segment is a copy of it with the two per-record offsets patched:
QUEUEOFFSET at byte 20 and PHYSICALOFFSET at byte 28 (docs/rocketmq-protocol.md §4.1). The body CRC
covers the body only, so it stays valid. All messages go to queue 0, so a record's queue offset is
simply its index in the log. The store is then reopened, so recovery checks the result (the CRC of
the last segments and the record chain of all of them) before the benchmark uses it.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import trio

from bench._common import MIB
from trioha._config import BrokerConfig
from trioha.broker import open_broker
from trioha.store import NewMessage, SentOffsets, open_store

TOPIC = "BenchTopic"
_OFFSETS = struct.Struct(">qq")  # QUEUEOFFSET, PHYSICALOFFSET (bytes 20..36)
_SIZE = struct.Struct(">i")


def make_backlog(root: Path, *, total: int, segment_size: int, body_size: int) -> int:
    """Create a store at *root* with at least *total* bytes of messages; returns its end offset."""
    segments = max(1, -(-total // segment_size))
    body = bytes(i % 251 for i in range(body_size))
    store = open_store(root, segment_size=segment_size)
    try:
        log = store.commitlog
        batch = [NewMessage(TOPIC, body, properties={"KEYS": "bench"})] * 64
        while log.max_offset < segment_size:
            log.append_batch(batch)
        first = bytes(log.read(0, segment_size))
        # Only complete segments are copied: drop what spilled into the second one.
        spilled = log.max_offset - segment_size
        records = _record_starts(first)
        if spilled:
            log.truncate(segment_size)
    finally:
        store.close()
    directory = root / "commitlog"
    for n in range(1, segments):
        start = n * segment_size
        data = bytearray(first)
        base = n * len(records)
        for k, pos in enumerate(records):
            _OFFSETS.pack_into(data, pos + 20, base + k, start + pos)
        path = directory / f"{start:020d}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            done = 0
            while done < len(view):
                done += os.pwrite(fd, view[done:], done)
        finally:
            os.close(fd)
    expected = segments * segment_size
    # A master's own log, as a master that wrote it would have said in its marks: a store with
    # data and no marks starts as a promoted slave, padded past its end (docs/replication.md).
    SentOffsets.open(root).note_recovered_end(expected)
    end = trio.run(_index, root, segment_size)
    if end != expected:
        raise RuntimeError(f"backlog at {root} recovered to {end}, expected {expected}")
    return end


async def _index(root: Path, segment_size: int) -> int:
    """Open the store as a broker once and wait until its consume queues cover the log.

    A broker that has been running holds consume queues for its log; without this the master
    would spend the benchmark building them for the whole backlog.
    """
    config = BrokerConfig(
        store_path_root_dir=str(root),
        mapped_file_size_commit_log=segment_size,
        ha_listen_port=0,
        listen_port=0,
    )
    async with open_broker(config) as broker:
        end = broker.store.commitlog.max_offset
        assert broker.client_side is not None
        await broker.client_side.reput.wait_dispatched(end)
        return end


def _record_starts(segment: bytes) -> list[int]:
    """Positions of the message records in a segment (stops at the blank end marker)."""
    starts = []
    pos = 0
    magic_at = 4
    while pos + 8 <= len(segment):
        (size,) = _SIZE.unpack_from(segment, pos)
        magic = segment[pos + magic_at : pos + magic_at + 4]
        if magic != b"\xda\xa3\x20\xa7":
            break
        starts.append(pos)
        pos += size
    return starts


if __name__ == "__main__":
    import sys
    import time

    t0 = time.perf_counter()
    end = make_backlog(
        Path(sys.argv[1]), total=int(sys.argv[2]) * MIB, segment_size=64 * MIB, body_size=1024
    )
    print(f"{end} bytes in {time.perf_counter() - t0:.1f} s")
