"""The broker's metadata: topics, consumer offsets, subscription groups, delay offsets.

Mirrors RocketMQ's ``ConfigManager`` family (``TopicConfigManager``,
``ConsumerOffsetManager``, ``SubscriptionGroupManager``, ``ScheduleMessageService``'s offset
table) and their files under ``<root>/config/`` (docs/rocketmq-protocol.md §4.5)::

    topics.json             {"dataVersion":{..},"topicConfigTable":{name: TopicConfig}}
    consumerOffset.json     {"offsetTable":{"topic@group":{queueId: offset}}}
    subscriptionGroup.json  {"dataVersion":{..},"subscriptionGroupTable":{group: config}}
    delayOffset.json        {"offsetTable":{level: offset}}

Files are written as ``MixAll.string2File`` does (a ``.tmp`` file, the previous version kept as
``.bak``, then a rename) and read with a fall-back to ``.bak``; a Java broker's files (fastjson,
unquoted integer keys) are read too. The merge rules a slave applies to what its master sends
(``SlaveSynchronize``, docs/rocketmq-protocol.md §6.1) live here, next to the tables they change.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from trioha._config import BrokerConfig
from trioha._errors import ConfigError
from trioha.remoting import (
    AUTO_CREATE_TOPIC,
    PERM_INHERIT,
    PERM_READ,
    PERM_WRITE,
    DataVersion,
    dumps,
    loads_lenient,
)

log = logging.getLogger("trioha.broker.metadata")

#: ``MixAll.RETRY_GROUP_TOPIC_PREFIX`` and ``DLQ_GROUP_TOPIC_PREFIX``.
RETRY_TOPIC_PREFIX = "%RETRY%"
DLQ_TOPIC_PREFIX = "%DLQ%"
#: ``TopicValidator.RMQ_SYS_SELF_TEST_TOPIC`` and ``OFFSET_MOVED_EVENT``.
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
#: ``TopicValidator.RMQ_SYS_BENCHMARK_TOPIC`` (1024 queues, for ``mqadmin`` benchmarks).
BENCHMARK_TOPIC = "BenchmarkTest"
#: ``TopicValidator.RMQ_SYS_SCHEDULE_TOPIC``: delayed messages wait here, a queue per level.
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
#: ``TopicConfigManager.SCHEDULE_TOPIC_QUEUE_NUM``.
SCHEDULE_TOPIC_QUEUE_NUM = 18
#: ``MixAll.REPLY_TOPIC_POSTFIX``: ``<cluster>_REPLY_TOPIC`` carries request-reply answers.
REPLY_TOPIC_POSTFIX = "REPLY_TOPIC"

#: ``SubscriptionGroupManager.init``: the groups every RocketMQ broker has, by name, and
#: whether the group consumes broadcast (all of them do with RocketMQ's defaults). The admin
#: tools consume as ``TOOLS_CONSUMER``; ``CID_ONS*`` are Alibaba Cloud's ONS groups.
BUILT_IN_GROUPS = (
    "TOOLS_CONSUMER",
    "FILTERSRV_CONSUMER",
    "SELF_TEST_C_GROUP",
    "CID_ONS-HTTP-PROXY",
    "CID_ONSAPI_PULL",
    "CID_ONSAPI_PERMISSION",
    "CID_ONSAPI_OWNER",
)


def reply_topic(cluster: str) -> str:
    """``MixAll.getReplyTopic``: the cluster's request-reply topic."""
    return f"{cluster}_{REPLY_TOPIC_POSTFIX}"


# --- files ---------------------------------------------------------------------------------


