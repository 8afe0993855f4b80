"""The order in which the cycle serves ClusterQueue heads (Kueue's entry iterators).

Classic: not borrowing before borrowing (by borrowing level), then higher priority, then
FIFO. Fair sharing: lowest dominant resource share after admission first (a tuple from the
top of the cohort tree down), then priority, then FIFO. With decayed fair sharing the shares
are computed on each node's decayed usage (``decayed``) instead of what it holds now.
"""

from __future__ import annotations

from phalanx.admission.flavors import PODS, Assignment
from phalanx.admission.records import Entry
from phalanx.admission.state import ClusterQueueState
from phalanx.quotas.fairshare import DecayedUsageOf, share_path
from phalanx.quotas.resources import FlavorResource

__all__ = ["Key", "estimated_key", "first_flavor_usage", "key"]

Key = tuple[tuple[int, ...], int, int, int]


def key(
    entry: Entry,
    state: ClusterQueueState,
    assignment: Assignment,
    *,
    fair_sharing: bool,
    lendable_cache: dict[str, dict[str, int]],
    decayed: DecayedUsageOf | None = None,
) -> Key:
    if fair_sharing:
        shares = share_path(
            state.node, assignment.usage, lendable_cache=lendable_cache, decayed=decayed
        )
        return (shares, -entry.priority, entry.order_time, entry.seq)
    return ((assignment.borrowing,), -entry.priority, entry.order_time, entry.seq)


def estimated_key(
    entry: Entry,
    state: ClusterQueueState,
    *,
    fair_sharing: bool,
    lendable_cache: dict[str, dict[str, int]],
    decayed: DecayedUsageOf | None = None,
) -> Key:
    """``key`` assuming each resource gets the first flavor of its group: cheap, and exact
    for single-flavor queues. The cycle recomputes the real key before acting."""
    usage = first_flavor_usage(state, entry)
    node = state.node
    if fair_sharing:
        shares = share_path(node, usage, lendable_cache=lendable_cache, decayed=decayed)
        return (shares, -entry.priority, entry.order_time, entry.seq)
    borrowing = int(
        node.parent is not None
        and any(node.usage.get(fr, 0) + amount > node.nominal(fr) for fr, amount in usage.items())
    )
    return ((borrowing,), -entry.priority, entry.order_time, entry.seq)


def first_flavor_usage(state: ClusterQueueState, entry: Entry) -> dict[FlavorResource, int]:
    """What ``entry`` would use if each resource got the first flavor of its group."""
    cached = entry.estimate
    if cached is not None and cached[0] is state.spec:
        return cached[1]
    usage: dict[FlavorResource, int] = {}
    groups = state.spec.resource_groups
    for ps in entry.workload.pod_sets:
        requests = {res: per_pod * ps.count for res, per_pod in ps.requests.items()}
        if PODS in state.group_of:
            requests[PODS] = ps.count
        for res, amount in requests.items():
            group = state.group_of.get(res)
            if group is None or not amount or not groups[group].flavors:
                continue
            fr = (groups[group].flavors[0].name, res)
            usage[fr] = usage.get(fr, 0) + amount
    entry.estimate = (state.spec, usage)
    return usage
