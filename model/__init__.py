"""Exhaustive model checking of trioha's HA replication and automatic failover, over the
production transition code.

The checker explores every reachable state of a small world (one master, one slave, a few
messages, fault budgets) whose protocol steps are :func:`trioha.proto.master_step` and
:func:`trioha.proto.slave_step` themselves, so what it proves is what production runs. The
failover world (``failover-*`` configurations) does the same for a broker group electing its
master through etcd: :func:`trioha.failover.failover_step` against the in-memory etcd's core.
``python -m model --list`` shows the configurations; docs/model.md explains the properties.

    >>> import model
    >>> result = model.check("smoke")
    >>> result.ok
    True
"""

from model._configs import CONFIGS, get
from model._engine import Edge, Goal, Invariant, Probe, Result, Spec, Trace, Violation
from model._failover_configs import FAILOVER_CONFIGS
from model._failover_properties import FailoverSpec
from model._failover_steps import FailoverModel, FKind, FStep
from model._failover_values import FailoverConfig, FailoverFaults, FailoverWorld
from model._properties import HASpec
from model._replay import ReplayMismatch, ReplayResult, fair_tail, random_walk, replay
from model._report import check, render_result, render_trace, verdict
from model._steps import HAModel
from model._values import Config, Conn, Faults, Kind, Step, World

__all__ = [
    "CONFIGS",
    "FAILOVER_CONFIGS",
    "Config",
    "Conn",
    "Edge",
    "FKind",
    "FStep",
    "FailoverConfig",
    "FailoverFaults",
    "FailoverModel",
    "FailoverSpec",
    "FailoverWorld",
    "Faults",
    "Goal",
    "HAModel",
    "HASpec",
    "Invariant",
    "Kind",
    "Probe",
    "ReplayMismatch",
    "ReplayResult",
    "Result",
    "Spec",
    "Step",
    "Trace",
    "Violation",
    "World",
    "check",
    "fair_tail",
    "get",
    "random_walk",
    "render_result",
    "render_trace",
    "replay",
    "verdict",
]
