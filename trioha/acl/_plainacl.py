"""``plain_acl.yml``: the accounts and white lists, loaded and checked.

Mirrors ``PlainPermissionManager.load``: the main file plus every ``*.yml``/``*.yaml`` below
the ``acl/`` directory next to it (RocketMQ: ``<ROCKETMQ_HOME>/conf/plain_acl.yml`` and
``<ROCKETMQ_HOME>/conf/acl/``); an accessKey found in several files is taken from the first
file loaded. Every account is checked as RocketMQ checks it (keys longer than 6 characters,
valid white-address patterns, ``resource=PERM`` entries) and an invalid file is an error that
names the file and the account, never a silently open or half-loaded table.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs
import yaml

from trioha._errors import ConfigError
from trioha.acl._addresses import AddressPattern, compile_pattern
from trioha.acl._permission import DENY, parse_perm, retry_topic

log = logging.getLogger("trioha.acl")


@attrs.frozen
class Account:
    """One ``accounts`` entry (``PlainAccessResource`` as the broker keeps it)."""

    access_key: str
    secret_key: str
    white_address: AddressPattern
    admin: bool = False
    default_topic_perm: int = DENY
    default_group_perm: int = DENY
    #: topicPerms and groupPerms (as ``%RETRY%<group>``); None when neither is listed.
    resource_perms: dict[str, int] | None = attrs.field(default=None, hash=False)
    source: str = ""


@attrs.frozen
class AclTable:
    """Everything loaded from the ACL files at one moment."""

    accounts: dict[str, Account] = attrs.field(factory=dict, hash=False)
    global_white: tuple[AddressPattern, ...] = ()
    files: tuple[str, ...] = ()


def _text(value: object) -> str | None:
    """A YAML scalar as Java's JSON conversion sees it (``secretKey: 12345678`` is a string)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    return isinstance(value, str) and value.strip().lower() == "true"


def _perms(entries: object, where: str, *, group: bool) -> dict[str, int]:
    """``Permission.parseResourcePerms``: ``resource=PERM`` entries."""
    out: dict[str, int] = {}
    if entries is None:
        return out
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: {'groupPerms' if group else 'topicPerms'} must be a list")
    for entry in entries:
        items = str(entry).split("=")
        if len(items) != 2:
            raise ConfigError(f"{where}: parse resource permission failed for {entry!r}")
        name = items[0].strip()
        key = retry_topic(name) if group else name
        assert key is not None
        out[key] = parse_perm(items[1].strip())
    return out


def parse_account(raw: object, where: str) -> Account:
    """``PlainPermissionManager.buildPlainAccessResource`` with its checks."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: an account must be a mapping, got {raw!r:.60}")
    access_key, secret_key = _text(raw.get("accessKey")), _text(raw.get("secretKey"))
    if access_key is None or secret_key is None or len(access_key) <= 6 or len(secret_key) <= 6:
        raise ConfigError(
            f"{where}: the accessKey={access_key} and secretKey cannot be null and length "
            "should longer than 6"
        )
    where = f"{where} (accessKey {access_key})"
    topic_perms = _perms(raw.get("topicPerms"), where, group=False)
    group_perms = _perms(raw.get("groupPerms"), where, group=True)
    listed = raw.get("topicPerms") is not None or raw.get("groupPerms") is not None
    try:
        white = compile_pattern(raw.get("whiteRemoteAddress"))
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return Account(
        access_key=access_key,
        secret_key=secret_key,
        white_address=white,
        admin=_bool(raw.get("admin")),
        default_topic_perm=parse_perm(_text(raw.get("defaultTopicPerm"))),
        default_group_perm=parse_perm(_text(raw.get("defaultGroupPerm"))),
        resource_perms={**topic_perms, **group_perms} if listed else None,
        source=where,
    )


def acl_files(main: Path) -> list[Path]:
    """The main file first, then ``<dir>/acl/**/*.yml|yaml`` in a stable (sorted) order."""
    extra = main.parent / "acl"
    found: list[Path] = []
    if extra.is_dir():
        found = sorted(p for p in extra.rglob("*") if p.suffix in {".yml", ".yaml"} and p.is_file())
    return [main, *(p for p in found if p.resolve() != main.resolve())]


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read ACL file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"ACL file {path} is not UTF-8: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"ACL file {path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"ACL file {path} must hold a mapping at the top level")
    return data


def load_table(paths: Iterable[Path]) -> AclTable:
    """Read and check every file; the first file holding an accessKey wins it."""
    accounts: dict[str, Account] = {}
    white: list[AddressPattern] = []
    names = []
    for path in paths:
        data = _read(path)
        names.append(str(path))
        patterns = data.get("globalWhiteRemoteAddresses") or []
        if not isinstance(patterns, list):
            raise ConfigError(f"{path}: globalWhiteRemoteAddresses must be a list")
        for pattern in patterns:
            try:
                white.append(compile_pattern(pattern))
            except ConfigError as exc:
                raise ConfigError(f"{path}: globalWhiteRemoteAddresses: {exc}") from None
        raw_accounts = data.get("accounts") or []
        if not isinstance(raw_accounts, list):
            raise ConfigError(f"{path}: accounts must be a list")
        for number, raw in enumerate(raw_accounts, 1):
            account = parse_account(raw, f"{path}: account #{number}")
            if account.access_key in accounts:
                log.warning(
                    "%s: accessKey %s is already defined in %s; this one is ignored",
                    path,
                    account.access_key,
                    accounts[account.access_key].source,
                )
                continue
            accounts[account.access_key] = account
    return AclTable(accounts=accounts, global_white=tuple(white), files=tuple(names))
