"""Flavor assignment: for every pod set and resource group, the flavor that can take it.

Kueue's ``flavorassigner``: flavors are tried in ClusterQueue order; a flavor is usable for a
pod set when the pod set may run there (taints, node labels) and, for every resource of the
group, the request fits the quota now (``FIT``), could fit by preempting (``PREEMPT``), or
cannot (``NO_FIT``). ``flavorFungibility`` decides whether a flavor that needs borrowing or
preemption ends the search or the next flavor is tried first. A workload's mode is the worst
of its pod sets: all of them fit, or the workload does not.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from phalanx.admission.decisions import (
    FitMode,
    FlavorAttempt,
    PendingReason,
    PodSetExplanation,
    ResourceCheck,
)
from phalanx.admission.model import (
    Admission,
    ClusterQueue,
    FungibilityPolicy,
    FungibilityPreference,
    PodSet,
    PodSetAssignment,
    ResourceFlavor,
)
from phalanx.admission.selectors import flavor_mismatch
from phalanx.quotas.quantity import format_quantity
from phalanx.quotas.resources import FlavorResource
from phalanx.quotas.tree import QuotaNode

__all__ = ["Assignment", "PodSetChoice", "assign_flavors"]

PODS = "pods"

# Severity of a pending reason when several pod sets or groups fail (Kueue's ordering).
_SEVERITY = {
    PendingReason.TOPOLOGY_PLACEMENT_FAILED: 1,
    PendingReason.WAITING_FOR_QUOTA: 2,
    PendingReason.EXCEEDS_MAX_QUOTA: 3,
    PendingReason.NO_MATCHING_FLAVOR: 4,
}


@dataclass(slots=True)
class PodSetChoice:
    """The flavors chosen for one pod set, at ``count`` pods."""

    pod_set: PodSet
    count: int
    flavors: dict[str, str] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=dict)


# (flavor, mode, borrowing, reason, reason_kind, checks); checks are
# (resource, requested, nominal, used, available, max_capacity) measured when tried.
_RawAttempt = tuple[
    str, FitMode, int, str, PendingReason | None, list[tuple[str, int, int, int, int, int]]
]


@dataclass(slots=True)
class Assignment:
    """The result of one flavor assignment; ``mode`` is the workload's representative mode."""

    mode: FitMode
    borrowing: int
    pod_sets: list[PodSetChoice]
    usage: dict[FlavorResource, int]
    preempt_frs: set[FlavorResource]
    reason: PendingReason | None
    message: str
    raw: list[tuple[str, int, list[_RawAttempt]]]

    def admission(
        self, cluster_queue: str, topology: Mapping[str, object] | None = None
    ) -> Admission:
        topology = topology or {}
        return Admission(
            cluster_queue=cluster_queue,
            pod_sets=tuple(
                PodSetAssignment(
                    name=choice.pod_set.name,
                    count=choice.count,
                    # The choice is this assignment's own, never shared: no copy needed.
                    flavors=choice.flavors,
                    resource_usage=choice.usage,
                    topology_assignment=topology.get(choice.pod_set.name),
                )
                for choice in self.pod_sets
            ),
        )

    def tried(self) -> set[FlavorResource]:
        """Every flavor-resource whose quota was checked (for naming who holds it)."""
        return {
            (flavor, check[0])
            for _, _, attempts in self.raw
            for flavor, _, _, _, _, checks in attempts
            for check in checks
        }

    def explain(self) -> tuple[PodSetExplanation, ...]:
        """The per pod set, per flavor record of what was tried (built only when asked)."""
        out = []
        for name, count, attempts in self.raw:
            flavors = []
            for flavor, mode, borrowing, reason, _kind, checks in attempts:
                flavors.append(
                    FlavorAttempt(
                        flavor=flavor,
                        mode=mode,
                        reason=reason,
                        borrowing=borrowing,
                        resources=tuple(
                            ResourceCheck(
                                resource=res,
                                requested=req,
                                nominal=nominal,
                                used=used,
                                available=max(0, avail),
                                borrowable=max(0, avail - max(0, nominal - used)),
                                max_capacity=cap,
                            )
                            for res, req, nominal, used, avail, cap in checks
                        ),
                    )
                )
            out.append(PodSetExplanation(name=name, count=count, attempts=tuple(flavors)))
        return tuple(out)


_BEST = (FitMode.FIT, 0)
_NO_FIT = (FitMode.NO_FIT, 0)

PreemptionCheck = Callable[[FlavorResource, int, int], bool]
"""``(fr, amount, nominal) -> bool``: whether preempting could ever free ``amount`` of ``fr``."""


