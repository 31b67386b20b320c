"""The broker's running figures, as ``StoreStatsService`` and ``BrokerStats`` keep them.

``GET_BROKER_RUNTIME_INFO`` reports these to ``mqadmin`` (``clusterList``, ``brokerStatus``),
which parses several of them (the first number of ``putTps``, ``commitLogDiskRatio``, ...):
they keep RocketMQ's names, units and text formats, Java's ``String.valueOf(double)`` included.

* Counters (puts, put failures, gets found/missed, messages transferred) are cumulative.
* Once a second :meth:`BrokerStats.sample` snapshots them; a TPS over a window of *n* seconds
  is the counter's growth between the newest snapshot and the one *n* snapshots older,
  divided by the time between them (``StoreStatsService.getPutTps(int)``), and is an empty
  string while fewer snapshots exist, as in RocketMQ.
* Put latencies fall into RocketMQ's 13 buckets; ``putMessageDistributeTime`` reports the
  previous minute's, and ``putLatency99``/``putLatency999`` the percentiles of recent puts.
* At local midnight the put and get totals are snapshotted (``BrokerStats.record``) for the
  ``msgPutTotalYesterdayMorning`` family.
"""

from __future__ import annotations

import collections
import datetime
import itertools
import math
import os
import time
from collections.abc import Callable
from typing import NoReturn

import trio

#: ``StoreStatsService.FREQUENCY_OF_SAMPLING`` (ms) and the longest window used (600 s).
SAMPLING_INTERVAL = 1.0
_MAX_SAMPLES = 601
#: The TPS windows ``getPutTps()`` and friends report, in seconds.
TPS_WINDOWS = (10, 60, 600)
#: ``StoreStatsService.PUT_MESSAGE_ENTIRE_TIME_MAX_DESC`` buckets: upper bounds in ms.
_LATENCY_BOUNDS = (0, 10, 50, 100, 200, 500, 1000, 2000, 3000, 4000, 5000, 10000)
_LATENCY_NAMES = (
    "<=0ms",
    "0~10ms",
    "10~50ms",
    "50~100ms",
    "100~200ms",
    "200~500ms",
    "500ms~1s",
    "1~2s",
    "2~3s",
    "3~4s",
    "4~5s",
    "5~10s",
    "10s~",
)
#: Samples (seconds) a group's consume TPS is measured over, and the (group, topic) pairs kept.
_GROUP_WINDOW = 60
_MAX_GROUP_KEYS = 10_000
#: Put latencies kept for the percentiles.
_RECENT_LATENCIES = 10_000


def java_double(value: float) -> str:
    """Java's ``String.valueOf(double)``: ``0.0``, ``12.5``, ``1.2345678E7``, ``NaN``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    magnitude = abs(value)
    if 1e-3 <= magnitude < 1e7:
        text = repr(float(value))
        return text if "." in text else text + ".0"
    mantissa, exponent = f"{value:.17e}".split("e")
    # The shortest mantissa that still reads back as the same double.
    for digits in range(1, 18):
        candidate = f"{value:.{digits - 1}e}"
        if float(candidate) == value:
            mantissa, exponent = candidate.split("e")
            break
    if "." not in mantissa:
        mantissa += ".0"
    return f"{mantissa}E{int(exponent)}"


def human_bytes(count: int) -> str:
    """``MixAll.humanReadableByteCount(bytes, false)``: ``512 B``, ``1.5 GiB``."""
    unit = 1024
    if count < unit:
        return f"{count} B"
    exp = int(math.log(count) / math.log(unit))
    return f"{count / unit**exp:.1f} {'KMGTPE'[exp - 1]}iB"


def runtime_text(ms: int) -> str:
    """``StoreStatsService.getFormatRuntime``: ``[ 0 days, 1 hours, 2 minutes, 3 seconds ]``.

    ``MessageFormat`` writes numbers with grouping separators (``1,234 days``).
    """
    seconds = ms // 1000
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"[ {days:,} days, {hours:,} hours, {minutes:,} minutes, {secs:,} seconds ]"


def disk_capacity_text(path: str) -> str:
    """``DefaultMessageStore``'s ``commitLogDirCapacity``: ``Total : <h>, Free : <h>.``."""
    try:
        st = os.statvfs(path)
    except OSError:
        return "Total : 0 B, Free : 0 B."
    total, free = st.f_blocks * st.f_frsize, st.f_bfree * st.f_frsize
    return f"Total : {human_bytes(total)}, Free : {human_bytes(free)}."


