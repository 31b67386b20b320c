"""The remoting frame codec (RemotingCommand.encode/decode), fed three ways."""

from __future__ import annotations

import json
import struct

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trioha import RemoteProtocolError
from trioha.remoting import _codec
from trioha.remoting._codec import (
    MAX_FRAME_LENGTH,
    FrameDecoder,
    HeaderError,
    RemotingCommand,
    SerializeType,
    decode_frame,
    encode,
    encode_response,
)
from trioha.remoting._codes import FLAG_ONEWAY, FLAG_RESPONSE, RequestCode

# What the official C++ client (librocketmq in the ``rocketmq`` wheel) sends for a route
# query, captured byte for byte: JSON header ending in a newline, numbers as JSON numbers.
CPP_ROUTE_QUERY_HEADER = (
    b'{"code":105,"extFields":{"AccessKey":"","OnsChannel":"ALIYUN","Signature":'
    b'"N/YT7X6tJe5UfutmW+uNwTTJ7Fc=","topic":"TopicTest"},"flag":0,"language":"CPP",'
    b'"opaque":0,"remark":"","version":63}\n'
)


def frame_of(header: bytes, body: bytes = b"", kind: int = 0) -> bytes:
    prefix = struct.pack(">ii", 4 + len(header) + len(body), (kind << 24) | len(header))
    return prefix + header + body


def feed_whole(data: bytes) -> tuple[list[RemotingCommand], FrameDecoder]:
    decoder = FrameDecoder()
    decoder.receive_data(data)
    return list(decoder.commands()), decoder


def feed_bytewise(data: bytes) -> tuple[list[RemotingCommand], FrameDecoder]:
    decoder = FrameDecoder()
    out: list[RemotingCommand] = []
    for i in range(len(data)):
        decoder.receive_data(data[i : i + 1])
        out.extend(decoder.commands())
    return out, decoder


SAMPLES = [
    RemotingCommand.request(RequestCode.SEND_MESSAGE, {"topic": "T", "queueId": 3}, b"body"),
    RemotingCommand.request(RequestCode.HEART_BEAT, body=b'{"clientID":"x"}', oneway=True),
    RemotingCommand(code=0, opaque=7, flag=FLAG_RESPONSE, remark="ok", body=b"\x00\xff" * 100),
    RemotingCommand(
        code=17,
        opaque=2**31 - 1,
        remark="naïve ✓",
        serialize_type=SerializeType.ROCKETMQ,
        ext_fields={"k": "v", "ü": ""},
        language="CPP",
        version=63,
    ),
]


@pytest.mark.parametrize("feed", [feed_whole, feed_bytewise])
def test_commands_round_trip_whole_and_byte_by_byte(feed: object) -> None:
    data = b"".join(encode(c) for c in SAMPLES)
    commands, decoder = feed(data)  # type: ignore[operator]
    assert commands == SAMPLES
    assert decoder.buffered == 0


def test_trailing_partial_frame_stays_buffered() -> None:
    first, second = encode(SAMPLES[0]), encode(SAMPLES[1])
    decoder = FrameDecoder()
    decoder.receive_data(first + second[:7])
    assert list(decoder.commands()) == [SAMPLES[0]]
    assert decoder.buffered == 7
    decoder.receive_data(second[7:])
    assert list(decoder.commands()) == [SAMPLES[1]]


def test_cpp_client_frame_decodes_with_numbers_as_strings() -> None:
    header = (
        b'{"code":11,"extFields":{"queueId":2,"queueOffset":"5","x":true},"flag":2,'
        b'"language":"CPP","opaque":9,"remark":"","version":63}\n'
    )
    (command,), _ = feed_whole(frame_of(header))
    assert command.code == 11
    assert command.is_oneway
    assert command.ext_fields == {"queueId": "2", "queueOffset": "5", "x": "true"}
    assert command.int_field("queueId") == 2
    assert command.language == "CPP"
    (route,), _ = feed_whole(frame_of(CPP_ROUTE_QUERY_HEADER))
    assert route.require("topic") == "TopicTest"


def test_response_keeps_opaque_and_serialize_type() -> None:
    request = RemotingCommand(code=10, opaque=41, serialize_type=SerializeType.ROCKETMQ)
    response = request.response(0, "fine", {"queueOffset": 12})
    assert (response.opaque, response.flag, response.serialize_type) == (
        41,
        FLAG_RESPONSE,
        SerializeType.ROCKETMQ,
    )
    assert response.ext_fields == {"queueOffset": "12"}
    assert decode_frame(encode(response)[4:]) == response


def test_json_response_fields_are_json_strings() -> None:
    # The C++ client reads a response field only if it is a JSON string (isString()).
    data = encode(RemotingCommand(code=0, flag=FLAG_RESPONSE, ext_fields={"queueId": 1}))
    header_length = struct.unpack(">i", data[4:8])[0] & 0xFFFFFF
    header = json.loads(data[8 : 8 + header_length])
    assert header["extFields"] == {"queueId": "1"}
    assert header["serializeTypeCurrentRPC"] == "JSON"


def test_oneway_flag() -> None:
    command = RemotingCommand.request(34, oneway=True)
    assert command.flag == FLAG_ONEWAY
    assert command.is_oneway
    assert not command.is_response


