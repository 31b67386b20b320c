"""Named failover worlds: the ones that must pass, and the known-bad twins that must fail.

Every name starts with ``failover`` (``python -m model --list`` shows them with the others).
Each twin turns exactly one part of the design off (docs/failover.md says why each part is
there) and must fail on the property named, with a short trace; the state count of every
passing one is pinned in ``tests/model/test_configs.py``.
"""

from __future__ import annotations

from typing import Any

import attrs

from model._failover_values import FailoverConfig, FailoverFaults
from trioha.failover import Unsafe

_BASE = FailoverConfig(name="failover", doc="")


def _config(name: str, doc: str, **changes: Any) -> FailoverConfig:
    return attrs.evolve(_BASE, name=name, doc=doc, **changes)


FAILOVER_CONFIGS: dict[str, FailoverConfig] = {
    c.name: c
    for c in (
        # --- must pass ------------------------------------------------------------------------
        _config(
            "failover-smoke",
            "2 brokers, 2 puts, SyncStateSet {1, 2}; broker 1 master at epoch 1; one power cut "
            "(the unflushed tail lost) at any moment. A second.",
            faults=FailoverFaults(crashes=1),
            liveness_bound=6,
        ),
        _config(
            "failover-ci",
            "2 brokers, 2 puts, SyncStateSet {1, 2}; broker 1 master at epoch 1; a power cut "
            "and a pause past the lease, each at any moment. At least 10^5 states; the default "
            "test run.",
            faults=FailoverFaults(crashes=1, pauses=1),
            liveness_bound=9,
        ),
        _config(
            "failover-network",
            "2 brokers, 1 put; messages to and from etcd lost, duplicated and delivered in "
            "any order, a watch batch delivered again after newer news, and a data-plane "
            "link broken.",
            messages=1,
            faults=FailoverFaults(losses=1, duplicates=1, stale_watches=1, links=1),
            liveness_bound=2,
        ),
        _config(
            "failover-late-keepalive",
            "2 brokers, 1 put; a keepalive's reply travels like any message, so a pause or a "
            "cut can hold it up after etcd renewed the lease: the deadline must count from "
            "when it was sent.",
            messages=1,
            keepalive_replies_travel=True,
            faults=FailoverFaults(pauses=1, cuts=1),
            liveness_bound=15,
        ),
        _config(
            "failover-min-in-sync",
            "2 brokers, 1 put, minInSyncReplicas 2: a master alone may not acknowledge; a cut "
            "and a pause shrink the set.",
            min_in_sync_replicas=2,
            messages=1,
            faults=FailoverFaults(pauses=1, cuts=1),
            liveness_bound=12,
        ),
        _config(
            "failover-bootstrap",
            "2 brokers start on an empty etcd: the first election, with one power cut.",
            messages=1,
            initial_sss=(),
            faults=FailoverFaults(crashes=1),
            liveness_bound=9,
        ),
        _config(
            "failover-handover",
            "2 brokers, 1 put; an operator asks the master to hand its role to broker 2 at any "
            "moment (failover-elect), with a power cut at any moment: the master fences, "
            "waits one tick for broker 2 to catch up, then releases the key or refuses.",
            messages=1,
            faults=FailoverFaults(crashes=1, handovers=1),
            liveness_bound=8,
        ),
        # --- known-bad twins: each fails on its property --------------------------------------
        _config(
            "failover-twin-ack-any",
            "allAckInSyncStateSet=false (RocketMQ's default): a put needs minInSyncReplicas "
            "copies, not every member; a member without it is elected.",
            all_ack_in_sync_state_set=False,
            messages=1,
            faults=FailoverFaults(crashes=1),
            expect="NoAckedWriteLost",
        ),
        _config(
            "failover-twin-unclean",
            "enableElectUncleanMaster=true: with the set's only member gone, a broker outside "
            "it is elected without the acknowledged writes.",
            enable_elect_unclean_master=True,
            initial_sss=(1,),
            messages=1,
            faults=FailoverFaults(crashes=1),
            expect="NoAckedWriteLost",
        ),
        _config(
            "failover-twin-no-token",
            "SyncStateSet changes compare only the set's mod_revision, not the master key's "
            "create_revision: a change sent in an earlier term lands in a later one.",
            unsafe=Unsafe(sss_without_token=True),
            initial_sss=(1,),
            messages=0,
            faults=FailoverFaults(cuts=1, stale_watches=1),
            expect="SSSSuperset",
        ),
        _config(
            "failover-twin-no-fence",
            "A master keeps acknowledging after its lease deadline (no self-fence).",
            unsafe=Unsafe(no_self_fence=True),
            messages=1,
            faults=FailoverFaults(cuts=1),
            expect="OneAckingMasterPerEpoch",
        ),
        _config(
            "failover-twin-high-watermark",
            "A reconnecting slave cuts its log to the last confirm offset it heard of (a high "
            "watermark, as Kafka did before KIP-101) instead of the epochs' consistent point.",
            truncate_to_high_watermark=True,
            messages=1,
            faults=FailoverFaults(links=1, crashes=1),
            expect="NoAckedWriteLost",
        ),
        _config(
            "failover-twin-expand-no-union",
            "While an expansion is pending the master waits only for the old set.",
            unsafe=Unsafe(expand_without_union=True),
            initial_sss=(1,),
            messages=1,
            faults=FailoverFaults(pauses=1),
            expect="SSSSuperset",
        ),
        _config(
            "failover-twin-min-in-sync-early",
            "minInSyncReplicas checked only before the append (RocketMQ's check): the set "
            "shrinks while a put waits, and it completes with one copy.",
            min_in_sync_before_append_only=True,
            min_in_sync_replicas=2,
            messages=1,
            faults=FailoverFaults(cuts=1),
            expect="PutOkHasMinCopies",
        ),
        _config(
            "failover-twin-ack-unflushed",
            "A slave acknowledges what it wrote, not what it flushed (ha_slave_ack_flushed "
            "off); a power cut takes an acknowledged write from it, and it is elected.",
            ack_flushed=False,
            messages=1,
            faults=FailoverFaults(crashes=2),
            expect="NoAckedWriteLost",
        ),
    )
}
