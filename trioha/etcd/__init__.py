"""etcd on Trio: the failover control plane's client, and real etcd members to run it against.

* :func:`open_etcd_client` / :class:`EtcdClient`: etcd's v3 API over its JSON gateway, with
  :mod:`trioha.failover`'s request and reply values (``await client.request(Txn(...))``),
  several endpoints, timeouts, retries only where they are safe, and watches that reconnect
  and resume (:meth:`EtcdClient.open_watch`); docs/etcd.md;
* :mod:`._gateway`: the JSON mapping itself, sans IO;
* :func:`start_etcd` / :class:`EtcdCluster` / :class:`EtcdMember`: one etcd member or a
  cluster as processes on free loopback ports (or in network namespaces), for the tests, the
  failover demo and the nemesis harness.

The failover core (:mod:`trioha.failover`) never imports this package: it stays sans IO.
"""

from trioha.etcd._client import (
    EtcdClient,
    EtcdClientOptions,
    EtcdClientStatistics,
    EtcdWatch,
    backoff_delay,
    open_etcd_client,
    parse_endpoints,
)
from trioha.etcd._gateway import (
    ClientRequest,
    ClientResponse,
    GatewayFormatError,
    MemberStatus,
    WatchMessage,
    decode,
    decode_status,
    decode_watch,
    encode,
    watch_create,
)
from trioha.etcd._members import (
    ETCD_INSTALL_HINT,
    EtcdCluster,
    EtcdMember,
    EtcdMemberError,
    find_etcd,
    start_etcd,
)

__all__ = [
    "ETCD_INSTALL_HINT",
    "ClientRequest",
    "ClientResponse",
    "EtcdClient",
    "EtcdClientOptions",
    "EtcdClientStatistics",
    "EtcdCluster",
    "EtcdMember",
    "EtcdMemberError",
    "EtcdWatch",
    "GatewayFormatError",
    "MemberStatus",
    "WatchMessage",
    "backoff_delay",
    "decode",
    "decode_status",
    "decode_watch",
    "encode",
    "find_etcd",
    "open_etcd_client",
    "parse_endpoints",
    "start_etcd",
    "watch_create",
]
