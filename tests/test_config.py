"""BrokerConfig and NamesrvConfig: RocketMQ's settings, defaults, broker.conf and
namesrv.properties (docs/rocketmq-protocol.md §3)."""

from __future__ import annotations

import builtins
from pathlib import Path
from typing import Optional, Union, get_type_hints

import attrs
import pytest

from trioha import BrokerConfig, BrokerRole, ConfigError, FlushDiskType
from trioha._config import (
    READERS,
    NamesrvConfig,
    RemotingServerConfig,
    config_properties,
    java_key,
    settings_readers,
)


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
    with pytest.raises(
        ConfigError,
        match=r"broker.conf:2: unknown key 'haSendHeartBeatInterval'"
        r"; did you mean 'haSendHeartbeatInterval'\?",
    ):
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


# --- java.util.Properties syntax ----------------------------------------------------------

from trioha._config import _parse_properties  # noqa: E402 - the reader itself, for its corners


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a=1", [("a", "1")]),
        ("a = 1", [("a", "1")]),
        ("a:1", [("a", "1")]),
        ("a : 1", [("a", "1")]),
        ("a 1", [("a", "1")]),
        ("a\t\f1", [("a", "1")]),
        ("a", [("a", "")]),
        ("a=", [("a", "")]),
        ("a==1", [("a", "=1")]),  # only the first separator separates
        ("a:=1", [("a", "=1")]),
        ("  # comment\n! comment\n\n   \nb=2", [("b", "2")]),
        ("a=x#y", [("a", "x#y")]),  # no comments after a value
        (
            "namesrvAddr=127.0.0.1:9876;\\\n    127.0.0.1:9877",
            [("namesrvAddr", "127.0.0.1:9876;127.0.0.1:9877")],
        ),
        ("a=1\\\\\nb=2", [("a", "1\\"), ("b", "2")]),  # an even count of backslashes ends it
        ("a=\\\n  # not a comment", [("a", "# not a comment")]),
        ("a\\=b=c", [("a=b", "c")]),
        ("a\\:b:c", [("a:b", "c")]),
        ("a\\ b c", [("a b", "c")]),
        ("a=\\u0041\\t\\n\\x", [("a", "A\t\nx")]),
        ("a=1\r\nb=2\rc=3", [("a", "1"), ("b", "2"), ("c", "3")]),
        ("a=1   ", [("a", "1")]),
        ("a=1\\", [("a", "1")]),  # a continuation at the end of the file
    ],
)
def test_properties_syntax_is_javas(text: str, expected: list[tuple[str, str]]) -> None:
    assert [(k, v) for _line, k, v in _parse_properties(text)] == expected


def test_properties_line_numbers_are_where_an_entry_starts() -> None:
    text = "# c\na=1,\\\n  2\nb=3\n"
    assert _parse_properties(text) == [(2, "a", "1,2"), (4, "b", "3")]


def test_a_malformed_unicode_escape_names_the_file_and_line(tmp_path: Path) -> None:
    conf = write(tmp_path, "brokerName=x\nbrokerIP1=\\u12\n")
    with pytest.raises(ConfigError, match=r"broker.conf: line 2: malformed \\uxxxx"):
        BrokerConfig.from_properties(conf)


def test_a_continued_namesrv_list_is_read(tmp_path: Path) -> None:
    conf = write(tmp_path, "namesrvAddr = 127.0.0.1:9876;\\\n              127.0.0.1:9877\n")
    assert BrokerConfig.from_properties(conf).namesrv_addr == "127.0.0.1:9876;127.0.0.1:9877"


def test_store_paths_and_disk_ratios_are_honoured(tmp_path: Path) -> None:
    conf = write(
        tmp_path,
        f"storePathRootDir={tmp_path / 'store'}\n"
        f"storePathCommitLog={tmp_path / 'fast' / 'commitlog'}\n"
        "diskMaxUsedSpaceRatio=80\n"
        "diskSpaceWarningLevelRatio=92\n"
        "serverChannelMaxIdleTimeSeconds=60\n",
    )
    config = BrokerConfig.from_properties(conf)
    assert config.store_root == tmp_path / "store"
    assert config.commitlog_dir == tmp_path / "fast" / "commitlog"
    assert config.disk_ratios == (0.92, 0.85, 0.80)
    assert config.server_channel_max_idle_time_seconds == 60
    assert BrokerConfig(store_path_root_dir=str(tmp_path)).commitlog_dir == tmp_path / "commitlog"


