"""Permission bits and strings of RocketMQ's plain ACL (``acl.common.Permission``)."""

from __future__ import annotations

DENY = 1
ANY = 2
PUB = 4
SUB = 8

#: ``MixAll.RETRY_GROUP_TOPIC_PREFIX``: a group's resource name is its retry topic.
RETRY_PREFIX = "%RETRY%"


def parse_perm(text: object) -> int:
    """``Permission.parsePermFromString``: ``PUB``, ``SUB``, ``PUB|SUB``/``SUB|PUB``, else DENY."""
    if not isinstance(text, str):
        return DENY
    match text.strip():
        case "PUB":
            return PUB
        case "SUB":
            return SUB
        case "PUB|SUB" | "SUB|PUB":
            return PUB | SUB
        case _:
            return DENY


def check_perm(needed: int, owned: int) -> bool:
    """``Permission.checkPermission``: DENY in *owned* refuses; ANY needs PUB or SUB."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


def perm_name(perm: int) -> str:
    return {PUB: "PUB", SUB: "SUB", PUB | SUB: "PUB|SUB", DENY: "DENY", ANY: "ANY"}.get(
        perm, str(perm)
    )


def retry_topic(group: str | None) -> str | None:
    """``MixAll.getRetryTopic``: a group's resource name (None stays None)."""
    return None if group is None else RETRY_PREFIX + group


def is_retry_topic(resource: str) -> bool:
    return resource.startswith(RETRY_PREFIX)


def print_resource(resource: str) -> str:
    """``PlainAccessResource.printStr``: ``group:<g>`` for a retry name, else ``topic:<t>``."""
    if is_retry_topic(resource):
        return f"group:{resource[len(RETRY_PREFIX) :]}"
    return f"topic:{resource}"
