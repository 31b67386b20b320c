"""Real etcd members on this machine, started as a user starts them, for tests and demos.

:func:`start_etcd` runs one member or a cluster of several, each a plain ``etcd`` process (the
Debian ``etcd-server`` package's binary, 3.4) with its client and peer URLs on free ports of
127.0.0.1 and its data directory under a directory the caller owns. Nothing here depends on,
or collides with, an etcd the system may run as a service on 2379/2380: the ports are picked
free, and every cluster has a token of its own, so members of two clusters never join.

What the failover tests, the demo and the nemesis harness need from it:

* start, wait until ready (the member answers ``/v3/maintenance/status`` and knows a leader),
  stop by PID (SIGTERM, then SIGKILL after a bound), kill -9, pause and resume (SIGSTOP and
  SIGCONT), restart on the same data directory;
* which member leads (:meth:`EtcdCluster.leader`, from each member's status);
* a command prefix per member (``("ip", "netns", "exec", "ns1")``) to run it inside a
  network namespace built by the caller, with an address and ports of the caller's choosing.

It is synchronous on purpose: pytest fixtures, a plain script and Trio code (through
``trio.to_thread.run_sync`` for the waits) can all use it. Each process runs in a session of
its own, so signals reach it (and whatever a command prefix forks) and nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import attrs

from trioha._errors import TriohaError
from trioha.etcd._gateway import STATUS_PATH, GatewayFormatError, MemberStatus, decode_status

__all__ = [
    "ETCD_INSTALL_HINT",
    "EtcdCluster",
    "EtcdMember",
    "EtcdMemberError",
    "find_etcd",
    "start_etcd",
]

#: The one line a user without etcd reads: what to install.
ETCD_INSTALL_HINT = (
    "etcd not found: install Debian's etcd-server (apt-get install etcd-server) "
    "or put an etcd 3.4+ binary on PATH"
)

#: How long :meth:`EtcdMember.stop` waits after SIGTERM before SIGKILL.
STOP_GRACE = 10.0


class EtcdMemberError(TriohaError):
    """An etcd member of the harness did not start or become ready; the message carries the
    tail of its log."""


def find_etcd() -> str | None:
    """The etcd binary: ``$TRIOHA_ETCD``, else ``etcd`` on PATH, else Debian's path."""
    named = os.environ.get("TRIOHA_ETCD")
    if named:
        return named if os.access(named, os.X_OK) else None
    found = shutil.which("etcd")
    if found:
        return found
    return "/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@attrs.define
