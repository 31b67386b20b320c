"""UPDATE_BROKER_CONFIG (``mqadmin updateBrokerConfig``): settings changed while the broker runs.

RocketMQ's ``updateBrokerConfig`` (docs/rocketmq-protocol.md §16.4) copies any key into its
config objects and answers success; whether the change does anything depends on whether some
code reads the field again, and many fields are read once at start (ports, paths, the role),
so the broker says "success" and goes on as before. trioha changes at run time only the keys
of :data:`LIVE_KEYS`, each read again where it is used; a request with any other key is
refused, the key named, and nothing changes.

Like RocketMQ (``Configuration.persist``), the change is written to the broker's config file:
the ``-c`` file it was started with, else ``<store root>/config/broker.properties``
(RocketMQ's ``~/store/config/broker.properties``), which a broker reads only when started with
it as ``-c``. Where RocketMQ writes out every setting, trioha rewrites only the changed keys'
lines and keeps the rest of the file, comments included; the previous text is kept as
``.bak``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trioha._config import (
    BrokerConfig,
    java_key,
    parse_properties,
    read_setting,
    rewrite_properties,
)
from trioha._errors import ConfigError
from trioha.broker._metadata import write_config_file

#: The config file of a broker started without ``-c``, under its store root.
DEFAULT_CONFIG_FILE = Path("config") / "broker.properties"

#: The fields UPDATE_BROKER_CONFIG changes at run time, and when each change takes effect.
LIVE_KEYS: dict[str, str] = {
    "flush_interval_commit_log": "the async flusher's next round",
    "sync_flush_timeout": (
        "SYNC_FLUSH puts from now on (a shorter timeout applies fully once the puts waiting "
        "under the old one are answered)"
    ),
    "disk_max_used_space_ratio": "at once (the last measurement is checked again)",
    "disk_space_warning_level_ratio": "at once: puts are refused or accepted by the new limit",
    "disk_space_clean_forcibly_ratio": "at once (the last measurement is checked again)",
    "file_reserved_time": "retention's next run",
    "delete_when": "retention's next run",
    "clean_file_forcibly_enable": "retention's next run",
    "delete_commit_log_files_interval": "retention's next file",
    "delete_consume_queue_files_interval": "retention's next run",
    "max_message_size": "the next send",
    "ha_slave_fallbehind_max": "the next SYNC_MASTER put",
    "auto_create_topic_enable": "the next send to a topic this broker does not have",
    "default_topic_queue_nums": "the next auto-created topic of a client that names no count",
}

_WHERE = "updateBrokerConfig"


def parse_settings(body: bytes) -> dict[str, str]:
    """``MixAll.string2Properties`` of a request body: ``key=value`` lines, the last wins."""
    try:
        text = body.decode("utf-8")
        entries = parse_properties(text)
    except (UnicodeDecodeError, ConfigError) as exc:
        raise ConfigError(f"{_WHERE}: the body is not Java properties: {exc}") from None
    return {key: value for _line, key, value in entries}


def updated_config(config: BrokerConfig, settings: Mapping[str, str]) -> BrokerConfig:
    """*config* with *settings* (RocketMQ keys) applied, every value checked as the config
    file's would be.

    Raises :class:`ConfigError` naming the first key that cannot change at run time (an
    unknown key, one trioha ignores, one read only at start), or the value that is invalid.
    """
    changes: dict[str, Any] = {}
    for key, raw in settings.items():
        name, value = read_setting(BrokerConfig, key, raw, where=_WHERE)
        if name not in LIVE_KEYS:
            live = ", ".join(sorted(java_key(n) for n in LIVE_KEYS))
            raise ConfigError(
                f"{_WHERE}: {key} cannot be changed while the broker runs; set it in the "
                f"broker's config file and restart it (changed at run time: {live})"
            )
        changes[name] = value
    try:
        return config.evolve(**changes)
    except ConfigError as exc:
        raise ConfigError(f"{_WHERE}: {exc}") from None


def persist_settings(path: Path, settings: Mapping[str, str]) -> None:
    """Write *settings* into the config file at *path* (blocking: run it in a thread).

    Raises ``OSError`` when the file cannot be read or written.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    write_config_file(path, rewrite_properties(text, settings))
