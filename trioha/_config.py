"""Broker configuration: RocketMQ's settings in snake_case, with RocketMQ's defaults.

Mirrors ``MessageStoreConfig`` and ``BrokerConfig`` (docs/rocketmq-protocol.md §3).
``BrokerConfig.from_properties`` reads a RocketMQ ``broker.conf`` (camelCase keys) the way
``java.util.Properties.load`` reads it (continuations, ``:`` and blank separators, escapes, ``!``
comments). A key trioha does not know is an error that names the nearest valid key; a RocketMQ
key that trioha knows but has no use for (retention times, thread pool sizes, ...) is accepted
and logged, so an existing ``broker.conf`` works; a store path trioha cannot honour is refused,
never ignored.

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
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, get_type_hints

import attrs

from trioha._errors import ConfigError
from trioha.proto import (
    HEARTBEAT_INTERVAL_MS,
    HOUSEKEEPING_INTERVAL_MS,
    SLAVE_TIMEOUT_MS,
    Timing,
)
from trioha.store import FlushDiskType

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


def _positive(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value <= 0:
        raise ConfigError(f"{attribute.name} must be positive, got {value}")


def _non_negative(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise ConfigError(f"{attribute.name} must not be negative, got {value}")


def _port(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not 0 <= value <= 65535:
        raise ConfigError(f"{attribute.name} must be a TCP port (0..65535), got {value}")


TLS_MODES = ("disabled", "permissive", "enforcing")


def _lower(value: str) -> str:
    return str(value).lower()


def _choice(allowed: tuple[str, ...]) -> Any:
    def check(_inst: object, attribute: attrs.Attribute[str], value: str) -> None:
        if value not in allowed:
            choices = ", ".join(allowed)
            raise ConfigError(f"{attribute.name} must be one of {choices}, got {value!r}")

    return check


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


def parse_delete_when(text: str) -> tuple[int, ...]:
    """``deleteWhen``: hours of the day, ``;``-separated (``"04"``, ``"04;16"``).

    RocketMQ parses it at every clean-up run (``UtilAll.isItTimeToDo``), where a bad entry
    throws every 10 s and no time-based deletion ever happens; here it is refused when read,
    the entry named. Raises :class:`ConfigError`.
    """
    hours = []
    for part in str(text).split(";"):
        entry = part.strip()
        if not entry.isdigit() or not 0 <= int(entry) <= 23:
            raise ConfigError(
                f"deleteWhen={text!r}: {entry!r} is not an hour of the day (0..23); give "
                "hours separated by ';', e.g. 04 or 04;16"
            )
        hours.append(int(entry))
    return tuple(hours)


def _delete_when(_inst: object, _attribute: attrs.Attribute[str], value: str) -> None:
    parse_delete_when(value)


def _percent(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not 0 <= value <= 100:
        raise ConfigError(f"{attribute.name} must be a percentage (0..100), got {value}")


def _read_bool(raw: str) -> bool:
    if raw.lower() not in {"true", "false"}:
        raise ValueError("expected true or false")
    return raw.lower() == "true"


def _read_str(raw: str) -> str:
    return raw


def _read_optional_str(raw: str) -> str | None:
    """Empty is unset (``brokerIP1=`` in a file means "not given")."""
    return raw or None


def _read_broker_role(raw: str) -> BrokerRole:
    return BrokerRole(raw.upper())


def _read_flush_disk_type(raw: str) -> FlushDiskType:
    return FlushDiskType(raw.upper())


#: How a ``.properties`` value becomes a setting's value, by the setting's type. The types are
#: the annotations resolved (``str | None``, ``Optional[str]`` and ``"str|None"`` are one
#: key), so how an annotation is spelled cannot change how its value is read.
READERS: dict[object, Callable[[str], Any]] = {
    bool: _read_bool,
    int: int,
    str: _read_str,
    str | None: _read_optional_str,
    BrokerRole: _read_broker_role,
    FlushDiskType: _read_flush_disk_type,
}


def settings_readers(cls: type, fields: list[attrs.Attribute[Any]]) -> list[attrs.Attribute[Any]]:
    """The ``field_transformer`` of the configuration classes: each field carries its reader
    (``metadata["read"]``: raw text -> value, ValueError for a bad value), chosen from
    :data:`READERS` by its resolved type unless the field names its own. A field whose type
    has no reader stops the class from being defined, so a setting can never be taken as raw
    text by accident."""
    hints = get_type_hints(cls)
    out = []
    for field in fields:
        reader = field.metadata.get("read") or READERS.get(hints.get(field.name))
        if reader is None:
            raise TypeError(
                f"{cls.__name__}.{field.name}: no reader for a setting of type {field.type!r}; "
                "give the field metadata={'read': ...} or add its type to READERS"
            )
        out.append(field.evolve(metadata={**field.metadata, "read": reader}))
    return out


@attrs.frozen(kw_only=True, field_transformer=settings_readers)
class RemotingServerConfig:
    """What a remoting port allows its peers, for the broker and the name server alike:
    ``NettyServerConfig``'s idle timeout and trioha's own limits (docs/operations.md, "Idle
    and hostile connections"; ``trioha.remoting._limits`` says why each exists)."""

    #: ``NettyServerConfig.serverChannelMaxIdleTimeSeconds``: a client connection that neither
    #: reads nor writes for this long is closed.
    server_channel_max_idle_time_seconds: int = attrs.field(default=120, validator=_positive)
    #: trioha's own: connections the port holds at once (0: half the process's open-file
    #: limit); more are closed at once, with a WARNING when the cap starts biting.
    server_max_connections: int = attrs.field(default=0, validator=_non_negative)
    #: trioha's own: a frame may take this many seconds from its first byte to its last, plus
    #: its size at ``server_frame_min_bytes_per_second``; a slower one closes its connection.
    server_frame_timeout_seconds: int = attrs.field(default=10, validator=_positive)
    server_frame_min_bytes_per_second: int = attrs.field(default=65536, validator=_positive)
    #: trioha's own: this share of ``server_max_connections`` is kept for client addresses
    #: holding fewer than ``server_connection_reserve_max_per_address`` connections (0: none).
    server_connection_reserve_percent: int = attrs.field(default=10, validator=_percent)
    server_connection_reserve_max_per_address: int = attrs.field(default=4, validator=_positive)


@attrs.frozen(kw_only=True, field_transformer=settings_readers)
class BrokerConfig(RemotingServerConfig):
    """Everything a trioha broker needs to run, as RocketMQ names it (in snake_case).

    The settings of its remoting ports (idle timeout, connection cap, frame deadline) are
    :class:`RemotingServerConfig`'s.
    """

    # --- identity and role (BrokerConfig / MessageStoreConfig) -----------------------------
    broker_role: BrokerRole = attrs.field(default=BrokerRole.ASYNC_MASTER, converter=BrokerRole)
    broker_cluster_name: str = "DefaultCluster"
    broker_name: str = "broker-a"
    broker_id: int = 0
    #: The address this broker advertises to clients (RocketMQ's brokerIP1).
    broker_ip1: str = "127.0.0.1"

    # --- store (MessageStoreConfig) ---------------------------------------------------------
    store_path_root_dir: str = attrs.field(default=str(Path.home() / "store"))
    #: Where the commit log lives (None: ``<root>/commitlog``), e.g. on a disk of its own.
    store_path_commit_log: str | None = None
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

    # --- disk space guards (MessageStoreConfig; DefaultMessageStore.isSpaceFull) ---------
    #: Percent. Above it, commit log files older than ``file_reserved_time`` are deleted at
    #: once, whatever the hour. Clamped to [10, 95] as ``getDiskMaxUsedSpaceRatio`` does.
    disk_max_used_space_ratio: int = attrs.field(default=75, validator=_positive)
    #: Percent (5.x broker-config ints; 4.x JVM properties): puts are refused above it.
    disk_space_warning_level_ratio: int = attrs.field(default=90, validator=_positive)
    #: Percent: above it (with ``clean_file_forcibly_enable``) files are deleted at any age.
    disk_space_clean_forcibly_ratio: int = attrs.field(default=85, validator=_positive)
    #: How often (ms) the disk is measured, failing writers retried and retention run.
    clean_resource_interval: int = attrs.field(default=10000, validator=_positive)

    # --- retention (MessageStoreConfig; DefaultMessageStore.CleanCommitLogService) ---------
    #: Hours a commit log file is kept after its last write.
    file_reserved_time: int = attrs.field(default=72, validator=_non_negative)
    #: The hours of the day (local time, ``;``-separated) at which expired files are deleted.
    delete_when: str = attrs.field(default="04", converter=str, validator=_delete_when)
    #: Above ``disk_space_clean_forcibly_ratio``, delete the oldest files whatever their age.
    clean_file_forcibly_enable: bool = True
    #: ms between two commit log files deleted in one run.
    delete_commit_log_files_interval: int = attrs.field(default=100, validator=_non_negative)
    #: ms after each consume queue that lost files, before the next one is looked at.
    delete_consume_queue_files_interval: int = attrs.field(default=100, validator=_non_negative)

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
    #: ``enableControllerMode`` (5.x BrokerConfig): replicate with the AutoSwitch HA protocol
    #: (epochs, handshake, truncation to the consistent point) instead of the classic one.
    #: Without ``failover_etcd_endpoints`` roles stay static (``broker_role``) and a master's
    #: epoch comes from its own epoch file; with them etcd elects the master and hands out
    #: epochs (automatic failover, docs/failover.md). Both ends of a connection must agree.
    enable_controller_mode: bool = False
    #: ``syncFromLastFile`` (5.x, epoch mode): a slave with an empty log asks for the start of
    #: the master's last segment instead of a full copy from its oldest offset.
    sync_from_last_file: bool = False

    # --- automatic failover through etcd (docs/failover.md) --------------------------------
    #: ``allAckInSyncStateSet`` (5.x): a put is PUT_OK only when every SyncStateSet member
    #: holds it. RocketMQ's default is false; trioha's is true (a member without the write
    #: could be elected otherwise).
    all_ack_in_sync_state_set: bool = True
    #: ``minInSyncReplicas`` (5.x): brokers (the master included) that must hold a put, asked
    #: before the append and again when it completes.
    min_in_sync_replicas: int = attrs.field(default=1, validator=_positive)
    #: ``enableElectUncleanMaster`` (5.x): with no live SyncStateSet member, elect any live
    #: broker (the bytes lost are logged at ERROR).
    enable_elect_unclean_master: bool = False
    #: ``haMaxTimeSlaveNotCatchup`` (ms): a member that has not caught up this long leaves
    #: the SyncStateSet.
    ha_max_time_slave_not_catchup: int = attrs.field(default=15000, validator=_positive)
    #: trioha's own: etcd's client URLs (``http://host:2379``, ``;`` or ``,`` between them).
    #: Set together with ``enable_controller_mode``, etcd decides this broker's role.
    failover_etcd_endpoints: str | None = None
    #: trioha's own: the root under which each group keeps its keys
    #: (``<root>/<brokerClusterName>/<brokerName>/``).
    failover_etcd_root: str = "/trioha"
    #: trioha's own: etcd user and password when etcd has authentication on.
    failover_etcd_user: str = ""
    failover_etcd_password: str = attrs.field(default="", repr=False)
    #: trioha's own: the TTL (seconds) of this broker's etcd lease. A master acknowledges for
    #: 4/5 of it after each keepalive; a dead master is replaced about one TTL after it died.
    failover_lease_ttl: int = attrs.field(default=3, validator=_positive)
    #: trioha's own: this broker's stable id in its group (1 and up, unique in the group). It
    #: registers with the name servers under it as a slave, and as brokerId 0 while master.
    failover_broker_id: int = 0
    #: trioha's own, **for tests only**: known-bad twins of the failover design switched on by
    #: name (``failoverUnsafe=no_self_fence``; several with ``,``), the fields of
    #: ``trioha.failover.Unsafe``. They exist so that the nemesis harness (bench/nemesis.py)
    #: can show its checker catching a broker that loses or diverges; a broker with any of
    #: them set can lose acknowledged messages and says so at start.
    failover_unsafe: str = ""

    # --- trioha's own HA options (where it deliberately does better; docs/replication.md) ----
    #: Slave: report (ack) only what is flushed to disk, so an acked message survives a
    #: slave restart. RocketMQ acks what is written to the page cache.
    ha_slave_ack_flushed: bool = False
    #: Master: serve a slave that reports 0 from the oldest offset (a full copy) instead of the
    #: start of the last segment (RocketMQ #3661).
    ha_sync_from_oldest: bool = False
    #: Slave: longest wait between reconnect attempts (doubling from 100 ms).
    ha_reconnect_backoff_max: int = attrs.field(default=5000, validator=_positive)
    #: Master: start even though recovery cut bytes that had been flushed (a damaged record,
    #: not a lost tail). Off, a master refuses to start on such a log (docs/replication.md).
    ha_accept_damaged_log: bool = False
    #: Master: start even though recovery ended below messages it had answered PUT_OK and
    #: sent to slaves, which may still hold them. Off, a master refuses to start then, naming
    #: the slave to promote (docs/replication.md); on, those messages are discarded.
    ha_accept_lost_acknowledged: bool = False

    # --- client side (BrokerConfig) ---------------------------------------------------------
    listen_port: int = attrs.field(default=10911, validator=_port)
    namesrv_addr: str | None = None
    auto_create_topic_enable: bool = True
    default_topic_queue_nums: int = attrs.field(default=8, validator=_positive)
    register_name_server_period: int = attrs.field(default=30000, validator=_positive)
    #: trioha's own: run a name server inside this broker, listening on the first
    #: ``namesrv_addr`` entry (127.0.0.1:9876 when unset), for a one-command setup.
    embedded_namesrv: bool = False
    #: trioha's own: a ``namesrv.properties`` for the embedded name server (its idle timeout,
    #: connection cap, ...; :class:`NamesrvConfig`). Unset: RocketMQ's name server defaults,
    #: never this broker's own ``server*`` settings.
    embedded_namesrv_config: str | None = None
    #: trioha's own: a slave's master broker address (its remoting port) for metadata sync
    #: when no name server tells it; RocketMQ learns it only from the name server.
    master_broker_addr: str | None = attrs.field(default=None, validator=_address)

    # --- access control and TLS (RocketMQ's plain ACL and TlsSystemConfig; docs/security.md) -
    #: ``aclEnable``: check every request on the broker port (and on an embedded name server)
    #: against ``plain_acl.yml``. Without a readable ACL file the broker refuses to start.
    acl_enable: bool = False
    #: trioha's own: the ``plain_acl.yml`` to load; ``*.yml`` files in an ``acl/`` directory
    #: beside it are loaded too. Unset: ``$ROCKETMQ_HOME/conf/plain_acl.yml``, as RocketMQ.
    acl_file: str | None = None
    #: trioha's own: the account this broker signs its own requests with (registration with
    #: name servers, a slave's metadata sync). The secret may be left out when the ACL file
    #: holds the account. RocketMQ 4.x sends these unsigned.
    acl_access_key: str | None = None
    acl_secret_key: str | None = attrs.field(default=None, repr=False)
    #: ``tls.server.mode``: ``disabled`` (plaintext only), ``permissive`` (TLS or plaintext,
    #: told apart by the first byte) or ``enforcing`` (TLS only), for the broker port and an
    #: embedded name server. A TLS client is refused while no certificate is configured.
    tls_server_mode: str = attrs.field(default="permissive", validator=_choice(TLS_MODES))
    tls_server_cert_path: str | None = None  # tls.server.certPath: PEM chain
    tls_server_key_path: str | None = None  # tls.server.keyPath: PEM private key
    tls_server_key_password: str | None = attrs.field(default=None, repr=False)
    #: ``tls.server.need.client.auth``: ``none``, ``optional`` or ``require`` a client certificate.
    tls_server_need_client_auth: str = attrs.field(
        default="none", converter=_lower, validator=_choice(("none", "optional", "require"))
    )
    #: ``tls.server.authClient``: verify client certificates against ``tls.server.trustCertPath``.
    tls_server_auth_client: bool = False
    tls_server_trust_cert_path: str | None = None
    #: ``tls.enable``: this broker's own requests (registration, slave sync) use TLS.
    tls_enable: bool = False
    tls_client_cert_path: str | None = None  # tls.client.certPath
    tls_client_key_path: str | None = None  # tls.client.keyPath
    tls_client_key_password: str | None = attrs.field(default=None, repr=False)
    #: ``tls.client.authServer``: verify the server's certificate against ``trustCertPath``.
    tls_client_auth_server: bool = False
    tls_client_trust_cert_path: str | None = None
    #: ``tls.config.file``: a properties file whose ``tls.*`` settings (all but
    #: ``tls.server.mode`` and ``tls.enable``) override this file's, as RocketMQ reads it.
    #: Unlike RocketMQ, nothing is read unless it is set.
    tls_config_file: str | None = None
    #: trioha's own, off by default so RocketMQ slaves and masters still connect: TLS on the
    #: HA port (master: ``ha_tls_cert_path``/``ha_tls_key_path``; both sides verify the peer
    #: against ``ha_tls_trust_cert_path`` when set, and a master with
    #: ``ha_tls_need_client_auth`` demands a slave certificate signed by it).
    ha_tls_enable: bool = False
    ha_tls_cert_path: str | None = None
    ha_tls_key_path: str | None = None
    ha_tls_trust_cert_path: str | None = None
    ha_tls_need_client_auth: bool = False
    #: trioha's own: a secret master and slave must both prove they know (HMAC challenge in
    #: both directions) before any commit log byte flows; with or without ``ha_tls_enable``.
    ha_auth_secret: str | None = attrs.field(default=None, repr=False)

    @property
    def acl_main_file(self) -> Path | None:
        """The ACL file to load: ``acl_file``, else ``$ROCKETMQ_HOME/conf/plain_acl.yml``."""
        if self.acl_file:
            return Path(self.acl_file).expanduser()
        home = os.environ.get("ROCKETMQ_HOME")
        return Path(home) / "conf" / "plain_acl.yml" if home else None

    def __attrs_post_init__(self) -> None:
        if self.ha_transfer_batch_size > JAVA_SLAVE_READ_BUFFER - 12:
            raise ConfigError(
                f"ha_transfer_batch_size {self.ha_transfer_batch_size} exceeds what a RocketMQ "
                f"slave can receive ({JAVA_SLAVE_READ_BUFFER - 12} bytes, its read buffer less the "
                "header)"
            )
        if self.failover:
            if self.failover_broker_id < 1:
                raise ConfigError(
                    "automatic failover (enableControllerMode with failoverEtcdEndpoints) needs "
                    f"failoverBrokerId, this broker's stable id in its group (1 and up), not "
                    f"{self.failover_broker_id}"
                )
            # docs/failover.md, "Durability": an acknowledged write is flushed on every broker
            # the ack rule counts.
            object.__setattr__(self, "ha_slave_ack_flushed", True)
        if self.broker_role is BrokerRole.SLAVE and self.broker_id == 0:
            # RocketMQ refuses this too (BrokerStartup): a slave with id 0 mistakes a
            # half-replicated trailing message for corruption (docs/rocketmq-protocol.md §1.7, §11).
            object.__setattr__(self, "broker_id", 1)

    # --- derived ----------------------------------------------------------------------------
    @property
    def store_root(self) -> Path:
        return Path(self.store_path_root_dir).expanduser()

    @property
    def commitlog_dir(self) -> Path:
        """``getStorePathCommitLog``: ``storePathCommitLog``, else ``<root>/commitlog``."""
        if self.store_path_commit_log:
            return Path(self.store_path_commit_log).expanduser()
        return self.store_root / "commitlog"

    @property
    def disk_ratios(self) -> tuple[float, float, float]:
        """(warning, clean forcibly, max used) as fractions; max used clamped to [0.10, 0.95]."""
        max_used = min(95, max(10, self.disk_max_used_space_ratio))
        return (
            self.disk_space_warning_level_ratio / 100,
            self.disk_space_clean_forcibly_ratio / 100,
            max_used / 100,
        )

    @property
    def delete_hours(self) -> tuple[int, ...]:
        """``delete_when`` as hours of the day."""
        return parse_delete_when(self.delete_when)

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
    def registration_period(self) -> float:
        """Seconds between registrations with the name servers: ``register_name_server_period``
        clamped to 10–60 s, as ``BrokerController`` does."""
        return min(max(self.register_name_server_period, 10_000), 60_000) / 1000

    @property
    def failover(self) -> bool:
        """Does etcd decide this broker's role (docs/failover.md)?"""
        return self.enable_controller_mode and bool(self.failover_etcd_endpoints)

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
    def from_properties(
        cls,
        path: str | Path | None,
        *,
        settings: Sequence[tuple[str, str]] = (),
        **overrides: Any,
    ) -> BrokerConfig:
        """Read a RocketMQ ``broker.conf`` (Java properties, camelCase keys).

        *settings* are ``(key, value)`` pairs applied after the file (``--set key=value``; no
        file when *path* is None), read with the same keys, conversions and errors; keyword
        *overrides* (already typed, snake_case) win over both.

        Raises :class:`ConfigError` naming the file, the line and the nearest valid key for a
        key trioha does not know, and naming the value for one it cannot parse.
        """
        entries = _read_entries(path, settings)
        fixed_paths = {key: (where, raw) for where, key, raw in entries if key in FIXED_STORE_PATHS}
        values = _entry_values(
            [e for e in entries if e[1] not in FIXED_STORE_PATHS],
            attrs.fields(cls),
            BROKER_IGNORED_KEYS,
        )
        fields = {f.name: f for f in attrs.fields(cls)}
        if values.get("tls_config_file"):
            values.update(_tls_file_values(Path(values["tls_config_file"]), fields))
        values.update(overrides)
        try:
            config = cls(**values)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{path or '--set'}: {exc}") from None
        for key, (where, raw) in fixed_paths.items():
            expected = config.store_root / FIXED_STORE_PATHS[key]
            if Path(raw).expanduser() != expected:
                raise ConfigError(
                    f"{where}: {key}={raw} cannot be honoured: trioha keeps it at {expected} "
                    "(under storePathRootDir); remove the line or point it there"
                )
        return config


#: ``NamesrvStartup``: ``mqnamesrv`` listens on 9876 (``NettyServerConfig`` says 8888).
DEFAULT_NAMESRV_PORT = 9876


@attrs.frozen(kw_only=True, field_transformer=settings_readers)
class NamesrvConfig(RemotingServerConfig):
    """A name server's settings: the ``NamesrvConfig`` and ``NettyServerConfig`` keys of a
    RocketMQ ``namesrv.properties`` that trioha honours (``mqnamesrv -c``, docs/rocketmq-protocol.md
    §18.1), in snake_case.

    The idle timeout, connection cap and frame deadline are :class:`RemotingServerConfig`'s,
    as on the broker port, but a name server has its own: an embedded one does not take its
    broker's. Keys RocketMQ knows and trioha has no use for (thread pools, ``rocketmqHome``,
    ...) are accepted and logged (:data:`IGNORED_NAMESRV_KEYS` says why each).
    """

    #: trioha's own: the address to listen on (RocketMQ binds every address).
    listen_host: str = "127.0.0.1"
    #: ``NettyServerConfig.listenPort`` (0: any free port).
    listen_port: int = attrs.field(default=DEFAULT_NAMESRV_PORT, validator=_port)
    #: ``NamesrvConfig.orderMessageEnable``: a route carries the topic's entry of the
    #: ``ORDER_TOPIC_CONFIG`` KV namespace as ``orderTopicConf``.
    order_message_enable: bool = False

    @classmethod
    def from_properties(
        cls,
        path: str | Path | None,
        *,
        settings: Sequence[tuple[str, str]] = (),
        **overrides: Any,
    ) -> NamesrvConfig:
        """Read a RocketMQ ``namesrv.properties``, then *settings* (``--set``), then typed
        *overrides*, with the reader and the errors of :meth:`BrokerConfig.from_properties`."""
        values = _entry_values(
            _read_entries(path, settings), attrs.fields(cls), IGNORED_NAMESRV_KEYS
        )
        values.update(overrides)
        try:
            return cls(**values)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{path or '--set'}: {exc}") from None


#: Why a RocketMQ key is accepted and ignored, when nothing more specific is said.
NO_USE = "a RocketMQ setting trioha has no use for"


def _read_entries(
    path: str | Path | None, settings: Sequence[tuple[str, str]]
) -> list[tuple[str, str, str]]:
    """``(where, key, raw value)`` of a properties file's entries, then of *settings*
    (``--set key=value``); *where* names the file and line, or the ``--set``."""
    entries: list[tuple[str, str, str]] = []
    if path is not None:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
        try:
            entries = [(f"{path}:{n}", k, v) for n, k, v in _parse_properties(text)]
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    entries += [(f"--set {key}={raw}", key.strip(), raw.strip()) for key, raw in settings]
    return entries


def _entry_values(
    entries: Sequence[tuple[str, str, str]],
    fields: Sequence[attrs.Attribute[Any]],
    ignored: dict[str, str],
) -> dict[str, Any]:
    """The typed field values *entries* set (the last one of a key wins).

    A key in *ignored* is logged at INFO with the reason it maps to; any other key that names
    no field is a :class:`ConfigError` naming where it was and the nearest valid key.
    """
    by_name = {f.name: f for f in fields}
    values: dict[str, Any] = {}
    for where, key, raw in entries:
        if key in ignored and _field_name(key) not in by_name:
            log.info("%s: %s is %s", where, key, ignored[key])
            continue
        name, value = _read_setting(by_name, key, raw, where, ignored)
        values[name] = value
    return values


def _field_name(key: str) -> str:
    """The field a RocketMQ key names: ``tls.server.mode`` -> ``tls_server_mode``."""
    return _snake(LEGACY_KEYS.get(key, key).replace(".", "_"))


def _read_setting(
    by_name: Mapping[str, attrs.Attribute[Any]],
    key: str,
    raw: str,
    where: str,
    ignored: Mapping[str, str],
) -> tuple[str, Any]:
    name = _field_name(key)
    field = by_name.get(name)
    if field is None:
        if key in ignored:
            raise ConfigError(f"{where}: {key} is {ignored[key]}")
        raise ConfigError(f"{where}: unknown key {key!r}{_nearest(key, by_name)}")
    return name, _convert(field, raw, where, key)


def _tls_file_values(path: Path, fields: dict[str, Any]) -> dict[str, Any]:
    """The settings of a ``tls.config.file`` (``TlsSystemConfig``): only ``tls.*`` keys."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read tls.config.file {path}: {exc.strerror or exc}") from None
    values: dict[str, Any] = {}
    for lineno, key, raw in _parse_properties(text):
        name = _snake(key.replace(".", "_"))
        where = f"{path}:{lineno}"
        if key in {"tls.server.mode", "tls.enable", "tls.config.file"} or name not in fields:
            if key in IGNORED_ROCKETMQ_KEYS:
                continue
            raise ConfigError(f"{where}: {key!r} cannot be set in a tls.config.file")
        values[name] = _convert(fields[name], raw, where, key)
    return values


# RocketMQ's older spellings, still accepted by its config loader and found in old files.
LEGACY_KEYS = {"mapedFileSizeCommitLog": "mappedFileSizeCommitLog"}

# Store paths RocketMQ derives from storePathRootDir (StorePathConfigHelper) and some files set
# explicitly: accepted when they name that same place, refused otherwise (never ignored).
FIXED_STORE_PATHS = {
    "storePathConsumeQueue": "consumequeue",
    "storePathIndex": "index",
    "storeCheckpoint": "checkpoint",
    "abortFile": "abort",
}

# RocketMQ settings a real broker.conf commonly carries that trioha accepts and ignores.
IGNORED_ROCKETMQ_KEYS = frozenset(
    {
        "brokerIP2",
        "mapedFileSizeConsumeQueue",
        "mappedFileSizeConsumeQueue",
        "sendMessageThreadPoolNums",
        "pullMessageThreadPoolNums",
        "useReentrantLockWhenPutMessage",
        "waitTimeMillsInSendQueue",
        "transientStorePoolEnable",
        "enableDLegerCommitLog",
        "autoCreateSubscriptionGroup",
        "traceTopicEnable",
        "slaveReadEnable",
        "brokerPermission",
        "defaultQueryMaxNum",
        "duplicationEnable",
        "offsetCheckInSlave",
        "tls.test.mode.enable",  # trioha never makes a throwaway certificate
    }
)

# ``NettyServerConfig`` settings of Netty's threads, buffers and allocator: valid in a
# broker.conf and a namesrv.properties; trioha runs a task per request and leaves buffers to the
# OS.
IGNORED_NETTY_SERVER_KEYS = frozenset(
    {
        "serverWorkerThreads",
        "serverCallbackExecutorThreads",
        "serverSelectorThreads",
        "serverOnewaySemaphoreValue",
        "serverAsyncSemaphoreValue",
        "serverSocketSndBufSize",
        "serverSocketRcvBufSize",
        "writeBufferHighWaterMark",
        "writeBufferLowWaterMark",
        "serverSocketBacklog",
        "serverPooledByteBufAllocatorEnable",
        "useEpollNativeSelector",
    }
)

#: Retention settings of RocketMQ's that guard against a file still in use: a segment
#: trioha deletes while a reader holds part of it stays mapped until the reader lets go, so
#: nothing waits or retries (docs/storage.md).
IGNORED_RETENTION_KEYS = {
    "destroyMapedFileIntervalForcibly": (
        "how long RocketMQ waits for readers of a deleted file; trioha deletes at once and a "
        "reader keeps its mapping until it is done"
    ),
    "redeleteHangedFileInterval": (
        "how often RocketMQ retries deleting a file readers held; trioha's deletion never "
        "waits for readers"
    ),
}

#: A broker.conf's keys trioha accepts and ignores, and why.
BROKER_IGNORED_KEYS: dict[str, str] = {
    **dict.fromkeys(IGNORED_ROCKETMQ_KEYS | IGNORED_NETTY_SERVER_KEYS, NO_USE),
    **IGNORED_RETENTION_KEYS,
}

# ``NamesrvConfig`` keys a trioha name server accepts and ignores, and why.
IGNORED_NAMESRV_KEYS: dict[str, str] = {
    "rocketmqHome": "where RocketMQ finds its logging configuration; trioha logs to stderr",
    "kvConfigPath": (
        "where RocketMQ keeps KV config; a trioha name server keeps it in memory only (empty "
        "after a restart)"
    ),
    "configStorePath": "where RocketMQ writes UPDATE_NAMESRV_CONFIG changes; trioha has none",
    "productEnvName": NO_USE,
    "clusterTest": NO_USE,
    **dict.fromkeys(IGNORED_NETTY_SERVER_KEYS, NO_USE),
}


_WHITESPACE = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _parse_properties(text: str) -> list[tuple[int, str, str]]:
    """``(line, key, value)`` of each entry, read as ``java.util.Properties.load`` reads them.

    * a line whose first non-blank character is ``#`` or ``!`` is a comment;
    * a line ending in an odd number of backslashes continues on the next line, whose leading
      blanks are dropped (a comment character there is data, not a comment);
    * the key ends at the first unescaped ``=``, ``:`` or blank; blanks around the separator
      are skipped, and a key alone has the empty value;
    * ``\\t \\n \\r \\f``, ``\\uXXXX`` and ``\\`` before any other character (``\\=``,
      ``\\:``, ``\\ ``, ``\\\\``) are unescaped in keys and values alike.

    Values also lose trailing blanks (Java keeps them, and then RocketMQ fails to parse
    ``"10911 "`` as a number). The line number is where the entry starts.
    """
    return [
        (start + 1, key, value.rstrip(_WHITESPACE))
        for start, _end, key, value in _entries(re.split(r"\r\n|\r|\n", text))
    ]


#: ``(line, key, value)`` of each entry of a ``.properties`` text (``Properties.load``).
parse_properties = _parse_properties


def _entries(lines: Sequence[str]) -> Iterator[tuple[int, int, str, str]]:
    """``(first, end, key, value)`` of each entry of *lines* (``lines[first:end]`` hold it,
    continuations included), as :func:`_parse_properties` reads them; values untrimmed."""
    i = 0
    while i < len(lines):
        start = i
        line = lines[i].lstrip(_WHITESPACE)
        i += 1
        if not line or line[0] in "#!":
            continue
        while _continues(line) and i < len(lines):
            line = line[:-1] + lines[i].lstrip(_WHITESPACE)
            i += 1
        if _continues(line):
            line = line[:-1]  # a continuation at the end of the file continues into nothing
        key, value = _split_entry(line, start + 1)
        yield start, i, key, value


def rewrite_properties(text: str, settings: Mapping[str, str]) -> str:
    """*text* (a ``broker.conf``) with each key of *settings* set to its value.

    The first entry of a key is replaced in place and any later one removed (the last one
    would win when the file is read); a key the file lacks is appended. Every other line,
    comments and blank lines included, is kept as it was.
    """
    # Each line with its end (the line ends _parse_properties splits on), kept as it was.
    lines = re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z", text)
    remaining = dict(settings)
    replaced: dict[int, str] = {}
    dropped: set[int] = set()
    for start, end, key, _value in _entries([line.rstrip("\r\n") for line in lines]):
        if key not in settings:
            continue
        dropped.update(range(start, end))
        if key in remaining:
            replaced[start] = f"{key}={_escape(remaining.pop(key))}\n"
    out = [
        replaced.get(i, line) for i, line in enumerate(lines) if i in replaced or i not in dropped
    ]
    if out and not out[-1].endswith("\n"):
        out[-1] += "\n"
    out += [f"{key}={_escape(value)}\n" for key, value in remaining.items()]
    return "".join(out)


def _escape(value: str) -> str:
    """A value as ``Properties.store`` writes it: backslashes, line ends and a leading blank
    escaped, so :func:`_parse_properties` reads back exactly *value*."""
    out = value.replace("\\", "\\\\")
    for char, escape in (("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r"), ("\f", "\\f")):
        out = out.replace(char, escape)
    return "\\" + out if out[:1] == " " else out


def _continues(line: str) -> bool:
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _split_entry(line: str, lineno: int) -> tuple[str, str]:
    """Split a logical line into its key and value, unescaping both."""
    pos = 0
    while pos < len(line) and line[pos] not in "=:" + _WHITESPACE:
        pos += 2 if line[pos] == "\\" else 1
    key_end = min(pos, len(line))
    while pos < len(line) and line[pos] in _WHITESPACE:
        pos += 1
    if pos < len(line) and line[pos] in "=:":
        pos += 1
        while pos < len(line) and line[pos] in _WHITESPACE:
            pos += 1
    return _unescape(line[:key_end], lineno), _unescape(line[pos:], lineno)


def _unescape(text: str, lineno: int) -> str:
    if "\\" not in text:
        return text
    out = []
    pos = 0
    while pos < len(text):
        char = text[pos]
        pos += 1
        if char != "\\" or pos >= len(text):
            out.append(char)
            continue
        char = text[pos]
        pos += 1
        if char == "u":
            digits = text[pos : pos + 4]
            if len(digits) < 4 or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise ConfigError(
                    f"line {lineno}: malformed \\uxxxx escape {text[pos - 2 : pos + 4]!r}"
                )
            out.append(chr(int(digits, 16)))
            pos += 4
        else:
            out.append(_ESCAPES.get(char, char))
    return "".join(out)


def _snake(key: str) -> str:
    """``haSendHeartbeatInterval`` -> ``ha_send_heartbeat_interval``; ``checkCRCOnRecover`` ->
    ``check_crc_on_recover`` (a run of capitals is one word)."""
    key = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", key)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key).lower()


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


#: Fields whose RocketMQ key keeps an acronym in capitals (:func:`_snake` reads both back).
_JAVA_KEYS = {"broker_ip1": "brokerIP1", "check_crc_on_recover": "checkCRCOnRecover"}


def java_key(name: str) -> str:
    """The RocketMQ (camelCase) key of the field *name*: ``broker_ip1`` -> ``brokerIP1``."""
    return _JAVA_KEYS.get(name) or _camel(name)


def config_properties(config: Any) -> dict[str, str]:
    """``MixAll.object2Properties`` of an attrs config: every field that is set, by its
    RocketMQ key, as text (what GET_BROKER_CONFIG and GET_NAMESRV_CONFIG answer)."""
    out: dict[str, str] = {}
    for field in attrs.fields(type(config)):
        value = getattr(config, field.name)
        if value is None:
            continue
        if isinstance(value, bool):
            out[java_key(field.name)] = "true" if value else "false"
        elif isinstance(value, enum.Enum):
            out[java_key(field.name)] = str(value.value)
        else:
            out[java_key(field.name)] = str(value)
    return out


def read_setting(cls: type, key: str, raw: str, *, where: str) -> tuple[str, Any]:
    """The field and typed value one ``key=value`` of a broker.conf sets (*cls*:
    :class:`BrokerConfig`), read as :meth:`BrokerConfig.from_properties` reads a line.

    Raises :class:`ConfigError` naming *where* for an unknown key (and the nearest valid
    one), for a RocketMQ key trioha has no use for, and for a value it cannot parse.
    """
    by_name = {f.name: f for f in attrs.fields(cls)}
    return _read_setting(by_name, key, raw, where, BROKER_IGNORED_KEYS)


def _nearest(key: str, fields: Mapping[str, Any]) -> str:
    candidates = [java_key(name) for name in fields]
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _convert(field: attrs.Attribute[Any], raw: str, where: str, key: str) -> Any:
    """*raw* read by the field's own reader (:func:`settings_readers`)."""
    try:
        return field.metadata["read"](raw)
    except ValueError as exc:
        raise ConfigError(f"{where}: {key}={raw!r} is not valid: {exc}") from None