class EtcdMember:
    """One etcd process of an :class:`EtcdCluster`."""

    name: str
    host: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    #: ``name=peer_url,...`` of every member, as ``--initial-cluster`` wants it.
    initial_cluster: str
    cluster_token: str
    etcd: str
    command_prefix: tuple[str, ...] = ()
    extra_args: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None

    @property
    def client_url(self) -> str:
        return f"http://{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def running(self) -> bool:
        """Started and not exited (a paused member is running)."""
        return self.process is not None and self.process.poll() is None

    def command(self) -> list[str]:
        return [
            *self.command_prefix,
            self.etcd,
            "--name",
            self.name,
            "--data-dir",
            str(self.data_dir),
            "--listen-client-urls",
            self.client_url,
            "--advertise-client-urls",
            self.client_url,
            "--listen-peer-urls",
            self.peer_url,
            "--initial-advertise-peer-urls",
            self.peer_url,
            "--initial-cluster",
            self.initial_cluster,
            "--initial-cluster-token",
            self.cluster_token,
            "--initial-cluster-state",
            "new",  # ignored once the data directory holds a member
            "--logger",
            "zap",
            "--log-outputs",
            "stderr",
            *self.extra_args,
        ]

    def start(self) -> None:
        """Start the process (a restart reuses the data directory); does not wait."""
        if self.running:
            raise EtcdMemberError(f"etcd member {self.name} already runs (pid {self.pid})")
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    def _signal(self, sig: signal.Signals) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)

    def stop(self, grace: float = STOP_GRACE) -> None:
        """SIGTERM, then SIGKILL if it has not exited after *grace* seconds; waits for it."""
        if self.process is None:
            return
        self._signal(signal.SIGCONT)  # a paused process cannot act on SIGTERM
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.kill()
        self.process = None

    def kill(self) -> None:
        """SIGKILL now (a crash: no clean shutdown), and reap it."""
        if self.process is None:
            return
        self._signal(signal.SIGKILL)
        self.process.wait()
        self.process = None

    def pause(self) -> None:
        """SIGSTOP: the process holds its sockets and answers nothing, as a hung machine.
        Returns once the kernel shows it stopped (a signal is delivered asynchronously, and
        a request sent in between would still be served)."""
        self._signal(signal.SIGSTOP)
        self._wait_state(stopped=True)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)
        self._wait_state(stopped=False)

    def _wait_state(self, *, stopped: bool, timeout: float = 10.0) -> None:
        if self.process is None:
            return
        stat = Path(f"/proc/{self.process.pid}/stat")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                # "pid (comm) S ...": the state is the first field after the command's ")".
                state = stat.read_text().rpartition(")")[2].split()[0]
            except (OSError, IndexError):
                return  # no /proc (not Linux) or the process is gone
            if (state in ("T", "t")) == stopped:
                return
            time.sleep(0.005)
        raise EtcdMemberError(
            f"etcd member {self.name} (pid {self.process.pid}) did not "
            f"{'stop' if stopped else 'continue'} within {timeout:g} s"
        )

    def restart(self, timeout: float = 30.0) -> None:
        """Stop, start on the same data directory, and wait until it is ready."""
        self.stop()
        self.start()
        self.wait_ready(timeout)

    def status(self, timeout: float = 1.0) -> MemberStatus | None:
        """Its ``/v3/maintenance/status``, or None when it does not answer in *timeout*."""
        request = urllib.request.Request(
            self.client_url + STATUS_PATH,
            data=b"{}",
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with _NO_PROXY.open(request, timeout=timeout) as reply:
                return decode_status(json.loads(reply.read()))
        except (OSError, ValueError, GatewayFormatError):
            return None

    def wait_ready(self, timeout: float = 30.0, *, leader: bool = True) -> MemberStatus:
        """Until the member answers (and, with *leader*, knows of one); its status then."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.running:
                raise EtcdMemberError(self.exited())
            status = self.status()
            if status is not None and (status.leader or not leader):
                return status
            if time.monotonic() >= deadline:
                raise EtcdMemberError(
                    f"etcd member {self.name} at {self.client_url} not ready after "
                    f"{timeout:g} s: {self.log_tail()}"
                )
            time.sleep(0.05)

    def log_tail(self, lines: int = 3) -> str:
        """What its log says went wrong: the last error-like lines, else the last lines."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        all_lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        faults = [line for line in all_lines if _FAULT.search(line)]
        return " | ".join((faults or all_lines)[-lines:]) or "(empty log)"

    def exited(self) -> str:
        code = None if self.process is None else self.process.returncode
        return f"etcd member {self.name} exited (code {code}): {self.log_tail()}"


#: Log lines that say why a member failed (zap's JSON levels, Go's flag and panic messages).
_FAULT = re.compile(
    r'"level":"(error|fatal|panic)"|flag provided but not defined|address already in use|panic:',
    re.IGNORECASE,
)

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@attrs.define
class EtcdCluster:
    """Members started together (:func:`start_etcd`); a context manager that stops them."""

    members: tuple[EtcdMember, ...]

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The client URLs, as :func:`trioha.etcd.open_etcd_client` takes them."""
        return tuple(m.client_url for m in self.members)

    def member(self, name: str) -> EtcdMember:
        for m in self.members:
            if m.name == name:
                return m
        raise KeyError(name)

    def wait_ready(self, timeout: float = 30.0) -> EtcdMember:
        """Until every running member answers and a majority agrees on one leader; it."""
        return self.leader(timeout)

    def leader(self, timeout: float = 10.0) -> EtcdMember:
        """The member a majority of the members names as leader, waiting for an election."""
        deadline = time.monotonic() + timeout
        while True:
            for m in self.members:
                if m.process is not None and not m.running:
                    raise EtcdMemberError(m.exited())
            statuses = {m.name: m.status() for m in self.members if m.running}
            ids = {s.member_id: name for name, s in statuses.items() if s is not None}
            votes: dict[int, int] = {}
            for s in statuses.values():
                if s is not None and s.leader:
                    votes[s.leader] = votes.get(s.leader, 0) + 1
            for leader_id, count in votes.items():
                if count > len(self.members) // 2 and leader_id in ids:
                    return self.member(ids[leader_id])
            if time.monotonic() >= deadline:
                raise EtcdMemberError(
                    f"no etcd leader agreed by a majority after {timeout:g} s (statuses {statuses})"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop every member (SIGTERM, then SIGKILL), each reaped."""
        for m in self.members:
            m.stop()

    def __enter__(self) -> EtcdCluster:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def start_etcd(
    directory: Path,
    size: int = 1,
    *,
    etcd: str | None = None,
    hosts: Sequence[str] | None = None,
    ports: Sequence[tuple[int, int]] | None = None,
    command_prefixes: Sequence[Sequence[str]] | None = None,
    extra_args: Sequence[str] = (),
    timeout: float = 60.0,
    attempts: int = 3,
) -> EtcdCluster:
    """Start *size* etcd members (one cluster) under *directory*, and wait until a leader is
    elected; the running :class:`EtcdCluster`.

    By default each member listens on 127.0.0.1 with a free client port and a free peer port;
    a port taken between the pick and etcd's bind makes the members start again on new ports
    (up to *attempts* times). *hosts*, *ports* (``(client, peer)`` per member) and
    *command_prefixes* (one per member, e.g. ``("ip", "netns", "exec", "ns1")``) place
    members elsewhere, such as in network namespaces the caller built.
    """
    binary = etcd or find_etcd()
    if binary is None:
        raise EtcdMemberError(ETCD_INSTALL_HINT)
    if size < 1:
        raise ValueError(f"an etcd cluster has at least one member, not {size}")
    for given, what in ((hosts, "hosts"), (ports, "ports"), (command_prefixes, "prefixes")):
        if given is not None and len(given) != size:
            raise ValueError(f"{len(given)} {what} for {size} etcd members")
    last: EtcdMemberError | None = None
    for attempt in range(attempts):
        cluster = _members(
            directory / f"etcd-{attempt}" if attempt else directory,
            size,
            binary=binary,
            hosts=hosts or ["127.0.0.1"] * size,
            ports=ports,
            command_prefixes=command_prefixes,
            extra_args=tuple(extra_args),
        )
        try:
            for m in cluster.members:
                m.start()
            cluster.wait_ready(timeout)
            return cluster
        except BaseException as e:
            cluster.stop()
            if not isinstance(e, EtcdMemberError):
                raise
            last = e
            if ports is not None or "address already in use" not in str(e):
                raise
    assert last is not None
    raise last


def _members(
    directory: Path,
    size: int,
    *,
    binary: str,
    hosts: Sequence[str],
    ports: Sequence[tuple[int, int]] | None,
    command_prefixes: Sequence[Sequence[str]] | None,
    extra_args: tuple[str, ...],
) -> EtcdCluster:
    directory.mkdir(parents=True, exist_ok=True)
    names = [f"etcd{i}" for i in range(1, size + 1)]
    chosen = list(ports) if ports is not None else [(_free_port(h), _free_port(h)) for h in hosts]
    initial = ",".join(
        f"{name}=http://{host}:{peer}"
        for name, host, (_, peer) in zip(names, hosts, chosen, strict=True)
    )
    token = f"trioha-{uuid.uuid4().hex[:12]}"
    return EtcdCluster(
        tuple(
            EtcdMember(
                name=name,
                host=host,
                client_port=client,
                peer_port=peer,
                data_dir=directory / f"{name}.etcd",
                log_path=directory / f"{name}.log",
                initial_cluster=initial,
                cluster_token=token,
                etcd=binary,
                command_prefix=tuple(command_prefixes[i]) if command_prefixes else (),
                extra_args=extra_args,
            )
            for i, (name, host, (client, peer)) in enumerate(zip(names, hosts, chosen, strict=True))
        )
    )
