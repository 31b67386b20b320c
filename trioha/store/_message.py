"""RocketMQ's stored message record: encode and decode, no IO.

Layout (docs/rocketmq-protocol.md §4.1; [494] ``CommitLog.MessageExtEncoder.encode``,
``calMsgLength``, ``checkMessageAndReturnSize``), all integers big-endian, IPv4 hosts::

     0 TOTALSIZE      int32     whole record, this field included
     4 MAGICCODE      int32     0xDAA320A7, or 0xDAA320AB ("V2", 2-byte topic length)
     8 BODYCRC        int32     zlib.crc32(body) & 0x7FFFFFFF
    12 QUEUEID        int32
    16 FLAG           int32
    20 QUEUEOFFSET    int64
    28 PHYSICALOFFSET int64
    36 SYSFLAG        int32     0x10: born host is IPv6, 0x20: store host is IPv6
    40 BORNTIMESTAMP  int64
    48 BORNHOST       4+4       (16+4 when IPv6)
    56 STORETIMESTAMP int64
    64 STOREHOST      4+4       (16+4 when IPv6)
    72 RECONSUMETIMES int32
    76 PREPARED TX    int64
    84 BODY           int32 length + bytes
       TOPIC          int8 length + UTF-8 (V2: int16 length)
       PROPERTIES     int16 length + UTF-8 "k\\x01v\\x02k\\x01v" (4.9 form),
                      "k\\x01v\\x02" (5.x form)

The blank record that closes a file (docs/rocketmq-protocol.md §4.3) is int32 remaining length +
int32 0xCBD43194.

Decoding never raises on bad bytes: :func:`decode_record` returns a value saying what was
found, because the recovery scan meets corrupt and torn records as a matter of course.
:func:`decode_message` is the strict variant and raises :class:`CorruptLogError`.
"""

from __future__ import annotations

import enum
import functools
import ipaddress
import mmap
import struct
import zlib
from collections.abc import Iterable, Mapping
from typing import Any, Final, NamedTuple, TypeAlias

import attrs

from trioha._errors import (
    BodyTooLargeError,
    CorruptLogError,
    MessageIllegalError,
    PropertiesTooLargeError,
    TopicTooLongError,
)

__all__ = [
    "BLANK_MAGIC",
    "BLANK_RECORD_SIZE",
    "MAX_PROPERTIES_SIZE",
    "MAX_TOPIC_SIZE_V1",
    "MAX_TOPIC_SIZE_V2",
    "MESSAGE_MAGIC",
    "MESSAGE_MAGIC_V2",
    "MIN_RECORD_SIZE",
    "Decoded",
    "DecodedBlank",
    "DecodedIncomplete",
    "DecodedInvalid",
    "DecodedMessage",
    "HostAddress",
    "InvalidReason",
    "PropertiesForm",
    "StoredMessage",
    "body_crc",
    "decode_message",
    "decode_record",
    "encode_blank",
    "encode_message",
    "make_msg_id",
    "message_length",
    "properties_to_string",
    "string_to_properties",
]

# --- constants (names follow MessageDecoder / CommitLog) ---------------------------------

MESSAGE_MAGIC: Final = 0xDAA320A7
"""``MessageDecoder.MESSAGE_MAGIC_CODE`` (-626843481 as a Java int)."""
MESSAGE_MAGIC_V2: Final = 0xDAA320AB
"""``MessageDecoder.MESSAGE_MAGIC_CODE_V2`` (5.1+, topic length is a short)."""
BLANK_MAGIC: Final = 0xCBD43194
"""``CommitLog.BLANK_MAGIC_CODE`` (-875286124 as a Java int)."""
BLANK_RECORD_SIZE: Final = 8
"""``CommitLog.END_FILE_MIN_BLANK_LENGTH``: a file always keeps room for this marker."""

MAX_TOPIC_SIZE_V1: Final = 127  # the length is a signed byte
MAX_TOPIC_SIZE_V2: Final = 32767  # signed short
MAX_PROPERTIES_SIZE: Final = 32767  # signed short

SYSFLAG_BORNHOST_V6: Final = 0x10
SYSFLAG_STOREHOST_V6: Final = 0x20

NAME_VALUE_SEPARATOR: Final = "\x01"
PROPERTY_SEPARATOR: Final = "\x02"
KEY_SEPARATOR: Final = " "