def write_config_file(path: Path, text: str) -> None:
    """``MixAll.string2File``: write ``.tmp``, keep the old file as ``.bak``, rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    if path.exists():
        bak = path.with_name(path.name + ".bak")
        bak.write_bytes(path.read_bytes())
    os.replace(tmp, path)


def write_snapshots(snapshots: Iterable[tuple[Path, str]]) -> None:
    for path, text in snapshots:
        write_config_file(path, text)


def read_config_file(path: Path) -> Any | None:
    """The parsed JSON of ``path`` (or its ``.bak``), None if neither exists.

    Mirrors ``ConfigManager.load``/``loadBak``. A file that exists but cannot be parsed, with
    no usable ``.bak``, raises :class:`ConfigError` naming it: starting with an empty table
    instead would silently rewind every consumer.
    """
    errors = []
    for candidate in (path, path.with_name(path.name + ".bak")):
        try:
            text = candidate.read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError) as exc:
            errors.append(f"{candidate}: {exc}")
            continue
        if not text.strip():
            continue  # RocketMQ treats an empty file as absent
        try:
            value = loads_lenient(text)
        except ValueError as exc:
            errors.append(f"{candidate}: not JSON ({exc})")
            log.error("config file %s is not JSON (%s); trying the backup", candidate, exc)
            continue
        if not isinstance(value, dict):
            errors.append(f"{candidate}: not a JSON object")
            continue
        return value
    if errors:
        raise ConfigError("cannot load " + "; ".join(errors))
    return None


# --- values --------------------------------------------------------------------------------


@attrs.frozen
class TopicConfig:
    """``TopicConfig``: queues and permission of one topic."""

    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "order": self.order,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicFilterType": self.topic_filter_type,
            "topicName": self.topic_name,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }

    @classmethod
    def from_json(cls, name: str, value: Mapping[str, Any]) -> TopicConfig:
        return cls(
            topic_name=str(value.get("topicName", name)),
            read_queue_nums=int(value.get("readQueueNums", 16)),
            write_queue_nums=int(value.get("writeQueueNums", 16)),
            perm=int(value.get("perm", PERM_READ | PERM_WRITE)),
            topic_filter_type=str(value.get("topicFilterType", "SINGLE_TAG")),
            topic_sys_flag=int(value.get("topicSysFlag", 0)),
            order=bool(value.get("order", False)),
        )

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writeable(self) -> bool:
        return bool(self.perm & PERM_WRITE)


@attrs.frozen
class SubscriptionGroupConfig:
    """``SubscriptionGroupConfig`` with RocketMQ's defaults."""

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "brokerId": self.broker_id,
            "consumeBroadcastEnable": self.consume_broadcast_enable,
            "consumeEnable": self.consume_enable,
            "consumeFromMinEnable": self.consume_from_min_enable,
            "groupName": self.group_name,
            "notifyConsumerIdsChangedEnable": self.notify_consumer_ids_changed_enable,
            "retryMaxTimes": self.retry_max_times,
            "retryQueueNums": self.retry_queue_nums,
            "whichBrokerWhenConsumeSlowly": self.which_broker_when_consume_slowly,
        }

    @classmethod
    def from_json(cls, name: str, value: Mapping[str, Any]) -> SubscriptionGroupConfig:
        return cls(
            group_name=str(value.get("groupName", name)),
            consume_enable=bool(value.get("consumeEnable", True)),
            consume_from_min_enable=bool(value.get("consumeFromMinEnable", True)),
            consume_broadcast_enable=bool(value.get("consumeBroadcastEnable", True)),
            retry_queue_nums=int(value.get("retryQueueNums", 1)),
            retry_max_times=int(value.get("retryMaxTimes", 16)),
            broker_id=int(value.get("brokerId", 0)),
            which_broker_when_consume_slowly=int(value.get("whichBrokerWhenConsumeSlowly", 1)),
            notify_consumer_ids_changed_enable=bool(
                value.get("notifyConsumerIdsChangedEnable", True)
            ),
        )


# --- managers ------------------------------------------------------------------------------


class _ConfigFile:
    """A table persisted to one JSON file; ``dirty`` until :meth:`persist`."""

    file_name = ""

    def __init__(self, config_dir: Path) -> None:
        self.path = config_dir / self.file_name
        self.dirty = False
        self._write_failed = False

    def encode(self) -> str:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def persist(self) -> None:
        """Write the file now; a disk that refuses (ENOSPC, EIO) leaves the table dirty for
        the broker's persister to retry, and is logged once per failure spell."""
        try:
            write_config_file(self.path, self.encode_pretty())
        except OSError as exc:
            self.dirty = True
            if not self._write_failed:
                self._write_failed = True
                log.error(
                    "cannot write %s: %s; kept in memory, written when the disk allows",
                    self.path,
                    exc,
                )
            return
        self._write_failed = False
        self.dirty = False

    def persist_if_dirty(self) -> None:
        if self.dirty:
            self.persist()

    def snapshot(self) -> tuple[Path, str]:
        """The file's new text, taken now (in the event loop) to be written elsewhere."""
        self.dirty = False
        return self.path, self.encode_pretty()

    def encode_pretty(self) -> str:
        return dumps(loads_lenient(self.encode()), pretty=True)


