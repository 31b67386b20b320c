"""The RocketMQ remoting frame, sans IO: bytes in, commands out, and back.

Mirrors ``org.apache.rocketmq.remoting.protocol.RemotingCommand`` (``encode``/``decode``),
``RocketMQSerializable`` and Netty's ``LengthFieldBasedFrameDecoder`` as RocketMQ configures
it (docs/rocketmq-protocol.md §6.1)::

    int32 length        4 + header length + body length (the length field itself excluded)
    int32 header info   high byte: serialize type (0 JSON, 1 ROCKETMQ); low 3 bytes: header length
    header              JSON object, or RocketMQ's binary form
    body                the rest

The JSON header holds ``code``, ``language``, ``version``, ``opaque``, ``flag`` (bit 0:
response, bit 1: oneway), ``remark`` and ``extFields`` (a string map; the C++ client also
sends numbers there, which are read as their decimal text). A response is written in the
request's serialize type, as RocketMQ does. Nothing here does IO; ``FrameDecoder`` buffers
arbitrarily split input and refuses a length above :data:`MAX_FRAME_LENGTH` before buffering.
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any

import attrs

from trioha._errors import LocalProtocolError, RemoteProtocolError, RequestError
from trioha.remoting._codes import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    LANGUAGE_CODES,
    LANGUAGE_NAMES,
    VERSION_4_9_7,
)

#: ``NettySystemConfig.frameMaxLength`` (``com.rocketmq.remoting.frameMaxLength``): 16 MiB.
MAX_FRAME_LENGTH = 16 * 1024 * 1024

_INT = struct.Struct(">i")
_PREFIX = struct.Struct(">ii")
_BINARY_FIXED = struct.Struct(">hbhii")  # code, language, version, opaque, flag
# One encoder for every header: json.dumps with arguments builds a new one per call, and
# JSONEncoder.encode builds its C scanner per call too; CPython's C encoder is made once here
# (the pure-Python encoder where it is missing).
_JSON_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_C_JSON_ENCODER = (
    _c_make_encoder(
        None,
        _JSON_ENCODER.default,
        json.encoder.encode_basestring,
        None,
        ":",
        ",",
        False,
        False,
        True,
    )
    if _c_make_encoder is not None
    else None
)
_JSON_DECODER = json.JSONDecoder()
_orjson: ModuleType | None
try:  # the ``fast`` extra: headers parsed in C; the standard parser is the fallback
    import orjson as _orjson
except ImportError:  # pragma: no cover - the dev extra installs it
    _orjson = None


def _dumps(value: dict[str, Any]) -> str:
    if _C_JSON_ENCODER is not None:
        return "".join(_C_JSON_ENCODER(value, 0))
    return _JSON_ENCODER.encode(value)


def _loads(text: str) -> Any:
    """``json.loads`` without its two whitespace scans when the text starts with its value."""
    if text[:1] not in ("{", "["):
        return json.loads(text)
    value, end = _JSON_DECODER.raw_decode(text)
    if end != len(text) and text[end:].strip():
        raise ValueError(f"extra data after the JSON value at {end}")
    return value


class SerializeType(enum.IntEnum):
    """``SerializeType``: how the header is encoded (the high byte of the header info)."""

    JSON = 0
    ROCKETMQ = 1


def _fields(value: Mapping[str, object] | None) -> dict[str, str]:
    """extFields as RocketMQ sees them: a map of strings (``HashMap<String, String>``)."""
    if not value:
        return {}
    if type(value) is dict:
        for key, item in value.items():
            if type(item) is not str or type(key) is not str:
                break
        else:
            return dict(value)  # already strings (every decoded header): one C-level copy
    out: dict[str, str] = {}
    for key, item in value.items():
        if item is None:
            continue
        if isinstance(item, bool):
            out[str(key)] = "true" if item else "false"
        elif isinstance(item, str | int | float):
            out[str(key)] = str(item)
        else:
            raise TypeError(f"extFields[{key!r}] must be a string or a number, got {item!r}")
    return out


@attrs.frozen
class RemotingCommand:
    """One request or response (``RemotingCommand``).

    ``ext_fields`` is the custom header, always strings; read it with :meth:`field`,
    :meth:`int_field` and :meth:`require`.
    """

    code: int
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = attrs.field(factory=dict, converter=_fields, hash=False)
    body: bytes = b""
    language: str = "JAVA"
    version: int = VERSION_4_9_7
    serialize_type: SerializeType = SerializeType.JSON

    # --- construction -------------------------------------------------------------------
    @classmethod
    def request(
        cls,
        code: int,
        fields: Mapping[str, object] | None = None,
        body: bytes = b"",
        *,
        opaque: int = 0,
        oneway: bool = False,
    ) -> RemotingCommand:
        return cls(
            code=int(code),
            opaque=opaque,
            flag=FLAG_ONEWAY if oneway else 0,
            ext_fields=fields,
            body=body,
        )

    def response(
        self,
        code: int,
        remark: str | None = None,
        fields: Mapping[str, object] | None = None,
        body: bytes = b"",
    ) -> RemotingCommand:
        """The response to this request: same opaque and serialize type, response flag set."""
        return RemotingCommand(
            code=int(code),
            opaque=self.opaque,
            flag=FLAG_RESPONSE,
            remark=remark,
            ext_fields=fields,
            body=body,
            serialize_type=self.serialize_type,
        )

    def with_opaque(self, opaque: int) -> RemotingCommand:
        return attrs.evolve(self, opaque=opaque)

    # --- reading ------------------------------------------------------------------------
    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def field(self, name: str, default: str | None = None) -> str | None:
        return self.ext_fields.get(name, default)

    def require(self, name: str) -> str:
        """A mandatory header field; :class:`HeaderError` names it when it is absent."""
        return require_field(self.ext_fields, name)

    def int_field(self, name: str, default: int | None = None) -> int:
        """A numeric header field (RocketMQ sends numbers as decimal strings)."""
        return int_field(self.ext_fields, name, default)

    def bool_field(self, name: str, default: bool = False) -> bool:
        value = self.ext_fields.get(name)
        if value is None:
            return default
        return value.strip().lower() == "true"


def require_field(fields: Mapping[str, str], name: str) -> str:
    """A mandatory custom header field; :class:`HeaderError` names it when it is absent."""
    value = fields.get(name)
    if value is None:
        raise HeaderError(f"the custom field <{name}> is null")
    return value


def int_field(fields: Mapping[str, str], name: str, default: int | None = None) -> int:
    """A numeric custom header field (RocketMQ sends numbers as decimal strings)."""
    value = fields.get(name)
    if value is None or value == "":
        if default is None:
            raise HeaderError(f"the custom field <{name}> is null")
        return default
    try:
        return int(value)
    except ValueError:
        pass
    try:  # a client that sent a JSON number with a fraction
        number = float(value)
    except ValueError:
        raise HeaderError(f"the custom field <{name}> is not a number: {value!r}") from None
    if not number.is_integer():
        raise HeaderError(f"the custom field <{name}> is not an integer: {value!r}")
    return int(number)


class HeaderError(RequestError):
    """A request's custom header lacks a field or has a malformed one.

    The broker answers such a request with SYSTEM_ERROR naming the field, as RocketMQ does
    for a ``RemotingCommandException`` from ``decodeCommandCustomHeader``; the connection
    stays open.
    """


# --- encoding ---------------------------------------------------------------------------


def encode(command: RemotingCommand) -> bytes:
    """The whole frame, length prefix included."""
    if command.serialize_type is SerializeType.JSON:
        header = _json_header(command)
    else:
        header = _binary_header(command)
    if len(header) > 0xFFFFFF:
        raise LocalProtocolError(f"remoting header of {len(header)} bytes does not fit 24 bits")
    length = 4 + len(header) + len(command.body)
    if length > MAX_FRAME_LENGTH:
        raise LocalProtocolError(
            f"remoting frame of {length} bytes exceeds the {MAX_FRAME_LENGTH}-byte limit"
        )
    prefix = _PREFIX.pack(length, (int(command.serialize_type) << 24) | len(header))
    return b"".join((prefix, header, command.body))


_encode_string = json.encoder.encode_basestring  # the C one where there is one
_JSON_KEYS: dict[str, str] = {}


def _json_key(key: str) -> str:
    """A field name as a JSON string; responses use few names, so each is escaped once."""
    quoted = _JSON_KEYS.get(key)
    if quoted is None:
        quoted = _encode_string(key)
        if len(_JSON_KEYS) < 256:
            _JSON_KEYS[key] = quoted
    return quoted


def _json_value(value: str) -> str:
    """A field value as a JSON string: letters and digits (ids, numbers) need no escaping."""
    if value.isalnum() and value.isascii():
        return f'"{value}"'
    return _encode_string(value)


def encode_response(request: RemotingCommand, code: int, fields: Mapping[str, str]) -> bytes:
    """``encode(request.response(code, None, fields))``, the same bytes, without the command.

    A send answers every message with a response of one shape; for a JSON request it is
    formatted straight into its frame (the ``extFields`` strings escaped as the encoder
    escapes them), which costs a fraction of building and encoding a command.
    """
    if request.serialize_type is not SerializeType.JSON or not fields:
        return encode(request.response(code, None, fields))
    ext = ",".join([f"{_json_key(k)}:{_json_value(v)}" for k, v in fields.items()])
    header = (
        f'{{"code":{int(code)},"extFields":{{{ext}}},"flag":{FLAG_RESPONSE},'
        f'"language":"JAVA","opaque":{request.opaque},"serializeTypeCurrentRPC":"JSON",'
        f'"version":{VERSION_4_9_7}}}'
    ).encode()
    return _PREFIX.pack(4 + len(header), len(header)) + header


def _json_header(command: RemotingCommand) -> bytes:
    # Keys in fastjson's order (sorted); remark and extFields left out when empty, as
    # fastjson drops nulls. extFields values are always strings: the C++ client ignores
    # a response field that is not a JSON string.
    header: dict[str, Any] = {"code": command.code}
    if command.ext_fields:
        header["extFields"] = command.ext_fields
    header["flag"] = command.flag
    header["language"] = command.language
    header["opaque"] = command.opaque
    if command.remark is not None:
        header["remark"] = command.remark
    header["serializeTypeCurrentRPC"] = "JSON"
    header["version"] = command.version
    return _dumps(header).encode("utf-8")


def _binary_header(command: RemotingCommand) -> bytes:
    remark = (command.remark or "").encode("utf-8")
    parts = [
        _BINARY_FIXED.pack(
            command.code,
            LANGUAGE_CODES.get(command.language, LANGUAGE_CODES["OTHER"]),
            command.version,
            command.opaque,
            command.flag,
        ),
        _INT.pack(len(remark)),
        remark,
    ]
    ext = bytearray()
    for key, value in command.ext_fields.items():
        key_bytes, value_bytes = key.encode("utf-8"), value.encode("utf-8")
        ext += struct.pack(">h", len(key_bytes)) + key_bytes
        ext += _INT.pack(len(value_bytes)) + value_bytes
    parts += [_INT.pack(len(ext)), bytes(ext)]
    return b"".join(parts)


# --- decoding ---------------------------------------------------------------------------


def decode_frame(frame: bytes | bytearray | memoryview) -> RemotingCommand:
    """One frame without its 4-byte length prefix (``RemotingCommand.decode``)."""
    if len(frame) < 4:
        raise RemoteProtocolError(f"remoting frame of {len(frame)} bytes has no header length")
    (info,) = _INT.unpack_from(frame, 0)
    kind, header_length = (info >> 24) & 0xFF, info & 0xFFFFFF
    if header_length > len(frame) - 4:
        raise RemoteProtocolError(
            f"remoting header length {header_length} exceeds the frame ({len(frame) - 4} bytes)"
        )
    header = bytes(frame[4 : 4 + header_length])
    body = bytes(frame[4 + header_length :])
    if kind == SerializeType.JSON:
        return _decode_json_header(header, body)
    if kind == SerializeType.ROCKETMQ:
        return _decode_binary_header(header, body)
    raise RemoteProtocolError(f"unknown remoting serialize type {kind}")


def _parse_json(header: bytes) -> Any:
    """The header's JSON value: orjson's where it is installed and accepts the header, else
    the standard parser's (which also decides, and names, what is wrong with a bad one)."""
    if _orjson is not None:
        try:
            return _orjson.loads(header)
        except _orjson.JSONDecodeError:
            pass  # e.g. NaN, a lone surrogate, a number beyond 64 bits: json decides
    return _loads(header.decode("utf-8"))


