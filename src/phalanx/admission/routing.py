"""Where a pending workload waits, and why: its ClusterQueue's queue, held aside
(LocalQueue or ClusterQueue missing, namespace not selected, LocalQueue stopped, workload
inactive), or backing off; and whether each ClusterQueue may admit at all.

Functions of the ``Scheduler``'s books, kept apart from the façade's event methods.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from phalanx.admission.decisions import Explanation, PendingReason
from phalanx.admission.model import StopPolicy
from phalanx.admission.queues import HeldWorkloads
from phalanx.admission.records import Entry, Where
from phalanx.admission.state import ClusterQueueState

if TYPE_CHECKING:
    from phalanx.admission.scheduler import Scheduler

__all__ = [
    "explain",
    "held",
    "hold",
    "inactive_text",
    "refresh_active",
    "refresh_all_active",
    "reroute_held",
    "retry_explanations",
    "route",
    "unqueue",
]


def route(s: Scheduler, entry: Entry) -> None:
    """Put a PENDING workload where it belongs: its ClusterQueue's queue, or held."""
    workload = entry.workload
    if not workload.active:
        _hold(s, entry, PendingReason.INACTIVE_WORKLOAD, "the workload is deactivated")
        return
    lq = s.local_queues.get(entry.local_queue)
    if lq is None:
        _hold(
            s,
            entry,
            PendingReason.LOCAL_QUEUE_NOT_FOUND,
            f"LocalQueue {workload.queue_name} doesn't exist in namespace {workload.namespace}",
        )
        return
    if lq.stop_policy != StopPolicy.NONE:
        _hold(s, entry, PendingReason.LOCAL_QUEUE_STOPPED, f"LocalQueue {lq.name} is stopped")
        return
    state = s.queues.get(lq.cluster_queue)
    if state is None or state.terminating:
        _hold(
            s,
            entry,
            PendingReason.CLUSTER_QUEUE_NOT_FOUND,
            f"ClusterQueue {lq.cluster_queue} doesn't exist",
        )
        return
    selector = state.spec.namespace_selector
    if selector is None or not selector.matches(s.namespaces.get(workload.namespace, {})):
        _hold(
            s,
            entry,
            PendingReason.NAMESPACE_MISMATCH,
            f"the workload's namespace {workload.namespace} is not selected by"
            f" ClusterQueue {state.name} (spec.namespaceSelector)",
        )
        return
    entry.cluster_queue = state.name
    if entry.requeue_at > s.now:
        entry.where = Where.BACKOFF
        s._backoff_seq += 1
        heapq.heappush(s.backoff, (entry.requeue_at, s._backoff_seq, entry))
        explain(
            s,
            entry,
            PendingReason.BACKOFF,
            f"requeued after eviction; retry at {entry.requeue_at}",
        )
        return
    held(s).release(entry.key)
    state.queue.push(entry)
    s.active.add(state.name)
    if not state.can_admit:
        explain(s, entry, PendingReason.CLUSTER_QUEUE_INACTIVE, inactive_text(s, state))
        return
    # Whatever it waited for before (a missing LocalQueue, ...) no longer holds: the cycle
    # tries it, or explains it like the equivalent workload that was tried.
    entry.explanation = None
    s.untried.append(entry)


def retry_explanations(s: Scheduler, state: ClusterQueueState) -> None:
    """A ClusterQueue may admit again: its queued workloads' "inactive"/"stopped"
    explanations are void; the next cycle explains them afresh."""
    for entry in state.queue.entries():
        entry.explanation = None
        s.untried.append(entry)


def held(s: Scheduler) -> HeldWorkloads:
    """The scheduler's held workloads, indexed by what they wait for (a plain dict found
    there is indexed once, its workloads marked for a re-check)."""
    found = s.held
    if not isinstance(found, HeldWorkloads):
        found = HeldWorkloads(sorted(found.values(), key=lambda e: e.seq))
        s.held = found
    return found


def waits_for(s: Scheduler, local_queue: str) -> object:
    """Everything ``route`` reads to hold a workload of ``local_queue`` other than the
    workload and its namespace's labels (whose changes re-route their workloads directly):
    while this is unchanged, a held workload of that LocalQueue stays held."""
    lq = s.local_queues.get(local_queue)
    if lq is None:
        return None
    state = s.queues.get(lq.cluster_queue)
    if state is None:
        return (lq, None)
    # The state object itself: a ClusterQueue deleted and created again is a new one.
    return (lq, state, state.terminating, state.spec.namespace_selector)


