"""The stored-message codec against docs/rocketmq-protocol.md §4.1 ([494]
CommitLog.MessageExtEncoder.encode, checkMessageAndReturnSize,
MessageDecoder.messageProperties2String/string2messageProperties).
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trioha import CorruptLogError, MessageTooLargeError
from trioha.store import (
    BLANK_MAGIC,
    BLANK_RECORD_SIZE,
    MESSAGE_MAGIC,
    MESSAGE_MAGIC_V2,
    MIN_RECORD_SIZE,
    DecodedBlank,
    DecodedIncomplete,
    DecodedInvalid,
    DecodedMessage,
    HostAddress,
    InvalidReason,
    PropertiesForm,
    StoredMessage,
    decode_message,
    decode_record,
    encode_blank,
    encode_message,
    make_msg_id,
    message_length,
    properties_to_string,
    string_to_properties,
)
from trioha.store._message import PreparedMessage
from trioha.testing.strategies import properties, stored_messages

# DefaultMessageStoreTest / HATest: "Once, there was a chance for me!", topic FooBar,
# bornHost 127.0.0.1:0, storeHost <local>:8123, keys = currentTimeMillis, tags TAG1.
BODY = b"Once, there was a chance for me!"
BORN = HostAddress("127.0.0.1", 0)
STORE = HostAddress("127.0.0.1", 8123)
NOW = 1_700_000_000_000


def java_record(props: str, *, queue_offset: int = 0, physical_offset: int = 0) -> bytes:
    """The record built field by field from the layout, the way Java's encoder does.

    docs/rocketmq-protocol.md §4.1.
    """
    topic = b"FooBar"
    props_b = props.encode()
    total = 84 + 4 + len(BODY) + 1 + len(topic) + 2 + len(props_b)
    out = struct.pack(">i", total)
    out += struct.pack(">i", -626843481)  # MESSAGE_MAGIC_CODE as a Java int
    out += struct.pack(">i", zlib.crc32(BODY) & 0x7FFFFFFF)
    out += struct.pack(">iiqq", 0, 0, queue_offset, physical_offset)
    out += struct.pack(">iq", 0, NOW)
    out += bytes([127, 0, 0, 1]) + struct.pack(">i", 0)
    out += struct.pack(">q", NOW + 5)
    out += bytes([127, 0, 0, 1]) + struct.pack(">i", 8123)
    out += struct.pack(">iq", 0, 0)
    out += struct.pack(">i", len(BODY)) + BODY
    out += bytes([len(topic)]) + topic
    out += struct.pack(">h", len(props_b)) + props_b
    return out


def foobar(form: PropertiesForm = PropertiesForm.V4_9, **kw: int) -> bytes:
    return encode_message(
        topic="FooBar",
        body=BODY,
        born_host=BORN,
        store_host=STORE,
        born_timestamp=NOW,
        store_timestamp=NOW + 5,
        properties=[("KEYS", str(NOW)), ("TAGS", "TAG1")],
        properties_form=form,
        **kw,
    )


def test_rocketmq_test_message_is_157_bytes_in_the_4_9_form() -> None:
    record = foobar()
    assert len(record) == 157
    assert record == java_record(f"KEYS\x01{NOW}\x02TAGS\x01TAG1")


def test_rocketmq_test_message_is_158_bytes_in_the_5_x_form() -> None:
    record = foobar(PropertiesForm.V5)
    assert len(record) == 158
    assert record == java_record(f"KEYS\x01{NOW}\x02TAGS\x01TAG1\x02")


def test_decode_of_a_java_record() -> None:
    raw = java_record(f"TAGS\x01TAG1\x02KEYS\x01{NOW}", queue_offset=7, physical_offset=1570)
    msg = decode_message(raw)
    assert msg == StoredMessage(
        total_size=157,
        magic=MESSAGE_MAGIC,
        body_crc=zlib.crc32(BODY) & 0x7FFFFFFF,
        queue_id=0,
        flag=0,
        queue_offset=7,
        physical_offset=1570,
        sysflag=0,
        born_timestamp=NOW,
        born_host=BORN,
        store_timestamp=NOW + 5,
        store_host=STORE,
        reconsume_times=0,
        prepared_transaction_offset=0,
        body=BODY,
        topic="FooBar",
        properties=(("TAGS", "TAG1"), ("KEYS", str(NOW))),
        properties_form=PropertiesForm.V4_9,
    )
    assert msg.tags == "TAG1"
    assert msg.keys == str(NOW)
    assert msg.end_offset == 1570 + 157
    assert msg.encode() == raw


# --- fed three ways (whole, one byte at a time, with trailing data) -----------------------


def test_whole_buffer_decodes_to_a_message() -> None:
    record = foobar()
    result = decode_record(record)
    assert isinstance(result, DecodedMessage)
    assert result.size == 157


def test_every_prefix_is_incomplete() -> None:
    record = foobar()
    for n in range(len(record)):
        result = decode_record(record[:n], base_offset=100)
        assert result == DecodedIncomplete(100, n, 8 if n < 8 else 157)


def test_trailing_data_is_left_alone() -> None:
    record = foobar()
    buf = b"\xff" * 5 + record + foobar(physical_offset=157) + b"garbage"
    first = decode_record(buf, 5, base_offset=1000)
    assert isinstance(first, DecodedMessage)
    assert first.size == 157
    second = decode_record(buf, 5 + 157)
    assert isinstance(second, DecodedMessage)
    assert second.message.physical_offset == 157
    assert decode_record(buf, 5 + 314) == DecodedIncomplete(319, 7, 8)


def test_end_bounds_the_record() -> None:
    record = foobar() + b"\0" * 10
    assert isinstance(decode_record(record, end=156), DecodedIncomplete)
    assert isinstance(decode_record(record, end=157), DecodedMessage)


# --- blank record ---------------------------------------------------------------------


def test_blank_record() -> None:
    blank = encode_blank(4000)
    assert len(blank) == BLANK_RECORD_SIZE
    assert blank == struct.pack(">ii", 4000, -875286124)
    assert struct.unpack(">I", blank[4:])[0] == BLANK_MAGIC
    assert decode_record(b"\0" * 16 + blank, 16, base_offset=4096) == DecodedBlank(4112, 4000)


# --- invalid records (checkMessageAndReturnSize) ----------------------------------------


def _invalid(buf: bytes, **kw: bool) -> InvalidReason:
    result = decode_record(buf, **kw)
    assert isinstance(result, DecodedInvalid), result
    assert result.offset == 0
    assert result.detail
    return result.reason


def test_zeros_read_as_bad_magic() -> None:
    assert _invalid(b"\0" * 200) is InvalidReason.BAD_MAGIC


def test_bad_magic() -> None:
    record = bytearray(foobar())
    record[7] ^= 0x01
    assert _invalid(bytes(record)) is InvalidReason.BAD_MAGIC


def test_total_size_smaller_than_any_record() -> None:
    record = bytearray(foobar())
    struct.pack_into(">i", record, 0, 20)
    assert _invalid(bytes(record)) is InvalidReason.BAD_TOTAL_SIZE


@pytest.mark.parametrize("delta", [-1, 1, -40])
def test_total_size_mismatch(delta: int) -> None:
    record = bytearray(foobar() + b"\0" * 64)
    struct.pack_into(">i", record, 0, 157 + delta)
    assert _invalid(bytes(record)) is InvalidReason.SIZE_MISMATCH


def test_crc_mismatch_and_check_crc_off() -> None:
    record = bytearray(foobar())
    record[88 + 3] ^= 0x20  # a body byte
    assert _invalid(bytes(record)) is InvalidReason.CRC_MISMATCH
    assert isinstance(decode_record(bytes(record), check_crc=False), DecodedMessage)


def test_empty_body_crc_is_not_checked_like_java() -> None:
    record = bytearray(encode_message(topic="T", body=b"", born_host=BORN, store_host=STORE))
    record[8:12] = b"\x00\x00\x00\x07"
    assert isinstance(decode_record(bytes(record)), DecodedMessage)


def test_negative_body_length() -> None:
    record = bytearray(foobar())
    struct.pack_into(">i", record, 84, -1)
    assert _invalid(bytes(record)) is InvalidReason.BAD_LENGTH


def test_v1_topic_length_is_a_signed_byte() -> None:
    record = bytearray(foobar())
    record[88 + len(BODY)] = 0x80
    assert _invalid(bytes(record)) is InvalidReason.BAD_LENGTH


def test_flipped_host_family_bit_is_a_size_mismatch() -> None:
    record = bytearray(foobar())
    record[39] |= 0x10
    assert _invalid(bytes(record)) is InvalidReason.SIZE_MISMATCH


def test_decode_message_is_strict() -> None:
    record = bytearray(foobar())
    record[100] ^= 0xFF
    with pytest.raises(CorruptLogError, match=r"at 4096 \(crc-mismatch\)"):
        decode_message(bytes(record), base_offset=4096)
    with pytest.raises(CorruptLogError, match="truncated record at 0"):
        decode_message(foobar()[:100])
    with pytest.raises(CorruptLogError, match="blank record"):
        decode_message(encode_blank(10))


# --- hosts, versions, limits ----------------------------------------------------------


def test_ipv6_hosts_set_the_sysflag_bits_and_widen_the_record() -> None:
    v6 = HostAddress("2001:db8::1", 10911)
    record = encode_message(topic="FooBar", body=BODY, born_host=v6, store_host=v6, sysflag=1)
    msg = decode_message(record)
    assert msg.sysflag == 0x31
    assert msg.total_size == 129 + 24
    assert msg.born_host == msg.store_host == v6
    assert message_length(0x30, len(BODY), 6, 0) == msg.total_size


def test_sysflag_host_bits_follow_the_hosts() -> None:
    record = encode_message(topic="T", body=b"", born_host=BORN, store_host=STORE, sysflag=0x30)
    assert decode_message(record).sysflag == 0


def test_long_topic_uses_the_v2_magic_and_a_short_length() -> None:
    topic = "t" * 128
    record = encode_message(topic=topic, body=b"x", born_host=BORN, store_host=STORE)
    assert struct.unpack_from(">I", record, 4)[0] == MESSAGE_MAGIC_V2
    assert struct.unpack_from(">h", record, 89)[0] == 128
    assert decode_message(record).topic == topic
    short = encode_message(topic="t" * 127, body=b"x", born_host=BORN, store_host=STORE)
    assert struct.unpack_from(">I", short, 4)[0] == MESSAGE_MAGIC


def test_limits_raise_message_too_large() -> None:
    with pytest.raises(MessageTooLargeError, match="128 bytes; the V1 record allows 127"):
        encode_message(
            topic="t" * 128, body=b"", born_host=BORN, store_host=STORE, magic=MESSAGE_MAGIC
        )
    with pytest.raises(MessageTooLargeError, match="properties are 32770 bytes"):
        encode_message(
            topic="t", body=b"", born_host=BORN, store_host=STORE, properties={"k": "v" * 32768}
        )


def test_out_of_range_fields_are_value_errors() -> None:
    with pytest.raises(ValueError, match="queue_id=2147483648"):
        encode_message(topic="t", body=b"", born_host=BORN, store_host=STORE, queue_id=2**31)


def test_host_address_validation_and_normalisation() -> None:
    assert HostAddress("0:0::0001", 1).host == "::1"
    assert str(HostAddress("::1", 5)) == "[::1]:5"
    assert str(HostAddress("10.1.2.3", 5)) == "10.1.2.3:5"
    with pytest.raises(ValueError, match="not an IPv4 or IPv6 address"):
        HostAddress("localhost", 1)


def test_msg_id_is_store_host_port_and_offset_in_upper_hex() -> None:
    assert make_msg_id(HostAddress("10.0.0.1", 10911), 1570) == "0A00000100002A9F0000000000000622"
    v6 = make_msg_id(HostAddress("::1", 1), 0)
    assert len(v6) == 56
    assert v6.endswith("00000001" + "0" * 16)


# --- properties -----------------------------------------------------------------------


def test_properties_forms() -> None:
    props = {"KEYS": "k1 k2", "TAGS": "a"}
    assert properties_to_string(props) == "KEYS\x01k1 k2\x02TAGS\x01a"
    assert properties_to_string(props, PropertiesForm.V5) == "KEYS\x01k1 k2\x02TAGS\x01a\x02"
    assert properties_to_string({}, PropertiesForm.V5) == ""
    expected = (("KEYS", "k1 k2"), ("TAGS", "a"))
    assert string_to_properties("KEYS\x01k1 k2\x02TAGS\x01a") == expected
    assert string_to_properties("KEYS\x01k1 k2\x02TAGS\x01a\x02") == expected


def test_parser_skips_what_java_skips() -> None:
    # string2messageProperties keeps a pair only with a non-empty key and value.
    text = "\x02a\x01\x02\x01b\x02xy\x02k\x01v\x01w\x02\x02"
    assert string_to_properties(text) == (("k", "v\x01w"),)


@pytest.mark.parametrize(
    "pair", [("", "v"), ("k", ""), ("k\x01", "v"), ("k", "v\x02"), ("k", "\x01")]
)
def test_unrepresentable_properties_are_rejected(pair: tuple[str, str]) -> None:
    with pytest.raises(ValueError, match="property"):
        properties_to_string([pair])


@given(properties(), st.sampled_from(PropertiesForm))
def test_properties_round_trip(props: tuple[tuple[str, str], ...], form: PropertiesForm) -> None:
    assert string_to_properties(properties_to_string(props, form)) == props


# --- round trips ----------------------------------------------------------------------


@given(stored_messages())
def test_round_trip(msg: StoredMessage) -> None:
    record = msg.encode()
    assert len(record) == msg.total_size
    assert decode_message(record) == msg


@settings(max_examples=25)
@given(stored_messages(max_body=64, long_topics=False), st.binary(max_size=20))
def test_round_trip_fed_byte_by_byte_and_with_trailing_data(
    msg: StoredMessage, trailing: bytes
) -> None:
    record = msg.encode()
    for n in range(len(record)):
        assert isinstance(decode_record(record[:n]), DecodedIncomplete)
    result = decode_record(record + trailing)
    assert result == DecodedMessage(msg)


# --- fields and records only hostile input produces -----------------------------------------


@pytest.mark.parametrize("port", [2**31, -(2**31) - 1])
def test_a_port_outside_int32_is_refused(port: int) -> None:
    with pytest.raises(ValueError, match=f"port {port} does not fit the int32"):
        HostAddress("127.0.0.1", port)


def test_a_host_from_its_packed_bytes() -> None:
    assert HostAddress.from_packed(bytes([10, 1, 2, 3]), 8123) == HostAddress("10.1.2.3", 8123)
    assert HostAddress.from_packed(bytes(15) + b"\1", 9) == HostAddress("::1", 9)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("flag", 2**31),
        ("sysflag", -(2**31) - 1),
        ("born_timestamp", 2**63),
        ("reconsume_times", 2**31),
        ("prepared_transaction_offset", -(2**63) - 1),
    ],
)
def test_each_out_of_range_field_is_named(field: str, value: int) -> None:
    fields: dict[str, Any] = {field: value}
    with pytest.raises(ValueError, match=f"{field}={value}"):
        encode_message(topic="t", body=b"", born_host=BORN, store_host=STORE, **fields)


def test_a_body_of_a_bytes_subclass_is_stored_as_plain_bytes() -> None:
    class Body(bytes):
        pass

    record = encode_message(topic="t", body=Body(b"abc"), born_host=BORN, store_host=STORE)
    assert type(decode_message(record).body) is bytes and decode_message(record).body == b"abc"


def test_a_body_over_the_limit_and_an_unknown_magic_are_refused() -> None:
    with pytest.raises(MessageTooLargeError, match="body is 11 bytes, more than maxMessageSize 10"):
        PreparedMessage(
            topic="t", body=b"x" * 11, born_host=BORN, store_host=STORE, max_body_size=10
        )
    with pytest.raises(ValueError, match="magic 0x1234 is neither"):
        encode_message(topic="t", body=b"", born_host=BORN, store_host=STORE, magic=0x1234)


def test_a_topic_longer_than_v2_allows_is_refused() -> None:
    with pytest.raises(MessageTooLargeError, match="32768 bytes; the V2 record allows 32767"):
        encode_message(
            topic="t" * 32768, body=b"", born_host=BORN, store_host=STORE, magic=MESSAGE_MAGIC_V2
        )


def test_host_bits_widening_the_header_past_the_total_is_a_size_mismatch() -> None:
    record = bytearray(encode_message(topic="T", body=b"", born_host=BORN, store_host=STORE))
    record[39] |= 0x30  # both hosts now "IPv6": 24 more header bytes than the record has
    assert _invalid(bytes(record)) is InvalidReason.SIZE_MISMATCH


def test_a_v2_body_length_running_into_the_topic_is_a_size_mismatch() -> None:
    record = bytearray(encode_message(topic="t" * 128, body=b"x", born_host=BORN, store_host=STORE))
    struct.pack_into(">i", record, 84, len(record) - 88)  # no room left for the topic length
    assert _invalid(bytes(record), check_crc=False) is InvalidReason.SIZE_MISMATCH


def test_a_topic_length_running_past_the_record_is_a_size_mismatch() -> None:
    record = bytearray(foobar())
    record[88 + len(BODY)] = 127
    assert _invalid(bytes(record)) is InvalidReason.SIZE_MISMATCH


def test_a_negative_properties_length_is_a_bad_length() -> None:
    record = bytearray(foobar())
    struct.pack_into(">h", record, 88 + len(BODY) + 1 + len("FooBar"), -1)
    assert _invalid(bytes(record)) is InvalidReason.BAD_LENGTH


# --- exact fields, bounds and messages ------------------------------------------------------


def test_fields_left_out_are_stored_as_zeros() -> None:
    record = encode_message(topic="FooBar", body=BODY, born_host=BORN, store_host=STORE)
    expected = bytearray(java_record(""))
    struct.pack_into(">q", expected, 40, 0)  # born timestamp
    struct.pack_into(">q", expected, 56, 0)  # store timestamp
    assert record == bytes(expected)


@pytest.mark.parametrize("port", [2**31 - 1, -(2**31)])
def test_ports_at_the_int32_bounds_are_stored(port: int) -> None:
    host = HostAddress("10.0.0.1", port)
    record = encode_message(topic="T", body=b"", born_host=host, store_host=host)
    assert record[48:56] == bytes([10, 0, 0, 1]) + struct.pack(">i", port)
    assert record[64:72] == bytes([10, 0, 0, 1]) + struct.pack(">i", port)
    assert decode_message(record).store_host == host


def test_msg_id_of_a_negative_port_is_its_java_int_bytes() -> None:
    # createMessageId puts the port as an int: -1 is FFFFFFFF.
    assert make_msg_id(HostAddress("10.0.0.1", -1), 16) == "0A000001FFFFFFFF0000000000000010"


def test_a_property_not_set_reads_as_none() -> None:
    msg = decode_message(
        encode_message(
            topic="T", body=b"", born_host=BORN, store_host=STORE, properties={"KEYS": "k"}
        )
    )
    assert msg.tags is None
    assert msg.get_property("TAGS") is None
    assert msg.keys == "k"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("queue_offset", 2**63),
        ("physical_offset", -(2**63) - 1),
        ("store_timestamp", 2**63),
    ],
)
def test_each_out_of_range_placement_field_is_named(field: str, value: int) -> None:
    fields: dict[str, Any] = {field: value}
    with pytest.raises(
        ValueError,
        match=rf"^{field}={value} is outside the Java range \[-9223372036854775808, "
        r"9223372036854775807\]$",
    ):
        encode_message(topic="t", body=b"", born_host=BORN, store_host=STORE, **fields)


def test_size_mismatch_details_name_the_sizes() -> None:
    record = bytearray(foobar() + b"\0" * 64)
    struct.pack_into(">i", record, 0, 158)
    result = decode_record(bytes(record), base_offset=4096)
    assert result == DecodedInvalid(
        4096, InvalidReason.SIZE_MISMATCH, "total size 158 at 4096 != computed length 157"
    )
    short = bytearray(foobar())
    short[88 + len(BODY)] = 127  # a topic length running past the record
    assert decode_record(bytes(short)) == DecodedInvalid(
        0, InvalidReason.SIZE_MISMATCH, "total size 157 at 0 is too short for its topic length"
    )


def test_properties_that_are_not_utf8_decode_as_java_decodes_them() -> None:
    # new String(bytes, UTF_8) replaces malformed input with U+FFFD.
    record = bytearray(foobar())
    assert record[-2:] == b"G1"
    record[-2] = 0xFF
    msg = decode_message(bytes(record))
    assert msg.tags == "TA\ufffd1"


def test_decode_message_reads_at_pos_and_can_skip_the_crc() -> None:
    buf = b"\0" * 10 + foobar(physical_offset=10)
    assert decode_message(buf, 10, base_offset=0).physical_offset == 10
    bad = bytearray(foobar())
    bad[88] ^= 0x01  # a body byte
    with pytest.raises(CorruptLogError, match="crc-mismatch"):
        decode_message(bytes(bad))
    assert decode_message(bytes(bad), check_crc=False).body == bytes(bad[88 : 88 + len(BODY)])


@pytest.mark.parametrize("given_as", ["mapping", "lone mapping", "pairs"])
@pytest.mark.parametrize(
    ("pair", "error"),
    [
        (("", "v"), "property ''='v': keys and values must be non-empty"),
        (("k", ""), "property 'k'='': keys and values must be non-empty"),
        (("k\x01", "v"), "property 'k\\\\x01'='v' contains a \\\\x01 or \\\\x02 separator"),
        (("k", "v\x02"), "property 'k'='v\\\\x02' contains a \\\\x01 or \\\\x02 separator"),
        (("k\x02", "v"), "property 'k\\\\x02'='v' contains a \\\\x01 or \\\\x02 separator"),
        (("k", "\x01"), "property 'k'='\\\\x01' contains a \\\\x01 or \\\\x02 separator"),
    ],
)
def test_a_pair_that_would_not_read_back_is_refused_by_name(
    pair: tuple[str, str], error: str, given_as: str
) -> None:
    props: Any = {
        "mapping": {"TAGS": "a", pair[0]: pair[1]},
        "lone mapping": {pair[0]: pair[1]},
        "pairs": [("TAGS", "a"), pair],
    }[given_as]
    with pytest.raises(ValueError, match=f"^{error}$"):
        properties_to_string(props)


@pytest.mark.parametrize("form", list(PropertiesForm))
def test_a_mapping_and_its_pairs_give_the_same_string(form: PropertiesForm) -> None:
    for props in ({"KEYS": "k"}, {"KEYS": "k", "TAGS": "a", "UNIQ_KEY": "u"}):
        text = properties_to_string(props, form)
        assert text == properties_to_string(list(props.items()), form)
        assert text.endswith("\x02") is (form is PropertiesForm.V5)
    assert properties_to_string([], form) == properties_to_string({}, form) == ""


@pytest.mark.parametrize("as_mapping", [True, False])
@pytest.mark.parametrize(
    ("pair", "shown"), [(("DELAY", 3), "'DELAY'=3"), ((b"KEYS", "k"), "b'KEYS'='k'")]
)
def test_a_pair_that_is_not_strings_is_refused_by_name(
    pair: tuple[Any, Any], shown: str, as_mapping: bool
) -> None:
    # A Java message's properties are a Map<String, String>: nothing else has a stored form.
    props: Any = {"TAGS": "a", pair[0]: pair[1]} if as_mapping else [("TAGS", "a"), pair]
    with pytest.raises(ValueError, match=f"^property {shown}: keys and values must be strings$"):
        properties_to_string(props)


# --- limits at their exact bounds -------------------------------------------------------------

INT32, INT64 = (-(2**31), 2**31 - 1), (-(2**63), 2**63 - 1)
RANGES = {
    "queue_id": INT32,
    "flag": INT32,
    "sysflag": INT32,
    "born_timestamp": INT64,
    "reconsume_times": INT32,
    "prepared_transaction_offset": INT64,
    "queue_offset": INT64,
    "physical_offset": INT64,
    "store_timestamp": INT64,
}


@pytest.mark.parametrize("field", sorted(RANGES))
def test_every_int_field_takes_its_java_range_and_nothing_beyond(field: str) -> None:
    lo, hi = RANGES[field]
    for value in (lo, hi):
        fields: dict[str, Any] = {field: value}
        record = encode_message(topic="t", body=b"", born_host=BORN, store_host=STORE, **fields)
        stored = getattr(decode_message(record), field)
        # The host family bits of sysflag follow the (IPv4) hosts.
        assert stored == (value & ~0x30 if field == "sysflag" else value)
    for value in (lo - 1, hi + 1):
        beyond: dict[str, Any] = {field: value}
        with pytest.raises(ValueError, match=rf"^{field}={value} is outside the Java range "):
            encode_message(topic="t", body=b"", born_host=BORN, store_host=STORE, **beyond)


def test_a_body_of_exactly_the_limit_is_accepted() -> None:
    prepared = PreparedMessage(
        topic="t", body=b"x" * 10, born_host=BORN, store_host=STORE, max_body_size=10
    )
    assert prepared.length == message_length(0, 10, 1, 0)


def test_a_body_given_as_a_bytearray_is_copied_when_prepared() -> None:
    # The commit log prepares a batch before it writes it: later changes by the caller
    # must not reach the log.
    body = bytearray(b"abc")
    prepared = PreparedMessage(topic="t", body=body, born_host=BORN, store_host=STORE)
    body[0] = ord("X")
    buf = bytearray(prepared.length)
    prepared.write_into(buf, 0, queue_offset=0, physical_offset=0, store_timestamp=0)
    assert decode_message(bytes(buf)).body == b"abc"


def test_topic_lengths_at_the_bounds_of_each_version() -> None:
    v1 = encode_message(
        topic="t" * 127, body=b"", born_host=BORN, store_host=STORE, magic=MESSAGE_MAGIC
    )
    assert v1[88] == 127 and decode_message(v1).topic == "t" * 127
    v2 = encode_message(
        topic="t" * 32767, body=b"", born_host=BORN, store_host=STORE, magic=MESSAGE_MAGIC_V2
    )
    assert struct.unpack_from(">h", v2, 88)[0] == 32767
    assert decode_message(v2).topic == "t" * 32767
    # The automatic choice counts bytes: 64 two-byte characters need V2.
    wide = encode_message(topic="é" * 64, body=b"", born_host=BORN, store_host=STORE)
    assert struct.unpack_from(">I", wide, 4)[0] == MESSAGE_MAGIC_V2
    assert decode_message(wide).topic == "é" * 64
    assert message_length(0, 0, 128, 0, magic=MESSAGE_MAGIC_V2) == 88 + 2 + 128 + 2
    assert message_length(0, 0, 127, 0) == 88 + 1 + 127 + 2


def test_properties_of_exactly_32767_bytes_are_accepted() -> None:
    props = {"k": "v" * (32767 - 2)}
    record = encode_message(topic="t", body=b"", born_host=BORN, store_host=STORE, properties=props)
    assert struct.unpack_from(">h", record, 88 + 1 + 1)[0] == 32767
    assert decode_message(record).properties_dict() == props


def test_the_smallest_record_is_91_bytes_and_decodes() -> None:
    record = encode_message(topic="", body=b"", born_host=BORN, store_host=BORN)
    assert len(record) == MIN_RECORD_SIZE == 91
    msg = decode_message(record)
    assert (msg.topic, msg.body, msg.properties, msg.total_size) == ("", b"", (), 91)


# --- what a rejected record says ---------------------------------------------------------


def _detail(buf: bytes | bytearray, **kw: Any) -> tuple[InvalidReason, str]:
    result = decode_record(bytes(buf), base_offset=1000, **kw)
    assert isinstance(result, DecodedInvalid), result
    assert result.offset == 1000
    return result.reason, result.detail


def test_each_rejection_names_what_was_found_and_where() -> None:
    record = bytearray(foobar())
    bad_magic = bytearray(record)
    bad_magic[4:8] = b"\x12\x34\x56\x78"
    assert _detail(bad_magic) == (InvalidReason.BAD_MAGIC, "magic 0x12345678 at 1000")
    small = bytearray(record)
    struct.pack_into(">i", small, 0, 90)
    assert _detail(small) == (InvalidReason.BAD_TOTAL_SIZE, "total size 90 at 1000 is too small")
    body = bytearray(record)
    struct.pack_into(">i", body, 84, -5)
    assert _detail(body) == (InvalidReason.BAD_LENGTH, "body length -5 at 1000")
    topic = bytearray(record)
    topic[88 + len(BODY)] = 0xFE
    assert _detail(topic) == (InvalidReason.BAD_LENGTH, "topic length -2 at 1000")
    props_at = 88 + len(BODY) + 1 + 6
    props = bytearray(record)
    struct.pack_into(">h", props, props_at, -3)
    assert _detail(props) == (InvalidReason.BAD_LENGTH, "properties length -3 at 1000")
    crc = bytearray(record)
    crc[88] ^= 0x01
    computed = zlib.crc32(bytes(crc[88 : 88 + len(BODY)])) & 0x7FFFFFFF
    stored = zlib.crc32(BODY) & 0x7FFFFFFF
    assert _detail(crc) == (
        InvalidReason.CRC_MISMATCH,
        f"body CRC {computed} != stored {stored} in the record at 1000",
    )


def test_a_body_length_running_past_the_record_is_named() -> None:
    record = bytearray(foobar())
    struct.pack_into(">i", record, 84, 157 - 88)  # the body takes everything after the head
    assert _detail(record, check_crc=False) == (
        InvalidReason.SIZE_MISMATCH,
        "total size 157 at 1000 is too short for its body length",
    )
    v1_exact = bytearray(foobar())
    struct.pack_into(">i", v1_exact, 84, 157 - 88 - 1)  # room for the topic length byte only
    assert _detail(v1_exact, check_crc=False) == (
        InvalidReason.SIZE_MISMATCH,
        "total size 157 at 1000 is too short for its topic length",
    )
    v2 = bytearray(encode_message(topic="t" * 128, body=b"x", born_host=BORN, store_host=STORE))
    struct.pack_into(">i", v2, 84, len(v2) - 88 - 1)  # one byte left: no room for a short
    assert _detail(v2, check_crc=False) == (
        InvalidReason.SIZE_MISMATCH,
        f"total size {len(v2)} at 1000 is too short for its body length",
    )
    exact = bytearray(v2)
    struct.pack_into(">i", exact, 84, len(v2) - 88 - 2)  # room for the topic length only
    struct.pack_into(">h", exact, len(v2) - 2, 0)
    assert _detail(exact, check_crc=False) == (
        InvalidReason.SIZE_MISMATCH,
        f"total size {len(v2)} at 1000 is too short for its topic length",
    )


def test_host_bits_making_the_header_exactly_the_record_are_a_body_mismatch() -> None:
    # 112 bytes is the header of two IPv6 hosts: no room is left for the topic length.
    record = bytearray(encode_message(topic="t" * 21, body=b"", born_host=BORN, store_host=STORE))
    assert len(record) == 112
    record[39] |= 0x30
    assert _detail(record) == (
        InvalidReason.SIZE_MISMATCH,
        "total size 112 at 1000 is too short for its body length",
    )
    wider = bytearray(encode_message(topic="t" * 20, body=b"", born_host=BORN, store_host=STORE))
    wider[39] |= 0x30
    assert _detail(wider) == (InvalidReason.SIZE_MISMATCH, "total size 111 at 1000 < header 112")


def test_strict_decoding_says_what_it_found() -> None:
    with pytest.raises(CorruptLogError, match=r"^blank record \(remaining 4000\) at 8, not a "):
        decode_message(b"\0" * 8 + encode_blank(4000), 8)
    with pytest.raises(
        CorruptLogError, match=r"^truncated record at 5: 100 bytes of at least 157$"
    ):
        decode_message(foobar()[:100], base_offset=5)
    with pytest.raises(CorruptLogError, match=r"^invalid record at 0 \(bad-magic\): magic 0x00"):
        decode_message(bytes(200))


def test_a_position_or_end_past_the_buffer_is_incomplete_not_an_error() -> None:
    record = foobar()
    assert decode_record(record, len(record) + 5) == DecodedIncomplete(len(record) + 5, 0, 8)
    assert decode_record(record, end=10_000) == decode_record(record)
    assert decode_record(record[:100], end=10_000) == DecodedIncomplete(0, 100, 157)


def test_a_prepared_message_stores_zeros_for_fields_left_out_and_says_where_it_ends() -> None:
    # LogCore.prepare leaves prepared_transaction_offset out; a send path may leave more.
    pairs = [("KEYS", str(NOW)), ("TAGS", "TAG1")]
    prepared = PreparedMessage(
        topic="FooBar", body=BODY, born_host=BORN, store_host=STORE, properties=pairs
    )
    buf = bytearray(b"\xee" * (7 + prepared.length + 5))
    end = prepared.write_into(buf, 7, queue_offset=0, physical_offset=0, store_timestamp=NOW + 5)
    assert end == 7 + prepared.length == 7 + 157
    expected = bytearray(java_record(f"KEYS\x01{NOW}\x02TAGS\x01TAG1"))
    struct.pack_into(">q", expected, 40, 0)  # born timestamp left out: 0
    assert buf[7:end] == expected
    assert (bytes(buf[:7]), bytes(buf[end:])) == (b"\xee" * 7, b"\xee" * 5)


def test_a_size_mismatch_inside_a_buffer_names_the_record_s_own_computed_length() -> None:
    record = bytearray(foobar() + b"\0" * 64)
    struct.pack_into(">i", record, 0, 158)
    buf = b"\xff" * 10 + bytes(record)
    assert decode_record(buf, 10, base_offset=5000) == DecodedInvalid(
        5010, InvalidReason.SIZE_MISMATCH, "total size 158 at 5010 != computed length 157"
    )
