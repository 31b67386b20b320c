"""The body of SEND_BATCH_MESSAGE: messages in ``MessageDecoder.encodeMessages`` form.

Each message::

    int32 total size | int32 magic (0) | int32 body CRC (0) | int32 flag
    int32 body length | body | int16 properties length | properties (UTF-8)

The topic and queue come from the request header; every message of a batch shares them.
"""

from __future__ import annotations

import struct

import attrs

from trioha._errors import RequestError

_HEAD = struct.Struct(">iiiii")  # total, magic, crc, flag, body length
_SHORT = struct.Struct(">h")


@attrs.frozen
class BatchItem:
    flag: int
    body: bytes
    properties: str


class BatchError(RequestError):
    """A batch body that does not decode; the message says at which byte and why."""


def decode_batch(data: bytes) -> list[BatchItem]:
    """``MessageDecoder.decodeMessages``; raises :class:`BatchError` on malformed input."""
    items = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < _HEAD.size:
            raise BatchError(f"batch message at byte {pos} is truncated")
        total, _magic, _crc, flag, body_len = _HEAD.unpack_from(data, pos)
        if total < _HEAD.size + 2 or pos + total > len(data):
            raise BatchError(f"batch message at byte {pos} has size {total}, which does not fit")
        body_start = pos + _HEAD.size
        if body_len < 0 or body_start + body_len + 2 > pos + total:
            raise BatchError(f"batch message at byte {pos} has body length {body_len}")
        body = data[body_start : body_start + body_len]
        (props_len,) = _SHORT.unpack_from(data, body_start + body_len)
        props_start = body_start + body_len + 2
        if props_len < 0 or props_start + props_len != pos + total:
            raise BatchError(
                f"batch message at byte {pos}: properties length {props_len} "
                f"does not match its size {total}"
            )
        try:
            properties = data[props_start : props_start + props_len].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BatchError(f"batch message at byte {pos}: properties are not UTF-8") from exc
        items.append(BatchItem(flag, body, properties))
        pos += total
    return items


def encode_batch(items: list[BatchItem]) -> bytes:
    """``MessageDecoder.encodeMessages`` (used by trioha's own client and the tests)."""
    out = bytearray()
    for item in items:
        props = item.properties.encode("utf-8")
        total = _HEAD.size + len(item.body) + 2 + len(props)
        out += _HEAD.pack(total, 0, 0, item.flag, len(item.body)) + item.body
        out += _SHORT.pack(len(props)) + props
    return bytes(out)
