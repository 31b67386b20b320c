"""The sans-IO master and slave, replicating through partial reads, drops, crashes and lies.

:class:`trioha.testing.ReplicationMachine` holds the rules and invariants (its docstring lists
them); this module runs it with options drawn per run and with a few fixed configurations.
Every failure Hypothesis has found is kept below as an explicit regression test.
"""

from __future__ import annotations

from trioha.testing import ReplicationMachine

TestReplication = ReplicationMachine.TestCase