# MessageConst property names (the ones a store or a broker looks at).
PROPERTY_KEYS: Final = "KEYS"
PROPERTY_TAGS: Final = "TAGS"
PROPERTY_WAIT_STORE_MSG_OK: Final = "WAIT"
PROPERTY_DELAY_TIME_LEVEL: Final = "DELAY"
PROPERTY_RETRY_TOPIC: Final = "RETRY_TOPIC"
PROPERTY_REAL_TOPIC: Final = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID: Final = "REAL_QID"
PROPERTY_TRANSACTION_PREPARED: Final = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP: Final = "PGROUP"
PROPERTY_MIN_OFFSET: Final = "MIN_OFFSET"
PROPERTY_MAX_OFFSET: Final = "MAX_OFFSET"
PROPERTY_BUYER_ID: Final = "BUYER_ID"
PROPERTY_ORIGIN_MESSAGE_ID: Final = "ORIGIN_MESSAGE_ID"
PROPERTY_TRANSFER_FLAG: Final = "TRANSFER_FLAG"
PROPERTY_CORRECTION_FLAG: Final = "CORRECTION_FLAG"
PROPERTY_MQ2_FLAG: Final = "MQ2_FLAG"
PROPERTY_RECONSUME_TIME: Final = "RECONSUME_TIME"
PROPERTY_MSG_REGION: Final = "MSG_REGION"
PROPERTY_TRACE_SWITCH: Final = "TRACE_ON"
PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: Final = "UNIQ_KEY"
PROPERTY_MAX_RECONSUME_TIMES: Final = "MAX_RECONSUME_TIMES"
PROPERTY_CONSUME_START_TIMESTAMP: Final = "CONSUME_START_TIME"
PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET: Final = "TRAN_PREPARED_QUEUE_OFFSET"
PROPERTY_TRANSACTION_CHECK_TIMES: Final = "TRANSACTION_CHECK_TIMES"
PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS: Final = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_INSTANCE_ID: Final = "INSTANCE_ID"
PROPERTY_CORRELATION_ID: Final = "CORRELATION_ID"
PROPERTY_MESSAGE_REPLY_TO_CLIENT: Final = "REPLY_TO_CLIENT"
PROPERTY_MESSAGE_TTL: Final = "TTL"
PROPERTY_CLUSTER: Final = "CLUSTER"
PROPERTY_MESSAGE_TYPE: Final = "MSG_TYPE"
PROPERTY_CRC32: Final = "__CRC32#"  # 5.x enabledAppendPropCRC (docs/rocketmq-protocol.md §4.4)

_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1

# Precompiled layouts. The head runs from TOTALSIZE to the body length inclusive; there is
# one per (born host family, store host family), indexed by (sysflag >> 4) & 3.
_PREFIX = struct.Struct(">iI")  # total size, magic
_BLANK = struct.Struct(">iI")  # remaining, BLANK_MAGIC
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_HEADS: Final = tuple(
    struct.Struct(f">iIiiiqqiq{born}siq{store}siiqi")
    for born, store in ((4, 4), (16, 4), (4, 16), (16, 16))
)
_SYSFLAG_AT: Final = 36
MIN_RECORD_SIZE: Final = _HEADS[0].size + 1 + 2
"""Smallest possible record: IPv4 hosts, V1, empty body, topic and properties (91)."""

ReadableBuffer: TypeAlias = bytes | bytearray | memoryview | mmap.mmap
PropertiesInput: TypeAlias = Mapping[str, str] | Iterable[tuple[str, str]]
Properties: TypeAlias = tuple[tuple[str, str], ...]


# --- values ----------------------------------------------------------------------------


def _normalize_host(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        raise ValueError(f"not an IPv4 or IPv6 address: {host!r}") from None


def _check_port(_inst: object, _attr: attrs.Attribute[int], port: int) -> None:
    # RocketMQ stores the port as a Java int and never checks it, so a record with an odd
    # port is still a valid record; only the int32 range is enforced here.
    if not _INT32_MIN <= port <= _INT32_MAX:
        raise ValueError(f"port {port} does not fit the int32 stored by RocketMQ")


@attrs.frozen
class HostAddress:
    """A born or store host: an IP address and a port, as RocketMQ stores them.

    ``host`` is normalised through :mod:`ipaddress` (``"::0001"`` becomes ``"::1"``) so that
    a decoded address compares equal to the one that was encoded.
    """

    host: str = attrs.field(converter=_normalize_host)
    port: int = attrs.field(validator=_check_port)
    packed: bytes = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "packed", ipaddress.ip_address(self.host).packed)

    @property
    def is_ipv6(self) -> bool:
        return len(self.packed) == 16

    @classmethod
    def from_packed(cls, packed: bytes, port: int) -> HostAddress:
        """The address stored as 4 or 16 raw bytes plus a port (cached: hosts repeat)."""
        return _host_from_packed(packed, port)

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if self.is_ipv6 else f"{self.host}:{self.port}"


