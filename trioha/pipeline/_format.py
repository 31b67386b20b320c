"""The CommitLog record layout as the pipeline reads it, and the problems it reports.

No numpy, no pyspark, so the planner, the CLI and the audit result classes can use it
without the ``spark`` extra. The record constants are the store's own
(``trioha.store._message``, which follows ``CommitLog.MessageExtEncoder.encode`` and
``checkMessageAndReturnSize``): the logs the store writes and the pipeline reads share one
definition. Importing the store's codec loads no Trio and nothing of the broker.
"""

from __future__ import annotations

import enum

import attrs

from trioha.store import (
    BLANK_MAGIC,
    MESSAGE_MAGIC,
    MESSAGE_MAGIC_V2,
    MIN_RECORD_SIZE,
    NAME_VALUE_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
)
from trioha.store import BLANK_RECORD_SIZE as BLANK_MARKER_SIZE

__all__ = [
    "BLANK_MAGIC",
    "BLANK_MARKER_SIZE",
    "MESSAGE_MAGIC",
    "MESSAGE_MAGIC_V2",
    "MIN_RECORD_SIZE",
    "NAME_VALUE_SEPARATOR",
    "PROPERTY_KEYS",
    "PROPERTY_SEPARATOR",
    "PROPERTY_TAGS",
    "SYSFLAG_BORNHOST_V6",
    "SYSFLAG_STOREHOST_V6",
    "Problem",
    "ProblemKind",
    "segment_name",
]

# --- record layout ----------------------------------------------------------------------

#: ``MessageSysFlag.COMPRESSED_FLAG``: the producer compressed the body.
SYSFLAG_COMPRESSED = 0x1
#: ``MessageSysFlag.COMPRESSION_TYPE_COMPARATOR`` (5.x): bits 8-10 name the algorithm.
SYSFLAG_COMPRESSION_SHIFT = 8
SYSFLAG_COMPRESSION_MASK = 0x7
#: ``CompressionType.findByValue``: 0 (a 4.x producer, which always used zlib) and 3 are
#: zlib, 1 is LZ4 (frame format), 2 is Zstandard.
COMPRESSION_NAMES = {0: "zlib", 1: "lz4", 2: "zstd", 3: "zlib"}

# Byte positions inside a record that do not depend on the host sizes.
POS_TOTAL_SIZE = 0
POS_MAGIC = 4
POS_BODY_CRC = 8
POS_QUEUE_ID = 12
POS_FLAG = 16
POS_QUEUE_OFFSET = 20
POS_PHYSICAL_OFFSET = 28
POS_SYSFLAG = 36
POS_BORN_TIMESTAMP = 40
POS_BORN_HOST = 48

HOST_V4_SIZE = 8  # 4-byte address + int32 port
HOST_V6_SIZE = 20  # 16-byte address + int32 port

#: Header bytes before the body length with IPv4 hosts ("fixed part = 84 bytes").
FIXED_PART_V4 = 84

#: RocketMQ masks the body CRC to a non-negative int (``UtilAll.crc32``).
CRC_MASK = 0x7FFFFFFF


def segment_name(start: int) -> str:
    """The file name of the segment starting at *start* (``UtilAll.offset2FileName``)."""
    return f"{start:020d}"


# --- problems ---------------------------------------------------------------------------


class ProblemKind(enum.Enum):
    """What is wrong with a region of a commit log.

    The first five are what RocketMQ's ``checkMessageAndReturnSize`` would trip over while
    recovering; the last two are about the directory, as ``MappedFileQueue.load`` and
    ``checkSelf`` see it.
    """

    BAD_MAGIC = "bad_magic"  # a record was expected, the magic code is neither kind
    SIZE_MISMATCH = "size_mismatch"  # total size implausible or not what the fields add up to
    OFFSET_MISMATCH = "offset_mismatch"  # the stored physical offset is not the record's own
    CRC_MISMATCH = "crc_mismatch"  # the body does not match its stored CRC
    TORN_TAIL = "torn_tail"  # the log ends inside a record (a partial last message)
    GAP = "gap"  # zeros where a record or an end-of-file marker was expected
    MISSING_SEGMENT = "missing_segment"  # a hole between segment files
    BAD_SEGMENT = "bad_segment"  # a segment file of the wrong length or misplaced


@attrs.frozen
class Problem:
    """One corrupt, torn or missing region, as a row of the ``problems`` output.

    *offset* is the absolute commit log offset where the region starts and *length* how many
    bytes it covers (0 when unknown). *segment* is the file name (20 digits).
    """

    offset: int
    segment: str
    kind: ProblemKind
    length: int
    detail: str

    def as_row(self) -> tuple[int, str, str, int, str]:
        """The values in the order of the problems schema."""
        return (self.offset, self.segment, self.kind.value, self.length, self.detail)

    def render(self) -> str:
        return f"{self.kind.value} at offset {self.offset} ({self.segment}): {self.detail}"
