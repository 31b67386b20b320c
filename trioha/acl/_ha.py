"""An authenticated HA port: TLS and/or a shared secret (trioha's own; off by default).

RocketMQ's HA port is plain TCP with no authentication: whoever connects and sends an offset
receives the commit log from there, and a slave follows whoever answers at its master's
address. With ``ha_tls_enable`` and/or ``ha_auth_secret`` trioha wraps the HA stream at
accept (master) and connect (slave), before the HA protocol sees a byte:

1. TLS, when enabled: the master presents ``ha_tls_cert_path``; the slave verifies it against
   ``ha_tls_trust_cert_path`` when set; with ``ha_tls_need_client_auth`` the master demands a
   slave certificate that verifies against the same trust file.
2. The secret, when set: a challenge in both directions, so neither side ever sends anything
   that would let a stranger pass, and neither side accepts a peer that does not know it::

       master -> slave   MAGIC nonce_m
       slave  -> master  MAGIC nonce_s HMAC-SHA256(secret, "slave"  nonce_m nonce_s)
       master -> slave   HMAC-SHA256(secret, "master" nonce_m nonce_s)

   The master checks the slave's proof before it sends its own. Without TLS this proves who
   is at the other end but does not hide the commit log from an eavesdropper.

A RocketMQ peer cannot connect to a port with either option on (it speaks neither).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import ssl
from collections.abc import Awaitable, Callable

import trio

from trioha._config import BrokerConfig
from trioha._errors import ConfigError
from trioha.acl._guard import LogOnce
from trioha.acl._streams import PrefixedStream, receive_exactly

log = logging.getLogger("trioha.ha.auth")

MAGIC = b"TRIOHA-HA-AUTH/1"
NONCE_SIZE = 16
PROOF_SIZE = 32
#: How long the TLS handshake and the challenge may take.
HANDSHAKE_TIMEOUT = 10.0


def proof(secret: str, role: bytes, nonce_master: bytes, nonce_slave: bytes) -> bytes:
    """What a side sends to show it knows *secret* (*role* is ``b"master"`` or ``b"slave"``)."""
    message = role + nonce_master + nonce_slave
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).digest()


def _server_context(config: BrokerConfig) -> ssl.SSLContext:
    if not config.ha_tls_cert_path or not config.ha_tls_key_path:
        raise ConfigError("ha_tls_enable on a master needs ha_tls_cert_path and ha_tls_key_path")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(config.ha_tls_cert_path, config.ha_tls_key_path)
        if config.ha_tls_need_client_auth:
            if not config.ha_tls_trust_cert_path:
                raise ConfigError("ha_tls_need_client_auth needs ha_tls_trust_cert_path")
            ctx.load_verify_locations(config.ha_tls_trust_cert_path)
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the HA port's TLS files: {exc}") from None
    return ctx


def _client_context(config: BrokerConfig) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False  # the trust file names who may be master, not a host name
    try:
        if config.ha_tls_trust_cert_path:
            ctx.load_verify_locations(config.ha_tls_trust_cert_path)
        else:
            ctx.verify_mode = ssl.CERT_NONE
        if config.ha_tls_cert_path and config.ha_tls_key_path:
            ctx.load_cert_chain(config.ha_tls_cert_path, config.ha_tls_key_path)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the HA port's TLS files: {exc}") from None
    return ctx


class HAAuthError(ConnectionError):
    """The HA peer failed TLS or the secret check (a ``ConnectionError``: the slave's
    reconnect loop treats it as a failed connect and backs off)."""


class HASecurity:
    """Wraps HA streams as the config asks; see the module docstring."""

    def __init__(self, config: BrokerConfig, *, master: bool) -> None:
        self.secret = config.ha_auth_secret
        self.context: ssl.SSLContext | None = None
        if config.ha_tls_enable:
            self.context = _server_context(config) if master else _client_context(config)
        self.refused = 0
        self._log = LogOnce(log)

    @classmethod
    def for_config(cls, config: BrokerConfig, *, master: bool) -> HASecurity | None:
        if not config.ha_tls_enable and not config.ha_auth_secret:
            return None
        return cls(config, master=master)

    # --- master -------------------------------------------------------------------------------
    async def accept(self, stream: trio.abc.Stream, peer: str) -> trio.abc.Stream | None:
        """The authenticated stream of an accepted slave, or None (logged once per peer host)."""
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT):
                return await self._accept(stream)
        except (OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
            self.refused += 1
            reason = str(exc.__cause__ or exc) or "timed out"
            self._log.warning(
                (peer.rsplit(":", 1)[0], type(exc).__name__),
                "HA connection from %s refused: %s",
                peer,
                reason,
            )
            return None

    async def _accept(self, stream: trio.abc.Stream) -> trio.abc.Stream:
        if self.context is not None:
            tls = trio.SSLStream(stream, self.context, server_side=True)
            await tls.do_handshake()
            stream = tls
        if self.secret is None:
            return stream
        nonce_m = os.urandom(NONCE_SIZE)
        await stream.send_all(MAGIC + nonce_m)
        hello, rest = await receive_exactly(
            stream, len(MAGIC) + NONCE_SIZE + PROOF_SIZE, "the HA authentication"
        )
        if not hello.startswith(MAGIC):
            raise HAAuthError("the peer does not speak trioha's HA authentication")
        nonce_s = hello[len(MAGIC) : len(MAGIC) + NONCE_SIZE]
        given = hello[len(MAGIC) + NONCE_SIZE :]
        if not hmac.compare_digest(given, proof(self.secret, b"slave", nonce_m, nonce_s)):
            raise HAAuthError("wrong HA secret")
        await stream.send_all(proof(self.secret, b"master", nonce_m, nonce_s))
        return PrefixedStream(stream, rest) if rest else stream

    # --- slave --------------------------------------------------------------------------------
    def connector(
        self, connect: Callable[[str, int], Awaitable[trio.abc.Stream]]
    ) -> Callable[[str, int], Awaitable[trio.abc.Stream]]:
        """An ``HAClient`` connector: *connect*, then TLS and the challenge."""

        async def secure_connect(host: str, port: int) -> trio.abc.Stream:
            stream = await connect(host, port)
            try:
                return await self._connect(stream)
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise

        return secure_connect

    async def _connect(self, stream: trio.abc.Stream) -> trio.abc.Stream:
        if self.context is not None:
            tls = trio.SSLStream(stream, self.context, server_hostname=None)
            try:
                await tls.do_handshake()
            except trio.BrokenResourceError as exc:
                cause = exc.__cause__ or exc
                raise HAAuthError(f"TLS handshake with the master failed: {cause}") from None
            stream = tls
        if self.secret is None:
            return stream
        try:
            hello, rest = await receive_exactly(
                stream, len(MAGIC) + NONCE_SIZE, "the HA authentication"
            )
            if not hello.startswith(MAGIC) or rest:
                raise HAAuthError("the master does not speak trioha's HA authentication")
            nonce_m, nonce_s = hello[len(MAGIC) :], os.urandom(NONCE_SIZE)
            await stream.send_all(MAGIC + nonce_s + proof(self.secret, b"slave", nonce_m, nonce_s))
            answer, rest = await receive_exactly(stream, PROOF_SIZE, "the HA authentication")
        except trio.BrokenResourceError as exc:
            raise HAAuthError(f"the master closed the HA authentication: {exc}") from None
        if not hmac.compare_digest(answer, proof(self.secret, b"master", nonce_m, nonce_s)):
            raise HAAuthError("the master does not know the HA secret")
        return PrefixedStream(stream, rest) if rest else stream
