"""An etcd v3 client on Trio, over etcd's JSON gateway, for the failover control plane.

The failover core (:mod:`trioha.failover`) asks for requests as values and wants replies as
values; this client carries them to a real etcd and back (:mod:`._gateway` does the JSON), and
turns everything that can go wrong between the two into an error an operator can act on.

Why the JSON gateway and httpx: etcd's gRPC API needs a gRPC stack that runs on asyncio or
threads, none on Trio; its gateway speaks plain HTTP/1.1, which httpx speaks on Trio (through
httpcore's Trio backend). Every call the failover core needs is there, including the two
streams: a keepalive is one POST answered once, a watch is one POST answered by a
newline-delimited stream of batches.

What a caller can rely on
=========================

* **Endpoints.** Requests go to the current endpoint; a connection failure, a timeout or a
  member without a leader moves the client on to the next one (and it stays there while it
  answers).
* **What is retried.** A request is sent again, to the next endpoint and after a backoff with
  full jitter, while ``retry_for`` seconds have not passed, but only when that cannot apply it
  twice: a read, a lease call (see :func:`._gateway.writes`), or any request that provably
  never reached etcd (the connection was refused, or etcd refused it before doing anything:
  no leader, too many requests, an expired token). A request that writes and may have
  reached etcd raises :class:`~trioha._errors.EtcdOutcomeUnknownError` at once; its caller
  reads the keys to learn whether it landed. The failover core treats both the same way (a
  :class:`~trioha.failover.Failed` event) and never assumes either outcome.
* **Leaders.** Every call carries gRPC's ``hasleader`` metadata (clientv3's
  ``WithRequireLeader``): a member cut off from the majority refuses at once instead of
  waiting, and a watch on it is cancelled, so the client moves to a member that can answer.
* **Answers.** etcd's refusals of the request itself (a missing lease, a compacted revision)
  come back as :class:`~trioha.failover.EtcdError` values, as the core expects them; faults of
  the set-up raise: :class:`~trioha._errors.EtcdUnavailableError` (nothing answered),
  :class:`~trioha._errors.EtcdNoQuorumError` (members answer, none has a leader),
  :class:`~trioha._errors.EtcdEndpointError` (something that is not etcd answers),
  :class:`~trioha._errors.EtcdAuthError` (credentials missing, refused, or not allowed), each
  one line naming the endpoints and what to do.
* **Watches** (:meth:`EtcdClient.open_watch`) reconnect by themselves, to the next endpoint
  after a backoff, and resume from the revision after the last event delivered, so a caller
  sees every event once, in order, across reconnects. A member that stops answering (paused,
  cut off) is noticed by a status probe beside the stream. If etcd compacted the history the
  watch needs, the watch raises :class:`~trioha._errors.EtcdCompactedError`: read the keys
  again and watch from there.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, assert_never, overload
from urllib.parse import urlsplit

import attrs
import httpx
import trio

from trioha._errors import (
    ConfigError,
    CoordinatorError,
    EtcdAuthError,
    EtcdCompactedError,
    EtcdEndpointError,
    EtcdNoQuorumError,
    EtcdOutcomeUnknownError,
    EtcdUnavailableError,
)
from trioha.etcd._gateway import (
    AUTHENTICATE_PATH,
    STATUS_PATH,
    WATCH_PATH,
    ClientRequest,
    ClientResponse,
    GatewayFormatError,
    MemberStatus,
    Refusal,
    classify,
    decode,
    decode_status,
    decode_watch,
    encode,
    gateway_error,
    parse_lines,
    refusal_value,
    watch_create,
    writes,
)
from trioha.failover import (
    DeleteRange,
    DeleteRangeResponse,
    EtcdError,
    LeaseGrant,
    LeaseGrantResponse,
    LeaseKeepAlive,
    LeaseKeepAliveResponse,
    LeaseRevoke,
    LeaseRevokeResponse,
    Put,
    PutResponse,
    Range,
    RangeResponse,
    Request,
    Response,
    Txn,
    TxnResponse,
    WatchEvent,
)

__all__ = [
    "EtcdClient",
    "EtcdClientOptions",
    "EtcdClientStatistics",
    "EtcdWatch",
    "backoff_delay",
    "open_etcd_client",
    "parse_endpoints",
]

log = logging.getLogger("trioha.etcd")

DEFAULT_PORT = 2379

#: gRPC metadata through the gateway: fail at once on a member without a leader.
_HEADERS = {"Grpc-Metadata-Hasleader": "true"}


def parse_endpoints(endpoints: str | Sequence[str]) -> tuple[str, ...]:
    """etcd client URLs from a comma-separated string or a list: ``http://host:port``;
    ``host:port`` and ``host`` are taken as http (and port 2379), as etcdctl takes them."""
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    out: list[str] = []
    for raw in items:
        text = raw.strip()
        if not text:
            continue
        url = text if "://" in text else f"http://{text}"
        try:
            parts = urlsplit(url)
            port = parts.port or DEFAULT_PORT
        except ValueError as e:
            raise ConfigError(f"etcd endpoint {text!r} is not a URL: {e}") from None
        if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/"):
            raise ConfigError(
                f"etcd endpoint {text!r} is not an etcd client URL like http://127.0.0.1:2379 "
                "(plain http, a host, no path)"
            )
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        normal = f"http://{host}:{port}"
        if normal not in out:
            out.append(normal)
    if not out:
        raise ConfigError("no etcd endpoint given (e.g. http://127.0.0.1:2379)")
    return tuple(out)


def _positive(instance: Any, attribute: attrs.Attribute[float], value: float) -> None:
    if not value > 0:
        raise ConfigError(f"etcd client option {attribute.name} must be positive, not {value}")


@attrs.frozen
class EtcdClientOptions:
    """How the client talks to etcd. Times are seconds."""

    endpoints: tuple[str, ...] = attrs.field(converter=parse_endpoints)
    #: etcd user and password, when etcd has authentication on (docs/etcd.md).
    user: str = ""
    password: str = attrs.field(default="", repr=False)
    #: One attempt: connect, send, and the whole answer.
    request_timeout: float = attrs.field(default=2.0, validator=_positive)
    #: How long a call keeps starting new attempts (each to the next endpoint) before it
    #: gives up; the first round over every endpoint is always made.
    retry_for: float = attrs.field(default=5.0, validator=_positive)
    #: Backoff between rounds: full jitter up to base x 2^round, capped.
    backoff_base: float = attrs.field(default=0.05, validator=_positive)
    backoff_cap: float = attrs.field(default=1.0, validator=_positive)
    #: A watch asks its member's status this often; no answer (or no leader) reconnects.
    probe_interval: float = attrs.field(default=2.0, validator=_positive)


def backoff_delay(round_: int, base: float, cap: float, rng: random.Random) -> float:
    """Full jitter (AWS's "Exponential Backoff and Jitter"): uniform in [0, min(cap, base x 2^n)].

    Members that all lost their leader at once are asked again at spread-out times, not in
    lockstep.
    """
    return rng.uniform(0.0, min(cap, base * 2.0 ** min(round_, 32)))


@attrs.frozen
class EtcdClientStatistics:
    """A snapshot of the client (``statistics()``, Trio style)."""

    #: The endpoint requests go to now.
    endpoint: str
    endpoints: tuple[str, ...]
    #: Calls made (a call may take several attempts).
    requests: int
    #: Calls that raised (unavailable, no quorum, unknown outcome, misconfigured).
    failures: int
    #: Attempts beyond each call's first.
    retries: int
    #: The last failure, one line ("" before any).
    last_error: str
    #: Watches open now, and how often they reconnected in all.
    watches: int
    watch_reconnects: int
    #: Tokens obtained (etcd with authentication on): one, plus one per expired token.
    authentications: int = 0


@attrs.frozen
class _Attempt:
    """What one attempt on one endpoint came to, when it brought no answer."""

    endpoint: str
    #: "refused", "timeout", "lost", "no leader", "busy", "not etcd", "maybe"
    kind: str
    detail: str
    #: False when the request provably did not reach etcd's state machine.
    maybe_applied: bool

    def describe(self) -> str:
        return f"{self.endpoint} {self.detail}"


class EtcdClient:
    """One etcd cluster, reached through its endpoints. Made by :func:`open_etcd_client`."""

    def __init__(
        self, http: httpx.AsyncClient, options: EtcdClientOptions, rng: random.Random
    ) -> None:
        self.options = options
        self._http = http
        self._rng = rng
        self._current = 0
        self._token: str | None = None  # None: not authenticated yet; "": auth is off
        self._auth_lock = trio.Lock()
        self._requests = 0
        self._failures = 0
        self._retries = 0
        self._last_error = ""
        self._watches = 0
        self._watch_reconnects = 0
        self._authentications = 0

    @property
    def endpoint(self) -> str:
        return self.options.endpoints[self._current]

    def statistics(self) -> EtcdClientStatistics:
        return EtcdClientStatistics(
            endpoint=self.endpoint,
            endpoints=self.options.endpoints,
            requests=self._requests,
            failures=self._failures,
            retries=self._retries,
            last_error=self._last_error,
            watches=self._watches,
            watch_reconnects=self._watch_reconnects,
            authentications=self._authentications,
        )

    # --- unary calls --------------------------------------------------------------------------

    @overload
    async def request(self, request: Txn) -> TxnResponse | EtcdError: ...
    @overload
    async def request(self, request: Range) -> RangeResponse | EtcdError: ...
    @overload
    async def request(self, request: Put) -> PutResponse | EtcdError: ...
    @overload
    async def request(self, request: DeleteRange) -> DeleteRangeResponse | EtcdError: ...
    @overload
    async def request(self, request: LeaseGrant) -> LeaseGrantResponse | EtcdError: ...
    @overload
    async def request(self, request: LeaseKeepAlive) -> LeaseKeepAliveResponse | EtcdError: ...
    @overload
    async def request(self, request: LeaseRevoke) -> LeaseRevokeResponse | EtcdError: ...
    @overload
    async def request(self, request: Request) -> Response: ...
    @overload
    async def request(self, request: ClientRequest) -> ClientResponse: ...
    async def request(self, request: ClientRequest) -> ClientResponse:
        """Send *request*; etcd's answer as a value (an :class:`EtcdError` when etcd refused
        what it asked). Raises the errors listed in the module docstring."""
        self._requests += 1
        path, body = encode(request)
        try:
            reply = await self._call(path, body, writes=writes(request))
        except CoordinatorError as e:
            self._failures += 1
            self._last_error = str(e)
            raise
        if isinstance(reply, EtcdError):
            return reply
        try:
            return decode(request, reply)
        except GatewayFormatError as e:
            self._failures += 1
            error = EtcdEndpointError(
                f"{self.endpoint} answered POST {path} with something etcd does not send "
                f"({e}); give etcd's client URL (etcd 3.4 or newer)"
            )
            self._last_error = str(error)
            raise error from None

    async def member_status(self, endpoint: str | None = None) -> MemberStatus:
        """One member's view of itself (answered without consensus): its id, the leader it
        knows of (0: none), its revision. One attempt, on *endpoint* (the current one)."""
        target = endpoint or self.endpoint
        outcome = await self._attempt(target, STATUS_PATH, {}, writes=False, leader=False)
        if isinstance(outcome, _Attempt):
            raise EtcdUnavailableError(f"etcd status: {outcome.describe()}")
        if isinstance(outcome, EtcdError):
            raise EtcdUnavailableError(f"etcd status at {target}: {outcome.message}")
        try:
            return decode_status(outcome)
        except GatewayFormatError as e:
            raise EtcdEndpointError(
                f"{target} answered POST {STATUS_PATH} with something etcd does not send ({e})"
            ) from None

    async def _call(self, path: str, body: dict[str, Any], *, writes: bool) -> Any:
        """Attempts over the endpoints until one answers, as the module docstring says."""
        options = self.options
        give_up_at = trio.current_time() + options.retry_for
        round_ = 0
        attempts = 0
        last: dict[str, _Attempt] = {}
        while True:
            for _ in options.endpoints:
                if round_ > 0 and trio.current_time() >= give_up_at:
                    break
                endpoint = self.endpoint
                if attempts:
                    self._retries += 1
                attempts += 1
                outcome = await self._attempt(endpoint, path, body, writes=writes)
                if not isinstance(outcome, _Attempt):
                    if last:
                        log.warning(
                            "etcd: %s answers POST %s after %s",
                            endpoint,
                            path,
                            "; ".join(f.describe() for f in last.values()),
                        )
                    return outcome
                last[endpoint] = outcome
                log.debug("etcd %s: %s", path, outcome.describe())
                if outcome.maybe_applied and writes:
                    raise EtcdOutcomeUnknownError(
                        f"etcd at {endpoint} {outcome.detail} to POST {path}, which writes: it "
                        "may or may not have been applied, so it is not sent again; read the "
                        "keys to learn which"
                    )
                self._next_endpoint(endpoint)
            if trio.current_time() >= give_up_at:
                raise self._summary(path, list(last.values()))
            delay = backoff_delay(round_, options.backoff_base, options.backoff_cap, self._rng)
            await trio.sleep(min(delay, max(0.0, give_up_at - trio.current_time())))
            round_ += 1

    def _next_endpoint(self, failed: str) -> None:
        if self.endpoint == failed and len(self.options.endpoints) > 1:
            self._current = (self._current + 1) % len(self.options.endpoints)

    def _summary(self, path: str, failures: list[_Attempt]) -> Exception:
        """The one error that says best why nothing answered."""
        tried = "; ".join(f.describe() for f in failures)
        waited = f"(tried for {self.options.retry_for:g} s)"
        for f in failures:
            if f.kind == "not etcd":
                return EtcdEndpointError(
                    f"{f.endpoint} is not etcd: {f.detail}; give etcd's client URL (etcd 3.4 or "
                    "newer, e.g. http://127.0.0.1:2379)"
                )
        if any(f.kind == "no leader" for f in failures):
            return EtcdNoQuorumError(
                f"etcd has no quorum: {tried} {waited}; a majority of etcd's members must be "
                "up and reach each other: start the stopped ones or mend the network "
                "(etcdctl endpoint status --cluster shows each member)"
            )
        return EtcdUnavailableError(
            f"etcd unavailable for POST {path}: {tried} {waited}; check that etcd runs there "
            "and that these are its client URLs (--advertise-client-urls)"
        )

    async def _attempt(
        self,
        endpoint: str,
        path: str,
        body: dict[str, Any],
        *,
        writes: bool,
        leader: bool = True,
    ) -> dict[str, Any] | EtcdError | _Attempt:
        """One POST to one endpoint: the reply object, etcd's refusal, or why there was none.

        An expired token is renewed and the request sent once more (etcd refused it before
        doing anything). Auth faults raise at once: no other endpoint would answer otherwise.
        """
        for _ in range(2):
            token = await self._authenticate(endpoint)
            if isinstance(token, _Attempt):
                # Whatever became of the authentication, the request itself was not sent.
                return attrs.evolve(token, maybe_applied=False)
            outcome = await self._post(endpoint, path, body, token=token, leader=leader)
            if isinstance(outcome, _Attempt):
                return outcome
            status, objects = outcome
            first = objects[0]
            error = gateway_error(first)
            if error is None:
                if status != 200:
                    return _not_etcd(endpoint, path, status, json.dumps(first))
                return first
            code, message = error
            refusal = classify(code, message)
            match refusal:
                case Refusal.ANSWER:
                    return refusal_value(message)
                case Refusal.NO_LEADER:
                    return _Attempt(endpoint, "no leader", "answers without a leader", False)
                case Refusal.BUSY:
                    return _Attempt(endpoint, "busy", f"is too busy ({message})", False)
                case Refusal.MAYBE:
                    return _Attempt(endpoint, "maybe", f"answered {message!r}", True)
                case Refusal.TOKEN:
                    self._token = None
                    continue
                case Refusal.AUTH_MISSING | Refusal.AUTH_OFF:
                    raise EtcdAuthError(
                        f"etcd at {endpoint} has authentication on and trioha gave no user "
                        f"({message}); set the etcd user and password trioha should use "
                        "(docs/etcd.md, Authentication)"
                    )
                case Refusal.AUTH_FAILED:
                    raise EtcdAuthError(
                        f"etcd at {endpoint} refused user {self.options.user!r} ({message}); "
                        "check the etcd user and password"
                    )
                case Refusal.PERMISSION:
                    raise EtcdAuthError(
                        f"etcd at {endpoint}: user {self.options.user!r} may not POST {path} "
                        f"({message}); grant its role readwrite on trioha's key prefix "
                        "(etcdctl role grant-permission ROLE --prefix=true readwrite PREFIX)"
                    )
                case _:
                    assert_never(refusal)
        return _Attempt(endpoint, "refused", "refused a renewed auth token twice", False)

    async def _post(
        self,
        endpoint: str,
        path: str,
        body: dict[str, Any],
        *,
        token: str,
        leader: bool = True,
    ) -> tuple[int, list[dict[str, Any]]] | _Attempt:
        headers = dict(_HEADERS) if leader else {}
        if token:
            headers["Authorization"] = token
        timeout = self.options.request_timeout
        response: httpx.Response | None = None
        with trio.move_on_after(timeout):
            try:
                response = await self._http.post(endpoint + path, json=body, headers=headers)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as e:
                return _Attempt(endpoint, "refused", _connect_failure(e), False)
            except httpx.TimeoutException:
                pass
            except httpx.TransportError as e:
                return _Attempt(endpoint, "lost", f"lost the connection ({_reason(e)})", True)
        if response is None:
            return _Attempt(endpoint, "timeout", f"gave no answer within {timeout:g} s", True)
        try:
            return response.status_code, parse_lines(response.text)
        except GatewayFormatError:
            return _not_etcd(endpoint, path, response.status_code, response.text, response)

    async def _authenticate(self, endpoint: str) -> str | _Attempt:
        """The token to send ("" without a user, or when etcd has authentication off)."""
        if not self.options.user:
            return ""
        async with self._auth_lock:
            if self._token is not None:
                return self._token
            body = {"name": self.options.user, "password": self.options.password}
            outcome = await self._post(endpoint, AUTHENTICATE_PATH, body, token="")
            if isinstance(outcome, _Attempt):
                return outcome
            status, objects = outcome
            error = gateway_error(objects[0])
            if error is None:
                token = objects[0].get("token")
                if status != 200 or not isinstance(token, str) or not token:
                    return _not_etcd(endpoint, AUTHENTICATE_PATH, status, json.dumps(objects[0]))
                self._token = token
                self._authentications += 1
                return token
            code, message = error
            refusal = classify(code, message)
            if refusal is Refusal.AUTH_OFF:
                log.warning(
                    "etcd at %s has authentication off; user %r is not used",
                    endpoint,
                    self.options.user,
                )
                self._token = ""
                return ""
            if refusal in (Refusal.NO_LEADER, Refusal.BUSY, Refusal.MAYBE):
                # Authenticating goes through consensus in etcd 3.4: the same faults apply.
                kind = "no leader" if refusal is Refusal.NO_LEADER else "busy"
                return _Attempt(endpoint, kind, f"could not authenticate ({message})", False)
            raise EtcdAuthError(
                f"etcd at {endpoint} refused user {self.options.user!r} ({message}); "
                "check the etcd user and password"
            )

    # --- watches ------------------------------------------------------------------------------

    @asynccontextmanager
    async def open_watch(
        self, watched: Range, start_revision: int, *, buffer: int = 64
    ) -> AsyncIterator[EtcdWatch]:
        """Watch *watched* from *start_revision* (inclusive): ``async for events in watch``
        gives each batch etcd sends (a tuple of events, one or more revisions, in order).

        The watch reconnects by itself and resumes after the last revision it delivered; it
        raises from the iteration only what reconnecting cannot cure: a compacted start
        (:class:`EtcdCompactedError`), an auth fault, or something that is not etcd.
        """
        if start_revision <= 0:
            raise ValueError(f"a watch starts at revision 1 or later, not {start_revision}")
        send, receive = trio.open_memory_channel[tuple[WatchEvent, ...] | Exception](buffer)
        watch = EtcdWatch(receive, start_revision)
        self._watches += 1
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._run_watch, watched, watch, send)
                try:
                    yield watch
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            self._watches -= 1

    async def _run_watch(
        self,
        watched: Range,
        watch: EtcdWatch,
        send: trio.MemorySendChannel[tuple[WatchEvent, ...] | Exception],
    ) -> None:
        async with send:
            round_ = 0
            while True:
                endpoint = self.endpoint
                try:
                    connected = await self._stream_watch(endpoint, watched, watch, send)
                except (EtcdCompactedError, EtcdAuthError, EtcdEndpointError) as e:
                    await send.send(e)
                    return
                if connected:
                    round_ = 0
                self._watch_reconnects += 1
                if self.endpoint == endpoint and len(self.options.endpoints) > 1:
                    self._current = (self._current + 1) % len(self.options.endpoints)
                delay = backoff_delay(
                    round_, self.options.backoff_base, self.options.backoff_cap, self._rng
                )
                round_ += 1
                await trio.sleep(delay)

    async def _stream_watch(
        self,
        endpoint: str,
        watched: Range,
        watch: EtcdWatch,
        send: trio.MemorySendChannel[tuple[WatchEvent, ...] | Exception],
    ) -> bool:
        """One watch stream on *endpoint*, until it ends or fails; whether it was created."""
        token = await self._authenticate(endpoint)
        if isinstance(token, _Attempt):
            log.debug("etcd watch: %s", token.describe())
            return False
        headers = dict(_HEADERS)
        if token:
            headers["Authorization"] = token
        body = watch_create(watched, watch.next_revision)
        timeout = httpx.Timeout(self.options.request_timeout, read=None)
        created = False
        fatal: CoordinatorError | None = None
        async with trio.open_nursery() as nursery:
            # The probe watches the member for the whole attempt: a paused member accepts the
            # connection and then sends nothing, not even the response's headers.
            nursery.start_soon(self._probe, endpoint, nursery.cancel_scope)
            try:
                async with self._http.stream(
                    "POST", endpoint + WATCH_PATH, json=body, headers=headers, timeout=timeout
                ) as response:
                    if response.status_code != 200:
                        text = (await response.aread()).decode("utf-8", "replace")
                        self._watch_refused(endpoint, response, text)
                    else:
                        async for line in response.aiter_lines():
                            if not line.strip():
                                continue
                            message = self._watch_message(endpoint, line)
                            if message is None:
                                break
                            if message.created:
                                created = True
                                if watch.reconnects:
                                    log.info(
                                        "etcd watch resumed at %s from revision %d",
                                        endpoint,
                                        watch.next_revision,
                                    )
                            if message.canceled:
                                self._watch_cancelled(endpoint, watched, watch, message)
                                break
                            if message.events:
                                # Before handing them over: the reader may look at once.
                                watch.next_revision = message.events[-1].revision + 1
                                await send.send(message.events)
                            elif message.progress:
                                watch.next_revision = max(watch.next_revision, message.revision + 1)
            except httpx.TransportError as e:
                log.debug("etcd watch at %s: %s", endpoint, _reason(e))
            except (EtcdCompactedError, EtcdAuthError, EtcdEndpointError) as e:
                fatal = e  # raised below, outside the nursery (not as a group)
            finally:
                watch.reconnects += 1
                nursery.cancel_scope.cancel()
        if fatal is not None:
            raise fatal
        return created

    def _watch_message(self, endpoint: str, line: str) -> Any:
        try:
            (body,) = parse_lines(line)
            error = gateway_error(body)
            if error is not None:
                code, message = error
                self._raise_auth(endpoint, classify(code, message), message, WATCH_PATH)
                log.debug("etcd watch at %s ended: %s", endpoint, message)
                return None
            return decode_watch(body)
        except GatewayFormatError as e:
            raise EtcdEndpointError(
                f"{endpoint} sent a watch stream etcd does not send ({e}); give etcd's "
                "client URL (etcd 3.4 or newer)"
            ) from None

    def _watch_refused(self, endpoint: str, response: httpx.Response, text: str) -> None:
        try:
            objects = parse_lines(text)
        except GatewayFormatError:
            raise EtcdEndpointError(
                _not_etcd(endpoint, WATCH_PATH, response.status_code, text, response).detail
            ) from None
        error = gateway_error(objects[0])
        if error is None:
            raise EtcdEndpointError(
                _not_etcd(endpoint, WATCH_PATH, response.status_code, text, response).detail
            )
        code, message = error
        refusal = classify(code, message)
        if refusal is Refusal.TOKEN:
            self._token = None
        self._raise_auth(endpoint, refusal, message, WATCH_PATH)
        log.debug("etcd watch at %s refused: %s", endpoint, message)

    def _watch_cancelled(
        self, endpoint: str, watched: Range, watch: EtcdWatch, message: Any
    ) -> None:
        if message.compact_revision:
            raise EtcdCompactedError(
                f"etcd at {endpoint} compacted its history up to revision "
                f"{message.compact_revision}, past the watch's revision {watch.next_revision} "
                f"on {watched.key!r}: read the keys again and watch from the read's revision + 1",
                compact_revision=message.compact_revision,
            )
        reason = message.cancel_reason
        self._raise_auth(endpoint, classify(0, reason), reason, WATCH_PATH)
        log.debug("etcd watch at %s cancelled: %s", endpoint, reason)

    def _raise_auth(self, endpoint: str, refusal: Refusal, message: str, path: str) -> None:
        if refusal in (Refusal.AUTH_MISSING, Refusal.AUTH_FAILED, Refusal.PERMISSION):
            who = f"user {self.options.user!r}" if self.options.user else "no user"
            raise EtcdAuthError(
                f"etcd at {endpoint} refused POST {path} with {who} ({message}); set an etcd "
                "user and password allowed to read and write trioha's key prefix (docs/etcd.md)"
            )

    async def _probe(self, endpoint: str, stream: trio.CancelScope) -> None:
        """End the watch stream when its member stops answering or loses its leader: a paused
        or cut-off member keeps the TCP connection open and sends nothing."""
        while True:
            await trio.sleep(self.options.probe_interval)
            try:
                status = await self.member_status(endpoint)
            except CoordinatorError as e:
                log.info("etcd watch at %s: status probe failed (%s); reconnecting", endpoint, e)
                stream.cancel()
                return
            if status.leader == 0:
                log.info("etcd watch at %s: member has no leader; reconnecting", endpoint)
                stream.cancel()
                return


class EtcdWatch:
    """An open watch: iterate it for batches of events (see :meth:`EtcdClient.open_watch`)."""

    def __init__(
        self,
        receive: trio.MemoryReceiveChannel[tuple[WatchEvent, ...] | Exception],
        start_revision: int,
    ) -> None:
        self._receive = receive
        #: The revision the watch resumes from if it reconnects now.
        self.next_revision = start_revision
        #: Streams that ended (by a fault, a restart of the member, a probe) and were reopened.
        self.reconnects = 0

    def __aiter__(self) -> EtcdWatch:
        return self

    async def __anext__(self) -> tuple[WatchEvent, ...]:
        try:
            item = await self._receive.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        if isinstance(item, Exception):
            raise item
        return item


@asynccontextmanager
async def open_etcd_client(
    endpoints: str | Sequence[str],
    *,
    user: str = "",
    password: str = "",
    request_timeout: float = 2.0,
    retry_for: float = 5.0,
    backoff_base: float = 0.05,
    backoff_cap: float = 1.0,
    probe_interval: float = 2.0,
    seed: int | None = None,
) -> AsyncIterator[EtcdClient]:
    """A client for the etcd cluster at *endpoints*; its connections close on exit.

    Opening connects nowhere: the first request finds out whether etcd is there. *seed* makes
    the backoff's jitter repeatable.
    """
    options = EtcdClientOptions(
        endpoints=endpoints,
        user=user,
        password=password,
        request_timeout=request_timeout,
        retry_for=retry_for,
        backoff_base=backoff_base,
        backoff_cap=backoff_cap,
        probe_interval=probe_interval,
    )
    http = httpx.AsyncClient(
        # No proxy from the environment (an http_proxy would swallow loopback endpoints),
        # and no retries inside httpx: this client decides what may be sent again.
        trust_env=False,
        transport=httpx.AsyncHTTPTransport(retries=0),
        timeout=httpx.Timeout(request_timeout),
        limits=httpx.Limits(max_keepalive_connections=8, keepalive_expiry=30.0),
    )
    async with http:
        yield EtcdClient(http, options, random.Random(seed))


def _connect_failure(error: httpx.HTTPError) -> str:
    if isinstance(error, httpx.ConnectTimeout):
        return f"did not accept a connection within the timeout ({_reason(error)})"
    causes = list(_os_errors(error))
    if any(isinstance(c, ConnectionRefusedError) for c in causes):
        return "refused the connection (nothing listens there)"
    return f"could not be reached ({_reason(causes[-1] if causes else error)})"


def _os_errors(error: BaseException) -> Iterator[OSError]:
    """The OS errors under an httpx error (httpcore wraps them, Trio groups them per address)."""
    seen: set[int] = set()
    todo: list[BaseException] = [error]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError):
            yield e
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)
        for nxt in (e.__cause__, e.__context__):
            if nxt is not None:
                todo.append(nxt)


def _reason(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return " ".join(text.split())


def _not_etcd(
    endpoint: str,
    path: str,
    status: int,
    text: str,
    response: httpx.Response | None = None,
) -> _Attempt:
    kind = response.headers.get("content-type", "no content type") if response else "JSON"
    sample = " ".join(text.split())[:60]
    return _Attempt(
        endpoint,
        "not etcd",
        f"answered POST {path} with HTTP {status} ({kind}: {sample!r}), not etcd's v3 JSON gateway",
        False,
    )
