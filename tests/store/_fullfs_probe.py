"""Everything the store does through its mappings, on a filesystem that is full.

Run as ``python -m tests.store._fullfs_probe DIR`` with DIR on an empty small tmpfs (see
``test_full_tmpfs``): it builds a store whose segments hold END_OF_FILE padding and a record
ending exactly on a page boundary (the holes a full tmpfs cannot back), a message index and
consume queues, fills the filesystem, then reads, walks, reopens, indexes, queries and
writes queue units. On a full tmpfs a fault on a hole of a shared mapping is a SIGBUS that
kills this process; what must happen instead is that reads work and writes fail with
ENOSPC, and that, once space is back, the same writes work. Prints one line per step done.
"""

from __future__ import annotations

import errno
import mmap
import sys
from pathlib import Path

from tests.broker._diskfaults import fill_until_full
from trioha.store import NewMessage, open_store
from trioha.store._consumequeue import ConsumeQueueStore
from trioha.store._index import IndexService

SEG = 64 * 1024
TOPIC = "Probe"


def _refused(what: str, call: object) -> None:
    assert callable(call)
    try:
        call()
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        print(f"{what}: refused ({exc.strerror})", flush=True)
        return
    print(f"{what}: fitted in pages already allocated", flush=True)


def _pipeline_read(directory: Path, end: int) -> None:
    """The Spark source's reader over every segment (it maps them too)."""
    try:
        from trioha.pipeline import Segment
        from trioha.pipeline._decode import open_segment
        from trioha.pipeline._framing import written_end
    except ImportError as exc:  # the spark extra is not installed
        print(f"pipeline: not installed ({exc.name})", flush=True)
        return
    segments = sorted(directory.iterdir())
    for path in segments:
        segment = Segment(str(path), int(path.name), SEG)
        with open_segment(segment) as data:
            last, torn = written_end(data)
        assert torn is None
    assert last == end, (last, end)
    print("pipeline read", flush=True)


def main(root: Path) -> None:
    store_dir = root / "store"
    with open_store(store_dir, segment_size=SEG) as store:
        log = store.commitlog
        for i in range(70):  # segment 0 closed by a blank record, segment 1 begun
            log.append(
                NewMessage(topic=TOPIC, body=b"m%04d" % i * 200, properties={"KEYS": f"k{i}"})
            )
        # A lost range: END_OF_FILE records pad the rest of segment 1 and all of 2 and 3.
        padded_to = log.skip_past(log.max_offset + 2 * SEG)
        # A record ending exactly on a page: the next header would lie in a hole.
        probe = log.append(NewMessage(topic=TOPIC, body=b""))
        body = mmap.PAGESIZE - 2 * probe.size  # the same overhead, plus the body
        log.append(NewMessage(topic=TOPIC, body=b"p" * body))
        assert log.max_offset % mmap.PAGESIZE == 0, log.max_offset
        end = log.max_offset
        messages = list(log.iter_messages())
    index = IndexService(store_dir)
    index.load(flushed_up_to=None)
    index.build_batch(
        [
            (m.topic, m.physical_offset, m.store_timestamp, None, m.keys.encode())
            for m in messages
            if m.keys
        ],
        now_ms=messages[-1].store_timestamp,
    )
    queues = ConsumeQueueStore(store_dir)
    queue = queues.find_or_create(TOPIC, 0)
    for m in messages:
        queue.put(m.queue_offset, m.physical_offset, m.total_size, 0)
    queue.write_pending()
    print("built", flush=True)

    fill_until_full(root / "filler")
    print("full", flush=True)

    with open_store(store_dir, segment_size=SEG) as store:  # recovery walks every record
        log = store.commitlog
        assert log.max_offset == end, (log.max_offset, end)
        offset, zeros = log.min_offset, 0
        while offset < log.max_offset:  # the padding too, as an HA master sends it
            chunk = bytes(log.read(offset, 8192))
            zeros += chunk.count(0)
            offset += len(chunk)
        assert zeros > 2 * SEG
        assert len(list(log.iter_messages())) == len(messages)
        assert log.last_record() is not None
        assert log.boundaries_around(padded_to - 100) == (padded_to - SEG, padded_to)
        print("read, walked and reopened", flush=True)

    _pipeline_read(store_dir / "commitlog", end)

    found = index.query_offsets(TOPIC, "k3", 32, 0, 2**62).phy_offsets
    assert found == [messages[3].physical_offset], found
    for i in range(2000):  # keys whose slot pages were never touched: read with pread
        assert index.query_offsets(TOPIC, f"none-{i}", 32, 0, 2**62).phy_offsets == []
    print("queried", flush=True)

    late = [(TOPIC, end + i, 0, None, f"late-{i}".encode()) for i in range(3000)]
    _refused("index", lambda: index.build_batch(late, now_ms=messages[-1].store_timestamp))
    for at in range(len(messages), len(messages) + 3000):
        queue.put(at, end, 100, 0)
    _refused("consume queue", queue.write_pending)

    (root / "filler").unlink()
    index.build_batch([], now_ms=messages[-1].store_timestamp)
    assert index.pending == 0
    assert index.query_offsets(TOPIC, "late-2999", 32, 0, 2**62).phy_offsets == [end + 2999]
    queue.write_pending()
    assert queue.max_offset == len(messages) + 3000
    index.close()
    queues.close()
    print("resumed", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
