"""BrokerConfig: RocketMQ's settings, defaults and broker.conf (docs/rocketmq-protocol.md §3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trioha import BrokerConfig, BrokerRole, ConfigError, FlushDiskType


def test_defaults_are_rocketmqs() -> None:
    config = BrokerConfig()
    assert config.broker_role is BrokerRole.ASYNC_MASTER
    assert config.flush_disk_type is FlushDiskType.ASYNC_FLUSH
    assert config.mapped_file_size_commit_log == 1 << 30
    assert (config.ha_listen_port, config.listen_port) == (10912, 10911)
    assert (config.ha_send_heartbeat_interval, config.ha_housekeeping_interval) == (5000, 20000)
    assert config.ha_transfer_batch_size == 32768
    assert config.ha_slave_fallbehind_max == 256 << 20
    assert (config.slave_timeout, config.sync_flush_timeout) == (3000, 5000)
    assert config.ha_listen_host == "127.0.0.1"  # trioha's own: loopback unless asked
    assert config.required_slave_acks == 1


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "broker.conf"
    path.write_text(text)
    return path


def test_a_rocketmq_broker_conf_is_read(tmp_path: Path) -> None:
    conf = write(
        tmp_path,
        "# a RocketMQ broker.conf\n"
        "brokerClusterName = DefaultCluster\n"
        "brokerName=broker-b\n"
        "brokerId=1\n"
        "deleteWhen=04\n"
        "fileReservedTime=48\n"
        "brokerRole=SLAVE\n"
        "flushDiskType=SYNC_FLUSH\n"
        "haMasterAddress=127.0.0.1:10912\n"
        "mapedFileSizeCommitLog=1048576\n"
        "haSlaveAckFlushed=true\n",
    )
    config = BrokerConfig.from_properties(conf)
    assert config.broker_role is BrokerRole.SLAVE
    assert config.flush_disk_type is FlushDiskType.SYNC_FLUSH
    assert (config.broker_name, config.broker_id) == ("broker-b", 1)
    assert config.ha_master == ("127.0.0.1", 10912)
    assert config.mapped_file_size_commit_log == 1 << 20
    assert config.ha_slave_ack_flushed


def test_an_unknown_key_names_the_line_and_the_nearest_valid_key(tmp_path: Path) -> None:
    conf = write(tmp_path, "brokerRole=SYNC_MASTER\nhaSendHeartBeatInterval=3\n")
    with pytest.raises(ConfigError, match=r"broker.conf:2: unknown key 'haSendHeartBeatInterval'"
                       r"; did you mean 'haSendHeartbeatInterval'\?"):
        BrokerConfig.from_properties(conf)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("haListenPort=abc", "haListenPort='abc' is not valid"),
        ("checkCRCOnRecover=yes", "expected true or false"),
        ("brokerRole=LEADER", "brokerRole='LEADER' is not valid"),
        ("haListenPort=70000", "TCP port"),
        ("haTransferBatchSize=8388608", r"exceeds what a RocketMQ slave can receive"),
        ("haMasterAddress=nowhere", "HOST:PORT"),
    ],
)
def test_bad_values_are_clear_errors(tmp_path: Path, line: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        BrokerConfig.from_properties(write(tmp_path, line + "\n"))


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read .*nothing\.conf"):
        BrokerConfig.from_properties(tmp_path / "nothing.conf")


def test_flags_override_the_file(tmp_path: Path) -> None:
    conf = write(tmp_path, "brokerRole=ASYNC_MASTER\n")
    config = BrokerConfig.from_properties(conf, broker_role=BrokerRole.SYNC_MASTER)
    assert config.broker_role is BrokerRole.SYNC_MASTER


def test_a_slave_never_has_broker_id_zero() -> None:
    # BrokerStartup refuses it: a slave with id 0 mistakes a half-replicated tail for
    # corruption (docs/rocketmq-protocol.md §1.7).
    assert BrokerConfig(broker_role="SLAVE").broker_id == 1


def test_in_sync_replicas_counts_the_master_as_rocketmq_5_does() -> None:
    assert BrokerConfig(in_sync_replicas=1).required_slave_acks == 0
    assert BrokerConfig(in_sync_replicas=3).required_slave_acks == 2