def test_store_paths_trioha_cannot_move_are_refused_not_ignored(tmp_path: Path) -> None:
    root = tmp_path / "store"
    same = write(tmp_path, f"storePathRootDir={root}\nstorePathConsumeQueue={root}/consumequeue\n")
    assert BrokerConfig.from_properties(same).store_root == root
    moved = write(tmp_path, f"storePathRootDir={root}\nstorePathIndex=/elsewhere/index\n")
    with pytest.raises(
        ConfigError,
        match=r"broker.conf:2: storePathIndex=/elsewhere/index "
        r"cannot be honoured: trioha keeps it at .*store/index",
    ):
        BrokerConfig.from_properties(moved)


# --- the remoting ports' limits, and the name server's settings ------------------------------


def test_the_remoting_limits_are_read_from_broker_conf(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "serverChannelMaxIdleTimeSeconds=300\nserverMaxConnections=5000\n"
        "serverFrameTimeoutSeconds=30\nserverFrameMinBytesPerSecond=16384\n"
        "serverConnectionReservePercent=20\nserverConnectionReserveMaxPerAddress=8\n"
        "serverWorkerThreads=16\nserverSocketSndBufSize=131072\n",  # Netty's: ignored
    )
    config = BrokerConfig.from_properties(path)
    assert config.server_channel_max_idle_time_seconds == 300
    assert config.server_max_connections == 5000
    assert (config.server_frame_timeout_seconds, config.server_frame_min_bytes_per_second) == (
        30,
        16384,
    )
    assert config.server_connection_reserve_percent == 20
    assert config.server_connection_reserve_max_per_address == 8
    default = BrokerConfig()
    assert (default.server_frame_timeout_seconds, default.server_frame_min_bytes_per_second) == (
        10,
        65536,
    )
    assert default.server_connection_reserve_percent == 10
    with pytest.raises(ConfigError, match="percentage"):
        BrokerConfig.from_properties(None, settings=[("serverConnectionReservePercent", "120")])


