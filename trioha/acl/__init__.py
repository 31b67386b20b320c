"""Who may do what: RocketMQ's plain ACL, TLS on the remoting ports, an authenticated HA port.

* :mod:`._signature`, :mod:`._permission`, :mod:`._addresses`, :mod:`._plainacl`,
  :mod:`._validator`: sans IO (``AclClientRPCHook``, ``Permission``,
  ``RemoteAddressStrategyFactory``, ``PlainPermissionManager``, ``PlainAccessValidator``);
* :mod:`._guard`: the file watcher, the request guard and the request signer on Trio;
* :mod:`._tls`: ``tls.server.mode`` and friends (``TlsSystemConfig``, ``HandshakeHandler``);
* :mod:`._ha`: trioha's TLS and shared-secret options for the HA port.

See ``docs/security.md``.
"""

from trioha.acl._guard import AclGuard, LogOnce, PlainAcl, RequestSigner
from trioha.acl._ha import HASecurity
from trioha.acl._plainacl import Account, AclTable, load_table
from trioha.acl._signature import sign, sign_fields, signature_matches, signed_content
from trioha.acl._tls import TlsAcceptor, client_context, server_context
from trioha.acl._validator import AccessValidator, Denial, Role

__all__ = [
    "AccessValidator",
    "Account",
    "AclGuard",
    "AclTable",
    "Denial",
    "HASecurity",
    "LogOnce",
    "PlainAcl",
    "RequestSigner",
    "Role",
    "TlsAcceptor",
    "client_context",
    "load_table",
    "server_context",
    "sign",
    "sign_fields",
    "signature_matches",
    "signed_content",
]
