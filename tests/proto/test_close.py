"""``CloseKind``: the one table of what a close is counted under and logged at.

Each close is given its kind where it is decided (the core's rules: ``test_state_outcomes``
compares whole ``Close`` actions, kind included; the IO layer: ``tests/net/test_connection``
and ``test_client``). The reasons in the comments are the closes of each kind an operator
reads.
"""

from __future__ import annotations

import logging

import pytest

from trioha.proto import CloseKind

ROWS = [
    # "slave closed the connection", "master closed the connection"
    (CloseKind.PEER_CLOSED, "peer_closed", logging.INFO),
    # "connection broken while reading: reset"
    (CloseKind.BROKEN, "broken", logging.INFO),
    # "nothing read from the slave for 20 s (housekeeping)"
    (CloseKind.TIMEOUT, "timeout", logging.INFO),
    # "slave requests offset 9 but the master's log ends at 4: ... (diverged history or a wrong
    # master)", "master pushed offset 5 but the slave's log ends at 3; nothing appended"
    (CloseKind.DIVERGED, "diverged", logging.WARNING),
    # "slave requests offset 0, which no longer exists on the master (oldest offset 9); ...",
    # "offset 5 was deleted on the master while the slave still needed it"
    (CloseKind.DELETED, "deleted", logging.WARNING),
    # "cannot append 100 bytes at 0: write at 0 failed" (ENOSPC, EIO)
    (CloseKind.DISK, "disk", logging.WARNING),
    # "internal error" (an exception out of the connection), a commit log short read
    (CloseKind.INTERNAL_ERROR, "internal_error", logging.WARNING),
    # "cancelled": still open when the service stopped
    (CloseKind.SHUTDOWN, "shutdown", logging.INFO),
    # an untrusted ack, a report before the handshake, bytes that are not the HA protocol
    (CloseKind.PROTOCOL_ERROR, "protocol_error", logging.WARNING),
    # "cannot connect to master ...": no connection to close, counted with the closes
    (CloseKind.CONNECT_FAILED, "connect_failed", logging.WARNING),
]


@pytest.mark.parametrize(("kind", "category", "level"), ROWS)
def test_each_kind_is_counted_under_one_category_and_logged_at_one_level(
    kind: CloseKind, category: str, level: int
) -> None:
    assert kind.category == category
    assert kind.level == level


def test_every_kind_has_a_row_and_the_categories_are_distinct() -> None:
    assert [row[0] for row in ROWS] == list(CloseKind)
    assert len({row[1] for row in ROWS}) == len(ROWS)