class TopicConfigManager(_ConfigFile):
    """``TopicConfigManager``: the topic table, auto-creation and its data version."""

    file_name = "topics.json"

    def __init__(self, config_dir: Path, broker: BrokerConfig) -> None:
        super().__init__(config_dir)
        self.broker = broker
        self.table: dict[str, TopicConfig] = {}
        self.data_version = DataVersion.new()
        for topic in self._system_topics():
            self.table[topic.topic_name] = topic
        loaded = read_config_file(self.path)
        if loaded is not None:
            self._adopt(loaded, source=str(self.path))

    def _system_topics(self) -> list[TopicConfig]:
        """The topics a RocketMQ 4.9.7 broker creates for itself (``TopicConfigManager()``).

        All of them, so that a Java slave, which replaces its topic table with its master's,
        keeps the ones it would have had with a Java master. The trace topic is not among
        them: RocketMQ creates it only with ``traceTopicEnable``, which trioha ignores.
        """
        cluster = self.broker.broker_cluster_name
        topics = [
            TopicConfig(SELF_TEST_TOPIC, 1, 1),
            TopicConfig(OFFSET_MOVED_EVENT, 1, 1),
            TopicConfig(BENCHMARK_TOPIC, 1024, 1024),
            TopicConfig(SCHEDULE_TOPIC, SCHEDULE_TOPIC_QUEUE_NUM, SCHEDULE_TOPIC_QUEUE_NUM),
            TopicConfig(reply_topic(cluster), 1, 1),
            TopicConfig(cluster, 16, 16, PERM_READ | PERM_WRITE | PERM_INHERIT),
            TopicConfig(self.broker.broker_name, 1, 1, PERM_READ | PERM_WRITE | PERM_INHERIT),
        ]
        if self.broker.auto_create_topic_enable:
            queues = self.broker.default_topic_queue_nums
            topics.append(
                TopicConfig(
                    AUTO_CREATE_TOPIC, queues, queues, PERM_READ | PERM_WRITE | PERM_INHERIT
                )
            )
        return topics

    def _adopt(self, value: Mapping[str, Any], *, source: str) -> None:
        table = value.get("topicConfigTable")
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: no topicConfigTable object")
        for name, item in table.items():
            if isinstance(item, dict):
                self.table[str(name)] = TopicConfig.from_json(str(name), item)
        self.data_version = DataVersion.from_json(value.get("dataVersion"))

    def select(self, topic: str) -> TopicConfig | None:
        return self.table.get(topic)

    def update(self, config: TopicConfig) -> None:
        """``updateTopicConfig``: replace, bump the version, persist."""
        self.table[config.topic_name] = config
        self.data_version = self.data_version.next()
        self.persist()

    def delete(self, topic: str) -> TopicConfig | None:
        """``deleteTopicConfig``: remove, bump the version, persist; the removed config."""
        removed = self.table.pop(topic, None)
        if removed is not None:
            self.data_version = self.data_version.next()
            log.info("deleted topic %s: %s", topic, removed)
            self.persist()
        return removed

    def create_in_send(
        self, topic: str, default_topic: str, client_queue_nums: int, topic_sys_flag: int = 0
    ) -> TopicConfig | None:
        """``createTopicInSendMessageMethod``: a new topic shaped like ``default_topic``.

        Only when the template's permission has the INHERIT bit (TBW102 has it when
        ``auto_create_topic_enable`` is on). Returns None when the topic cannot be created.
        """
        existing = self.table.get(topic)
        if existing is not None:
            return existing
        template = self.table.get(default_topic)
        if template is None or not template.perm & PERM_INHERIT:
            return None
        if default_topic == AUTO_CREATE_TOPIC and not self.broker.auto_create_topic_enable:
            return None
        queues = max(1, min(client_queue_nums, template.write_queue_nums))
        config = TopicConfig(
            topic,
            read_queue_nums=queues,
            write_queue_nums=queues,
            perm=template.perm & ~PERM_INHERIT,
            topic_sys_flag=topic_sys_flag,
        )
        log.info("auto-created topic %s from %s: %s", topic, default_topic, config)
        self.update(config)
        return config

    def create_in_send_back(self, topic: str, queue_nums: int, perm: int) -> TopicConfig:
        """``createTopicInSendMessageBackMethod``: the retry and dead-letter topics."""
        existing = self.table.get(topic)
        if existing is not None:
            return existing
        config = TopicConfig(topic, queue_nums, queue_nums, perm)
        log.info("created topic %s: %s", topic, config)
        self.update(config)
        return config

    def wrapper(self) -> dict[str, Any]:
        """``TopicConfigSerializeWrapper`` (GET_ALL_TOPIC_CONFIG, REGISTER_BROKER bodies)."""
        return {
            "dataVersion": self.data_version.to_json(),
            "topicConfigTable": {name: c.to_json() for name, c in sorted(self.table.items())},
        }

    def encode(self) -> str:
        return dumps(self.wrapper())

    def adopt_from_master(self, value: Mapping[str, Any]) -> bool:
        """``SlaveSynchronize.syncTopicConfig``: take the master's table if its version differs.

        RocketMQ 4.x clears and replaces the table and adopts the master's data version;
        trioha does the same (the slave's topics are the master's). Returns True on change.
        """
        version = DataVersion.from_json(value.get("dataVersion"))
        if version == self.data_version:
            return False
        table = value.get("topicConfigTable")
        if not isinstance(table, dict):
            raise ValueError("the master's topic config has no topicConfigTable object")
        self.table = {
            str(name): TopicConfig.from_json(str(name), item)
            for name, item in table.items()
            if isinstance(item, dict)
        }
        self.data_version = version
        self.persist()
        return True


