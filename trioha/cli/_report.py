"""What a running broker logs: a slave's catch-up as progress, otherwise its state lines."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("trioha")


#: Bytes behind the master's end from which a slave reports catch-up progress.
CATCH_UP_BYTES = 1 << 20
#: Seconds between plain status lines (RocketMQ logs 'Slave fall behind master' every 60 s).
REPORT_INTERVAL = 10.0


class BrokerReport:
    """What a running broker logs: a slave's catch-up as progress (bytes, rate, ETA from the
    master's end), otherwise lag or state lines every ``interval`` seconds."""

    def __init__(
        self,
        *,
        interval: float = REPORT_INTERVAL,
        clock: Callable[[], float] | None = None,
        terminal: bool | None = None,
    ) -> None:
        import time

        self.interval = interval
        self.clock = clock or time.monotonic
        self.terminal = terminal
        self.catch_up: Any = None  # a trioha._progress.Progress while catching up
        self._from = 0
        self._last_line = self.clock()

    def tick(self, stats: Any) -> None:
        """Look at one ``statistics()`` snapshot (called about once a second)."""
        client = stats.client
        behind = getattr(client, "behind_bytes", None) if client is not None else None
        if (
            self.catch_up is None
            and behind is not None
            and behind >= CATCH_UP_BYTES
            and client.connected
        ):
            from trioha._progress import Progress

            self._from = stats.max_offset
            self.catch_up = Progress(
                "slave catch-up",
                total=behind,
                unit="B",
                interval=self.interval,
                clock=self.clock,
                terminal=self.terminal,
            )
        if self.catch_up is not None:
            assert client is not None
            master_end = max(client.master_end or 0, stats.max_offset)
            self.catch_up.set(stats.max_offset - self._from, total=master_end - self._from)
            if behind is None or behind < CATCH_UP_BYTES or not client.connected:
                self.catch_up.close()
                self.catch_up = None
                log.info(
                    "slave caught up with master %s at %d"
                    if client.connected
                    else "slave catch-up interrupted (master %s) at %d",
                    client.master,
                    stats.max_offset,
                    extra={"peer": client.master, "offset": stats.max_offset},
                )
            self._last_line = self.clock()
            return
        now = self.clock()
        if now - self._last_line < self.interval:
            return
        self._last_line = now
        self.state_lines(stats)

    def state_lines(self, stats: Any) -> None:
        if stats.ha is not None:
            for slave in stats.ha.slaves:
                log.info(
                    "slave %s acked %d, behind by %d bytes, %.3f s",
                    slave.peer,
                    slave.ack_offset,
                    slave.lag,
                    slave.behind_seconds or 0.0,
                    extra={
                        "peer": slave.peer,
                        "offset": slave.ack_offset,
                        "behind_bytes": slave.lag,
                        "behind_seconds": slave.behind_seconds,
                    },
                )
            if not stats.ha.slaves:
                log.info(
                    "no slave connected; log ends at %d",
                    stats.max_offset,
                    extra={"offset": stats.max_offset},
                )
        elif stats.client is not None and stats.client.fell_behind_master_offset >= 0:
            log.error(
                "not replicating: master %s deleted what this slave needs (its log begins at "
                "%d, this slave's ends at %d); re-seed this slave",
                stats.client.master,
                stats.client.fell_behind_master_offset,
                stats.max_offset,
                extra={"peer": stats.client.master, "reason": "fell_behind"},
            )
        elif stats.client is not None and stats.client.needs_reseed:
            log.error(
                "not replicating: diverged from master %s at %d (this slave holds up to "
                "%d); run `trioha slave --truncate-to-master` or re-seed",
                stats.client.master,
                stats.client.diverged_master_offset,
                stats.client.diverged_slave_offset,
                extra={"peer": stats.client.master, "reason": "diverged"},
            )
        elif stats.client is not None:
            state = "connected to" if stats.client.connected else "waiting for"
            behind = stats.client.behind_bytes
            seconds = getattr(stats.client, "behind_seconds", None)
            tail = "" if behind is None else f", {behind} bytes behind"
            if behind is not None and seconds is not None:
                tail += f" ({seconds:.1f} s)"
            log.info(
                "%s master %s; log ends at %d%s",
                state,
                stats.client.master,
                stats.max_offset,
                tail,
                extra={
                    "peer": stats.client.master,
                    "offset": stats.max_offset,
                    "state": stats.client.state,
                    "behind_bytes": behind,
                    "behind_seconds": seconds,
                },
            )
