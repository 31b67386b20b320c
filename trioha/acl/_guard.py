"""The ACL on a running server: the file watcher, the request guard, the request signer.

* :class:`PlainAcl` holds the loaded table and reloads it when a file changes
  (``AclFileWatchService``: RocketMQ polls every 5 s; so does :meth:`PlainAcl.watch`). A
  reload that fails keeps the previous table and logs why: a typo in the file never opens the
  server.
* :class:`AclGuard` wraps a server's :class:`~trioha.remoting.RequestHandler` and runs the
  check before every request, as RocketMQ's RPC hook does (``BrokerController.initialAcl``);
  a refusal is logged once per client address and reason. The requests it allows in a read
  go on to the guarded handler's bursts, so a broker with ACL on takes its sends together
  as one without.
* :class:`RequestSigner` signs outgoing requests (``AclClientRPCHook``).
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NoReturn

import attrs
import trio

from trioha._errors import ConfigError
from trioha.acl._plainacl import AclTable, acl_files, load_table
from trioha.acl._signature import sign_fields
from trioha.acl._validator import AccessValidator, Denial, Role, client_ip
from trioha.remoting import (
    Burst,
    RemotingCommand,
    RemotingConnection,
    RequestHandler,
    ResponseCode,
)

log = logging.getLogger("trioha.acl")

#: ``AclFileWatchService``: 5 s between looks at the files.
WATCH_INTERVAL = 5.0
#: Distinct (client, reason) pairs remembered for log de-duplication.
LOGGED_MAX = 4096


def file_stamps(paths: Iterable[str | Path]) -> tuple[tuple[str, int, int], ...]:
    """Path, modification time and size of each file (-1s for a missing one): what the
    watchers compare to notice a file added, removed or changed."""
    out = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append((str(path), -1, -1))
        else:
            out.append((str(path), st.st_mtime_ns, st.st_size))
    return tuple(out)


class PlainAcl:
    """The ACL files of one server, loaded (:meth:`load`) and kept current (:meth:`watch`)."""

    def __init__(self, main_file: str | Path) -> None:
        self.path = Path(main_file).expanduser()
        self.table = AclTable()
        self.reloads = 0
        self.last_error: str | None = None
        self._stamp: tuple[tuple[str, int, int], ...] = ()

    @classmethod
    def load(cls, main_file: str | Path) -> PlainAcl:
        """Load now; :class:`ConfigError` if the main file is missing, unreadable or invalid."""
        acl = cls(main_file)
        if not acl.path.is_file():
            raise ConfigError(f"ACL is enabled but the ACL file {acl.path} does not exist")
        files = acl_files(acl.path)
        acl._stamp = file_stamps(files)
        acl.table = load_table(files)
        log.info(
            "ACL loaded from %s: %d accounts, %d global white patterns",
            ", ".join(acl.table.files),
            len(acl.table.accounts),
            len(acl.table.global_white),
        )
        return acl

    def reload_if_changed(self) -> bool:
        """Reload when a file was added, removed or changed; True if a new table is in use."""
        files = acl_files(self.path)
        stamp = file_stamps(files)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            table = load_table(files)
        except ConfigError as exc:
            self.last_error = str(exc)
            log.error("ACL files changed but cannot be loaded; keeping the previous ones: %s", exc)
            return False
        self.table = table
        self.reloads += 1
        self.last_error = None
        log.info("ACL reloaded: %d accounts", len(table.accounts))
        return True

    async def watch(self, interval: float = WATCH_INTERVAL) -> NoReturn:
        while True:
            await trio.sleep(interval)
            await trio.to_thread.run_sync(self.reload_if_changed)

    def validator(self, role: Role) -> AccessValidator:
        return _LiveValidator(self, role)

    def secret_of(self, access_key: str) -> str | None:
        account = self.table.accounts.get(access_key)
        return None if account is None else account.secret_key


class _LiveValidator(AccessValidator):
    """An :class:`AccessValidator` that always decides with its :class:`PlainAcl`'s newest table."""

    def __init__(self, acl: PlainAcl, role: Role) -> None:
        super().__init__(acl.table, role)
        self._acl = acl

    def check(self, request: RemotingCommand, peer: str) -> Denial | None:
        self.table = self._acl.table
        return super().check(request, peer)


class LogOnce:
    """Logs a warning the first time a key is seen (a bounded memory of recent keys), so a
    client retrying a refused request does not flood the log."""

    def __init__(self, logger: logging.Logger, size: int = LOGGED_MAX) -> None:
        self._logger = logger
        self._size = size
        self._seen: OrderedDict[object, None] = OrderedDict()

    def warning(self, key: object, message: str, *args: object) -> bool:
        if key in self._seen:
            self._seen.move_to_end(key)
            return False
        self._seen[key] = None
        if len(self._seen) > self._size:
            self._seen.popitem(last=False)
        self._logger.warning(message, *args)
        return True


@attrs.frozen
class GuardStatistics:
    allowed: int
    denied: int


class AclGuard:
    """A :class:`RequestHandler` that checks each request before *handler* sees it."""

    def __init__(self, handler: RequestHandler, validator: AccessValidator) -> None:
        self.handler = handler
        self.validator = validator
        self.allowed = 0
        self.denied = 0
        self._log = LogOnce(log)

    async def handle_request(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand | None:
        denial = self.validator.check(request, connection.peer)
        if denial is None:
            self.allowed += 1
            return await self.handler.handle_request(request, connection)
        self.denied += 1
        self._log.warning(
            (client_ip(connection.peer), denial.message),
            "%s refused request code %d from %s: %s (not logged again for this client and reason)",
            self.validator.role.value,
            request.code,
            connection.peer,
            denial.message,
        )
        return request.response(ResponseCode.SYSTEM_ERROR, denial.remark)

    def take_burst(
        self, requests: Sequence[RemotingCommand], connection: RemotingConnection
    ) -> Burst | None:
        """The guarded handler's burst among the requests this guard allows.

        A refused request is left to :meth:`handle_request`, which answers and logs it as
        for any request; so is an allowed one the handler does not take, which is checked
        again there (a read mixing sends with other requests is rare; a producer's reads are
        its sends).
        """
        check, peer = self.validator.check, connection.peer
        allowed = [request for request in requests if check(request, peer) is None]
        if not allowed:
            return None
        burst = self.handler.take_burst(allowed, connection)
        if burst is not None:
            self.allowed += len(burst.requests)
        return burst

    def statistics(self) -> GuardStatistics:
        return GuardStatistics(allowed=self.allowed, denied=self.denied)


@attrs.frozen
class RequestSigner:
    """``AclClientRPCHook``: adds ``AccessKey`` and ``Signature`` to each outgoing request."""

    access_key: str
    secret_key: str = attrs.field(repr=False)
    security_token: str | None = attrs.field(default=None, repr=False)

    def __call__(self, request: RemotingCommand) -> RemotingCommand:
        fields = sign_fields(
            request.ext_fields,
            request.body,
            access_key=self.access_key,
            secret_key=self.secret_key,
            security_token=self.security_token,
        )
        return attrs.evolve(request, ext_fields=fields)
