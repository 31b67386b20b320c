"""The request signature of RocketMQ's plain ACL, sans IO.

Mirrors ``AclClientRPCHook`` / ``AclUtils.combineRequestContent`` / ``AclSigner``: the signed
bytes are the *values* of every ext field except ``Signature``, in ascending key order by
Java's ``String.compareTo`` (UTF-16 code units), concatenated with no separator and encoded as
UTF-8, followed by the raw body. The signature is the standard Base64 (padded) of
HMAC-SHA1 keyed with the UTF-8 secret key (docs/rocketmq-protocol.md §12.2). The same
function signs (a client, or a broker talking to another broker or a name server) and verifies
(the broker and the name server).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

#: ``SessionCredentials``' ext-field names.
ACCESS_KEY = "AccessKey"
SECRET_KEY = "SecretKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"

#: Added by RocketMQ 4.9.x clients to QUERY_MESSAGE (``MixAll.UNIQUE_MSG_QUERY_FLAG``).
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"


def _java_order(key: str) -> tuple[int, ...]:
    """A sort key equal to Java's ``String.compareTo``: UTF-16 code units, not code points."""
    data = key.encode("utf-16-be", "surrogatepass")
    return tuple(int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2))


def signed_content(
    fields: Mapping[str, str], body: bytes = b"", *, leave_out: frozenset[str] = frozenset()
) -> bytes:
    """The bytes a signature covers (``AclUtils.combineRequestContent`` + the body)."""
    keys = [k for k in fields if k != SIGNATURE and k not in leave_out]
    # Code-point order is UTF-16 order unless a key holds a character from U+E000 up (where a
    # supplementary character, a surrogate pair in UTF-16, sorts differently): the fast path.
    if all(not k or max(k) < "\ue000" for k in keys):
        keys.sort()
    else:
        keys.sort(key=_java_order)
    text = "".join(fields[k] for k in keys)
    return text.encode("utf-8", "surrogatepass") + body


def sign(content: bytes, secret_key: str) -> str:
    """``AclSigner.calSignature``: Base64(HMAC-SHA1(secret, content))."""
    digest = hmac.new(secret_key.encode("utf-8"), content, hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def sign_fields(
    fields: Mapping[str, str],
    body: bytes,
    *,
    access_key: str,
    secret_key: str,
    security_token: str | None = None,
) -> dict[str, str]:
    """The ext fields with ``AccessKey`` (and ``SecurityToken``) and ``Signature`` added.

    What ``AclClientRPCHook.doBeforeRequest`` does to a request about to be sent.
    """
    out = dict(fields)
    out[ACCESS_KEY] = access_key
    if security_token is not None:
        out[SECURITY_TOKEN] = security_token
    out.pop(SIGNATURE, None)
    out[SIGNATURE] = sign(signed_content(out, body), secret_key)
    return out


def signature_matches(
    fields: Mapping[str, str], body: bytes, secret_key: str, *, code: int | None = None
) -> bool:
    """Whether the ``Signature`` ext field is right for *fields* and *body*.

    Compared in constant time (RocketMQ compares strings with ``equals``). For QUERY_MESSAGE
    (code 12) a signature computed without ``_UNIQUE_KEY_QUERY`` is accepted as well as one
    computed over every field: 4.9.x clients sign the field, older clients add it after
    signing, and the 4.9.7 broker accepts only the latter (so every signed query from a 4.9.7
    client fails there).
    """
    given = fields.get(SIGNATURE)
    if given is None:
        return False
    given_bytes = given.encode("utf-8", "surrogatepass")
    expected = sign(signed_content(fields, body), secret_key).encode("ascii")
    if hmac.compare_digest(given_bytes, expected):
        return True
    if code == 12 and UNIQUE_KEY_QUERY in fields:
        older = signed_content(fields, body, leave_out=frozenset({UNIQUE_KEY_QUERY}))
        return hmac.compare_digest(given_bytes, sign(older, secret_key).encode("ascii"))
    return False
