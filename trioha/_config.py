"""Broker configuration: RocketMQ's settings in snake_case, with RocketMQ's defaults.

Mirrors ``MessageStoreConfig`` and ``BrokerConfig`` (docs/rocketmq-protocol.md §3).
``BrokerConfig.from_properties`` reads a RocketMQ ``broker.conf`` (camelCase keys). A key trioha
does not know is an error that names the nearest valid key; a RocketMQ key that trioha knows but
has no use for (retention times, thread pool sizes, ...) is accepted and logged, so an existing
``broker.conf`` works.

Where trioha's default differs from RocketMQ's, the field says why:

* ``ha_listen_host`` is ``127.0.0.1``: nothing listens beyond loopback unless asked.
* ``in_sync_replicas`` is 2 (the master and one slave). It counts replicas the way RocketMQ
  5.x does; 5.x defaults to 1, which makes SYNC_MASTER wait for nobody
  (docs/rocketmq-protocol.md §5.3). 2 is 4.x's SYNC_MASTER behaviour.
"""

from __future__ import annotations

import difflib
import enum
import logging
import re
from pathlib import Path
from typing import Any

import attrs

from trioha._errors import ConfigError
from trioha.proto._timing import (
    HEARTBEAT_INTERVAL_MS,
    HOUSEKEEPING_INTERVAL_MS,
    SLAVE_TIMEOUT_MS,
    Timing,
)

log = logging.getLogger("trioha.config")

GIB = 1 << 30
MIB = 1 << 20

#: The Java slave's receive buffer (``HAClient.READ_MAX_BUFFER_SIZE``, docs/rocketmq-protocol.md
#: §1.6): a frame larger than this minus its 12-byte header can never be received by a RocketMQ
#: slave.
JAVA_SLAVE_READ_BUFFER = 4 * MIB


class BrokerRole(enum.Enum):
    """``org.apache.rocketmq.store.config.BrokerRole``."""

    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"

    @property
    def is_master(self) -> bool:
        return self is not BrokerRole.SLAVE


class FlushDiskType(enum.Enum):
    """``org.apache.rocketmq.store.config.FlushDiskType``."""

    SYNC_FLUSH = "SYNC_FLUSH"
    ASYNC_FLUSH = "ASYNC_FLUSH"


