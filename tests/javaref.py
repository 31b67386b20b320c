"""Where the Java RocketMQ 4.9.7 reference is, for the optional Java tests and benchmarks.

One environment variable names it: ``TRIOHA_JAVA_ROCKETMQ``, the directory holding its
``rocketmq.sh`` (``namesrv PORT DIR``, ``broker CONF DIR``, ``mqadmin ARGS``, ``classpath``).
Unset, or naming a directory without that script, the Java tests skip and the benchmarks
measure trioha alone, each saying why (:data:`MISSING`).
"""

from __future__ import annotations

import os
from pathlib import Path

#: The one variable the Java tests and benchmarks read.
JAVA_ROCKETMQ = "TRIOHA_JAVA_ROCKETMQ"
#: Why the reference cannot be used, for skip reasons and benchmark lines.
MISSING = f"no Java RocketMQ 4.9.7 reference ({JAVA_ROCKETMQ}: the directory holding rocketmq.sh)"


def java_rocketmq() -> Path | None:
    """The reference's directory, holding ``rocketmq.sh``; None when it is not set up."""
    configured = os.environ.get(JAVA_ROCKETMQ)
    if not configured:
        return None
    home = Path(configured).expanduser()
    return home if (home / "rocketmq.sh").is_file() else None


def rocketmq_sh() -> Path | None:
    """The reference's ``rocketmq.sh``; None when it is not set up."""
    home = java_rocketmq()
    return None if home is None else home / "rocketmq.sh"
