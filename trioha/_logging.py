"""Log output for the ``trioha`` command: plain lines for people, JSON lines for machines.

``--log-format json`` writes one JSON object per line with ``time`` (UTC, ISO 8601 with
milliseconds), ``level``, ``logger``, ``message`` and every structured field the call passed in
``extra=`` (``peer``, ``offset``, ``reason``, ...), so a log pipeline can filter on them without
parsing prose. An exception's traceback goes in ``exc``.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any, Final, TextIO

FORMATS: Final = ("text", "json")

#: What every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD: Final = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
        out: dict[str, Any] = {
            "time": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def configure_logging(
    *, verbose: bool = False, fmt: str = "text", stream: TextIO | None = None
) -> None:
    """Send trioha's logs (and everything else's) to *stream* (stderr) in *fmt*."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter(
                "%(asctime)s %(levelname)-7s %(name)s: %(message)s", datefmt="%H:%M:%S"
            )
        )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    # httpx (the etcd client's HTTP) logs every request at INFO; the failover control plane
    # makes several a second. Its warnings and errors still show.
    logging.getLogger("httpx").setLevel(logging.WARNING)