def hold(s: Scheduler, entry: Entry, reason: PendingReason, message: str) -> None:
    """Hold ``entry`` for a reason the caller decided: it is re-checked at the next
    queue change."""
    _hold(s, entry, reason, message, recheck=True)


def _hold(
    s: Scheduler,
    entry: Entry,
    reason: PendingReason,
    message: str,
    *,
    recheck: bool = False,
) -> None:
    entry.where = Where.HELD
    if reason == PendingReason.INACTIVE_WORKLOAD:
        # No queue change can release it; only a new version of the workload can.
        held(s).hold(entry, None, None)
    else:
        held(s).hold(entry, entry.local_queue, waits_for(s, entry.local_queue), recheck=recheck)
    explain(s, entry, reason, message)


def explain(s: Scheduler, entry: Entry, reason: PendingReason, message: str) -> None:
    explanation = Explanation(
        workload=entry.key,
        cluster_queue=entry.cluster_queue,
        reason=reason,
        message=message,
        time=s.now,
    )
    entry.explanation = explanation
    s.fresh[entry.key] = explanation


def unqueue(s: Scheduler, entry: Entry) -> None:
    """Take a PENDING workload out of wherever it waits."""
    if entry.where == Where.QUEUED and entry.cluster_queue in s.queues:
        s.queues[entry.cluster_queue].queue.discard(entry)
    held(s).release(entry.key)
    entry.where = Where.NOWHERE


def reroute_held(s: Scheduler) -> None:
    """A LocalQueue or ClusterQueue changed: route again, in ``seq`` order, the held
    workloads whose LocalQueue or ClusterQueue is not what it was when they were held.

    Costs O(LocalQueues with held workloads + workloads re-routed), not O(held workloads).
    """
    for entry in held(s).take_changed(lambda local_queue: waits_for(s, local_queue)):
        entry.where = Where.NOWHERE
        route(s, entry)


def inactive_text(s: Scheduler, state: ClusterQueueState) -> str:
    if state.inactive_reason:
        return f"ClusterQueue {state.name} is inactive: {state.inactive_reason}"
    return f"ClusterQueue {state.name} is stopped (spec.stopPolicy {state.spec.stop_policy})"


def refresh_active(s: Scheduler, state: ClusterQueueState) -> None:
    """Recompute whether a ClusterQueue can admit (flavors exist, no cohort cycle)."""
    before = state.can_admit
    reason = ""
    if state.terminating:
        reason = "Terminating"
    missing = [f for f in state.spec.flavor_names() if f not in s.flavors]
    if not reason and missing:
        reason = f"FlavorNotFound: flavor(s) {', '.join(missing)} not found"
    if not reason and state.spec.admission_checks:
        reason = _admission_check_problem(s, state.spec.admission_checks)
    if not reason and state.spec.cohort:
        for node in state.node.path_to_root():
            if node.name in s.cycle_errors and node.is_cohort:
                reason = f"CohortCycle: {s.cycle_errors[node.name]}"
                break
        if not reason and state.spec.cohort in s.cycle_errors:
            reason = f"CohortCycle: {s.cycle_errors[state.spec.cohort]}"
    if not reason and s.placement is not None:
        for fname in state.spec.flavor_names():
            flavor = s.flavors.get(fname)
            if flavor and flavor.topology_name and not s.placement.has_topology(fname):
                reason = f"TopologyNotFound: topology {flavor.topology_name} of flavor {fname}"
                break
    state.inactive_reason = reason
    if state.can_admit != before or not state.can_admit:
        s.explain_queues.add(state.name)
        if state.can_admit:
            s.active.add(state.name)
            retry_explanations(s, state)


def _admission_check_problem(s: Scheduler, checks: tuple[str, ...]) -> str:
    """Kueue's reasons for a queue naming AdmissionChecks that cannot be evaluated."""
    missing = [c for c in checks if c not in s.admission_checks]
    if missing:
        return f"AdmissionCheckNotFound: references missing AdmissionCheck(s): {','.join(missing)}"
    inactive = [c for c in checks if not s.admission_checks[c]]
    if inactive:
        return (
            f"AdmissionCheckInactive: references inactive AdmissionCheck(s): {','.join(inactive)}"
        )
    return ""


def refresh_all_active(s: Scheduler) -> None:
    for state in s.queues.values():
        refresh_active(s, state)