@functools.lru_cache(maxsize=4096)
def _host_from_packed(packed: bytes, port: int) -> HostAddress:
    return HostAddress(str(ipaddress.ip_address(packed)), port)


@functools.lru_cache(maxsize=4096)
def _decode_topic(raw: bytes) -> str:
    # Java decodes with new String(bytes, UTF_8), which replaces malformed input.
    return raw.decode("utf-8", "replace")


class PropertiesForm(enum.Enum):
    """How the properties string ends (docs/rocketmq-protocol.md §4.1).

    ``V4_9``: 4.9.1 to 5.1.x drop the trailing ``\\x02`` (#2883). ``V5``: 5.2.0 and later
    (and 4.9.0 and earlier) end every pair with ``\\x02`` (#7468). Both parse the same.
    """

    V4_9 = "4.9"
    V5 = "5.x"


def properties_to_string(
    properties: PropertiesInput, form: PropertiesForm = PropertiesForm.V4_9
) -> str:
    """``MessageDecoder.messageProperties2String`` in either form.

    Keys and values must be non-empty and free of ``\\x01``/``\\x02``: RocketMQ's parser
    drops empty keys or values, and the separators cannot be escaped, so anything else
    would not read back as written.
    """
    if isinstance(properties, Mapping):
        # One join in C; the checks below only look closer when a separator count is off
        # or a key or value is empty (then the loop names the pair).
        text: str | None
        try:
            text = "\x02".join(map("\x01".join, properties.items()))
        except TypeError:  # not strings: the loop below names the pair
            text = None
        n = len(properties)
        if (
            text is not None
            and text.count("\x01") == n
            and text.count("\x02") == max(n - 1, 0)
            and all(properties)
            and all(properties.values())
        ):
            return text + "\x02" if text and form is PropertiesForm.V5 else text
    items = properties.items() if isinstance(properties, Mapping) else properties
    parts: list[str] = []
    for key, value in items:
        if not isinstance(key, str) or not isinstance(value, str):
            raise MessageIllegalError(
                f"property {key!r}={value!r}: keys and values must be strings"
            )
        if not key or not value:
            raise MessageIllegalError(
                f"property {key!r}={value!r}: keys and values must be non-empty"
            )
        if "\x01" in key or "\x02" in key or "\x01" in value or "\x02" in value:
            raise MessageIllegalError(
                f"property {key!r}={value!r} contains a \\x01 or \\x02 separator"
            )
        parts.append(f"{key}\x01{value}")
    if not parts:
        return ""
    joined = "\x02".join(parts)
    return joined + "\x02" if form is PropertiesForm.V5 else joined


def string_to_properties(text: str) -> Properties:
    """``MessageDecoder.string2messageProperties``: accepts both forms.

    Like Java it skips pairs with an empty key or value; the value is everything after the
    first ``\\x01``. Pairs keep their stored order (duplicates included); see
    :meth:`StoredMessage.properties_dict` for Java's map view.
    """
    if not text:
        return ()
    out: list[tuple[str, str]] = []
    for part in text.split("\x02"):
        key, sep, value = part.partition("\x01")
        if sep and key and value:
            out.append((key, value))
    return tuple(out)


def body_crc(body: bytes | bytearray | memoryview) -> int:
    """``UtilAll.crc32``: CRC-32 masked to a non-negative Java int."""
    return zlib.crc32(body) & 0x7FFFFFFF


def message_length(
    sysflag: int,
    body_length: int,
    topic_length: int,
    properties_length: int,
    *,
    magic: int = MESSAGE_MAGIC,
) -> int:
    """``CommitLog.calMsgLength``: the record size for these field lengths (bytes)."""
    topic_len_size = 2 if magic == MESSAGE_MAGIC_V2 else 1
    return (
        _HEADS[(sysflag >> 4) & 3].size
        + body_length
        + topic_len_size
        + topic_length
        + 2
        + properties_length
    )


