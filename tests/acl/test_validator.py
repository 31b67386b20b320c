"""Who may do what: ``PlainPermissionManager.validate`` and ``PlainAccessValidator.parse``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trioha._errors import ConfigError
from trioha.acl import AccessValidator, PlainAcl, Role, load_table, sign_fields
from trioha.acl._addresses import compile_pattern
from trioha.acl._validator import java_hashmap_order
from trioha.remoting import RemotingCommand, RequestCode

ACL = """
globalWhiteRemoteAddresses:
  - 10.10.103.*
  - 192.168.0.{1,2}
accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB
    groupPerms:
      - groupA=DENY
      - groupB=PUB|SUB
  - accessKey: rocketmq2
    secretKey: 12345678
    whiteRemoteAddress: 192.168.1.*
    admin: true
"""

PEER = "127.0.0.1:5555"
MANAGER = "org.apache.rocketmq.acl.plain.PlainPermissionManager"
VALIDATE = f"{MANAGER}.validate(PlainPermissionManager.java:"
CHECK = f"{MANAGER}.checkPerm(PlainPermissionManager.java:"


@pytest.fixture
def validator(tmp_path: Path) -> AccessValidator:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL)
    return AccessValidator(load_table([path]))


def signed(
    code: int,
    fields: dict[str, str],
    body: bytes = b"",
    *,
    ak: str = "RocketMQ",
    sk: str = "12345678",
) -> RemotingCommand:
    return RemotingCommand.request(
        code, sign_fields(fields, body, access_key=ak, secret_key=sk), body
    )


def remark(v: AccessValidator, request: RemotingCommand, peer: str = PEER) -> str | None:
    denial = v.check(request, peer)
    return None if denial is None else denial.remark


def test_global_white_list_lets_anything_through(validator: AccessValidator) -> None:
    bare = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC)
    assert validator.check(bare, "10.10.103.7:1234") is None
    assert validator.check(bare, "192.168.0.2:1") is None
    assert validator.check(bare, "192.168.0.3:1") is not None


def test_refusals_read_as_the_java_broker_writes_them(validator: AccessValidator) -> None:
    bare = RemotingCommand.request(RequestCode.SEND_MESSAGE, {"topic": "topicB"})
    assert remark(validator, bare) == (
        "org.apache.rocketmq.acl.common.AclException: No accessKey is configured, "
        + VALIDATE
        + "663)"
    )
    unknown = signed(RequestCode.SEND_MESSAGE, {"topic": "topicB"}, ak="nobody12")
    assert remark(validator, unknown) == (
        "org.apache.rocketmq.acl.common.AclException: No acl config for nobody12, "
        + VALIDATE
        + "667)"
    )
    wrong = signed(RequestCode.SEND_MESSAGE, {"topic": "topicB"}, sk="87654321")
    assert remark(validator, wrong) == (
        "org.apache.rocketmq.acl.common.AclException: Check signature failed for "
        "accessKey=RocketMQ, " + VALIDATE + "683)"
    )
    admin = signed(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "topicB"})
    assert remark(validator, admin) == (
        "org.apache.rocketmq.acl.common.AclException: Need admin permission for request "
        "code=17, but accessKey=RocketMQ is not, " + CHECK + "580)"
    )


def test_topic_and_group_permissions(validator: AccessValidator) -> None:
    def pull(topic: str, group: str) -> str | None:
        request = signed(RequestCode.PULL_MESSAGE, {"topic": topic, "consumerGroup": group})
        return remark(validator, request)

    assert pull("topicB", "groupB") is None
    assert pull("topicC", "anyGroup") is None  # defaultGroupPerm SUB
    denied = pull("topicA", "groupB")
    assert denied is not None and "No default permission for topic:topicA" in denied
    assert denied.endswith(CHECK + "610)")  # a listed permission refused
    unlisted = pull("topicZ", "groupB")
    assert unlisted is not None and unlisted.endswith(CHECK + "605)")  # the default refused
    group = pull("topicB", "groupA")
    assert group is not None and "No default permission for group:groupA" in group
    send = signed(RequestCode.SEND_MESSAGE_V2, {"a": "PG", "b": "topicC"})
    assert "topic:topicC" in (remark(validator, send) or "")  # SUB only: no PUB
    assert remark(validator, signed(RequestCode.SEND_MESSAGE_V2, {"b": "topicB"})) is None
    trace = signed(RequestCode.SEND_MESSAGE, {"topic": "RMQ_SYS_TRACE_TOPIC"})
    assert remark(validator, trace) is None


def test_heartbeat_checks_every_consumer_group_and_subscription(
    validator: AccessValidator,
) -> None:
    def heartbeat(group: str, topic: str) -> RemotingCommand:
        body = {
            "clientID": "c",
            "consumerDataSet": [
                {"groupName": group, "subscriptionDataSet": [{"topic": topic, "subString": "*"}]}
            ],
            "producerDataSet": [{"groupName": "anything"}],
        }
        return signed(RequestCode.HEART_BEAT, {}, json.dumps(body).encode())

    assert remark(validator, heartbeat("groupB", "topicB")) is None
    assert "topic:topicA" in (remark(validator, heartbeat("groupB", "topicA")) or "")
    assert "group:groupA" in (remark(validator, heartbeat("groupA", "topicB")) or "")


def test_trioha_closes_what_rocketmq_leaves_open(validator: AccessValidator) -> None:
    # Metadata dumps and the ACL codes are admin-only (RocketMQ: any signed account).
    for code in (RequestCode.GET_ALL_CONSUMER_OFFSET, RequestCode.GET_ALL_TOPIC_CONFIG, 50, 54):
        assert "Need admin permission" in (remark(validator, signed(code, {})) or "")
    # Batch sends and offset queries check their topic (RocketMQ checks nothing).
    batch = signed(RequestCode.SEND_BATCH_MESSAGE, {"a": "PG", "b": "topicA"})
    assert "topic:topicA" in (remark(validator, batch) or "")
    query = signed(RequestCode.QUERY_CONSUMER_OFFSET, {"topic": "topicA", "consumerGroup": "g"})
    assert "topic:topicA" in (remark(validator, query) or "")


def test_an_admin_account_without_listed_perms_may_do_anything(tmp_path: Path) -> None:
    path = tmp_path / "a.yml"
    path.write_text("accounts:\n  - {accessKey: adminKey1, secretKey: adminSecret1, admin: true}\n")
    v = AccessValidator(load_table([path]))
    for code, fields in ((17, {"topic": "t"}), (11, {"topic": "t", "consumerGroup": "g"})):
        assert v.check(signed(code, fields, ak="adminKey1", sk="adminSecret1"), PEER) is None


def test_account_white_address_skips_the_signature(validator: AccessValidator) -> None:
    request = RemotingCommand.request(
        RequestCode.UPDATE_AND_CREATE_TOPIC, {"AccessKey": "rocketmq2"}
    )
    assert validator.check(request, "192.168.1.9:1") is None
    assert validator.check(request, "192.168.2.9:1") is not None


def test_name_server_needs_admin_for_writes_and_a_signature_for_reads(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL)
    v = AccessValidator(load_table([path]), Role.NAMESRV)
    assert v.check(signed(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "t"}), PEER) is None
    for code in (
        RequestCode.REGISTER_BROKER,
        RequestCode.UNREGISTER_BROKER,
        RequestCode.PUT_KV_CONFIG,
        RequestCode.DELETE_KV_CONFIG,
    ):
        assert "Need admin permission" in (remark(v, signed(code, {})) or "")
        bare = RemotingCommand.request(code)
        assert "No accessKey is configured" in (remark(v, bare) or "")
    route = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "t"})
    assert "No accessKey" in (remark(v, route) or "")


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("*", ["1.2.3.4", "::1"], []),
        ("", [], ["1.2.3.4"]),
        ("192.168.1.{1,2,3}", ["192.168.1.2"], ["192.168.1.4", "192.168.1.23"]),
        ("10.0.0.1,10.0.0.2", ["10.0.0.2"], ["10.0.0.3"]),
        ("192.168.*.*", ["192.168.5.9"], ["192.169.5.9"]),
        ("192.168.1-10.7", ["192.168.5.9", "192.168.10.1"], ["192.168.11.7"]),
        ("127.0.0.1", ["127.0.0.1"], ["127.0.0.2"]),
        ("::1", ["0:0:0:0:0:0:0:1"], ["::2"]),
    ],
)
def test_white_address_patterns(pattern: str, yes: list[str], no: list[str]) -> None:
    compiled = compile_pattern(pattern)
    assert all(compiled.matches(ip) for ip in yes)
    assert not any(compiled.matches(ip) for ip in no)


@pytest.mark.parametrize("pattern", ["192.168.1", "300.1.1.1", "1.2.3-1.4", "1.2.-3.4", "x.y"])
def test_invalid_patterns_are_named(pattern: str) -> None:
    with pytest.raises(ConfigError, match=r"pattern|address"):
        compile_pattern(pattern)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("accounts:\n  - {accessKey: short, secretKey: 12345678}\n", "longer than 6"),
        (
            "accounts:\n  - {accessKey: longkey1, secretKey: 12345678, topicPerms: [a]}\n",
            "parse resource permission failed",
        ),
        (
            "accounts:\n  - {accessKey: longkey1, secretKey: 12345678, whiteRemoteAddress: 1.2}\n",
            "longkey1",
        ),
        ("accounts: [\n", "not valid YAML"),
        ("- a\n", "mapping"),
    ],
)
def test_a_bad_file_is_an_error_naming_it(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        load_table([path])
    assert str(path) in str(info.value)


def test_missing_file_is_a_start_up_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        PlainAcl.load(tmp_path / "nope.yml")


def test_reload_picks_up_changes_and_keeps_the_old_table_on_a_bad_edit(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text("accounts:\n  - {accessKey: first123, secretKey: secret12}\n")
    acl = PlainAcl.load(path)
    assert not acl.reload_if_changed()
    path.write_text("accounts:\n  - {accessKey: second12, secretKey: secret12}\n")
    assert acl.reload_if_changed()
    assert set(acl.table.accounts) == {"second12"}
    path.write_text("accounts: [\n")
    assert not acl.reload_if_changed()
    assert set(acl.table.accounts) == {"second12"} and acl.last_error is not None
    # A file added under acl/ is loaded; an accessKey already known keeps its first file.
    (tmp_path / "acl").mkdir()
    path.write_text("accounts:\n  - {accessKey: second12, secretKey: secret12}\n")
    (tmp_path / "acl" / "more.yaml").write_text(
        "accounts:\n  - {accessKey: second12, secretKey: other123}\n"
        "  - {accessKey: third123, secretKey: secret12}\n"
    )
    assert acl.reload_if_changed()
    assert set(acl.table.accounts) == {"second12", "third123"}
    assert acl.table.accounts["second12"].secret_key == "secret12"


def test_refusals_name_the_resource_java_would_name_first() -> None:
    # The orders below were printed by java.util.HashMap.keySet() (OpenJDK) for the same puts;
    # the second one has 14 keys, so the table has grown to 32 buckets.
    assert java_hashmap_order(["topicA", "%RETRY%groupB"]) == ["topicA", "%RETRY%groupB"]
    keys = "TopicX %RETRY%G1 T2 T3 %RETRY%G2 abc q zz TopicY %RETRY%C Z1 Z2 Z3 Z4"
    java = "zz abc TopicY TopicX %RETRY%C q Z1 Z2 Z3 %RETRY%G1 Z4 %RETRY%G2 T2 T3"
    assert java_hashmap_order(keys.split(" ")) == java.split(" ")


def test_broker_conf_spells_the_keys_as_rocketmq(tmp_path: Path) -> None:
    from trioha._config import BrokerConfig

    conf = tmp_path / "broker.conf"
    conf.write_text(
        "aclEnable=true\naclFile=/etc/acl.yml\naclAccessKey=brokerAdmin\n"
        "tls.server.mode=enforcing\ntls.server.certPath=/c\ntls.server.keyPath=/k\n"
        "tls.server.keyPassword=pw\ntls.server.need.client.auth=REQUIRE\n"
        "tls.server.authClient=true\ntls.server.trustCertPath=/t\ntls.enable=true\n"
        "tls.client.authServer=true\ntls.client.trustCertPath=/ct\ntls.test.mode.enable=false\n"
        "haTlsEnable=true\nhaTlsNeedClientAuth=true\nhaAuthSecret=xyz\naclSecretKey=sk12345\n"
    )
    c = BrokerConfig.from_properties(conf)
    assert (c.acl_enable, c.acl_file, c.acl_access_key) == (True, "/etc/acl.yml", "brokerAdmin")
    assert (c.tls_server_mode, c.tls_server_need_client_auth) == ("enforcing", "require")
    assert (c.tls_server_key_password, c.tls_server_trust_cert_path) == ("pw", "/t")
    assert c.tls_server_auth_client and c.tls_enable and c.tls_client_auth_server
    assert c.ha_tls_enable and c.ha_tls_need_client_auth and c.ha_auth_secret == "xyz"
    assert "xyz" not in repr(c) and "sk12345" not in repr(c) and "pw" not in repr(c)
    conf.write_text("tls.server.mode=enforce\n")
    with pytest.raises(ConfigError, match="tls_server_mode"):
        BrokerConfig.from_properties(conf)


def test_an_empty_group_names_no_resource(validator: AccessValidator) -> None:
    """The C++ producer unregisters with ``consumerGroup=""``; RocketMQ refuses that."""
    request = signed(
        RequestCode.UNREGISTER_CLIENT, {"clientID": "c", "producerGroup": "PG", "consumerGroup": ""}
    )
    assert validator.check(request, PEER) is None


def test_tls_config_file_settings_win(tmp_path: Path) -> None:
    from trioha._config import BrokerConfig

    (tmp_path / "tls.properties").write_text(
        "tls.server.certPath=/from/file.pem\ntls.test.mode.enable=false\n"
    )
    conf = tmp_path / "broker.conf"
    conf.write_text(
        f"tls.config.file={tmp_path / 'tls.properties'}\ntls.server.certPath=/from/conf.pem\n"
    )
    assert BrokerConfig.from_properties(conf).tls_server_cert_path == "/from/file.pem"
    (tmp_path / "tls.properties").write_text("tls.server.mode=disabled\n")
    with pytest.raises(ConfigError, match=r"cannot be set in a tls\.config\.file"):
        BrokerConfig.from_properties(conf)
    (tmp_path / "tls.properties").unlink()
    with pytest.raises(ConfigError, match=r"cannot read tls\.config\.file"):
        BrokerConfig.from_properties(conf)


async def test_guard_answers_system_error_and_logs_once_per_client_and_reason(
    validator: AccessValidator, caplog: pytest.LogCaptureFixture
) -> None:
    from types import SimpleNamespace
    from typing import Any

    from trioha.acl import AclGuard
    from trioha.remoting import NoBursts, ResponseCode

    class Inner(NoBursts):
        async def handle_request(self, request: RemotingCommand, connection: Any) -> Any:
            return request.response(ResponseCode.SUCCESS)

    guard = AclGuard(Inner(), validator)
    bare = RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "topicB"})
    wrong = signed(RequestCode.GET_MAX_OFFSET, {"topic": "topicB"}, sk="87654321")
    good = signed(RequestCode.GET_MAX_OFFSET, {"topic": "topicB"})
    for request, port in [(bare, 1), (bare, 2), (bare, 3), (wrong, 4), (wrong, 5)]:
        connection: Any = SimpleNamespace(peer=f"10.0.0.9:{port}")
        response = await guard.handle_request(request, connection)
        assert response is not None and response.code == ResponseCode.SYSTEM_ERROR
    elsewhere: Any = SimpleNamespace(peer="10.0.0.8:1")
    await guard.handle_request(bare, elsewhere)
    ok = await guard.handle_request(good, elsewhere)
    assert ok is not None and ok.code == ResponseCode.SUCCESS
    refusals = [r.message for r in caplog.records if "refused request" in r.message]
    assert len(refusals) == 3  # (10.0.0.9, no key), (10.0.0.9, signature), (10.0.0.8, no key)
    assert guard.statistics() == type(guard.statistics())(allowed=1, denied=6)


def test_the_operators_admin_codes_need_an_admin_account(tmp_path: Path) -> None:
    """``mqadmin``'s admin codes: RocketMQ requires admin for 25 and 207 only; trioha for
    every one of them (an offset reset or a group deletion is no client's business), on the
    broker and on the name server alike (GET_NAMESRV_CONFIG included: it shows paths)."""
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL)
    broker = AccessValidator(load_table([path]))
    for code in (
        RequestCode.UPDATE_BROKER_CONFIG,
        RequestCode.GET_PRODUCER_CONNECTION_LIST,
        RequestCode.DELETE_SUBSCRIPTIONGROUP,
        RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
        RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE,
        RequestCode.GET_CONSUMER_RUNNING_INFO,
        RequestCode.CLEAN_UNUSED_TOPIC,
        RequestCode.QUERY_CONSUME_QUEUE,
        RequestCode.DELETE_EXPIRED_COMMITLOG,
    ):
        assert "Need admin permission" in (remark(broker, signed(code, {})) or ""), code
        assert broker.check(signed(code, {}, ak="rocketmq2", sk="12345678"), PEER) is None, code
    namesrv = AccessValidator(load_table([path]), Role.NAMESRV)
    for code in (
        RequestCode.WIPE_WRITE_PERM_OF_BROKER,
        RequestCode.ADD_WRITE_PERM_OF_BROKER,
        RequestCode.UPDATE_NAMESRV_CONFIG,
        RequestCode.GET_NAMESRV_CONFIG,
    ):
        assert "Need admin permission" in (remark(namesrv, signed(code, {})) or ""), code
        assert namesrv.check(signed(code, {}, ak="rocketmq2", sk="12345678"), PEER) is None
