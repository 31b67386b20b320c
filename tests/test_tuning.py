"""tune_gc_for_serving changes the process it runs in, so it is tried in a child process."""

from __future__ import annotations

import subprocess
import sys


def test_gc_tuning_freezes_startup_objects_and_raises_the_young_threshold() -> None:
    code = (
        "import gc, trioha._tuning as t; t.tune_gc_for_serving(); "
        "print(gc.get_threshold(), gc.get_freeze_count() > 1000, gc.isenabled())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split("\n")[0]
    assert out == "(50000, 20, 100) True True"


def test_importing_trioha_leaves_the_collector_alone() -> None:
    code = "import gc, trioha, trioha.broker; print(gc.get_threshold(), gc.get_freeze_count())"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()
    assert out == "(700, 10, 10) 0"