class ConsumerOffsetManager(_ConfigFile):
    """``ConsumerOffsetManager``: committed offsets per ``topic@group`` and queue."""

    file_name = "consumerOffset.json"

    def __init__(self, config_dir: Path) -> None:
        super().__init__(config_dir)
        self.table: dict[str, dict[int, int]] = {}
        loaded = read_config_file(self.path)
        if loaded is not None:
            self.table = _offset_table(loaded, source=str(self.path))

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """``commitOffset``: the client's offset, as it says (it may move backwards)."""
        self.table.setdefault(f"{topic}@{group}", {})[queue_id] = offset
        self.dirty = True

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """``queryOffset``: the committed offset or -1."""
        return self.table.get(f"{topic}@{group}", {}).get(queue_id, -1)

    def remove_group(self, group: str) -> int:
        """``removeOffset``: forget every offset of *group*; how many topics it had."""
        keys = [key for key in self.table if key.split("@", 1)[1] == group]
        for key in keys:
            del self.table[key]
        if keys:
            self.dirty = True
            log.info("removed the offsets of group %s on %d topics", group, len(keys))
        return len(keys)

    def groups_of(self, topic: str) -> set[str]:
        return {key.split("@", 1)[1] for key in self.table if key.split("@", 1)[0] == topic}

    def topics_of(self, group: str) -> set[str]:
        """``whichTopicByConsumer``: the topics ``group`` has committed offsets for."""
        return {key.split("@", 1)[0] for key in self.table if key.split("@", 1)[1] == group}

    def encode(self) -> str:
        return dumps(
            {
                "offsetTable": {
                    key: {str(q): o for q, o in sorted(queues.items())}
                    for key, queues in sorted(self.table.items())
                }
            }
        )

    def merge_from_master(self, value: Mapping[str, Any]) -> int:
        """``SlaveSynchronize.syncConsumerOffset``, without RocketMQ #1094.

        RocketMQ's slave ``putAll``s the master's table, so after a master restart with
        stale offsets the slave's newer ones are overwritten and consumers re-consume.
        trioha keeps, per queue, the larger of the two offsets: a committed consumer offset
        only moves forward on the slave. (An administrative rewind on the master is
        therefore not copied to the slave.) Returns the number of queues changed.
        """
        incoming = _offset_table(value, source="the master's consumer offsets")
        changed = 0
        for key, queues in incoming.items():
            local = self.table.setdefault(key, {})
            for queue_id, offset in queues.items():
                if offset > local.get(queue_id, -1):
                    local[queue_id] = offset
                    changed += 1
        if changed:
            self.dirty = True
        return changed


