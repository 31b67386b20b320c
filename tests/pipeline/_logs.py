"""Commit logs for the pipeline tests, written by trioha's own store.

The store is the reference: the data source must read back exactly what the store's plain
iteration yields. Logs use 64 KiB segments so that a few hundred messages span several
files, each closed by a blank record.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

from trioha.store import (
    HostAddress,
    NewMessage,
    PropertiesForm,
    StoredMessage,
    make_msg_id,
    open_store,
)

SEGMENT = 64 * 1024

TOPICS = (
    "orders",
    "Bestellungen-ü",
    "主题-交易",
    "t" * 60 + "é" * 40,  # 140 bytes of UTF-8: stored with the V2 magic (2-byte length)
)
HOSTS = (
    HostAddress("10.1.2.3", 10911),
    HostAddress("192.168.0.7", 54321),
    HostAddress("::1", 10911),
    HostAddress("2001:db8::8a2e:370:7334", 40000),
)


def varied_messages(count: int, seed: int = 7) -> list[NewMessage]:
    """Deterministic messages covering what a log can hold (see the module docstring)."""
    rng = random.Random(seed)
    out: list[NewMessage] = []
    for i in range(count):
        props: list[tuple[str, str]] = []
        if i % 3:
            props.append(("TAGS", f"tag-{i % 5}"))
        if i % 4:
            props.append(("KEYS", f"key-{i} k{i % 7}"))
        if i % 5 == 0:
            props.append(("schlüssel", "wert-ü ✓"))
        if i % 11 == 0:
            props.append(("TAGS", "later-wins"))  # a duplicate key: Java's map keeps the last
        body_len = 0 if i % 9 == 0 else rng.choice((1, 17, 200, 1024, 3000))
        out.append(
            NewMessage(
                topic=TOPICS[i % len(TOPICS)],
                body=rng.randbytes(body_len),
                queue_id=i % 4,
                flag=i % 3,
                properties=tuple(props),
                born_timestamp=1_700_000_000_000 + i * 7,
                store_timestamp=1_700_000_000_500 + i * 7,
                born_host=HOSTS[i % len(HOSTS)],
                store_host=HOSTS[(i // 2) % len(HOSTS)],
                reconsume_times=i % 2,
                prepared_transaction_offset=i * 3 if i % 6 == 0 else 0,
                properties_form=PropertiesForm.V5 if i % 2 else PropertiesForm.V4_9,
            )
        )
    return out


def write_log(
    root: Path, messages: list[NewMessage], *, segment_size: int = SEGMENT, batch: int = 1
) -> list[StoredMessage]:
    """Append *messages* to a new store at *root*; return what the store reads back."""
    with open_store(root, segment_size=segment_size) as store:
        log = store.commitlog
        for i in range(0, len(messages), batch):
            log.append_batch(messages[i : i + batch])
        log.flush()
        return list(log.iter_messages())


def segments(root: Path) -> list[Path]:
    return sorted((root / "commitlog").iterdir())


def copy_log(src: Path, dst: Path) -> Path:
    """A byte-for-byte replica of the commit log at *src* (what HA produces)."""
    (dst / "commitlog").mkdir(parents=True)
    for seg in segments(src):
        shutil.copyfile(seg, dst / "commitlog" / seg.name)
    return dst


def expected_row(m: StoredMessage) -> dict[str, Any]:
    """One message as the data source's columns, timestamps in milliseconds."""
    return {
        "physical_offset": m.physical_offset,
        "size": m.total_size,
        "topic": m.topic,
        "queue_id": m.queue_id,
        "queue_offset": m.queue_offset,
        "tags": m.tags,
        "keys": m.keys,
        "born_timestamp": m.born_timestamp,
        "born_host": str(m.born_host),
        "store_timestamp": m.store_timestamp,
        "store_host": str(m.store_host),
        "sysflag": m.sysflag,
        "flag": m.flag,
        "body_crc": m.body_crc,
        "reconsume_times": m.reconsume_times,
        "prepared_transaction_offset": m.prepared_transaction_offset,
        "magic_code": m.magic,
        "properties": m.properties_dict(),
        "body": m.body,
        "msg_id": make_msg_id(m.store_host, m.physical_offset),
        "compressed": bool(m.sysflag & 1),
        "compression": None if not m.sysflag & 1 else compression(m.sysflag),
    }


def compression(sysflag: int) -> str:
    """RocketMQ's ``CompressionType.findByValue`` of bits 8-10, written out independently."""
    return {0: "zlib", 1: "lz4", 2: "zstd", 3: "zlib"}.get((sysflag >> 8) & 7, "unknown")
