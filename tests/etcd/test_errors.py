"""An etcd that is not there, not etcd, too slow, or refuses trioha's credentials: each one
error, one line, naming the endpoint and what to do."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator

import httpx
import pytest
import trio

from tests.etcd._harness import closed_port, http_answer, running_etcd, serve_http
from trioha._errors import (
    ConfigError,
    EtcdAuthError,
    EtcdEndpointError,
    EtcdOutcomeUnknownError,
    EtcdUnavailableError,
)
from trioha.etcd import EtcdClientOptions, EtcdCluster, EtcdWatch, open_etcd_client
from trioha.failover import LeaseGrant, Put, Range, RangeResponse, Txn, TxnResponse


def one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text
    return text


# --- nothing there, something else there, something slow ------------------------------------


async def test_nothing_listening_is_unavailable_naming_every_endpoint() -> None:
    ports = closed_port(), closed_port()
    endpoints = [f"http://127.0.0.1:{p}" for p in ports]
    async with open_etcd_client(endpoints, retry_for=0.3) as client:
        with pytest.raises(EtcdUnavailableError) as raised:
            await client.request(Range(b"/k"))
        # A write that never left is not "unknown": it provably did not happen.
        with pytest.raises(EtcdUnavailableError):
            await client.request(Txn((), (Put(b"/k", b"v"),)))
        stats = client.statistics()
    text = one_line(raised.value)
    assert text.startswith("etcd unavailable for POST /v3/kv/range: ")
    for endpoint in endpoints:
        assert f"{endpoint} refused the connection (nothing listens there)" in text
    assert "(tried for 0.3 s); check that etcd runs there" in text
    assert stats.failures == 2
    assert stats.retries >= 2


@pytest.mark.parametrize(
    ("answer", "shown"),
    [
        (http_answer("404 Not Found", "text/plain", b"Not Found\n"), "HTTP 404 (text/plain"),
        (http_answer("200 OK", "text/html", b"<html><body>hi</body></html>"), "HTTP 200"),
        (http_answer("200 OK", "application/json", b'{"ok": true}'), "HTTP 200"),
        (http_answer("502 Bad Gateway", "application/json", b"[]"), "HTTP 502"),
    ],
    ids=["404-text", "200-html", "200-other-json", "502-json-array"],
)
async def test_something_that_is_not_etcd_is_an_endpoint_error(answer: bytes, shown: str) -> None:
    async with serve_http(answer) as url, open_etcd_client(url, retry_for=0.3) as client:
        with pytest.raises(EtcdEndpointError) as raised:
            await client.request(Range(b"/k"))
    text = one_line(raised.value)
    assert text.startswith(f"{url} ")
    assert "not etcd" in text or "something etcd does not send" in text
    assert "etcd's client URL" in text
    assert isinstance(raised.value, ConfigError)
    if "not etcd" in text:
        assert shown in text


async def drain(watch: EtcdWatch) -> None:
    with trio.fail_after(60):
        async for _ in watch:
            pass


async def test_a_watch_on_something_that_is_not_etcd_raises_from_the_iteration() -> None:
    answer = http_answer("404 Not Found", "text/plain", b"Not Found\n")
    async with (
        serve_http(answer) as url,
        open_etcd_client(url) as client,
        client.open_watch(Range.prefix(b"/"), 1) as watch,
    ):
        with pytest.raises(EtcdEndpointError, match="not etcd's v3 JSON gateway"):
            await drain(watch)


async def test_a_server_that_never_answers_leaves_reads_unavailable_and_writes_unknown() -> None:
    async with (
        serve_http(None) as url,
        open_etcd_client(url, request_timeout=0.3, retry_for=0.5) as client,
    ):
        with pytest.raises(EtcdUnavailableError) as read:
            await client.request(Range(b"/k"))
        with pytest.raises(EtcdOutcomeUnknownError) as write:
            await client.request(Txn((), (Put(b"/k", b"v"),)))
        with pytest.raises(EtcdOutcomeUnknownError):
            await client.request(Put(b"/k", b"v"))
        with pytest.raises(EtcdUnavailableError):
            await client.request(LeaseGrant(3))  # a spare lease expires by itself: retried
    assert f"{url} gave no answer within 0.3 s" in one_line(read.value)
    assert one_line(write.value) == (
        f"etcd at {url} gave no answer within 0.3 s to POST /v3/kv/txn, which writes: it may or "
        "may not have been applied, so it is not sent again; read the keys to learn which"
    )


async def test_a_write_whose_authentication_got_no_answer_was_never_sent() -> None:
    async with (
        serve_http(None) as url,
        open_etcd_client(
            url, user="root", password="pw", request_timeout=0.3, retry_for=0.3
        ) as client,
    ):
        with pytest.raises(EtcdUnavailableError) as raised:
            await client.request(Txn((), (Put(b"/k", b"v"),)))
    assert f"{url} gave no answer within 0.3 s" in one_line(raised.value)


def test_bad_options_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="request_timeout must be positive, not 0"):
        EtcdClientOptions(endpoints=("127.0.0.1:2379",), request_timeout=0)
    with pytest.raises(ConfigError, match="not an etcd client URL"):
        EtcdClientOptions(endpoints=("ftp://127.0.0.1",))


# --- authentication ---------------------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def auth_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """A member with authentication on: ``root`` (password ``rootpw``) may do anything,
    ``bob`` (``bobpw``) only read and write under ``/other/``. Tokens live one second, so a
    test can see one expire."""
    with running_etcd(tmp_path_factory.mktemp("etcd-auth"), 1, "--auth-token-ttl", "1") as etcd:
        calls = [
            ("/v3/auth/user/add", {"name": "root", "password": "rootpw"}),
            ("/v3/auth/user/grant", {"user": "root", "role": "root"}),
            ("/v3/auth/role/add", {"name": "elsewhere"}),
            (
                "/v3/auth/role/grant",
                {
                    "name": "elsewhere",
                    "perm": {
                        "permType": "READWRITE",
                        "key": b64(b"/other/"),
                        "range_end": b64(b"/other0"),
                    },
                },
            ),
            ("/v3/auth/user/add", {"name": "bob", "password": "bobpw"}),
            ("/v3/auth/user/grant", {"user": "bob", "role": "elsewhere"}),
            ("/v3/auth/enable", {}),
        ]
        with httpx.Client(trust_env=False) as http:
            for path, body in calls:
                reply = http.post(etcd.endpoints[0] + path, json=body)
                assert reply.status_code == 200, (path, reply.text)
        yield etcd


async def test_authentication_on_and_no_user_given(auth_etcd: EtcdCluster) -> None:
    (endpoint,) = auth_etcd.endpoints
    async with open_etcd_client(endpoint) as client:
        with pytest.raises(EtcdAuthError) as raised:
            await client.request(Range(b"/k"))
        async with client.open_watch(Range.prefix(b"/"), 1) as watch:
            with pytest.raises(EtcdAuthError):
                await drain(watch)
    assert one_line(raised.value) == (
        f"etcd at {endpoint} has authentication on and trioha gave no user (etcdserver: user "
        "name is empty); set the etcd user and password trioha should use (docs/etcd.md, "
        "Authentication)"
    )


async def test_a_wrong_password_is_refused_at_once(auth_etcd: EtcdCluster) -> None:
    (endpoint,) = auth_etcd.endpoints
    async with open_etcd_client(endpoint, user="root", password="nope") as client:
        with pytest.raises(EtcdAuthError) as raised:
            await client.request(Range(b"/k"))
        stats = client.statistics()
    assert one_line(raised.value) == (
        f"etcd at {endpoint} refused user 'root' (etcdserver: authentication failed, invalid "
        "user ID or password); check the etcd user and password"
    )
    assert isinstance(raised.value, ConfigError)
    assert stats.retries == 0


async def test_a_user_without_permission_on_the_prefix(auth_etcd: EtcdCluster) -> None:
    (endpoint,) = auth_etcd.endpoints
    async with open_etcd_client(endpoint, user="bob", password="bobpw") as client:
        allowed = await client.request(Txn((), (Put(b"/other/k", b"1"),)))
        assert isinstance(allowed, TxnResponse)
        with pytest.raises(EtcdAuthError) as raised:
            await client.request(Txn((), (Put(b"/trioha/k", b"1"),)))
    assert one_line(raised.value) == (
        f"etcd at {endpoint}: user 'bob' may not POST /v3/kv/txn (etcdserver: permission "
        "denied); grant its role readwrite on trioha's key prefix (etcdctl role "
        "grant-permission ROLE --prefix=true readwrite PREFIX)"
    )


async def test_the_right_user_works_and_an_expired_token_is_renewed(
    auth_etcd: EtcdCluster,
) -> None:
    key = f"/trioha/{uuid.uuid4().hex}".encode()
    async with open_etcd_client(auth_etcd.endpoints, user="root", password="rootpw") as client:
        written = await client.request(Txn((), (Put(key, b"1"),)))
        assert isinstance(written, TxnResponse)
        async with client.open_watch(Range(key), written.revision) as watch:
            with trio.fail_after(60):
                (event,) = await watch.__anext__()
        assert event.kv.value == b"1"
        await trio.sleep(3)  # the token (TTL 1 s) is gone by now
        read = await client.request(Range(key))
        stats = client.statistics()
    assert isinstance(read, RangeResponse)
    assert [kv.value for kv in read.kvs] == [b"1"]
    assert stats.authentications == 2
    assert stats.failures == 0