def _positive(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value <= 0:
        raise ConfigError(f"{attribute.name} must be positive, got {value}")


def _port(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not 0 <= value <= 65535:
        raise ConfigError(f"{attribute.name} must be a TCP port (0..65535), got {value}")


def _address(_inst: object, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    if value is not None:
        parse_address(value, what=attribute.name)


def parse_address(text: str, *, what: str = "address") -> tuple[str, int]:
    """Split ``host:port`` (or ``[v6]:port``) and check the port; a clear error otherwise."""
    match = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([^:\s]+):(\d+)", text.strip())
    if match is None:
        raise ConfigError(f"{what} must look like HOST:PORT, got {text!r}")
    host = match.group(1) or match.group(3)
    port = int(match.group(2) or match.group(4))
    if not 0 <= port <= 65535:
        raise ConfigError(f"{what} has port {port}, which is not a TCP port")
    return host, port


@attrs.frozen(kw_only=True)
class BrokerConfig:
    """Everything a trioha broker needs to run, as RocketMQ names it (in snake_case)."""

    # --- identity and role (BrokerConfig / MessageStoreConfig) -----------------------------
    broker_role: BrokerRole = attrs.field(default=BrokerRole.ASYNC_MASTER, converter=BrokerRole)
    broker_cluster_name: str = "DefaultCluster"
    broker_name: str = "broker-a"
    broker_id: int = 0
    #: The address this broker advertises to clients (RocketMQ's brokerIP1).
    broker_ip1: str = "127.0.0.1"

    # --- store (MessageStoreConfig) ---------------------------------------------------------
    store_path_root_dir: str = attrs.field(default=str(Path.home() / "store"))
    mapped_file_size_commit_log: int = attrs.field(default=GIB, validator=_positive)
    flush_disk_type: FlushDiskType = attrs.field(
        default=FlushDiskType.ASYNC_FLUSH, converter=FlushDiskType
    )
    flush_interval_commit_log: int = attrs.field(default=500, validator=_positive)
    sync_flush_timeout: int = attrs.field(default=5000, validator=_positive)
    max_message_size: int = attrs.field(default=4 * MIB, validator=_positive)
    check_crc_on_recover: bool = True
    #: The message index (``<root>/index``): on/off, and each file's hash slots and entries.
    message_index_enable: bool = True
    max_hash_slot_num: int = attrs.field(default=5_000_000, validator=_positive)
    max_index_num: int = attrs.field(default=20_000_000, validator=_positive)
    #: Delay levels (``ScheduleMessageService``): level n waits the n-th duration.
    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

    # --- HA (MessageStoreConfig) ------------------------------------------------------------
    ha_listen_host: str = "127.0.0.1"
    ha_listen_port: int = attrs.field(default=10912, validator=_port)
    ha_master_address: str | None = attrs.field(default=None, validator=_address)
    ha_send_heartbeat_interval: int = attrs.field(
        default=HEARTBEAT_INTERVAL_MS, validator=_positive
    )
    ha_housekeeping_interval: int = attrs.field(
        default=HOUSEKEEPING_INTERVAL_MS, validator=_positive
    )
    ha_transfer_batch_size: int = attrs.field(default=32768, validator=_positive)
    ha_slave_fallbehind_max: int = attrs.field(default=256 * MIB, validator=_positive)
    slave_timeout: int = attrs.field(default=SLAVE_TIMEOUT_MS, validator=_positive)
    #: Replicas (the master included, as in RocketMQ 5.x) that must hold a SYNC_MASTER put.
    in_sync_replicas: int = attrs.field(default=2, validator=_positive)

    # --- trioha's own HA options (where it deliberately does better; docs/replication.md) ----
    #: Slave: report (ack) only what is flushed to disk, so an acked message survives a
    #: slave restart. RocketMQ acks what is written to the page cache.
    ha_slave_ack_flushed: bool = False
    #: Master: serve a slave that reports 0 from the oldest offset (a full copy) instead of the
    #: start of the last segment (RocketMQ #3661).
    ha_sync_from_oldest: bool = False
    #: Slave: longest wait between reconnect attempts (doubling from 100 ms).
    ha_reconnect_backoff_max: int = attrs.field(default=5000, validator=_positive)

    # --- client side (BrokerConfig) ---------------------------------------------------------
    listen_port: int = attrs.field(default=10911, validator=_port)
    namesrv_addr: str | None = None
    auto_create_topic_enable: bool = True
    default_topic_queue_nums: int = attrs.field(default=8, validator=_positive)
    register_name_server_period: int = attrs.field(default=30000, validator=_positive)
    #: trioha's own: run a name server inside this broker, listening on the first
    #: ``namesrv_addr`` entry (127.0.0.1:9876 when unset), for a one-command setup.
    embedded_namesrv: bool = False
    #: trioha's own: a slave's master broker address (its remoting port) for metadata sync
    #: when no name server tells it; RocketMQ learns it only from the name server.
    master_broker_addr: str | None = attrs.field(default=None, validator=_address)

    def __attrs_post_init__(self) -> None:
        if self.ha_transfer_batch_size > JAVA_SLAVE_READ_BUFFER - 12:
            raise ConfigError(
                f"ha_transfer_batch_size {self.ha_transfer_batch_size} exceeds what a RocketMQ "
                f"slave can receive ({JAVA_SLAVE_READ_BUFFER - 12} bytes, its read buffer less the "
                "header)"
            )
        if self.broker_role is BrokerRole.SLAVE and self.broker_id == 0:
            # RocketMQ refuses this too (BrokerStartup): a slave with id 0 mistakes a
            # half-replicated trailing message for corruption (docs/rocketmq-protocol.md §1.7, §11).
            object.__setattr__(self, "broker_id", 1)

    # --- derived ----------------------------------------------------------------------------
    @property
    def store_root(self) -> Path:
        return Path(self.store_path_root_dir).expanduser()

    @property
    def ha_master(self) -> tuple[str, int] | None:
        """``ha_master_address`` parsed, or None (RocketMQ ignores values shorter than 6)."""
        if self.ha_master_address is None or len(self.ha_master_address) < 6:
            return None
        return parse_address(self.ha_master_address, what="ha_master_address")

    @property
    def ha_timing(self) -> Timing:
        """The heartbeat and housekeeping intervals both HA ends run with, in seconds."""
        return Timing.from_millis(self.ha_send_heartbeat_interval, self.ha_housekeeping_interval)

    @property
    def required_slave_acks(self) -> int:
        """How many slaves must ack a SYNC_MASTER put (0: none, as 5.x with in_sync_replicas 1)."""
        return max(0, self.in_sync_replicas - 1)

    def evolve(self, **changes: Any) -> BrokerConfig:
        """A copy with *changes* applied and validated (``attrs.evolve``)."""
        try:
            return attrs.evolve(self, **changes)
        except TypeError as exc:
            raise ConfigError(str(exc)) from None

    # --- broker.conf ------------------------------------------------------------------------
    @classmethod
    def from_properties(cls, path: str | Path, **overrides: Any) -> BrokerConfig:
        """Read a RocketMQ ``broker.conf`` (Java properties, camelCase keys).

        Raises :class:`ConfigError` naming the file, the line and the nearest valid key for a
        key trioha does not know, and naming the value for one it cannot parse.
        """
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
        values: dict[str, Any] = {}
        fields = {f.name: f for f in attrs.fields(cls)}
        for lineno, key, raw in _parse_properties(text):
            name = _snake(LEGACY_KEYS.get(key, key))
            where = f"{path}:{lineno}"
            if name not in fields:
                if key in IGNORED_ROCKETMQ_KEYS:
                    log.info("%s: %s is a RocketMQ setting trioha has no use for", where, key)
                    continue
                raise ConfigError(f"{where}: unknown key {key!r}{_nearest(key, fields)}")
            values[name] = _convert(fields[name], raw, where, key)
        values.update(overrides)
        try:
            return cls(**values)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{path}: {exc}") from None


# RocketMQ's older spellings, still accepted by its config loader and found in old files.
LEGACY_KEYS = {"mapedFileSizeCommitLog": "mappedFileSizeCommitLog"}

# RocketMQ settings a real broker.conf commonly carries that trioha accepts and ignores.
IGNORED_ROCKETMQ_KEYS = frozenset(
    {
        "deleteWhen",
        "fileReservedTime",
        "brokerIP2",
        "storePathCommitLog",
        "storePathConsumeQueue",
        "storePathIndex",
        "storeCheckpoint",
        "abortFile",
        "mapedFileSizeConsumeQueue",
        "mappedFileSizeConsumeQueue",
        "sendMessageThreadPoolNums",
        "pullMessageThreadPoolNums",
        "useReentrantLockWhenPutMessage",
        "waitTimeMillsInSendQueue",
        "transientStorePoolEnable",
        "enableDLegerCommitLog",
        "diskMaxUsedSpaceRatio",
        "autoCreateSubscriptionGroup",
        "traceTopicEnable",
        "aclEnable",
        "slaveReadEnable",
        "brokerPermission",
        "defaultQueryMaxNum",
        "duplicationEnable",
        "offsetCheckInSlave",
    }
)


def _parse_properties(text: str) -> list[tuple[int, str, str]]:
    """Java ``.properties`` lines: ``k=v``, ``k: v`` or ``k v``; ``#`` and ``!`` start comments."""
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped[0] in "#!":
            continue
        match = re.match(r"([^=:\s]+)\s*[=:\s]\s*(.*)$", stripped)
        if match is None:
            out.append((lineno, stripped, ""))
        else:
            out.append((lineno, match.group(1), match.group(2).strip()))
    return out


def _snake(key: str) -> str:
    """``haSendHeartbeatInterval`` -> ``ha_send_heartbeat_interval``; ``checkCRCOnRecover`` ->
    ``check_crc_on_recover`` (a run of capitals is one word)."""
    key = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", key)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key).lower()


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _nearest(key: str, fields: dict[str, Any]) -> str:
    candidates = [_camel(name) for name in fields]
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _convert(field: attrs.Attribute[Any], raw: str, where: str, key: str) -> Any:
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
    try:
        if kind == "bool":
            if raw.lower() not in {"true", "false"}:
                raise ValueError("expected true or false")
            return raw.lower() == "true"
        if kind == "int":
            return int(raw)
        if kind in {"BrokerRole", "FlushDiskType"}:
            enum_type = BrokerRole if kind == "BrokerRole" else FlushDiskType
            return enum_type(raw.upper())
        if kind == "str | None":
            return raw or None
        return raw
    except ValueError as exc:
        raise ConfigError(f"{where}: {key}={raw!r} is not valid: {exc}") from None
