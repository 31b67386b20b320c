"""Hypothesis strategies for RocketMQ stored messages.

Sizes and CRCs are computed here from RocketMQ's record layout (docs/rocketmq-protocol.md §4.1),
not by the codec, so a test that compares the codec's output with these values checks the codec
against RocketMQ's rules.
"""

from __future__ import annotations

import itertools
import zlib

from hypothesis import strategies as st

from trioha.store import (
    MAX_TOPIC_SIZE_V1,
    MESSAGE_MAGIC,
    MESSAGE_MAGIC_V2,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    PROPERTY_WAIT_STORE_MSG_OK,
    HostAddress,
    PropertiesForm,
    StoredMessage,
)

__all__ = [
    "host_addresses",
    "hostile_frame_streams",
    "int32s",
    "int64s",
    "properties",
    "property_texts",
    "report_words",
    "split_anywhere",
    "stored_messages",
    "topics",
]

int32s = st.integers(-(2**31), 2**31 - 1)
int64s = st.integers(-(2**63), 2**63 - 1)

_NO_SURROGATES = st.characters(codec="utf-8")


def host_addresses() -> st.SearchStrategy[HostAddress]:
    """IPv4 and IPv6 hosts with real port numbers."""
    ips = st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6))
    return st.builds(HostAddress, ips.map(str), st.integers(0, 65535))


def topics(*, long: bool = True) -> st.SearchStrategy[str]:
    """Unicode topics; with ``long``, sometimes over 127 UTF-8 bytes (V2 records)."""
    short = st.text(_NO_SURROGATES, max_size=24)
    if not long:
        return short
    return st.one_of(short, st.text(_NO_SURROGATES, min_size=128, max_size=300))


def property_texts() -> st.SearchStrategy[str]:
    """A property key or value: non-empty, without the \\x01/\\x02 separators."""
    chars = st.characters(codec="utf-8", exclude_characters="\x01\x02")
    return st.one_of(
        st.sampled_from(
            [
                PROPERTY_KEYS,
                PROPERTY_TAGS,
                PROPERTY_WAIT_STORE_MSG_OK,
                PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
            ]
        ),
        st.text(chars, min_size=1, max_size=20),
    )


def properties(max_size: int = 6) -> st.SearchStrategy[tuple[tuple[str, str], ...]]:
    """Ordered property pairs (duplicate keys allowed, as a stored record may hold them)."""
    return st.lists(st.tuples(property_texts(), property_texts()), max_size=max_size).map(tuple)


@st.composite
def stored_messages(
    draw: st.DrawFn, *, max_body: int = 256, long_topics: bool = True
) -> StoredMessage:
    """Any valid stored message, with ``total_size`` and ``body_crc`` computed from the layout."""
    born = draw(host_addresses())
    store = draw(host_addresses())
    topic = draw(topics(long=long_topics))
    topic_b = topic.encode()
    if len(topic_b) > MAX_TOPIC_SIZE_V1:
        magic = MESSAGE_MAGIC_V2
    else:
        magic = draw(st.sampled_from([MESSAGE_MAGIC, MESSAGE_MAGIC_V2]))
    body = draw(st.binary(max_size=max_body))
    props = draw(properties())
    form = draw(st.sampled_from(PropertiesForm))
    props_text = "\x02".join(f"{k}\x01{v}" for k, v in props)
    if props and form is PropertiesForm.V5:
        props_text += "\x02"
    sysflag = draw(int32s) & ~0x30
    sysflag |= (0x10 if born.is_ipv6 else 0) | (0x20 if store.is_ipv6 else 0)
    total = (
        84
        + (12 if born.is_ipv6 else 0)
        + (12 if store.is_ipv6 else 0)
        + 4
        + len(body)
        + (2 if magic == MESSAGE_MAGIC_V2 else 1)
        + len(topic_b)
        + 2
        + len(props_text.encode())
    )
    return StoredMessage(
        total_size=total,
        magic=magic,
        body_crc=zlib.crc32(body) & 0x7FFFFFFF,
        queue_id=draw(int32s),
        flag=draw(int32s),
        queue_offset=draw(int64s),
        physical_offset=draw(int64s),
        sysflag=sysflag,
        born_timestamp=draw(int64s),
        born_host=born,
        store_timestamp=draw(int64s),
        store_host=store,
        reconsume_times=draw(int32s),
        prepared_transaction_offset=draw(int64s),
        body=body,
        topic=topic,
        properties=props,
        # An empty properties string reads back as the default form.
        properties_form=form if props else PropertiesForm.V4_9,
    )


