"""JSON as RocketMQ's Java side writes it, read leniently; JSON as we write it, strictly.

fastjson (what a Java broker and name server use for bodies and config files) writes map
keys that are not strings without quotes: a consumer offset table comes out as
``{"offsetTable":{"T@G":{0:7,1:12}}}`` and a route's ``brokerAddrs`` as
``{0:"10.0.0.1:10911"}`` (docs/rocketmq-protocol.md §6.1). Python's :mod:`json` rejects that, so
:func:`loads_lenient` quotes bare keys before parsing. Everything trioha writes is standard
JSON (quoted keys), which fastjson, jsoncpp (the C++ client) and Go all read.
"""

from __future__ import annotations

import json
import re
from typing import Any

# A bare key right after "{" or "," and before ":" (numbers, identifiers, negative numbers).
_BARE_KEY = re.compile(r"([{,]\s*)(-?[A-Za-z0-9_$.%@\-]+)(\s*:)")
# String literals, so that a bare-looking key inside a string value is left alone.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)


def loads_lenient(text: str | bytes) -> Any:
    """Parse JSON that may have unquoted object keys (fastjson's output).

    Raises ``ValueError`` (``json.JSONDecodeError``) for anything else that is not JSON.
    """
    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode("utf-8")
    try:
        return json.loads(text)
    except ValueError:
        pass
    parts: list[str] = []
    pos = 0
    for match in _STRING.finditer(text):
        parts.append(_BARE_KEY.sub(r'\1"\2"\3', text[pos : match.start()]))
        parts.append(match.group(0))
        pos = match.end()
    parts.append(_BARE_KEY.sub(r'\1"\2"\3', text[pos:]))
    return json.loads("".join(parts))


def dumps(value: Any, *, pretty: bool = False) -> str:
    """Standard JSON; ``pretty`` as RocketMQ's config files (``toJson(true)``)."""
    if pretty:
        return json.dumps(value, indent="\t", ensure_ascii=False)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def dumps_bytes(value: Any) -> bytes:
    return dumps(value).encode("utf-8")