def make_msg_id(store_host: HostAddress, physical_offset: int) -> str:
    """``MessageDecoder.createMessageId``: store IP + int32 port + int64 offset, hex upper.

    32 hex digits for an IPv4 store host, 56 for IPv6. It is not stored in the record.
    """
    return (store_host.packed + struct.pack(">iq", store_host.port, physical_offset)).hex().upper()


@attrs.frozen
class StoredMessage:
    """One decoded record, every stored field (``MessageExt`` as read back from disk)."""

    total_size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sysflag: int
    born_timestamp: int
    born_host: HostAddress
    store_timestamp: int
    store_host: HostAddress
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties: Properties = ()
    properties_form: PropertiesForm = PropertiesForm.V4_9

    @property
    def end_offset(self) -> int:
        """Physical offset just after this record."""
        return self.physical_offset + self.total_size

    @property
    def msg_id(self) -> str:
        return make_msg_id(self.store_host, self.physical_offset)

    def properties_dict(self) -> dict[str, str]:
        """The properties as Java's map sees them (a later duplicate key wins)."""
        return dict(self.properties)

    def get_property(self, name: str) -> str | None:
        found = None
        for key, value in self.properties:
            if key == name:
                found = value
        return found

    @property
    def tags(self) -> str | None:
        return self.get_property(PROPERTY_TAGS)

    @property
    def keys(self) -> str | None:
        """``Message.getKeys``: keys joined by :data:`KEY_SEPARATOR` (a space)."""
        return self.get_property(PROPERTY_KEYS)

    def encode(self) -> bytes:
        """The record bytes for these fields (``total_size`` and ``body_crc`` recomputed)."""
        return encode_message(
            topic=self.topic,
            body=self.body,
            queue_id=self.queue_id,
            flag=self.flag,
            queue_offset=self.queue_offset,
            physical_offset=self.physical_offset,
            sysflag=self.sysflag,
            born_timestamp=self.born_timestamp,
            born_host=self.born_host,
            store_timestamp=self.store_timestamp,
            store_host=self.store_host,
            reconsume_times=self.reconsume_times,
            prepared_transaction_offset=self.prepared_transaction_offset,
            properties=self.properties,
            properties_form=self.properties_form,
            magic=self.magic,
        )


# --- encoding --------------------------------------------------------------------------


def _check_int(name: str, value: int, lo: int, hi: int) -> None:
    if not lo <= value <= hi:
        raise MessageIllegalError(f"{name}={value} is outside the Java range [{lo}, {hi}]")


