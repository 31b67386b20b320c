"""The request signature (``AclClientRPCHook``, ``AclUtils.combineRequestContent``)."""

from __future__ import annotations

import base64
import hashlib
import hmac

from hypothesis import given
from hypothesis import strategies as st

from trioha.acl import sign, sign_fields, signature_matches, signed_content

SECRET = "12345678"


def independent_sign(fields: dict[str, str], body: bytes, secret: str) -> str:
    """The algorithm as RocketMQ describes it, written separately from trioha's: values of the
    fields but Signature, ordered by key as Java's String.compareTo orders (UTF-16 units)."""
    keys = sorted((k for k in fields if k != "Signature"), key=lambda k: k.encode("utf-16-be"))
    content = "".join(fields[k] for k in keys).encode("utf-8") + body
    mac = hmac.new(secret.encode("utf-8"), content, hashlib.sha1).digest()
    return base64.b64encode(mac).decode()


def test_vector_a_pull_header_without_body() -> None:
    fields = {"AccessKey": "RocketMQ", "consumerGroup": "GroupA", "queueId": "0", "topic": "TopicA"}
    assert signed_content(fields) == b"RocketMQGroupA0TopicA"
    assert sign(signed_content(fields), SECRET) == "D342lTAXg/IgrbUx5/pcR+PA9G4="


def test_vector_b_send_v2_header_with_token_and_body() -> None:
    fields = {
        "AccessKey": "RocketMQ",
        "SecurityToken": "tok",
        "a": "PG",
        "b": "TopicA",
        "c": "TBW102",
        "d": "4",
        "e": "0",
        "f": "0",
        "g": "1700000000000",
        "h": "0",
        "i": "KEYS\x01订单-1\x02TAGS\x01TagA",
        "j": "0",
        "k": "false",
        "m": "false",
    }
    assert sign(signed_content(fields, b"Hello"), SECRET) == "kU0SRKJlvgJ9rGI5nJN/qJVPk+8="
    signed = sign_fields(
        {k: v for k, v in fields.items() if k not in {"AccessKey", "SecurityToken"}},
        b"Hello",
        access_key="RocketMQ",
        secret_key=SECRET,
        security_token="tok",
    )
    assert signed["Signature"] == "kU0SRKJlvgJ9rGI5nJN/qJVPk+8="


def test_signing_key_value_pairs_is_a_different_signature() -> None:
    fields = {"AccessKey": "RocketMQ", "consumerGroup": "GroupA", "queueId": "0", "topic": "TopicA"}
    wrong = "".join(f"{k}={fields[k]}" for k in sorted(fields)).encode()
    assert sign(wrong, SECRET) == "4yvPPELAsHkRVlTty9b1/kVy2gU="
    assert sign(signed_content(fields), SECRET) != sign(wrong, SECRET)


def test_what_the_official_client_sends_verifies() -> None:
    """Captured from the ``rocketmq`` 0.4.4 wheel (librocketmq) with
    ``set_session_credentials("RocketMQ", "12345678", "ALIYUN")``: GET_ROUTEINFO_BY_TOPIC as it
    arrived at a trioha port. The C++ client also signs its ``OnsChannel`` field."""
    for topic, signature in (
        ("TBW102", "XOY9JsLWW1mHgOhcRL/mlZ+74dw="),
        ("TopicA", "p8pEJu5L0ZC7GO43xVqziXfrwNQ="),
    ):
        fields = {
            "AccessKey": "RocketMQ",
            "OnsChannel": "ALIYUN",
            "Signature": signature,
            "topic": topic,
        }
        assert signature_matches(fields, b"", SECRET)
        assert not signature_matches(fields, b"", "12345679")


def test_query_message_from_a_4_9_7_client_is_accepted_either_way() -> None:
    """The 4.9.7 client signs ``_UNIQUE_KEY_QUERY``; the 4.9.7 broker leaves it out and so
    refuses every signed QUERY_MESSAGE. trioha accepts the signature over all fields (and the
    older form without it)."""
    fields = {
        "AccessKey": "RocketMQ",
        "topic": "TopicA",
        "key": "k1",
        "maxNum": "32",
        "beginTimestamp": "0",
        "endTimestamp": "9223372036854775807",
        "_UNIQUE_KEY_QUERY": "false",
    }
    assert sign(signed_content(fields), SECRET) == "KjO3It0mJrLO6M0lMgao4KJXGW4="
    older = signed_content(fields, leave_out=frozenset({"_UNIQUE_KEY_QUERY"}))
    assert sign(older, SECRET) == "dFs96DaLQvBhP/LuoM6y6qpWtWM="
    for signature in ("KjO3It0mJrLO6M0lMgao4KJXGW4=", "dFs96DaLQvBhP/LuoM6y6qpWtWM="):
        assert signature_matches({**fields, "Signature": signature}, b"", SECRET, code=12)
    # Only QUERY_MESSAGE gets the second form.
    assert not signature_matches(
        {**fields, "Signature": "dFs96DaLQvBhP/LuoM6y6qpWtWM="}, b"", SECRET, code=11
    )


def test_utf16_order_puts_upper_case_first_and_surrogates_by_code_unit() -> None:
    fields = {"b": "2", "B": "1", "\U0001f600": "4", "\uffff": "5", "a": "3"}
    # U+1F600 is D83D DE00 in UTF-16: before U+FFFF, unlike code-point order.
    assert signed_content(fields).decode() == "1" + "3" + "2" + "4" + "5"
    # The same inside longer keys that start alike.
    mixed = {"a\uffff": "late", "a\U0001f600": "early", "ab": "first"}
    assert signed_content(mixed) == b"firstearlylate"


keys = st.text(min_size=1, max_size=12).filter(lambda k: k != "Signature")
field_maps = st.dictionaries(keys, st.text(max_size=20), max_size=8)
secrets = st.text(min_size=7, max_size=20)


@given(fields=field_maps, body=st.binary(max_size=64), secret=secrets)
def test_round_trip_with_an_independent_signer(
    fields: dict[str, str], body: bytes, secret: str
) -> None:
    signed = {**fields, "AccessKey": "RocketMQ"}
    signed["Signature"] = independent_sign(signed, body, secret)
    assert signature_matches(signed, body, secret)
    ours = sign_fields(fields, body, access_key="RocketMQ", secret_key=secret)
    assert ours == signed


@given(
    fields=field_maps,
    body=st.binary(max_size=64),
    secret=secrets,
    where=st.integers(min_value=0),
    delta=st.integers(min_value=1, max_value=255),
)
def test_any_single_byte_change_is_refused(
    fields: dict[str, str], body: bytes, secret: str, where: int, delta: int
) -> None:
    signed = sign_fields(fields, body, access_key="RocketMQ", secret_key=secret)
    # Change one byte of the body, or one character of one value (a key or the signature).
    items = sorted(signed)
    total = len(body) + sum(len(signed[k]) for k in items)
    if total == 0:
        return
    spot = where % total
    if spot < len(body):
        changed = bytearray(body)
        changed[spot] = (changed[spot] + delta) % 256
        assert not signature_matches(signed, bytes(changed), secret)
        return
    spot -= len(body)
    for key in items:
        if spot < len(signed[key]):
            value = signed[key]
            char = chr((ord(value[spot]) + delta) % 0x110000 or 1)
            if 0xD800 <= ord(char) <= 0xDFFF:
                char = "x" if value[spot] != "x" else "y"
            tampered = {**signed, key: value[:spot] + char + value[spot + 1 :]}
            assert not signature_matches(tampered, body, secret)
            return
        spot -= len(signed[key])
