"""Metadata tables and files (ConfigManager family) and the slave's merge rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from trioha import ConfigError
from trioha._config import BrokerConfig
from trioha.broker._metadata import (
    ConsumerOffsetManager,
    DelayOffsets,
    Metadata,
    SubscriptionGroupManager,
    TopicConfig,
    TopicConfigManager,
    read_config_file,
    write_config_file,
)
from trioha.remoting import AUTO_CREATE_TOPIC, PERM_INHERIT, PERM_READ, PERM_WRITE, loads_lenient

# What a RocketMQ 4.9 master's fastjson writes: integer map keys without quotes
# (docs/rocketmq-protocol.md §6.1).
JAVA_OFFSETS = '{"offsetTable":{"T@G":{0:7,1:12},"%RETRY%G@G":{0:0}}}'


def test_lenient_json_reads_fastjson_integer_keys() -> None:
    assert loads_lenient(JAVA_OFFSETS) == {
        "offsetTable": {"T@G": {"0": 7, "1": 12}, "%RETRY%G@G": {"0": 0}}
    }
    assert loads_lenient('{"brokerAddrs":{0:"a:1",1:"b:2"}}') == {
        "brokerAddrs": {"0": "a:1", "1": "b:2"}
    }
    # A bare-key look-alike inside a string value is left alone.
    assert loads_lenient('{"remark":"{0:1}",2:"x"}') == {"remark": "{0:1}", "2": "x"}
    with pytest.raises(ValueError, match="Expecting"):
        loads_lenient("{0:")


def test_offsets_merge_never_moves_backwards_rocketmq_1094(tmp_path: Path) -> None:
    # The slave took newer commits while the master was down; the restarted master sends
    # its stale table. RocketMQ's putAll would roll the slave back (apache/rocketmq#1094).
    slave = ConsumerOffsetManager(tmp_path)
    slave.commit("G", "T", 0, 10)
    slave.commit("G", "T", 1, 3)
    changed = slave.merge_from_master(loads_lenient(JAVA_OFFSETS))
    assert slave.query("G", "T", 0) == 10  # kept: newer than the master's 7
    assert slave.query("G", "T", 1) == 12  # taken: the master is ahead
    assert slave.query("G", "%RETRY%G", 0) == 0
    assert changed == 2
    assert slave.query("G", "T", 5) == -1


def test_offsets_file_round_trip_and_java_file(tmp_path: Path) -> None:
    offsets = ConsumerOffsetManager(tmp_path)
    offsets.commit("G", "T", 0, 42)
    offsets.persist()
    again = ConsumerOffsetManager(tmp_path)
    assert again.query("G", "T", 0) == 42
    (tmp_path / "consumerOffset.json").write_text(JAVA_OFFSETS)
    java = ConsumerOffsetManager(tmp_path)
    assert java.query("G", "T", 1) == 12


def test_corrupt_file_falls_back_to_bak(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "consumerOffset.json"
    write_config_file(path, '{"offsetTable":{"T@G":{"0":1}}}')
    write_config_file(path, '{"offsetTable":{"T@G":{"0":2}}}')  # the first is now .bak
    path.write_text('{"offsetTable": {"T@G": {0: ')  # torn
    offsets = ConsumerOffsetManager(tmp_path)
    assert offsets.query("G", "T", 0) == 1
    assert "consumerOffset.json is not JSON" in caplog.text


def test_corrupt_file_without_backup_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "topics.json").write_text("garbage")
    with pytest.raises(ConfigError, match=r"topics\.json: not JSON"):
        TopicConfigManager(tmp_path, BrokerConfig())
    assert read_config_file(tmp_path / "absent.json") is None


def test_auto_create_from_tbw102(tmp_path: Path) -> None:
    topics = TopicConfigManager(tmp_path, BrokerConfig(default_topic_queue_nums=8))
    template = topics.select(AUTO_CREATE_TOPIC)
    assert template == TopicConfig(AUTO_CREATE_TOPIC, 8, 8, PERM_READ | PERM_WRITE | PERM_INHERIT)
    version = topics.data_version
    created = topics.create_in_send("T", AUTO_CREATE_TOPIC, 4)
    assert created == TopicConfig("T", 4, 4, PERM_READ | PERM_WRITE)
    assert topics.data_version.counter == version.counter + 1
    assert TopicConfigManager(tmp_path, BrokerConfig()).select("T") == created  # persisted


def test_no_auto_create_when_disabled(tmp_path: Path) -> None:
    topics = TopicConfigManager(tmp_path, BrokerConfig(auto_create_topic_enable=False))
    assert topics.select(AUTO_CREATE_TOPIC) is None
    assert topics.create_in_send("T", AUTO_CREATE_TOPIC, 4) is None


def test_topic_sync_adopts_a_different_version_only(tmp_path: Path) -> None:
    master = TopicConfigManager(tmp_path / "m", BrokerConfig())
    master.create_in_send("T", AUTO_CREATE_TOPIC, 4)
    slave = TopicConfigManager(tmp_path / "s", BrokerConfig(broker_role="SLAVE"))
    text = master.encode()
    assert slave.adopt_from_master(loads_lenient(text))
    assert slave.select("T") == master.select("T")
    assert slave.data_version == master.data_version
    assert not slave.adopt_from_master(loads_lenient(text))
    assert TopicConfigManager(tmp_path / "s", BrokerConfig()).select("T") is not None


def test_subscription_groups_auto_create_and_sync(tmp_path: Path) -> None:
    master = SubscriptionGroupManager(tmp_path / "m")
    config = master.find("G")
    assert config is not None
    assert (config.retry_queue_nums, config.retry_max_times) == (1, 16)
    slave = SubscriptionGroupManager(tmp_path / "s")
    assert slave.adopt_from_master(loads_lenient(master.encode()))
    assert slave.table == master.table
    assert SubscriptionGroupManager(tmp_path / "s", auto_create=False).find("G") == config
    assert SubscriptionGroupManager(tmp_path / "x", auto_create=False).find("G") is None


def test_delay_offsets_are_kept_verbatim(tmp_path: Path) -> None:
    delay = DelayOffsets(tmp_path)
    text = '{"offsetTable":{1:5,2:0}}'
    assert delay.adopt_from_master(text)
    assert (tmp_path / "delayOffset.json").read_text() == text
    assert not delay.adopt_from_master(text)
    with pytest.raises(ValueError, match="Expecting"):
        delay.adopt_from_master("{1:")


def test_metadata_loads_all_tables_under_config(tmp_path: Path) -> None:
    meta = Metadata.load(tmp_path, BrokerConfig())
    meta.offsets.commit("G", "T", 0, 1)
    meta.persist_all()
    assert sorted(p.name for p in (tmp_path / "config").iterdir()) == ["consumerOffset.json"]
    assert Metadata.load(tmp_path, BrokerConfig()).offsets.query("G", "T", 0) == 1


def test_the_topics_and_groups_every_rocketmq_broker_has(tmp_path: Path) -> None:
    """A Java slave replaces its tables with its master's: a trioha master must list what a
    Java master would (``TopicConfigManager()``, ``SubscriptionGroupManager.init``)."""
    config = BrokerConfig(broker_cluster_name="C1", broker_name="b1")
    topics = TopicConfigManager(tmp_path, config).table
    shapes = {name: (t.read_queue_nums, t.write_queue_nums, t.perm) for name, t in topics.items()}
    assert shapes == {
        "SELF_TEST_TOPIC": (1, 1, 6),
        "OFFSET_MOVED_EVENT": (1, 1, 6),
        "BenchmarkTest": (1024, 1024, 6),
        "SCHEDULE_TOPIC_XXXX": (18, 18, 6),
        "C1_REPLY_TOPIC": (1, 1, 6),
        "C1": (16, 16, 7),
        "b1": (1, 1, 7),
        AUTO_CREATE_TOPIC: (8, 8, 7),
    }
    groups = SubscriptionGroupManager(tmp_path).table
    assert set(groups) == {
        "TOOLS_CONSUMER",
        "FILTERSRV_CONSUMER",
        "SELF_TEST_C_GROUP",
        "CID_ONS-HTTP-PROXY",
        "CID_ONSAPI_PULL",
        "CID_ONSAPI_PERMISSION",
        "CID_ONSAPI_OWNER",
    }
    assert all(g.consume_broadcast_enable for g in groups.values())


def test_a_groups_file_adds_to_the_built_in_groups_and_overrides_them(tmp_path: Path) -> None:
    write_config_file(
        tmp_path / "subscriptionGroup.json",
        '{"subscriptionGroupTable":{"G":{"groupName":"G"},'
        '"TOOLS_CONSUMER":{"groupName":"TOOLS_CONSUMER","retryMaxTimes":3}},'
        '"dataVersion":{"counter":4,"timestamp":1}}',
    )
    groups = SubscriptionGroupManager(tmp_path)
    assert {"G", "TOOLS_CONSUMER", "SELF_TEST_C_GROUP"} <= set(groups.table)
    assert groups.table["TOOLS_CONSUMER"].retry_max_times == 3


def test_delete_a_group_and_remove_its_offsets(tmp_path: Path) -> None:
    groups = SubscriptionGroupManager(tmp_path)
    groups.find("G")
    version = groups.data_version
    assert groups.delete("G") is not None
    assert "G" not in groups.table and groups.data_version != version
    assert groups.delete("G") is None
    offsets = ConsumerOffsetManager(tmp_path)
    offsets.commit("G", "T", 0, 1)
    offsets.commit("G", "U", 0, 2)
    offsets.commit("GG", "T", 0, 3)
    offsets.persist()
    assert offsets.remove_group("G") == 2
    assert offsets.dirty
    assert offsets.topics_of("G") == set()
    assert offsets.query("GG", "T", 0) == 3
    assert offsets.remove_group("G") == 0
