"""Commit log bytes built the way RocketMQ 4.9 builds them, without trioha's codec.

``java_message`` follows ``CommitLog.MessageExtEncoder.encode`` field by field
(docs/rocketmq-protocol.md §4.1); ``write_java_commitlog`` lays records out as
``DefaultAppendMessageCallback.doAppend`` and ``MappedFileQueue`` do: a record never crosses a file,
``msgLen + 8 > remaining`` closes the file with a blank record of ``maxBlank`` bytes, the rest of
each file stays zero.
"""

from __future__ import annotations

import ipaddress
import struct
import zlib
from pathlib import Path

import attrs


@attrs.frozen
class JavaMessage:
    topic: str
    body: bytes
    queue_id: int = 0
    properties: tuple[tuple[str, str], ...] = ()
    born: tuple[str, int] = ("127.0.0.1", 0)
    store: tuple[str, int] = ("127.0.0.1", 8123)
    born_timestamp: int = 1_700_000_000_000
    store_timestamp: int = 1_700_000_000_005
    flag: int = 0
    reconsume_times: int = 0


def _host(host: tuple[str, int]) -> bytes:
    return ipaddress.ip_address(host[0]).packed + struct.pack(">i", host[1])


def java_message(m: JavaMessage, *, queue_offset: int, physical_offset: int) -> bytes:
    topic = m.topic.encode()
    # messageProperties2String in 4.9.1+: pairs joined by \x02, no trailing separator.
    props = "\x02".join(f"{k}\x01{v}" for k, v in m.properties).encode()
    born, store = _host(m.born), _host(m.store)
    sysflag = (0x10 if len(born) == 20 else 0) | (0x20 if len(store) == 20 else 0)
    total = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + len(born) + 8 + len(store) + 4 + 8
    total += 4 + len(m.body) + 1 + len(topic) + 2 + len(props)
    out = bytearray()
    out += struct.pack(">i", total)
    out += struct.pack(">i", -626843481)
    out += struct.pack(">i", zlib.crc32(m.body) & 0x7FFFFFFF)
    out += struct.pack(">i", m.queue_id)
    out += struct.pack(">i", m.flag)
    out += struct.pack(">q", queue_offset)
    out += struct.pack(">q", physical_offset)
    out += struct.pack(">i", sysflag)
    out += struct.pack(">q", m.born_timestamp)
    out += born
    out += struct.pack(">q", m.store_timestamp)
    out += store
    out += struct.pack(">i", m.reconsume_times)
    out += struct.pack(">q", 0)
    out += struct.pack(">i", len(m.body)) + m.body
    out += struct.pack(">b", len(topic)) + topic
    out += struct.pack(">h", len(props)) + props
    assert len(out) == total
    return bytes(out)


@attrs.frozen
class Placed:
    offset: int
    queue_offset: int
    record: bytes


def write_java_commitlog(
    directory: Path, messages: list[JavaMessage], file_size: int
) -> tuple[list[Placed], list[int]]:
    """Write ``messages`` as RocketMQ would; returns the records and the blank offsets."""
    directory.mkdir(parents=True, exist_ok=True)
    files: dict[int, bytearray] = {0: bytearray(file_size)}
    current, pos = 0, 0
    queue_offsets: dict[tuple[str, int], int] = {}
    placed: list[Placed] = []
    blanks: list[int] = []
    for m in messages:
        qo = queue_offsets.get((m.topic, m.queue_id), 0)
        size = len(java_message(m, queue_offset=0, physical_offset=0))
        if size + 8 > file_size - pos:
            blank = struct.pack(">iI", file_size - pos, 0xCBD43194)
            files[current][pos : pos + 8] = blank
            blanks.append(current + pos)
            current += file_size
            pos = 0
            files[current] = bytearray(file_size)
        record = java_message(m, queue_offset=qo, physical_offset=current + pos)
        files[current][pos : pos + size] = record
        placed.append(Placed(current + pos, qo, record))
        queue_offsets[(m.topic, m.queue_id)] = qo + 1
        pos += size
    for start, data in files.items():
        (directory / f"{start:020d}").write_bytes(bytes(data))
    return placed, blanks