def _decode_json_header(header: bytes, body: bytes) -> RemotingCommand:
    try:
        obj = _parse_json(header)
    except (UnicodeDecodeError, ValueError) as exc:
        raise RemoteProtocolError(f"remoting JSON header is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise RemoteProtocolError(f"remoting JSON header is not an object: {header[:80]!r}")
    ext = obj.get("extFields")
    if ext is not None and not isinstance(ext, dict):
        raise RemoteProtocolError(f"remoting extFields is not an object: {ext!r:.80}")
    remark = obj.get("remark")
    language = obj.get("language", "JAVA")
    try:
        return RemotingCommand(  # the ext_fields converter checks and copies the map
            code=_int_member(obj, "code", required=True),
            opaque=_int_member(obj, "opaque"),
            flag=_int_member(obj, "flag"),
            remark=None if remark is None else str(remark),
            ext_fields=ext,
            body=body,
            language=str(language),
            version=_int_member(obj, "version"),
            serialize_type=SerializeType.JSON,
        )
    except TypeError as exc:
        raise RemoteProtocolError(f"remoting header: {exc}") from None


def _int_member(obj: dict[str, Any], name: str, *, required: bool = False) -> int:
    value = obj.get(name)
    if value is None:
        if required:
            raise RemoteProtocolError(f"remoting header has no {name!r}")
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise RemoteProtocolError(f"remoting header {name!r} is not an integer: {value!r:.40}")
    if not -(2**31) <= value < 2**31:
        raise RemoteProtocolError(f"remoting header {name!r} does not fit 32 bits: {value}")
    return value


def _decode_binary_header(header: bytes, body: bytes) -> RemotingCommand:
    view = memoryview(header)
    try:
        code, language, version, opaque, flag = _BINARY_FIXED.unpack_from(view, 0)
        pos = _BINARY_FIXED.size
        remark, pos = _binary_chunk(view, pos, "remark")
        ext_raw, pos = _binary_chunk(view, pos, "extFields")
        fields: dict[str, str] = {}
        ext_pos = 0
        while ext_pos < len(ext_raw):
            (key_len,) = struct.unpack_from(">h", ext_raw, ext_pos)
            ext_pos += 2
            key = ext_raw[ext_pos : ext_pos + key_len]
            ext_pos += key_len
            (value_len,) = _INT.unpack_from(ext_raw, ext_pos)
            ext_pos += 4
            if key_len < 0 or value_len < 0 or ext_pos + value_len > len(ext_raw):
                raise RemoteProtocolError("remoting binary extFields entry overruns the header")
            fields[key.decode("utf-8")] = ext_raw[ext_pos : ext_pos + value_len].decode("utf-8")
            ext_pos += value_len
    except (struct.error, UnicodeDecodeError) as exc:
        raise RemoteProtocolError(f"remoting binary header is malformed: {exc}") from None
    return RemotingCommand(
        code=code,
        opaque=opaque,
        flag=flag,
        remark=remark.decode("utf-8", "replace") if remark else None,
        ext_fields=fields,
        body=body,
        language=LANGUAGE_NAMES.get(language, "OTHER"),
        version=version,
        serialize_type=SerializeType.ROCKETMQ,
    )


def _binary_chunk(view: memoryview, pos: int, what: str) -> tuple[bytes, int]:
    (length,) = _INT.unpack_from(view, pos)
    pos += 4
    if length < 0 or pos + length > len(view):
        raise RemoteProtocolError(
            f"remoting binary {what} length {length} exceeds the header ({len(view)} bytes)"
        )
    return bytes(view[pos : pos + length]), pos + length


class FrameDecoder:
    """Incremental frame reader: feed bytes as they come, take whole commands out.

    A length prefix above ``max_frame_length`` (or below 4) raises
    :class:`RemoteProtocolError` as soon as its 4 bytes are in, so a hostile peer cannot
    make us buffer more than one legitimate frame. After an error the decoder stays broken:
    the connection must be closed.
    """

    def __init__(self, max_frame_length: int = MAX_FRAME_LENGTH) -> None:
        self._max = max_frame_length
        self._buffer = bytearray()
        self._start = 0
        self._error: RemoteProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as a command."""
        return len(self._buffer) - self._start

    @property
    def partial_frame_size(self) -> int | None:
        """The size, length prefix included, of the frame being received: None when no byte of
        one is buffered, 0 while its length prefix is incomplete. Call it after
        :meth:`commands` has taken every complete frame out (the server's frame deadline)."""
        buffered = self.buffered
        if buffered == 0:
            return None
        if buffered < 4:
            return 0
        length: int = _INT.unpack_from(self._buffer, self._start)[0]
        return 4 + length

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        if self._start and self._start * 2 >= len(self._buffer):
            del self._buffer[: self._start]  # compact once the consumed part dominates
            self._start = 0
        self._buffer += data

    def next_command(self) -> RemotingCommand | None:
        """The next complete command, or None until more bytes arrive."""
        if self._error is not None:
            raise self._error
        if self.buffered < 4:
            return None
        (length,) = _INT.unpack_from(self._buffer, self._start)
        if not 4 <= length <= self._max:
            self._error = RemoteProtocolError(
                f"remoting frame length {length} is outside 4..{self._max}"
            )
            raise self._error
        if self.buffered < 4 + length:
            return None
        begin = self._start + 4
        frame = memoryview(self._buffer)[begin : begin + length]
        try:
            command = decode_frame(frame)
        except RemoteProtocolError as exc:
            self._error = exc
            raise
        finally:
            frame.release()
        self._start = begin + length
        return command

    def commands(self) -> Iterator[RemotingCommand]:
        while (command := self.next_command()) is not None:
            yield command