class PreparedMessage:
    """A message with every offset-independent part encoded, ready to be placed.

    The commit log prepares a whole batch (so that limits fail before anything is
    written), decides where it goes, then writes each record with :meth:`write_into`.
    Mirrors ``MessageExtEncoder.encode`` split at the point where ``doAppend`` fills in
    the queue offset, physical offset and store timestamp under the put lock.
    """

    __slots__ = (
        "body",
        "born_host",
        "born_timestamp",
        "crc",
        "flag",
        "head",
        "length",
        "magic",
        "prepared_transaction_offset",
        "properties",
        "queue_id",
        "reconsume_times",
        "store_host",
        "sysflag",
        "topic",
        "topic_str",
    )

    def __init__(
        self,
        *,
        topic: str,
        body: bytes | bytearray | memoryview,
        queue_id: int = 0,
        flag: int = 0,
        sysflag: int = 0,
        born_timestamp: int = 0,
        born_host: HostAddress,
        store_host: HostAddress,
        reconsume_times: int = 0,
        prepared_transaction_offset: int = 0,
        properties: PropertiesInput = (),
        properties_form: PropertiesForm = PropertiesForm.V4_9,
        magic: int | None = None,
        max_body_size: int | None = None,
    ) -> None:
        if not (
            _INT32_MIN <= queue_id <= _INT32_MAX
            and _INT32_MIN <= flag <= _INT32_MAX
            and _INT32_MIN <= sysflag <= _INT32_MAX
            and _INT64_MIN <= born_timestamp <= _INT64_MAX
            and _INT32_MIN <= reconsume_times <= _INT32_MAX
            and _INT64_MIN <= prepared_transaction_offset <= _INT64_MAX
        ):  # one test on the hot path; name the culprit only when there is one
            _check_int("queue_id", queue_id, _INT32_MIN, _INT32_MAX)
            _check_int("flag", flag, _INT32_MIN, _INT32_MAX)
            _check_int("sysflag", sysflag, _INT32_MIN, _INT32_MAX)
            _check_int("born_timestamp", born_timestamp, _INT64_MIN, _INT64_MAX)
            _check_int("reconsume_times", reconsume_times, _INT32_MIN, _INT32_MAX)
            _check_int(
                "prepared_transaction_offset", prepared_transaction_offset, _INT64_MIN, _INT64_MAX
            )
        if type(body) is not bytes:
            body = bytes(body)
        if max_body_size is not None and len(body) > max_body_size:
            raise BodyTooLargeError(
                f"message body is {len(body)} bytes, more than maxMessageSize {max_body_size}"
            )
        topic_b = topic.encode("utf-8")
        if magic is None:
            # 5.x autoMessageVersionOnTopicLen; decided on bytes, which is what the length
            # field holds (Java counts UTF-16 units and would corrupt a long non-ASCII topic).
            magic = MESSAGE_MAGIC_V2 if len(topic_b) > MAX_TOPIC_SIZE_V1 else MESSAGE_MAGIC
        if magic == MESSAGE_MAGIC:
            if len(topic_b) > MAX_TOPIC_SIZE_V1:
                raise TopicTooLongError(
                    f"topic is {len(topic_b)} bytes; the V1 record allows {MAX_TOPIC_SIZE_V1}"
                )
        elif magic == MESSAGE_MAGIC_V2:
            if len(topic_b) > MAX_TOPIC_SIZE_V2:
                raise TopicTooLongError(
                    f"topic is {len(topic_b)} bytes; the V2 record allows {MAX_TOPIC_SIZE_V2}"
                )
        else:
            raise MessageIllegalError(
                f"magic {magic:#x} is neither MESSAGE_MAGIC nor MESSAGE_MAGIC_V2"
            )
        props_b = properties_to_string(properties, properties_form).encode("utf-8")
        if len(props_b) > MAX_PROPERTIES_SIZE:
            raise PropertiesTooLargeError(
                f"properties are {len(props_b)} bytes; a record allows {MAX_PROPERTIES_SIZE}"
            )
        # The host family bits always follow the hosts, as MessageExt.setBornHostV6Flag does.
        sysflag &= ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)
        if born_host.is_ipv6:
            sysflag |= SYSFLAG_BORNHOST_V6
        if store_host.is_ipv6:
            sysflag |= SYSFLAG_STOREHOST_V6
        self.head = _HEADS[(sysflag >> 4) & 3]
        self.topic = topic_b
        self.topic_str = topic
        self.body = body
        self.properties = props_b
        self.crc = body_crc(body)
        self.sysflag = sysflag
        self.magic = magic
        self.queue_id = queue_id
        self.flag = flag
        self.born_timestamp = born_timestamp
        self.born_host = born_host
        self.store_host = store_host
        self.reconsume_times = reconsume_times
        self.prepared_transaction_offset = prepared_transaction_offset
        self.length = message_length(sysflag, len(body), len(topic_b), len(props_b), magic=magic)

    def write_into(
        self,
        buf: bytearray | memoryview,
        pos: int,
        *,
        queue_offset: int,
        physical_offset: int,
        store_timestamp: int,
    ) -> int:
        """Write the record at ``buf[pos:]``; returns the position after it."""
        head = self.head
        born, store = self.born_host, self.store_host
        head.pack_into(
            buf,
            pos,
            self.length,
            self.magic,
            self.crc,
            self.queue_id,
            self.flag,
            queue_offset,
            physical_offset,
            self.sysflag,
            self.born_timestamp,
            born.packed,
            born.port,
            store_timestamp,
            store.packed,
            store.port,
            self.reconsume_times,
            self.prepared_transaction_offset,
            len(self.body),
        )
        p = pos + head.size
        n = len(self.body)
        buf[p : p + n] = self.body
        p += n
        n = len(self.topic)
        if self.magic == MESSAGE_MAGIC_V2:
            _I16.pack_into(buf, p, n)
            p += 2
        else:
            buf[p] = n
            p += 1
        buf[p : p + n] = self.topic
        p += n
        n = len(self.properties)
        _I16.pack_into(buf, p, n)
        p += 2
        buf[p : p + n] = self.properties
        return p + n