def _preferred(
    a: tuple[FitMode, int], b: tuple[FitMode, int], preference: FungibilityPreference | None
) -> bool:
    """Kueue's ``isPreferred``: is granular mode ``a`` (mode, borrowing) better than ``b``?"""
    if a[0] == FitMode.NO_FIT:
        return False
    if b[0] == FitMode.NO_FIT:
        return True
    if preference == FungibilityPreference.PREEMPTION_OVER_BORROWING:
        if a[1] != b[1]:
            return a[1] < b[1]
        return a[0] > b[0]
    if a[0] != b[0]:
        return a[0] > b[0]
    return a[1] < b[1]


def assign_flavors(
    *,
    cluster_queue: ClusterQueue,
    node: QuotaNode,
    group_of: Mapping[str, int],
    flavors: Mapping[str, ResourceFlavor],
    pod_sets: Sequence[PodSet],
    counts: Sequence[int] | None = None,
    can_preempt: PreemptionCheck,
    has_topology: Callable[[str], bool],
    mismatch_cache: dict[tuple[str, Hashable], str | None] | None = None,
) -> Assignment:
    """Assign a flavor to every requested resource of every pod set.

    ``group_of`` maps a resource name to the index of the resource group covering it.
    ``counts`` overrides pod set counts (partial admission). ``mismatch_cache`` memoises
    ``flavor_mismatch`` per flavor and pod-set scheduling constraints; the caller clears it
    when flavors change.
    """
    fungibility = cluster_queue.flavor_fungibility
    try_next_borrow = fungibility.when_can_borrow == FungibilityPolicy.TRY_NEXT_FLAVOR
    try_next_preempt = fungibility.when_can_preempt == FungibilityPolicy.TRY_NEXT_FLAVOR
    preference = fungibility.preference
    covers_pods = PODS in group_of
    groups = cluster_queue.resource_groups

    total_usage: dict[FlavorResource, int] = {}
    preempt_frs: set[FlavorResource] = set()
    choices: list[PodSetChoice] = []
    raw: list[tuple[str, int, list[_RawAttempt]]] = []
    worst_mode = FitMode.FIT
    worst_borrow = 0
    reason: PendingReason | None = None
    failures: list[str] = []

    usage_of = node.usage
    quotas = node.quotas
    for index, pod_set in enumerate(pod_sets):
        placement_key = _placement_key(pod_set)
        count = pod_set.count if counts is None else counts[index]
        requests = {res: per_pod * count for res, per_pod in pod_set.requests.items() if per_pod}
        if covers_pods:
            requests[PODS] = count
        choice = PodSetChoice(pod_set=pod_set, count=count)
        attempts: list[_RawAttempt] = []
        by_group: dict[int, list[str]] = {}
        for res in requests:
            group = group_of.get(res)
            if group is None:
                worst_mode = FitMode.NO_FIT
                reason = _worse(reason, PendingReason.NO_MATCHING_FLAVOR)
                failures.append(
                    f"couldn't assign flavors to pod set {pod_set.name}:"
                    f" resource {res} unavailable in ClusterQueue"
                )
                continue
            by_group.setdefault(group, []).append(res)
        for group_index in sorted(by_group):
            resources = by_group[group_index]
            best: tuple[FitMode, int] = (FitMode.NO_FIT, 1 << 30)
            best_flavor: str | None = None
            group_kind: PendingReason | None = None
            group_reasons: list[str] = []
            for flavor_quotas in groups[group_index].flavors:
                fname = flavor_quotas.name
                flavor = flavors.get(fname)
                if flavor is None:
                    why = f"flavor {fname} not found"
                    attempts.append(
                        (fname, FitMode.NO_FIT, 0, why, PendingReason.NO_MATCHING_FLAVOR, [])
                    )
                    group_reasons.append(why)
                    group_kind = _milder(group_kind, PendingReason.NO_MATCHING_FLAVOR)
                    continue
                key = (fname, placement_key)
                if mismatch_cache is not None and key in mismatch_cache:
                    why_not = mismatch_cache[key]
                else:
                    why_not = flavor_mismatch(flavor, pod_set, has_topology=has_topology(fname))
                    if mismatch_cache is not None:
                        mismatch_cache[key] = why_not
                if why_not is not None:
                    attempts.append(
                        (fname, FitMode.NO_FIT, 0, why_not, PendingReason.NO_MATCHING_FLAVOR, [])
                    )
                    group_reasons.append(why_not)
                    group_kind = _milder(group_kind, PendingReason.NO_MATCHING_FLAVOR)
                    continue
                mode = _BEST
                why = ""
                kind: PendingReason | None = None
                checks: list[tuple[str, int, int, int, int, int]] = []
                for res in resources:
                    fr = (fname, res)
                    value = total_usage.get(fr, 0) + requests[res]
                    quota = quotas.get(fr)
                    nominal = quota.nominal if quota is not None else 0
                    used = usage_of.get(fr, 0)
                    cap = node.potential_available(fr)
                    avail = node.available(fr)
                    checks.append((res, value, nominal, used, avail, cap))
                    if value > cap:
                        res_mode = _NO_FIT
                        why = why or (
                            f"insufficient quota for {res} in flavor {fname}, request"
                            f" ({format_quantity(value, resource=res)}) > maximum capacity"
                            f" ({format_quantity(cap, resource=res)})"
                        )
                        kind = PendingReason.EXCEEDS_MAX_QUOTA
                    else:
                        borrow = node.borrowing_height(fr, value)
                        if value <= avail:
                            res_mode = (FitMode.FIT, borrow)
                        else:
                            why = why or (
                                f"insufficient unused quota for {res} in flavor {fname},"
                                f" {format_quantity(value - max(avail, 0), resource=res)}"
                                " more needed"
                            )
                            if can_preempt(fr, value, nominal):
                                res_mode = (FitMode.PREEMPT, borrow)
                            else:
                                res_mode = _NO_FIT
                                kind = kind or PendingReason.WAITING_FOR_QUOTA
                    if res_mode is not mode and _preferred(mode, res_mode, preference):
                        mode = res_mode
                    if mode[0] is FitMode.NO_FIT:
                        break
                attempts.append((fname, mode[0], mode[1], why, kind, checks))
                if mode[0] == FitMode.NO_FIT:
                    group_reasons.append(why)
                    group_kind = _milder(group_kind, kind or PendingReason.WAITING_FOR_QUOTA)
                stop = mode[0] != FitMode.NO_FIT and not (
                    (mode[0] == FitMode.PREEMPT and try_next_preempt)
                    or (mode[1] > 0 and try_next_borrow)
                )
                if stop or _preferred(mode, best, preference):
                    best, best_flavor = mode, fname
                if stop:
                    break
            if best_flavor is None:
                worst_mode = FitMode.NO_FIT
                reason = _worse(reason, group_kind or PendingReason.NO_MATCHING_FLAVOR)
                failures.append(
                    f"couldn't assign flavors to pod set {pod_set.name}: "
                    + ", ".join(r for r in group_reasons if r)
                )
                continue
            for res in resources:
                fr = (best_flavor, res)
                choice.flavors[res] = best_flavor
                choice.usage[res] = requests[res]
                total_usage[fr] = total_usage.get(fr, 0) + requests[res]
                if best[0] == FitMode.PREEMPT:
                    preempt_frs.add(fr)
            worst_mode = min(worst_mode, best[0])
            worst_borrow = max(worst_borrow, best[1])
            if best[0] == FitMode.PREEMPT:
                reason = _worse(reason, PendingReason.WAITING_FOR_QUOTA)
                failures.append(
                    f"couldn't assign flavors to pod set {pod_set.name}: "
                    + next((a[3] for a in attempts if a[0] == best_flavor and a[3]), "")
                )
        choices.append(choice)
        raw.append((pod_set.name, count, attempts))

    final = worst_mode
    return Assignment(
        mode=final,
        borrowing=worst_borrow if final != FitMode.NO_FIT else 0,
        pod_sets=choices,
        usage=total_usage,
        preempt_frs=preempt_frs,
        reason=None if final == FitMode.FIT else (reason or PendingReason.WAITING_FOR_QUOTA),
        message="" if final == FitMode.FIT else "; ".join(failures),
        raw=raw,
    )


def _placement_key(pod_set: PodSet) -> Hashable:
    """What ``flavor_mismatch`` depends on, as a hashable key (shared by plain pod sets)."""
    if not (pod_set.node_selector or pod_set.node_affinity or pod_set.tolerations) and (
        pod_set.topology is None
    ):
        return None
    return (
        tuple(sorted(pod_set.node_selector.items())),
        pod_set.node_affinity,
        pod_set.tolerations,
        pod_set.topology,
    )


def _worse(a: PendingReason | None, b: PendingReason) -> PendingReason:
    """Across pod sets and groups, the most severe reason wins."""
    if a is None or _SEVERITY.get(b, 0) > _SEVERITY.get(a, 0):
        return b
    return a


def _milder(a: PendingReason | None, b: PendingReason) -> PendingReason:
    """Among the flavors of one group (alternatives), the least severe reason wins."""
    if a is None or _SEVERITY.get(b, 0) < _SEVERITY.get(a, 0):
        return b
    return a