def _latency_bucket(ms: float) -> int:
    if ms <= 0:
        return 0
    for index, bound in enumerate(_LATENCY_BOUNDS[1:], start=1):
        if ms < bound:
            return index
    return len(_LATENCY_BOUNDS)


class BrokerStats:
    """Counters, once-a-second snapshots and daily totals; see the module docstring."""

    def __init__(
        self,
        *,
        puts_total: Callable[[], int],
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self._puts_total = puts_total
        self.wall_ms = wall_ms
        self.boot_timestamp = wall_ms()
        self.put_failed = 0
        self.put_max_ms = 0
        self.get_max_ms = 0
        self.get_found = 0
        self.get_miss = 0
        self.get_transferred = 0
        self._buckets = [0] * len(_LATENCY_NAMES)
        self._last_minute_buckets = [0] * len(_LATENCY_NAMES)
        self._minute = self._minute_of(self.boot_timestamp)
        self._latencies: collections.deque[float] = collections.deque(maxlen=_RECENT_LATENCIES)
        #: (ms, puts, found, miss, transferred) snapshots, oldest first.
        self._samples: collections.deque[tuple[int, int, int, int, int]] = collections.deque(
            maxlen=_MAX_SAMPLES
        )
        #: Messages pulled per (group, topic), and a snapshot of them per sample (a minute's).
        self.group_gets: collections.Counter[tuple[str, str]] = collections.Counter()
        self._group_samples: collections.deque[tuple[int, dict[tuple[str, str], int]]] = (
            collections.deque(maxlen=_GROUP_WINDOW + 1)
        )
        self._day = self._date_of(self.boot_timestamp)
        self.put_yesterday_morning = self.put_today_morning = 0
        self.get_yesterday_morning = self.get_today_morning = 0
        self.sample()

    # --- recording ----------------------------------------------------------------------
    @property
    def put_times_total(self) -> int:
        return self._puts_total()

    def record_put(self, elapsed_ms: float, *, ok: bool, count: int = 1) -> None:
        """*count* send requests answered after ``elapsed_ms`` each, stored or not (*ok*)
        (``setPutMessageEntireTimeMax``, ``putMessageDistributeTime``, the failed puts):
        a burst of sends answered by one wait is *count* requests with one latency."""
        self._roll_minute()
        if not ok:
            self.put_failed += count
        self.put_max_ms = max(self.put_max_ms, math.ceil(elapsed_ms))
        self._buckets[_latency_bucket(elapsed_ms)] += count
        self._latencies.extend(itertools.repeat(elapsed_ms, count))

    def record_get(
        self,
        elapsed_ms: float,
        *,
        found: bool,
        messages: int,
        group_topic: tuple[str, str] | None = None,
    ) -> None:
        """One pull answered (``getMessageTimesTotalFound``/``Miss``, ``TransferedMsgCount``,
        and ``BrokerStatsManager``'s per group and topic ``GROUP_GET_NUMS``)."""
        self.get_max_ms = max(self.get_max_ms, math.ceil(elapsed_ms))
        if found:
            self.get_found += 1
            self.get_transferred += messages
            if group_topic is not None and len(self.group_gets) < _MAX_GROUP_KEYS:
                self.group_gets[group_topic] += messages
        else:
            self.get_miss += 1

    # --- sampling -----------------------------------------------------------------------
    def sample(self) -> None:
        """Take the once-a-second snapshot, and the midnight one when the day changed."""
        now = self.wall_ms()
        puts = self.put_times_total
        self._samples.append((now, puts, self.get_found, self.get_miss, self.get_transferred))
        self._group_samples.append((now, dict(self.group_gets)))
        self._roll_minute()
        day = self._date_of(now)
        if day != self._day:
            self._day = day
            self.put_yesterday_morning, self.put_today_morning = self.put_today_morning, puts
            self.get_yesterday_morning = self.get_today_morning
            self.get_today_morning = self.get_transferred

    async def run(self) -> NoReturn:
        """Sample once a second (``StoreStatsService.run``)."""
        while True:
            await trio.sleep(SAMPLING_INTERVAL)
            self.sample()

    def group_tps(self, group: str, topic: str) -> float:
        """Messages per second pulled by ``group`` from ``topic`` over the last minute
        (``GROUP_GET_NUMS``' ``getStatsDataInMinute().getTps()``)."""
        if len(self._group_samples) < 2:
            return 0.0
        (first_ms, first), (last_ms, last) = self._group_samples[0], self._group_samples[-1]
        if last_ms <= first_ms:
            return 0.0
        key = (group, topic)
        return (last.get(key, 0) - first.get(key, 0)) / (last_ms - first_ms) * 1000

    def _tps(self, column: int, window: int, *, always: bool = False) -> str:
        samples = self._samples
        last = samples[-1]
        if len(samples) > window:
            first = samples[-(window + 1)]
        elif always:
            first = samples[0]
        else:
            return ""
        elapsed = last[0] - first[0]
        if elapsed <= 0:
            return "0.0"
        return java_double((last[column] - first[column]) / elapsed * 1000)

    def _tps_text(self, *columns: int, always: bool = False) -> str:
        parts = []
        for window in TPS_WINDOWS:
            if len(columns) == 1:
                parts.append(self._tps(columns[0], window, always=always))
                continue
            values = [self._tps(c, window, always=always) for c in columns]
            parts.append(java_double(sum(float(v) for v in values)) if all(values) else "")
        return " ".join(parts)

    def _roll_minute(self) -> None:
        minute = self._minute_of(self.wall_ms())
        if minute != self._minute:
            previous = self._buckets if minute == self._minute + 1 else None
            self._last_minute_buckets = previous or [0] * len(_LATENCY_NAMES)
            self._buckets = [0] * len(_LATENCY_NAMES)
            self._minute = minute

    @staticmethod
    def _minute_of(ms: int) -> int:
        return ms // 60_000

    @staticmethod
    def _date_of(ms: int) -> datetime.date:
        return datetime.datetime.fromtimestamp(ms / 1000).date()

    def _percentile(self, fraction: float) -> float:
        if not self._latencies:
            return 0.0
        ordered = sorted(self._latencies)
        return ordered[min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1)]

    # --- reporting ----------------------------------------------------------------------
    def runtime_info(self, *, put_size_total: int) -> dict[str, str]:
        """``StoreStatsService.getRuntimeInfo`` plus ``BrokerStats``' daily totals."""
        self._roll_minute()
        puts = self.put_times_total
        times_total = puts or 1  # RocketMQ reports 1 while nothing was put
        distribute = "".join(
            f"[{name}]:{n} "
            for name, n in zip(_LATENCY_NAMES, self._last_minute_buckets, strict=True)
        )
        return {
            "bootTimestamp": str(self.boot_timestamp),
            "runtime": runtime_text(self.wall_ms() - self.boot_timestamp),
            "putMessageEntireTimeMax": str(self.put_max_ms),
            "getMessageEntireTimeMax": str(self.get_max_ms),
            "putMessageTimesTotal": str(times_total),
            "putMessageFailedTimes": str(self.put_failed),
            "putMessageSizeTotal": str(put_size_total),
            "putMessageAverageSize": java_double(put_size_total / times_total),
            "putMessageDistributeTime": distribute,
            "dispatchMaxBuffer": "0",
            "putTps": self._tps_text(1),
            "getFoundTps": self._tps_text(2),
            "getMissTps": self._tps_text(3),
            "getTransferedTps": self._tps_text(4),
            "getTotalTps": self._tps_text(2, 3, always=True),
            "putLatency99": f"{self._percentile(0.99):.2f}",
            "putLatency999": f"{self._percentile(0.999):.2f}",
            "msgPutTotalYesterdayMorning": str(self.put_yesterday_morning),
            "msgPutTotalTodayMorning": str(self.put_today_morning),
            "msgPutTotalTodayNow": str(puts),
            "msgGetTotalYesterdayMorning": str(self.get_yesterday_morning),
            "msgGetTotalTodayMorning": str(self.get_today_morning),
            "msgGetTotalTodayNow": str(self.get_transferred),
        }
