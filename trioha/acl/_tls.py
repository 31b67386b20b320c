"""TLS on the remoting ports as RocketMQ 4.9.7 offers it (docs/rocketmq-protocol.md §13).

* :func:`server_context` / :func:`client_context` build stdlib ``ssl`` contexts from the
  RocketMQ settings (``tls.server.*``, ``tls.client.*``).
* :class:`TlsAcceptor` is what a server runs on each accepted socket before any remoting
  byte, as RocketMQ's ``HandshakeHandler``: it looks at the first byte. ``0x16`` (a TLS
  handshake record, the start of a ClientHello) means TLS: the socket is wrapped in a
  ``trio.SSLStream``. Anything else is plaintext (a remoting frame starts with its length,
  whose first byte is 0 for any frame up to 16 MiB): kept in ``permissive`` mode, closed in
  ``enforcing`` mode. ``disabled`` needs no acceptor.

The certificate, key and trust files are looked at again (at most once a second, when a
client connects) and the context rebuilt when one changed; open connections keep theirs.

Differences from RocketMQ (docs/security.md): no throwaway self-signed certificate is made
(``tls.test.mode.enable`` is ignored): without a certificate a TLS client is refused; and a
client certificate can only be asked for together with a trust store to verify it against
(the stdlib cannot accept an unverified client certificate).
"""

from __future__ import annotations

import logging
import math
import ssl
from collections.abc import Awaitable, Callable

import trio

from trioha._config import BrokerConfig
from trioha._errors import ConfigError
from trioha.acl._guard import LogOnce, file_stamps
from trioha.acl._streams import PrefixedStream

log = logging.getLogger("trioha.tls")

#: First byte of a TLS record of type handshake.
TLS_HANDSHAKE = 0x16
#: How long an accepted socket may stay silent before its first byte (RocketMQ's idle limit for
#: a server channel, ``serverChannelMaxIdleTimeSeconds``: 120 s).
FIRST_BYTE_TIMEOUT = 120.0
#: How long the TLS handshake may take once the ClientHello has begun.
HANDSHAKE_TIMEOUT = 10.0

#: The certificate files are looked at, on an accept, at most this often.
RELOAD_CHECK_INTERVAL = 1.0

StreamWrapper = Callable[[trio.SocketStream], Awaitable[trio.abc.Stream | None]]


def _load_chain(ctx: ssl.SSLContext, cert: str, key: str | None, password: str | None) -> None:
    try:
        ctx.load_cert_chain(cert, key, password)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS certificate {cert} / key {key}: {exc}") from None


def _load_trust(ctx: ssl.SSLContext, path: str) -> None:
    try:
        ctx.load_verify_locations(path)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS trust certificates {path}: {exc}") from None


def server_context(config: BrokerConfig) -> ssl.SSLContext | None:
    """The server side context, or None when no certificate is configured."""
    if config.tls_server_mode == "disabled":
        return None
    if not config.tls_server_cert_path or not config.tls_server_key_path:
        if config.tls_server_mode == "enforcing":
            raise ConfigError(
                "tls.server.mode=enforcing needs tls.server.certPath and tls.server.keyPath"
            )
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _load_chain(
        ctx, config.tls_server_cert_path, config.tls_server_key_path, config.tls_server_key_password
    )
    need = config.tls_server_need_client_auth
    if need != "none":
        if not (config.tls_server_auth_client and config.tls_server_trust_cert_path):
            raise ConfigError(
                f"tls.server.need.client.auth={need} needs tls.server.authClient=true and "
                "tls.server.trustCertPath: trioha verifies every client certificate it asks for"
            )
        ctx.verify_mode = ssl.CERT_REQUIRED if need == "require" else ssl.CERT_OPTIONAL
    if config.tls_server_auth_client and config.tls_server_trust_cert_path:
        _load_trust(ctx, config.tls_server_trust_cert_path)
    return ctx


def client_context(config: BrokerConfig) -> ssl.SSLContext | None:
    """The context of this broker's own requests when ``tls.enable`` is set, else None."""
    if not config.tls_enable:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False  # RocketMQ checks the chain, never the host name
    if config.tls_client_auth_server:
        if not config.tls_client_trust_cert_path:
            raise ConfigError("tls.client.authServer=true needs tls.client.trustCertPath")
        _load_trust(ctx, config.tls_client_trust_cert_path)
    else:
        ctx.verify_mode = ssl.CERT_NONE
    if config.tls_client_cert_path:
        _load_chain(
            ctx,
            config.tls_client_cert_path,
            config.tls_client_key_path,
            config.tls_client_key_password,
        )
    return ctx