def encode_message(
    *,
    topic: str,
    body: bytes,
    born_host: HostAddress,
    store_host: HostAddress,
    queue_id: int = 0,
    flag: int = 0,
    queue_offset: int = 0,
    physical_offset: int = 0,
    sysflag: int = 0,
    born_timestamp: int = 0,
    store_timestamp: int = 0,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
    properties: PropertiesInput = (),
    properties_form: PropertiesForm = PropertiesForm.V4_9,
    magic: int | None = None,
) -> bytes:
    """One record as RocketMQ stores it; computes TOTALSIZE and BODYCRC.

    ``magic=None`` picks V2 only when the topic is longer than 127 bytes (5.x
    ``autoMessageVersionOnTopicLen``). The IPv6 bits of ``sysflag`` are set from the hosts.
    """
    _check_int("queue_offset", queue_offset, _INT64_MIN, _INT64_MAX)
    _check_int("physical_offset", physical_offset, _INT64_MIN, _INT64_MAX)
    _check_int("store_timestamp", store_timestamp, _INT64_MIN, _INT64_MAX)
    prepared = PreparedMessage(
        topic=topic,
        body=body,
        queue_id=queue_id,
        flag=flag,
        sysflag=sysflag,
        born_timestamp=born_timestamp,
        born_host=born_host,
        store_host=store_host,
        reconsume_times=reconsume_times,
        prepared_transaction_offset=prepared_transaction_offset,
        properties=properties,
        properties_form=properties_form,
        magic=magic,
    )
    buf = bytearray(prepared.length)
    prepared.write_into(
        buf,
        0,
        queue_offset=queue_offset,
        physical_offset=physical_offset,
        store_timestamp=store_timestamp,
    )
    return bytes(buf)


def encode_blank(remaining: int) -> bytes:
    """The END_OF_FILE marker: int32 ``remaining`` (bytes left in the file) + BLANK_MAGIC."""
    return _BLANK.pack(remaining, BLANK_MAGIC)


# --- decoding --------------------------------------------------------------------------


class InvalidReason(enum.Enum):
    """Why ``checkMessageAndReturnSize`` would reject a record (used in file names too)."""

    BAD_MAGIC = "bad-magic"  # includes zeros: the normal end of data in a preallocated file
    BAD_TOTAL_SIZE = "bad-total-size"  # smaller than any record can be
    BAD_LENGTH = "bad-length"  # a negative body/topic/properties length
    SIZE_MISMATCH = "size-mismatch"  # TOTALSIZE differs from calMsgLength of the fields
    CRC_MISMATCH = "crc-mismatch"


@attrs.frozen
class DecodedMessage:
    """A complete, valid record."""

    message: StoredMessage

    @property
    def size(self) -> int:
        return self.message.total_size


@attrs.frozen
class DecodedBlank:
    """The END_OF_FILE marker at ``offset``; ``remaining`` is its stored length field."""

    offset: int
    remaining: int


@attrs.frozen
class DecodedIncomplete:
    """The buffer ends inside a record that looks valid so far; ``needed`` bytes are needed."""

    offset: int
    available: int
    needed: int


@attrs.frozen
class DecodedInvalid:
    """Not a valid record at ``offset``: ``reason`` and a human ``detail``."""

    offset: int
    reason: InvalidReason
    detail: str


Decoded: TypeAlias = DecodedMessage | DecodedBlank | DecodedIncomplete | DecodedInvalid


class RecordLayout(NamedTuple):
    """Where a valid record's fields sit (internal to the store; used to scan cheaply)."""

    fields: tuple[Any, ...]  # the head: TOTALSIZE ... body length, as _HEADS unpacks it
    magic: int
    topic_start: int
    topic_end: int
    props_end: int
    body_end: int


