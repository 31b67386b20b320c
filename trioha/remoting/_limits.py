"""What a remoting server allows its peers: the rules, with the time passed in.

Three guards keep one peer from shutting everyone else out of a port (docs/operations.md,
"Idle and hostile connections"). RocketMQ's ``NettyRemotingServer`` has only the first
(docs/rocketmq-protocol.md §18):

* ``idle_timeout`` (``serverChannelMaxIdleTimeSeconds``): a connection that moves no byte for
  that long is closed;
* :class:`FrameDeadline`: a frame must arrive within a few seconds plus time for its size,
  counted from its first byte. Without it a peer that sends a length prefix and then one byte
  every few seconds holds its connection for ever, idle timeout or not, since bytes do arrive;
  a few hundred such peers hold every slot of the cap (the "slowloris");
* :class:`ConnectionReserve`: the last slots below ``serverMaxConnections`` are kept for
  addresses holding few connections. Whoever fills the port from one address (or a few)
  then cannot take the rest, and every other client still gets in.

Why a reserve and not a fixed share per address: many legitimate clients often share one
address (a NAT gateway, an application host running many producers, everything on
loopback), and a share would refuse them even on an empty port. The reserve costs nothing
until the port is nearly full, and only then refuses the addresses that hold the most.
"""

from __future__ import annotations

import enum
import ipaddress
import logging
import math
import resource

import attrs

from trioha._config import RemotingServerConfig


def _positive(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be positive, got {value}")


@attrs.frozen
class FrameDeadline:
    """How long one frame may take, from its first byte to its last.

    ``base`` seconds plus its size at ``min_rate`` bytes per second (a frame whose length
    prefix is not complete yet gets ``base``). Only the time the connection spends waiting for
    the peer counts: while the server holds back reading (its own back pressure), the frame's
    clock stops.
    """

    base: float = attrs.field(default=10.0, validator=_positive)
    min_rate: float = attrs.field(default=65536.0, validator=_positive)

    def seconds_for(self, size: int) -> float:
        """The time a frame of *size* bytes (length prefix included; 0: not known yet) gets."""
        return self.base + size / self.min_rate


@attrs.frozen
class SlowFrame:
    """A frame that missed its deadline: what arrived of it, and in how long."""

    size: int  # the frame's size with its length prefix; 0 when the prefix never completed
    received: int
    seconds: float


def address_key(host: str) -> str:
    """The address a connection counts against in :class:`ConnectionReserve`.

    An IPv4 address (an IPv4-mapped IPv6 address too) is itself; an IPv6 address counts as its
    /64 network, which one host usually holds whole (so it cannot pass for many clients).
    Anything else (a placeholder of an in-memory stream) is itself.
    """
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def default_max_connections() -> int:
    """Half the process's soft open-file limit (at least 64): far from it, whatever comes."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 65536
    return max(64, soft // 2)


class Admission(enum.Enum):
    """What :meth:`ConnectionReserve.admit` decides for a new connection."""

    ACCEPT = "accept"
    #: The port holds ``max_connections``: nobody gets in.
    FULL = "full"
    #: Only reserved slots are left, and this address holds too many connections to take one.
    RESERVED = "reserved"


@attrs.frozen
class ConnectionReserve:
    """The last ``percent`` % of a port's cap, kept for addresses holding fewer than
    ``max_per_address`` connections on it (see the module docstring for why)."""

    percent: int = 10
    max_per_address: int = 4

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.percent <= 100:
            raise ValueError(f"the reserve must be 0..100 % of the cap, got {self.percent}")
        if self.max_per_address < 1:
            raise ValueError(f"max_per_address must be positive, got {self.max_per_address}")

    def slots(self, max_connections: int) -> int:
        """How many of *max_connections* are reserved (rounded up, never all of them)."""
        if self.percent == 0:
            return 0
        return min(max_connections - 1, math.ceil(max_connections * self.percent / 100))

    def admit(self, open_connections: int, max_connections: int, held: int) -> Admission:
        """Whether a new connection from an address that already holds *held* gets in."""
        if open_connections >= max_connections:
            return Admission.FULL
        if (
            open_connections >= max_connections - self.slots(max_connections)
            and held >= self.max_per_address
        ):
            return Admission.RESERVED
        return Admission.ACCEPT


@attrs.frozen
class ServerLimits:
    """Everything :func:`~trioha.remoting.serve_remoting` enforces (None: not enforced)."""

    idle_timeout: float | None = None
    max_connections: int | None = None
    frame_deadline: FrameDeadline | None = None
    #: Applies only with ``max_connections``.
    reserve: ConnectionReserve | None = None

    @classmethod
    def from_config(cls, config: RemotingServerConfig) -> ServerLimits:
        """The limits a broker or name server port runs with (its ``server*`` settings)."""
        return cls(
            idle_timeout=config.server_channel_max_idle_time_seconds,
            max_connections=config.server_max_connections or default_max_connections(),
            frame_deadline=FrameDeadline(
                config.server_frame_timeout_seconds, config.server_frame_min_bytes_per_second
            ),
            reserve=ConnectionReserve(
                config.server_connection_reserve_percent,
                config.server_connection_reserve_max_per_address,
            ),
        )


class ThrottledLog:
    """One log line per ``interval`` seconds at most for a recurring event; what it held back
    is counted, and said in the next line it lets through. *now* comes in, so the rule is
    testable without a clock."""

    def __init__(self, logger: logging.Logger, interval: float = 60.0) -> None:
        self._logger = logger
        self.interval = interval
        self._next = -math.inf
        self.held_back = 0

    def log(self, level: int, now: float, message: str, *args: object) -> bool:
        """Log *message* unless a line went out less than ``interval`` ago; True if logged."""
        if now < self._next:
            self.held_back += 1
            return False
        if self.held_back:
            message += " (and %d more like it since the last such line, not logged)"
            args = (*args, self.held_back)
            self.held_back = 0
        self._next = now + self.interval
        self._logger.log(level, message, *args)
        return True