class TlsAcceptor:
    """Sniffs each accepted socket and wraps it in TLS or refuses it (see the module doc)."""

    def __init__(
        self,
        mode: str,
        context: ssl.SSLContext | None,
        *,
        what: str,
        reload: Callable[[], ssl.SSLContext | None] | None = None,
        watched: tuple[str, ...] = (),
    ) -> None:
        if mode not in {"permissive", "enforcing"}:
            raise ConfigError(f"TlsAcceptor needs mode permissive or enforcing, got {mode!r}")
        self.mode = mode
        self.context = context
        self.what = what
        self.reloads = 0
        self._reload = reload
        self._watched = watched
        self._stamp = file_stamps(watched)
        self._checked = -math.inf
        self.tls = 0
        self.plaintext = 0
        self.refused = 0
        self._log = LogOnce(log)

    @classmethod
    def for_config(cls, config: BrokerConfig, *, what: str) -> TlsAcceptor | None:
        """The acceptor the config asks for; None when there is nothing to sniff for.

        That is ``disabled``, and ``permissive`` without a certificate: a ClientHello then
        fails the frame decoder's length check (0x16... is far above 16 MiB) and the
        connection is closed, which is what the acceptor would do, at no cost per connection.
        """
        context = server_context(config)
        if config.tls_server_mode == "disabled" or context is None:
            return None
        watched = (
            config.tls_server_cert_path,
            config.tls_server_key_path,
            config.tls_server_trust_cert_path,
        )
        return cls(
            config.tls_server_mode,
            context,
            what=what,
            reload=lambda: server_context(config),
            watched=tuple(p for p in watched if p),
        )

    def reload_if_changed(self) -> bool:
        """Rebuild the context when a certificate, key or trust file changed (as RocketMQ's
        ``FileWatchService`` does); open connections keep their session. A file that does not
        load leaves the previous context in use."""
        stamp = file_stamps(self._watched)
        if stamp == self._stamp or self._reload is None:
            return False
        self._stamp = stamp
        try:
            context = self._reload()
        except ConfigError as exc:
            log.error(
                "%s: TLS files changed but cannot be loaded; keeping the old ones: %s",
                self.what,
                exc,
            )
            return False
        self.context = context
        self.reloads += 1
        log.info("%s: TLS certificate reloaded", self.what)
        return True

    async def __call__(self, stream: trio.SocketStream) -> trio.abc.Stream | None:
        peer = _peer(stream)
        now = trio.current_time()
        if now - self._checked >= RELOAD_CHECK_INTERVAL:
            self._checked = now
            self.reload_if_changed()
        host = peer.rsplit(":", 1)[0]  # refusals are logged once per client address
        try:
            with trio.fail_after(FIRST_BYTE_TIMEOUT):
                first = await stream.receive_some(65536)
        except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError):
            log.debug("%s: %s sent nothing", self.what, peer)
            return None
        if not first:
            return None
        if first[0] != TLS_HANDSHAKE:
            if self.mode == "enforcing":
                self.refused += 1
                self._log.warning(
                    (host, "plaintext"),
                    "%s: plaintext connection from %s refused (tls.server.mode=enforcing)",
                    self.what,
                    peer,
                )
                return None
            self.plaintext += 1
            return PrefixedStream(stream, first)
        if self.context is None:
            self.refused += 1
            self._log.warning(
                (host, "no-cert"),
                "%s: TLS connection from %s refused: no tls.server.certPath/keyPath",
                self.what,
                peer,
            )
            return None
        tls = trio.SSLStream(PrefixedStream(stream, first), self.context, server_side=True)
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT):
                await tls.do_handshake()
        except trio.TooSlowError:
            log.debug("%s: %s did not finish the TLS handshake", self.what, peer)
            return None
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.refused += 1
            self._log.warning(
                (host, "handshake"),
                "%s: TLS handshake with %s failed: %s",
                self.what,
                peer,
                exc.__cause__ or exc,
            )
            return None
        self.tls += 1
        return tls


def _peer(stream: trio.abc.Stream) -> str:
    sock = getattr(stream, "socket", None)
    try:
        host, port = sock.getpeername()[:2] if sock is not None else ("<stream>", 0)
    except OSError:
        return "<unconnected>"
    return f"{host}:{port}"