def parse_record(
    buf: ReadableBuffer, pos: int, end: int, check_crc: bool, base_offset: int
) -> RecordLayout | DecodedBlank | DecodedIncomplete | DecodedInvalid:
    """Validate the record at ``buf[pos:end]`` like ``checkMessageAndReturnSize``.

    The record may not extend past ``end``. Every length is checked against TOTALSIZE
    before it is used, so garbage can never make this read outside the record.
    """
    off = base_offset + pos
    avail = end - pos
    if avail < 8:
        return DecodedIncomplete(off, max(avail, 0), 8)
    total, magic = _PREFIX.unpack_from(buf, pos)
    if magic == BLANK_MAGIC:
        return DecodedBlank(off, total)
    if magic != MESSAGE_MAGIC and magic != MESSAGE_MAGIC_V2:  # noqa: PLR1714 (hot path)
        return DecodedInvalid(off, InvalidReason.BAD_MAGIC, f"magic {magic:#010x} at {off}")
    if total < MIN_RECORD_SIZE:
        return DecodedInvalid(
            off, InvalidReason.BAD_TOTAL_SIZE, f"total size {total} at {off} is too small"
        )
    if avail < total:
        return DecodedIncomplete(off, avail, total)
    rec_end = pos + total
    sysflag = _I32.unpack_from(buf, pos + _SYSFLAG_AT)[0]
    head = _HEADS[(sysflag >> 4) & 3]
    if head.size > total:
        return DecodedInvalid(
            off, InvalidReason.SIZE_MISMATCH, f"total size {total} at {off} < header {head.size}"
        )
    fields = head.unpack_from(buf, pos)
    body_len = fields[16]
    if body_len < 0:
        return DecodedInvalid(off, InvalidReason.BAD_LENGTH, f"body length {body_len} at {off}")
    p = pos + head.size
    body_end = p + body_len
    if magic == MESSAGE_MAGIC_V2:
        if body_end + 2 > rec_end:
            return _mismatch(off, total, "body")
        topic_len = _I16.unpack_from(buf, body_end)[0]
        topic_start = body_end + 2
    else:
        if body_end + 1 > rec_end:
            return _mismatch(off, total, "body")
        topic_len = buf[body_end]
        if topic_len > 127:  # Java reads a signed byte: a negative length fails
            topic_len -= 256
        topic_start = body_end + 1
    if topic_len < 0:
        return DecodedInvalid(off, InvalidReason.BAD_LENGTH, f"topic length {topic_len} at {off}")
    topic_end = topic_start + topic_len
    if topic_end + 2 > rec_end:
        return _mismatch(off, total, "topic")
    props_len = _I16.unpack_from(buf, topic_end)[0]
    if props_len < 0:
        return DecodedInvalid(
            off, InvalidReason.BAD_LENGTH, f"properties length {props_len} at {off}"
        )
    props_end = topic_end + 2 + props_len
    if props_end != rec_end:
        return _mismatch(off, total, "properties", props_end - pos)
    if check_crc and body_len:
        crc = zlib.crc32(memoryview(buf)[p:body_end]) & 0x7FFFFFFF
        if crc != fields[2]:
            return DecodedInvalid(
                off,
                InvalidReason.CRC_MISMATCH,
                f"body CRC {crc} != stored {fields[2]} in the record at {off}",
            )
    return RecordLayout(fields, magic, topic_start, topic_end, props_end, body_end)


#: What ties a stored record to the place that names it: TOTALSIZE, MAGICCODE, QUEUEID,
#: QUEUEOFFSET and PHYSICALOFFSET (§4.1), in one unpack of the record's first bytes.
_TIES = struct.Struct(">iI4xi4xqq")
RECORD_HEAD_SIZE: Final = _TIES.size
"""Bytes :func:`is_record_at` needs: a record's head up to its PHYSICALOFFSET."""


def is_record_at(
    head: ReadableBuffer,
    offset: int,
    *,
    size: int | None = None,
    queue_id: int | None = None,
    queue_offset: int | None = None,
) -> bool:
    """Whether ``head``, the first :data:`RECORD_HEAD_SIZE` (or more) bytes read at commit log
    ``offset``, begins the message stored there, of ``size`` bytes at ``queue_offset`` of
    queue ``queue_id`` when those are given (what a consume queue unit says).

    Every record names its own physical offset, so zeros, padding, a blank marker, bytes
    inside another record or a record of another queue all fail; a unit or an index entry
    left pointing at bytes the log no longer holds (a tail lost in a crash) is told apart
    without decoding anything.
    """
    if len(head) < _TIES.size:
        return False
    total, magic, found_queue, found_offset, physical = _TIES.unpack_from(head, 0)
    return (
        magic in (MESSAGE_MAGIC, MESSAGE_MAGIC_V2)
        and physical == offset
        and total >= MIN_RECORD_SIZE
        and (size is None or total == size)
        and (queue_id is None or found_queue == queue_id)
        and (queue_offset is None or found_offset == queue_offset)
    )


