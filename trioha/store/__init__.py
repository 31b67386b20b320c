"""The RocketMQ commit log: record codec, segment files, recovery, store layout.

The codec (``_message``) is pure; everything else follows RocketMQ's ``CommitLog``,
``MappedFileQueue`` and ``DefaultMessageStore`` (docs/rocketmq-protocol.md §4). ``CommitLog`` is the
interface; ``FileCommitLog`` and ``MemoryCommitLog`` implement it; ``open_store`` opens a store
root.
"""

from trioha._config import FlushDiskType
from trioha.store._checkpoint import CHECKPOINT_SIZE, Checkpoint, read_checkpoint, write_checkpoint
from trioha.store._commitlog import FileCommitLog, RecoveryReport
from trioha.store._consumequeue import CQUnit
from trioha.store._contract import (
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_STORE_HOST,
    AppendResult,
    CommitLog,
    FlushPolicy,
    NewMessage,
    SetAside,
)
from trioha.store._epochfile import EPOCH_FILE_NAME, EpochFile
from trioha.store._memory import MemoryCommitLog
from trioha.store._message import (
    BLANK_MAGIC,
    BLANK_RECORD_SIZE,
    MESSAGE_MAGIC,
    MESSAGE_MAGIC_V2,
    MIN_RECORD_SIZE,
    RECORD_HEAD_SIZE,
    Decoded,
    DecodedBlank,
    DecodedIncomplete,
    DecodedInvalid,
    DecodedMessage,
    HostAddress,
    InvalidReason,
    PropertiesForm,
    StoredMessage,
    body_crc,
    decode_message,
    decode_record,
    encode_blank,
    encode_message,
    is_record_at,
    make_msg_id,
    message_length,
    properties_to_string,
    string_to_properties,
)
from trioha.store._segment import DEFAULT_SEGMENT_SIZE, MIN_SEGMENT_SIZE, backed_end, segment_name
from trioha.store._sent import SENT_OFFSET_FILE, SentOffsets, forget_master_marks
from trioha.store._store import Store, open_store

__all__ = [
    "BLANK_MAGIC",
    "BLANK_RECORD_SIZE",
    "CHECKPOINT_SIZE",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_SEGMENT_SIZE",
    "DEFAULT_STORE_HOST",
    "EPOCH_FILE_NAME",
    "MESSAGE_MAGIC",
    "MESSAGE_MAGIC_V2",
    "MIN_RECORD_SIZE",
    "MIN_SEGMENT_SIZE",
    "RECORD_HEAD_SIZE",
    "SENT_OFFSET_FILE",
    "AppendResult",
    "CQUnit",
    "Checkpoint",
    "CommitLog",
    "Decoded",
    "DecodedBlank",
    "DecodedIncomplete",
    "DecodedInvalid",
    "DecodedMessage",
    "EpochFile",
    "FileCommitLog",
    "FlushDiskType",
    "FlushPolicy",
    "HostAddress",
    "InvalidReason",
    "MemoryCommitLog",
    "NewMessage",
    "PropertiesForm",
    "RecoveryReport",
    "SentOffsets",
    "SetAside",
    "Store",
    "StoredMessage",
    "backed_end",
    "body_crc",
    "decode_message",
    "decode_record",
    "encode_blank",
    "encode_message",
    "forget_master_marks",
    "is_record_at",
    "make_msg_id",
    "message_length",
    "open_store",
    "properties_to_string",
    "read_checkpoint",
    "segment_name",
    "string_to_properties",
    "write_checkpoint",
]