def _offset_table(value: Mapping[str, Any], *, source: str) -> dict[str, dict[int, int]]:
    table = value.get("offsetTable")
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: offsetTable is not an object")
    out: dict[str, dict[int, int]] = {}
    for key, queues in table.items():
        if not isinstance(queues, dict) or "@" not in str(key):
            log.warning("%s: ignoring malformed offset entry %r", source, key)
            continue
        try:
            out[str(key)] = {int(q): int(o) for q, o in queues.items()}
        except (TypeError, ValueError):
            log.warning("%s: ignoring malformed offsets of %r", source, key)
    return out


class SubscriptionGroupManager(_ConfigFile):
    """``SubscriptionGroupManager``: consumer group settings, created on first use."""

    file_name = "subscriptionGroup.json"

    def __init__(self, config_dir: Path, *, auto_create: bool = True) -> None:
        super().__init__(config_dir)
        self.auto_create = auto_create
        #: The built-in groups first, then the file's (which win), as ``init()`` + ``load()``.
        self.table: dict[str, SubscriptionGroupConfig] = {
            name: SubscriptionGroupConfig(name) for name in BUILT_IN_GROUPS
        }
        self.data_version = DataVersion.new()
        loaded = read_config_file(self.path)
        if loaded is not None:
            table = loaded.get("subscriptionGroupTable")
            if not isinstance(table, dict):
                raise ConfigError(f"{self.path}: no subscriptionGroupTable object")
            self.table.update(
                (str(name), SubscriptionGroupConfig.from_json(str(name), item))
                for name, item in table.items()
                if isinstance(item, dict)
            )
            self.data_version = DataVersion.from_json(loaded.get("dataVersion"))

    def find(self, group: str) -> SubscriptionGroupConfig | None:
        """``findSubscriptionGroupConfig``: created with defaults if auto-creation is on."""
        config = self.table.get(group)
        if config is None and self.auto_create:
            config = self.table[group] = SubscriptionGroupConfig(group)
            self.data_version = self.data_version.next()
            log.info("auto-created subscription group %s", group)
            self.persist()
        return config

    def update(self, config: SubscriptionGroupConfig) -> None:
        """``updateSubscriptionGroupConfig``: replace, bump the version, persist."""
        old = self.table.get(config.group_name)
        self.table[config.group_name] = config
        self.data_version = self.data_version.next()
        verb = "updated" if old else "created"
        log.info("%s subscription group %s: %s", verb, config.group_name, config)
        self.persist()

    def delete(self, group: str) -> SubscriptionGroupConfig | None:
        """``deleteSubscriptionGroupConfig``: remove, bump the version, persist; the removed
        config (None: there was none, and nothing changes)."""
        removed = self.table.pop(group, None)
        if removed is not None:
            self.data_version = self.data_version.next()
            log.info("deleted subscription group %s: %s", group, removed)
            self.persist()
        return removed

    def wrapper(self) -> dict[str, Any]:
        return {
            "dataVersion": self.data_version.to_json(),
            "subscriptionGroupTable": {n: c.to_json() for n, c in sorted(self.table.items())},
        }

    def encode(self) -> str:
        return dumps(self.wrapper())

    def adopt_from_master(self, value: Mapping[str, Any]) -> bool:
        """``syncSubscriptionGroupConfig``: replace the table if the version differs."""
        version = DataVersion.from_json(value.get("dataVersion"))
        if version == self.data_version:
            return False
        table = value.get("subscriptionGroupTable")
        if not isinstance(table, dict):
            raise ValueError("the master's subscription groups have no subscriptionGroupTable")
        self.table = {
            str(name): SubscriptionGroupConfig.from_json(str(name), item)
            for name, item in table.items()
            if isinstance(item, dict)
        }
        self.data_version = version
        self.persist()
        return True


