"""Hypothesis profiles and the autojump clock for the whole test suite.

* ``dev`` (the default): every local ``pytest`` run; fast enough to run on every change.
* ``ci``: ``tasks.py test`` selects it when the ``CI`` environment variable is set. Ten times
  the examples and twice the steps of ``dev``, derandomized so that a CI failure reproduces
  from the same commit, and still a few minutes for the whole suite.
* ``nightly``: ``pytest --hypothesis-profile=nightly``; a hundred times ``dev``'s examples and
  four times its stateful steps. Runs for many minutes; meant to be left alone.

Deadlines are off everywhere: a slow example on a shared machine is not a bug, and the
protocol tests measure behaviour, never speed. ``HYPOTHESIS_PROFILE`` picks a profile when
pytest's option is not at hand (a test file run some other way).

``autojump_clock`` replaces pytest-trio's fixture of that name with ``tests.clock``'s
``thread_aware_autojump_clock``, which does not jump time while a worker thread runs.
"""

from __future__ import annotations

import os

import pytest
import trio.testing
from hypothesis import HealthCheck, settings

from tests.clock import thread_aware_autojump_clock

settings.register_profile(
    "dev",
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
)
settings.register_profile(
    "ci",
    max_examples=1000,
    stateful_step_count=100,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "nightly",
    max_examples=10_000,
    stateful_step_count=200,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    """pytest-trio's autojump clock, minus its jumps while a worker thread runs."""
    return thread_aware_autojump_clock()