def test_a_namesrv_properties_is_read_as_mqnamesrv_reads_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO")
    path = tmp_path / "namesrv.properties"
    path.write_text(
        "listenPort=9877\n"
        "serverChannelMaxIdleTimeSeconds=300\n"
        "orderMessageEnable=true\n"
        "rocketmqHome=/opt/rocketmq\n"
        "kvConfigPath=/opt/rocketmq/kvConfig.json\n"
        "serverWorkerThreads=8\n"
    )
    config = NamesrvConfig.from_properties(path, settings=[("serverMaxConnections", "100")])
    assert (config.listen_host, config.listen_port) == ("127.0.0.1", 9877)
    assert config.server_channel_max_idle_time_seconds == 300
    assert config.server_max_connections == 100
    assert config.order_message_enable
    said = [r.getMessage() for r in caplog.records]
    assert f"{path}:4: rocketmqHome is where RocketMQ finds its logging configuration" in said[0]
    assert "kvConfigPath is where RocketMQ keeps KV config" in said[1]
    assert "in memory only" in said[1]
    assert f"{path}:6: serverWorkerThreads is a RocketMQ setting trioha has no use for" == said[2]
    default = NamesrvConfig()  # mqnamesrv's defaults
    assert (default.listen_port, default.server_channel_max_idle_time_seconds) == (9876, 120)
    assert not default.order_message_enable


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("serverChannelMaxIdleTimeSecond=300", "did you mean 'serverChannelMaxIdleTimeSeconds'"),
        ("brokerRole=SLAVE", "unknown key 'brokerRole'"),  # a broker.conf key is no namesrv key
        ("listenPort=99999", "must be a TCP port"),
        ("serverMaxConnections=many", "serverMaxConnections='many' is not valid"),
    ],
)
def test_a_bad_namesrv_properties_is_a_clear_error(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "namesrv.properties"
    path.write_text(f"# mine\n{line}\n")
    with pytest.raises(ConfigError, match=message) as info:
        NamesrvConfig.from_properties(path)
    if "unknown" in message or "did you mean" in message:
        assert str(info.value).startswith(f"{path}:2: unknown key")


@pytest.mark.parametrize(
    ("text", "settings", "expected"),
    [
        ("", {"a": "1"}, "a=1\n"),
        ("# keep\na = 2\nb=3\n", {"a": "1"}, "# keep\na=1\nb=3\n"),
        ("a=2\nb=3\na=4", {"a": "1"}, "a=1\nb=3\n"),  # a later duplicate would win: gone
        ("x=1\\\n  2\r\na:9\n", {"x": "5", "c": "7"}, "x=5\na:9\nc=7\n"),  # a continued entry
        ("b=3", {"a": " lead\\ing"}, "b=3\na=\\ lead\\\\ing\n"),
    ],
)
def test_rewrite_properties_changes_only_its_keys(
    text: str, settings: dict[str, str], expected: str
) -> None:
    from trioha._config import parse_properties, rewrite_properties

    out = rewrite_properties(text, settings)
    assert out == expected
    read = {key: value for _line, key, value in parse_properties(out)}
    assert {key: read[key] for key in settings} == settings


def test_read_setting_is_the_files_reading_of_one_key() -> None:
    from trioha._config import read_setting

    assert read_setting(BrokerConfig, "brokerIP1", "10.0.0.1", where="w") == (
        "broker_ip1",
        "10.0.0.1",
    )
    assert read_setting(BrokerConfig, "flushDiskType", "sync_flush", where="w") == (
        "flush_disk_type",
        FlushDiskType.SYNC_FLUSH,
    )
    with pytest.raises(ConfigError, match="w: unknown key 'brokerIPP1'; did you mean 'brokerIP1'"):
        read_setting(BrokerConfig, "brokerIPP1", "x", where="w")
    with pytest.raises(ConfigError, match="w: brokerIP2 is a RocketMQ setting trioha"):
        read_setting(BrokerConfig, "brokerIP2", "10.0.0.2", where="w")
    assert read_setting(BrokerConfig, "fileReservedTime", "48", where="w") == (
        "file_reserved_time",
        48,
    )
    assert read_setting(BrokerConfig, "deleteWhen", "04;16", where="w") == ("delete_when", "04;16")
    with pytest.raises(ConfigError, match="deleteWhen='4pm': '4pm' is not an hour of the day"):
        BrokerConfig(delete_when="4pm")
    with pytest.raises(
        ConfigError, match="destroyMapedFileIntervalForcibly is how long RocketMQ waits for readers"
    ):
        read_setting(BrokerConfig, "destroyMapedFileIntervalForcibly", "120000", where="w")
    with pytest.raises(ConfigError, match="w: listenPort='x' is not valid"):
        read_setting(BrokerConfig, "listenPort", "x", where="w")


def test_config_properties_round_trip_through_the_reader(tmp_path: Path) -> None:
    from trioha._config import config_properties, java_key

    config = BrokerConfig(broker_ip1="10.1.1.1", flush_disk_type=FlushDiskType.SYNC_FLUSH)
    properties = config_properties(config)
    assert properties["brokerIP1"] == "10.1.1.1"
    assert properties["checkCRCOnRecover"] == "true"
    assert properties["flushDiskType"] == "SYNC_FLUSH"
    assert "namesrvAddr" not in properties  # unset
    assert java_key("ha_slave_fallbehind_max") == "haSlaveFallbehindMax"
    conf = write(tmp_path, "".join(f"{k}={v}\n" for k, v in properties.items()))
    assert BrokerConfig.from_properties(conf) == config


def test_failover_is_read_in_rocketmqs_words_plus_trioha_keys(tmp_path: Path) -> None:
    conf = write(
        tmp_path,
        "enableControllerMode=true\n"
        "allAckInSyncStateSet=false\n"
        "minInSyncReplicas=2\n"
        "enableElectUncleanMaster=true\n"
        "haMaxTimeSlaveNotCatchup=7000\n"
        "failoverEtcdEndpoints=http://127.0.0.1:2379;http://127.0.0.1:2479\n"
        "failoverEtcdRoot=/prod\n"
        "failoverLeaseTtl=5\n"
        "failoverBrokerId=2\n",
    )
    config = BrokerConfig.from_properties(conf)
    assert config.failover
    assert not config.all_ack_in_sync_state_set
    assert (config.min_in_sync_replicas, config.ha_max_time_slave_not_catchup) == (2, 7000)
    assert config.enable_elect_unclean_master
    assert (config.failover_etcd_root, config.failover_lease_ttl) == ("/prod", 5)
    assert config.failover_broker_id == 2
    # docs/failover.md, "Durability": slaves acknowledge only what they flushed.
    assert config.ha_slave_ack_flushed


def test_failover_defaults_and_what_turns_it_on() -> None:
    config = BrokerConfig()
    assert config.all_ack_in_sync_state_set  # trioha's default; RocketMQ's is false
    assert (config.min_in_sync_replicas, config.ha_max_time_slave_not_catchup) == (1, 15000)
    assert not config.enable_elect_unclean_master and config.failover_lease_ttl == 3
    assert not config.failover
    # Epoch mode without etcd keeps static roles; etcd without epoch mode is not failover.
    assert not BrokerConfig(enable_controller_mode=True).failover
    assert not BrokerConfig(failover_etcd_endpoints="http://127.0.0.1:2379").failover


def test_failover_needs_a_stable_broker_id() -> None:
    with pytest.raises(ConfigError, match="needs failoverBrokerId"):
        BrokerConfig(enable_controller_mode=True, failover_etcd_endpoints="http://127.0.0.1:2379")


# --- every setting reads its value with its own reader ---------------------------------------


@pytest.mark.parametrize("cls", [BrokerConfig, NamesrvConfig, RemotingServerConfig])
def test_every_setting_carries_the_reader_of_its_type(cls: type) -> None:
    hints = get_type_hints(cls)
    for field in attrs.fields(cls):
        assert field.metadata["read"] is READERS[hints[field.name]], field.name


def test_every_setting_reads_back_what_config_properties_wrote() -> None:
    """Each field's text (``MixAll.object2Properties``) read by its reader is its value: a
    reader that took a number or a flag as text would fail here, field by field."""
    config = BrokerConfig(tls_server_mode="enforcing", broker_ip1="10.0.0.1")
    text = config_properties(config)
    read = {
        field.name: field.metadata["read"](text[java_key(field.name)])
        for field in attrs.fields(BrokerConfig)
        if java_key(field.name) in text
    }
    assert len(read) > 50
    assert BrokerConfig(**read) == config
    assert {type(value) for value in read.values()} == {bool, int, str, BrokerRole, FlushDiskType}


def test_however_an_annotation_is_spelled_it_is_read_the_same() -> None:
    @attrs.frozen(kw_only=True, field_transformer=settings_readers)
    class Spelled:
        plain: str | None = None
        union: Union[str, None] = None  # noqa: UP007 - the point is the other spelling
        optional: Optional[str] = None  # noqa: UP045 - likewise
        number: "int" = 0  # noqa: UP037 - a quoted annotation inside the quoted ones
        flag: builtins.bool = False

    readers = {f.name: f.metadata["read"] for f in attrs.fields(Spelled)}
    assert readers["union"] is readers["optional"] is readers["plain"]
    assert [readers["plain"](""), readers["number"]("7"), readers["flag"]("TRUE")] == [
        None,
        7,
        True,
    ]
    with pytest.raises(ValueError, match="true or false"):
        readers["flag"]("yes")


def test_a_setting_of_a_type_without_a_reader_cannot_be_defined() -> None:
    with pytest.raises(TypeError, match=r"Odd\.ratio: no reader for a setting of type 'float'"):

        @attrs.frozen(kw_only=True, field_transformer=settings_readers)
        class Odd:
            ratio: float = 0.5

    with pytest.raises(TypeError, match=r"Odd\.port: no reader"):

        @attrs.frozen(kw_only=True, field_transformer=settings_readers)
        class Odd:  # type: ignore[no-redef]
            port: int | None = None


def test_a_field_may_name_its_own_reader() -> None:
    @attrs.frozen(kw_only=True, field_transformer=settings_readers)
    class Own:
        ratio: float = attrs.field(default=0.5, metadata={"read": float})

    (field,) = attrs.fields(Own)
    assert field.metadata["read"]("0.25") == 0.25