# --- the HA protocol (trioha.proto): byte streams as a network or a hostile peer delivers them --

#: Interesting int64 values for offsets and sizes on the wire: zero, the edges of int32 and
#: int64, and values whose sum with a small size no longer fits an int64.
_EDGE_INT64 = (0, 1, 2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 2**20, 2**63 - 1)


@st.composite
def split_anywhere(draw: st.DrawFn, data: bytes, *, max_pieces: int = 48) -> list[bytes]:
    """*data* cut at arbitrary points, as successive reads may return it (empty reads included).

    Headers, bodies and 8-byte reports are split anywhere; joining the pieces gives *data*.
    """
    if not data:
        return draw(st.lists(st.just(b""), max_size=2))
    cuts = draw(st.lists(st.integers(0, len(data)), max_size=max_pieces - 1))
    bounds = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def _header(offset: int, size: int) -> bytes:
    """A 12-byte frame header; out-of-range values wrap as a hostile peer's raw bytes would."""
    return (offset % 2**64).to_bytes(8, "big") + (size % 2**32).to_bytes(4, "big")


@st.composite
def hostile_frame_streams(draw: st.DrawFn, *, log_max: int, max_body: int) -> bytes:
    """Master→slave bytes mixing honest frames with everything a broken or hostile master sends.

    Pieces: frames that continue the slave's log, heartbeats, frames at the wrong offset,
    negative offsets and sizes, sizes over *max_body*, offsets whose end overflows an int64,
    random garbage, and a frame cut short at the end. What the slave must do with them is
    decided by the test (a reference reading), not here.
    """
    end = log_max
    out = bytearray()
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(
            st.sampled_from(
                [
                    "frame",
                    "frame",
                    "frame",
                    "heartbeat",
                    "wrong_offset",
                    "bad_size",
                    "edge",
                    "garbage",
                ]
            )
        )
        if kind == "frame":
            offset = end if end else draw(st.sampled_from([0, 1024, 4096, end]))
            body = draw(st.binary(max_size=min(max_body, 200)))
            out += _header(offset, len(body)) + body
            end = offset + len(body) if body else end
        elif kind == "heartbeat":
            out += _header(end, 0)
        elif kind == "wrong_offset":
            delta = draw(st.integers(1, 2**20)) * draw(st.sampled_from([-1, 1]))
            body = draw(st.binary(max_size=16))
            out += _header(end + delta, len(body)) + body
        elif kind == "bad_size":
            size = draw(st.one_of(st.integers(-(2**31), -1), st.integers(max_body + 1, 2**31 - 1)))
            out += _header(end, size)
        elif kind == "edge":
            offset = draw(st.one_of(st.sampled_from(_EDGE_INT64), st.integers(-(2**63), -1)))
            body = draw(st.binary(max_size=16))
            out += _header(offset, len(body)) + body
        else:
            out += draw(st.binary(min_size=1, max_size=40))
    if draw(st.booleans()):
        body = draw(st.binary(min_size=1, max_size=min(max_body, 64)))
        frame = _header(end, len(body)) + body
        out += frame[: draw(st.integers(1, len(frame) - 1))]
    return bytes(out)


def report_words(max_offset: int) -> st.SearchStrategy[bytes]:
    """Single 8-byte slave reports: honest-looking, beyond the end, int64 edges, negative."""
    offsets = st.one_of(
        st.integers(0, max(0, max_offset)),
        st.integers(max_offset + 1, max_offset + 2**20),
        st.sampled_from(_EDGE_INT64),
        st.integers(-(2**63), -1),
    )
    return offsets.map(lambda o: (o % 2**64).to_bytes(8, "big"))