def parse_before_hole(  # noqa: PLR0917 (parse_record's arguments, and the hole's start)
    buf: ReadableBuffer, pos: int, end: int, backed: int, check_crc: bool, base_offset: int
) -> RecordLayout | DecodedBlank | DecodedIncomplete | DecodedInvalid:
    """:func:`parse_record` over a segment whose bytes from ``backed`` on are a hole (zeros
    never written, see ``_segment``), without reading the hole through ``buf``.

    A record that runs into the hole was never written whole: it is reported as
    :class:`DecodedIncomplete` (a torn record), whatever the zeros would have made of it.
    A header that lies in the hole reads as the zeros it is.
    """
    if end <= backed:
        return parse_record(buf, pos, end, check_crc, base_offset)
    if pos + _PREFIX.size <= backed:
        return parse_record(buf, pos, backed, check_crc, base_offset)
    head = bytes(buf[pos:backed]) if pos < backed else b""
    head += bytes(_PREFIX.size - len(head))
    return parse_record(head, 0, min(_PREFIX.size, end - pos), check_crc, base_offset + pos)


def _mismatch(off: int, total: int, where: str, computed: int | None = None) -> DecodedInvalid:
    detail = f"total size {total} at {off} "
    detail += (
        f"!= computed length {computed}"
        if computed is not None
        else f"is too short for its {where} length"
    )
    return DecodedInvalid(off, InvalidReason.SIZE_MISMATCH, detail)


def build_message(buf: ReadableBuffer, pos: int, layout: RecordLayout) -> StoredMessage:
    """The :class:`StoredMessage` for a record :func:`parse_record` accepted."""
    f = layout.fields
    mv = memoryview(buf)
    props_text = str(mv[layout.topic_end + 2 : layout.props_end], "utf-8", "replace")
    return StoredMessage(
        total_size=f[0],
        magic=layout.magic,
        body_crc=f[2],
        queue_id=f[3],
        flag=f[4],
        queue_offset=f[5],
        physical_offset=f[6],
        sysflag=f[7],
        born_timestamp=f[8],
        born_host=_host_from_packed(f[9], f[10]),
        store_timestamp=f[11],
        store_host=_host_from_packed(f[12], f[13]),
        reconsume_times=f[14],
        prepared_transaction_offset=f[15],
        body=bytes(mv[layout.body_end - f[16] : layout.body_end]),
        topic=_decode_topic(bytes(mv[layout.topic_start : layout.topic_end])),
        properties=string_to_properties(props_text),
        properties_form=PropertiesForm.V5 if props_text.endswith("\x02") else PropertiesForm.V4_9,
    )


def decode_record(
    buf: ReadableBuffer,
    pos: int = 0,
    *,
    check_crc: bool = True,
    base_offset: int = 0,
    end: int | None = None,
) -> Decoded:
    """Decode the record at ``buf[pos:]`` (``buf[pos:end]`` if ``end`` is given).

    Never raises for bad bytes. ``offset`` in the result is ``base_offset + pos``, so a
    caller that passes the physical offset of ``buf[0]`` gets physical offsets back.
    A prefix of a valid record gives :class:`DecodedIncomplete`.
    """
    stop = len(buf) if end is None else min(end, len(buf))
    layout = parse_record(buf, pos, stop, check_crc, base_offset)
    if isinstance(layout, RecordLayout):
        return DecodedMessage(build_message(buf, pos, layout))
    return layout


def decode_message(
    buf: ReadableBuffer, pos: int = 0, *, check_crc: bool = True, base_offset: int = 0
) -> StoredMessage:
    """Strict :func:`decode_record`: a message or :class:`CorruptLogError` saying why not."""
    match decode_record(buf, pos, check_crc=check_crc, base_offset=base_offset):
        case DecodedMessage(message):
            return message
        case DecodedBlank(offset, remaining):
            raise CorruptLogError(
                f"blank record (remaining {remaining}) at {offset}, not a message"
            )
        case DecodedIncomplete(offset, available, needed):
            raise CorruptLogError(
                f"truncated record at {offset}: {available} bytes of at least {needed}"
            )
        case DecodedInvalid(offset, reason, detail):
            raise CorruptLogError(f"invalid record at {offset} ({reason.value}): {detail}")
