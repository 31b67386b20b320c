"""The CommitLog record layout as the pipeline reads it, and the problems it reports.

Pure Python (no numpy, no pyspark), so the planner, the CLI and the audit result classes can
use it without the ``spark`` extra. The numbers come from the spec, §4.1–4.3, which read
RocketMQ's ``CommitLog.MessageExtEncoder.encode`` and ``checkMessageAndReturnSize``. A test
checks that they agree with the store's codec (``trioha.store._message``), which writes the
logs; they are repeated here so that Spark executors need nothing of trioha but this package.
"""

from __future__ import annotations

import enum

import attrs

# --- record layout (docs/rocketmq-protocol.md §4.1) -----------------------------------------------

# Read as unsigned 32-bit values (Java's ints -626843481, -626843477 and -875286124).
MESSAGE_MAGIC = 0xDAA320A7  # topic length in one (signed) byte
MESSAGE_MAGIC_V2 = 0xDAA320AB  # 5.1+: topic length in two bytes
BLANK_MAGIC = 0xCBD43194  # end-of-file marker (docs/rocketmq-protocol.md §4.3)

#: The first three bytes both message magics share; scanning for them finds candidates.
MAGIC_PREFIX = b"\xda\xa3\x20"

SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20

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

#: Header bytes before the body length with IPv4 hosts (docs/rocketmq-protocol.md §4.1: "fixed part
#: = 84 bytes").
FIXED_PART_V4 = 84
#: The smallest record there can be: IPv4 hosts, empty body, empty topic, no properties.
MIN_RECORD_SIZE = FIXED_PART_V4 + 4 + 1 + 2

BLANK_MARKER_SIZE = 8  # int32 remaining + int32 BLANK magic

#: RocketMQ masks the body CRC to a non-negative int (``UtilAll.crc32``, docs/rocketmq-protocol.md
#: §4.1).
CRC_MASK = 0x7FFFFFFF

PROPERTY_SEPARATOR = "\x02"
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_TAGS = "TAGS"
PROPERTY_KEYS = "KEYS"


def segment_name(start: int) -> str:
    """The file name of the segment starting at *start* (``UtilAll.offset2FileName``)."""
    return f"{start:020d}"


# --- problems ---------------------------------------------------------------------------


class ProblemKind(enum.Enum):
    """What is wrong with a region of a commit log.

    The first five are what RocketMQ's ``checkMessageAndReturnSize`` would trip over while
    recovering; the last two are about the directory, as ``MappedFileQueue.load`` and
    ``checkSelf`` see it (docs/rocketmq-protocol.md §4.5).
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