class DelayOffsets(_ConfigFile):
    """``ScheduleMessageService``'s offset table: per delay level, the next queue offset of
    ``SCHEDULE_TOPIC_XXXX`` to deliver.

    Written as RocketMQ writes it (fastjson, unquoted integer keys): compact on the wire
    (GET_ALL_DELAY_OFFSET) and pretty in the file. A slave stores its master's text verbatim
    (``syncDelayOffset``), so a Java master's file round-trips unchanged.
    """

    file_name = "delayOffset.json"

    def __init__(self, config_dir: Path) -> None:
        super().__init__(config_dir)
        self.table: dict[int, int] = {}
        loaded = read_config_file(self.path)
        if loaded is not None:
            self.table = _delay_table(loaded, source=str(self.path))
        self.text = self._pretty()

    def offset(self, level: int) -> int:
        """The next queue offset to deliver at ``level`` (0 when absent)."""
        return self.table.get(level, 0)

    def set_offset(self, level: int, offset: int) -> None:
        """``updateOffset``: delivered up to ``offset`` (persisted by the next flush)."""
        self.table[level] = offset
        self.text = self._pretty()
        self.dirty = True

    def _entries(self) -> str:
        return ",".join(f"{level}:{offset}" for level, offset in sorted(self.table.items()))

    def encode(self) -> str:
        """``ScheduleMessageService.encode()``: ``{"offsetTable":{1:7,3:12}}``."""
        return '{"offsetTable":{' + self._entries() + "}}"

    def _pretty(self) -> str:
        """fastjson's pretty form: ``{\\n\\t"offsetTable":{1:7,3:12\\n\\t}\\n}``."""
        if not self.table:
            return '{\n\t"offsetTable":{}\n}'
        return '{\n\t"offsetTable":{' + self._entries() + "\n\t}\n}"

    def encode_pretty(self) -> str:
        return self.text

    def adopt_from_master(self, text: str) -> bool:
        """Validate (leniently) and store the master's text as it is."""
        value = loads_lenient(text)
        if not isinstance(value, dict):
            raise ValueError("the master's delay offsets are not a JSON object")
        if text == self.text:
            return False
        self.table = _delay_table(value, source="the master's delay offsets")
        self.text = text
        self.persist()
        return True


def _delay_table(value: Mapping[str, Any], *, source: str) -> dict[int, int]:
    table = value.get("offsetTable")
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: offsetTable is not an object")
    out: dict[int, int] = {}
    for level, offset in table.items():
        try:
            out[int(level)] = int(offset)
        except (TypeError, ValueError):
            log.warning("%s: ignoring malformed delay offset %r: %r", source, level, offset)
    return out


@attrs.define
class Metadata:
    """Every table of one broker, loaded from ``<root>/config``."""

    topics: TopicConfigManager
    offsets: ConsumerOffsetManager
    groups: SubscriptionGroupManager
    delay: DelayOffsets

    @classmethod
    def load(cls, root: Path, broker: BrokerConfig) -> Metadata:
        config_dir = root / "config"
        return cls(
            topics=TopicConfigManager(config_dir, broker),
            offsets=ConsumerOffsetManager(config_dir),
            groups=SubscriptionGroupManager(config_dir),
            delay=DelayOffsets(config_dir),
        )

    def persist_all(self) -> None:
        for table in self._tables():
            table.persist_if_dirty()

    def dirty_snapshots(self) -> list[tuple[Path, str]]:
        """Texts of the changed tables, for :func:`write_snapshots` in a worker thread."""
        return [table.snapshot() for table in self._tables() if table.dirty]

    def mark_dirty(self, paths: Iterable[Path]) -> None:
        """Mark the tables of *paths* changed again (their snapshot could not be written)."""
        wanted = set(paths)
        for table in self._tables():
            if table.path in wanted:
                table.dirty = True

    def _tables(self) -> Iterable[_ConfigFile]:
        return (self.topics, self.offsets, self.groups, self.delay)
