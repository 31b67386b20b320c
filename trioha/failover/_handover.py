"""The operator's side of a handover: what may be asked, and the transaction that asks it.

``python -m trioha failover-elect`` (RocketMQ's ``mqadmin electMaster``) hands the master role
of a group to a chosen member on purpose. The master does the work (``_core``: it fences
itself, waits until the target holds its whole log, then releases the master key to it);
the command only checks that the request makes sense, as far as etcd shows, and writes it.
Both are pure functions of the group's :class:`~trioha.failover._view.GroupView`, so the
command, the tests and the model write the same request.
"""

from __future__ import annotations

from trioha.failover._etcd import Compare, Put, Range, Txn
from trioha.failover._keys import GroupKeys, Handover, HandoverState
from trioha.failover._view import GroupView

__all__ = ["handover_refusal", "handover_txn"]


def handover_refusal(keys: GroupKeys, view: GroupView, target: int) -> str:
    """Why a handover to broker *target* cannot be asked for now ("" when it can).

    The master judges the request again when it sees it (the set may change meanwhile);
    these are the refusals etcd's keys already show. A target that is the master already is
    not refused here: there is nothing to do, and the caller says so.
    """
    where = keys.prefix.decode()
    master = view.master
    if not (master.present or view.epoch.present or view.live()):
        return (
            f"group {where} not found in etcd (no master, epoch or broker under it): check "
            "brokerClusterName, brokerName and failoverEtcdRoot"
        )
    if not master.present:
        return (
            f"group {where} has no master (the master key is vacant: an election is due, or "
            "no SyncStateSet member is alive)"
        )
    if master.current is None:
        return f"the master key cannot be read ({master.error})"
    registered = sorted(view.live())
    if target not in registered:
        return (
            f"broker {target} is not registered in group {where} (unknown id, not running, "
            f"or cut off from etcd); registered: {registered}"
        )
    sss = view.sss.current
    if sss is None:
        return f"the SyncStateSet cannot be read ({view.sss.error or 'absent'})"
    if target not in sss.members:
        return (
            f"broker {target} is not in the SyncStateSet {sorted(sss.members)}: it may not "
            "hold every acknowledged message; wait until it has caught up and joined"
        )
    pending = view.handover.current
    if pending is not None and pending.state is not HandoverState.REFUSED:
        return (
            f"a handover to broker {pending.target} is already {pending.state.value} (epoch "
            f"{pending.epoch})"
        )
    return ""


def handover_txn(
    keys: GroupKeys, view: GroupView, target: int, *, lease: int, timeout_ms: int
) -> Txn:
    """Ask the master *view* names to hand over to *target*: the ``handover`` key, bound to
    the requester's *lease* (an abandoned request goes with it), written only while the
    master key is still that master's (its fencing token) and the key is as *view* saw it
    (a refused request from before is overwritten)."""
    master = view.master
    record = master.current
    assert record is not None, "handover_refusal first"
    request = Handover(target, record.epoch, HandoverState.REQUESTED, timeout_ms)
    old = view.handover
    compares = (
        Compare.created_at(keys.master, master.create_revision),
        Compare.modified_at(keys.handover, old.mod_revision)
        if old.present
        else Compare.absent(keys.handover),
    )
    return Txn(
        compares,
        (Put(keys.handover, request.encode(), lease),),
        (Range.prefix(keys.prefix),),
    )
