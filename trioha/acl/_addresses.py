"""White-address patterns (``RemoteAddressStrategyFactory`` and its strategies).

A pattern is compiled once when the ACL file loads; an invalid one is an error that names it.
The client address is compared as text, IPv6 addresses after expansion to eight groups of four
upper-case hex digits, as RocketMQ compares them (docs/rocketmq-protocol.md §12.4):

* blank: matches nothing; ``*``, ``*.*.*.*``, ``*:*:*:*:*:*:*:*``: matches everything;
* ``192.168.1.{1,2,3}``: the prefix followed by each listed item;
* ``10.0.0.1,10.0.0.2``: exactly those addresses;
* ``192.168.*.*`` or ``192.168.1-10.*``: the first of the second to fourth octets that is ``*``
  or ``n-m`` must be in range and the octets before it equal; the octets after it are not
  looked at (RocketMQ's rule, kept so that a file means the same to both);
* anything else: one address.
"""

from __future__ import annotations

import ipaddress

import attrs

from trioha._errors import ConfigError


def _expand_v6(text: str) -> str:
    return ipaddress.IPv6Address(text).exploded.upper()


def _is_v4(text: str) -> bool:
    return _parses(ipaddress.IPv4Address, text)


def _is_v6(text: str) -> bool:
    return _parses(ipaddress.IPv6Address, text)


def _parses(kind: type[ipaddress.IPv4Address | ipaddress.IPv6Address], text: str) -> bool:
    try:
        kind(text)
    except ValueError:
        return False
    return True


def normalise(address: str) -> str:
    """A client address as patterns see it (IPv6 expanded and upper-cased)."""
    return _expand_v6(address) if ":" in address and _is_v6(address) else address


@attrs.frozen
class AddressPattern:
    """One compiled pattern; :meth:`matches` takes a client IP (no port)."""

    text: str
    kind: str  # "none", "all", "set", "range"
    addresses: frozenset[str] = frozenset()
    head: str = ""
    low: int = 0
    high: int = 0
    separator: str = "."

    def matches(self, ip: str) -> bool:
        if self.kind == "all":
            return True
        if self.kind == "set":
            return normalise(ip) in self.addresses
        if self.kind == "range":
            address = normalise(ip) if self.separator == ":" else ip
            if not address.startswith(self.head):
                return False
            part = address[len(self.head) :].split(self.separator, 1)[0]
            try:
                value = int(part, 16 if self.separator == ":" else 10)
            except ValueError:
                return False
            return self.low <= value <= self.high
        return False


def _exact(items: list[str], pattern: str) -> frozenset[str]:
    out = set()
    for raw in items:
        item = raw.strip()
        if _is_v4(item):
            out.add(item)
        elif _is_v6(item):
            out.add(_expand_v6(item))
        else:
            raise ConfigError(f"white address pattern {pattern!r}: {item!r} is not an IP address")
    return frozenset(out)


def compile_pattern(pattern: object) -> AddressPattern:
    """``RemoteAddressStrategyFactory.getRemoteAddressStrategy``; ConfigError if invalid."""
    if pattern is None or not str(pattern).strip():
        return AddressPattern(text="", kind="none")
    text = str(pattern).strip()
    if text in {"*", "*.*.*.*", "*:*:*:*:*:*:*:*"}:
        return AddressPattern(text=text, kind="all")
    if text.endswith("}"):
        start = text.find("{")
        if start < 0:
            raise ConfigError(f"white address pattern {text!r} has '}}' without '{{'")
        prefix, items = text[:start], text[start + 1 : -1].split(",")
        if ":" not in text and prefix.count(".") != 3:
            raise ConfigError(f"white address pattern {text!r} does not have four octets")
        return AddressPattern(
            text=text, kind="set", addresses=_exact([prefix + i.strip() for i in items], text)
        )
    if "," in text:
        return AddressPattern(text=text, kind="set", addresses=_exact(text.split(","), text))
    if "*" in text or "-" in text:
        return _range(text)
    return AddressPattern(text=text, kind="set", addresses=_exact([text], text))


def _range(text: str) -> AddressPattern:
    separator = ":" if ":" in text else "."
    parts = [p.strip() for p in text.split(separator)]
    width, base, top = (8, 16, 0xFFFF) if separator == ":" else (4, 10, 255)
    if len(parts) != width:
        raise ConfigError(f"white address pattern {text!r} does not have {width} parts")

    def number(part: str) -> int:
        try:
            value = int(part, base)
        except ValueError:
            raise ConfigError(f"white address pattern {text!r}: {part!r} is not a number") from None
        if not 0 <= value <= top:
            raise ConfigError(f"white address pattern {text!r}: {part} is out of range")
        return value

    for index in range(1, width):
        part = parts[index]
        if part == "*":
            low, high = 0, top
        elif "-" in part:
            first, _, last = part.partition("-")
            if not first:
                raise ConfigError(f"white address pattern {text!r}: range {part!r} has no start")
            low, high = number(first), number(last)
            if low > high:
                raise ConfigError(f"white address pattern {text!r}: range {part!r} is empty")
        else:
            continue
        for before in parts[:index]:
            number(before)
        for after in parts[index + 1 :]:
            if after != "*" and "-" not in after:
                number(after)
        head_parts = parts[:index]
        if separator == ":":
            head_parts = [f"{number(p):04X}" for p in head_parts]
        head = separator.join(head_parts) + separator
        return AddressPattern(
            text=text, kind="range", head=head, low=low, high=high, separator=separator
        )
    raise ConfigError(f"white address pattern {text!r}: the first part cannot be a range")