def test_header_field_errors_name_the_field() -> None:
    command = RemotingCommand.request(11, {"queueId": "x"})
    with pytest.raises(HeaderError, match="<queueId> is not a number"):
        command.int_field("queueId")
    with pytest.raises(HeaderError, match="<topic> is null"):
        command.require("topic")
    assert command.int_field("maxMsgNums", 32) == 32


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (struct.pack(">i", MAX_FRAME_LENGTH + 1), "outside"),
        (struct.pack(">i", -5), "outside"),
        (struct.pack(">i", 2), "outside"),
        (struct.pack(">ii", 8, 100) + b"\0" * 4, "header length 100 exceeds"),
        (frame_of(b"{not json"), "not valid JSON"),
        (frame_of(b"[1,2]"), "not an object"),
        (frame_of(b'{"opaque":1}'), "no 'code'"),
        (frame_of(b'{"code":"ten"}'), "'code' is not an integer"),
        (frame_of(b'{"code":1,"extFields":[1]}'), "extFields is not an object"),
        (frame_of(b'{"code":1,"extFields":{"a":{"b":1}}}'), "extFields"),
        (frame_of(b"{}", kind=7), "serialize type 7"),
        (frame_of(b"\x00\x01", kind=1), "binary header is malformed"),
        (frame_of(struct.pack(">hbhiii", 1, 0, 1, 1, 0, 1000), kind=1), "remark length 1000"),
    ],
)
def test_garbage_is_a_remote_protocol_error(data: bytes, message: str) -> None:
    decoder = FrameDecoder()
    decoder.receive_data(data)
    with pytest.raises(RemoteProtocolError, match=message):
        decoder.next_command()
    with pytest.raises(RemoteProtocolError):  # the decoder stays broken
        decoder.next_command()


def test_hostile_length_is_refused_before_buffering() -> None:
    decoder = FrameDecoder(max_frame_length=1024)
    decoder.receive_data(struct.pack(">i", 1 << 30))
    with pytest.raises(RemoteProtocolError, match=r"outside 4\.\.1024"):
        decoder.next_command()


def test_frame_at_the_limit_is_accepted() -> None:
    header = b'{"code":1}'
    body = b"x" * (1000 - 4 - len(header))
    decoder = FrameDecoder(max_frame_length=1000)
    decoder.receive_data(frame_of(header, body))
    command = decoder.next_command()
    assert command is not None
    assert command.body == body


texts = st.text(max_size=20)
commands = st.builds(
    RemotingCommand,
    code=st.integers(-(2**15), 2**15 - 1),
    opaque=st.integers(-(2**31), 2**31 - 1),
    flag=st.integers(0, 3),
    remark=st.none() | st.text(min_size=1, max_size=30),
    ext_fields=st.dictionaries(texts, texts, max_size=5),
    body=st.binary(max_size=200),
    language=st.sampled_from(["JAVA", "CPP", "GO", "PYTHON"]),
    version=st.integers(0, 2**15 - 1),
    serialize_type=st.sampled_from(SerializeType),
)


@given(st.lists(commands, max_size=4), st.integers(1, 50))
def test_any_split_decodes_the_same(cmds: list[RemotingCommand], chunk: int) -> None:
    data = b"".join(encode(c) for c in cmds) + b"\x00\x00"  # plus a trailing partial prefix
    decoder = FrameDecoder()
    out: list[RemotingCommand] = []
    for i in range(0, len(data), chunk):
        decoder.receive_data(data[i : i + chunk])
        out.extend(decoder.commands())
    assert out == cmds
    assert decoder.buffered == 2


@given(
    code=st.integers(0, 300),
    opaque=st.integers(0, 2**31 - 1),
    fields=st.dictionaries(st.text(min_size=1, max_size=12), st.text(max_size=40), max_size=6),
    binary=st.booleans(),
)
def test_encode_response_is_the_encoded_response(
    code: int, opaque: int, fields: dict[str, str], binary: bool
) -> None:
    """The send path's direct response encoding gives the bytes the command would."""
    request = RemotingCommand(
        code=RequestCode.SEND_MESSAGE,
        opaque=opaque,
        ext_fields={"topic": "T"},
        serialize_type=SerializeType.ROCKETMQ if binary else SerializeType.JSON,
    )
    assert encode_response(request, code, fields) == encode(request.response(code, None, fields))


@given(
    command=commands,
    extra=st.sampled_from(
        [b"", b',"x":NaN', b',"x":1e999', b',"x":123456789012345678901234567890', b',"x":"\\ud800"']
    ),
)
def test_json_headers_decode_alike_with_and_without_orjson(
    command: RemotingCommand, extra: bytes
) -> None:
    """The fast extra's parser and the standard one read every header alike, including the
    values only the standard parser takes (orjson refuses them; json then decides)."""
    frame = encode(attrs.evolve(command, serialize_type=SerializeType.JSON))[4:]
    (info,) = struct.unpack_from(">i", frame)
    header = frame[4 : 4 + info].rstrip(b"}") + extra + b"}"
    frame = struct.pack(">i", len(header)) + header + frame[4 + info :]
    fast = decode_frame(frame)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_codec, "_orjson", None)
        plain = decode_frame(frame)
    assert fast == plain
    assert _codec._orjson is not None  # the dev extra installs it: both paths are tested
