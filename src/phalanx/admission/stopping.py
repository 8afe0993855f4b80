"""What a workload gives back when it stops running or waiting for victims: quota,
placement and claims; and the evictions that stop policies and deactivation ask for.

Functions of the ``Scheduler``'s books, kept apart from the façade's event methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phalanx.admission import routing
from phalanx.admission.decisions import Evict, EvictionReason
from phalanx.admission.model import LocalQueue, StopPolicy
from phalanx.admission.records import Entry, Phase
from phalanx.admission.state import ClusterQueueState

if TYPE_CHECKING:
    from phalanx.admission.scheduler import Scheduler

__all__ = [
    "deactivate",
    "evict",
    "local_queue_changed",
    "release_admitted",
    "release_claim",
    "release_hold",
    "release_placement",
    "reserving",
    "stop_policy_changed",
]


def release_admitted(s: Scheduler, entry: Entry) -> None:
    """An ADMITTED or EVICTING workload stops counting: free its quota and placement.

    A preemption victim's quota is not freed but handed to its preemptor's hold, so that no
    other workload takes it before the preemptor is admitted (``cycle`` step 2)."""
    state = s.queues.get(entry.cluster_queue or "")
    claimer = s.claims.get(entry.claimed_by or "")
    waiting = claimer is not None and entry.key in claimer.victims_pending
    if entry.usage and state is not None:
        if claimer is not None and waiting:
            claimer.held = (*claimer.held, (state.name, entry.usage))
        else:
            s.tree.remove_usage(state.node, entry.usage)
            s.dirty_roots.add(state.node.root)
    entry.usage = {}
    if state is not None:
        state.remove_admitted(entry)
    s.evicting.pop(entry.key, None)
    release_placement(s, entry)
    if claimer is not None and waiting:
        claimer.victims_pending = claimer.victims_pending - {entry.key}
        if not claimer.victims_pending:
            s.ready_claims.append(claimer)
    entry.claimed_by = None
    entry.admission = None
    if state is not None and state.terminating and not reserving(s, state.name):
        s.delete_cluster_queue(state.name)


def reserving(s: Scheduler, cluster_queue: str) -> bool:
    """Whether any workload still holds quota in ``cluster_queue`` in the API's eyes."""
    state = s.queues.get(cluster_queue)
    if state is not None and state.admitted:
        return True
    return any(e.cluster_queue == cluster_queue for e in s.evicting.values())


def release_hold(s: Scheduler, entry: Entry) -> None:
    """Give back what a preemptor holds in the quota tree for itself."""
    for name, usage in entry.held:
        state = s.queues.get(name)
        if state is not None and usage:
            s.tree.remove_usage(state.node, usage)
            s.dirty_roots.add(state.node.root)
    entry.held = ()


def release_claim(s: Scheduler, entry: Entry) -> None:
    """A preemptor gives up its claim (deleted, stopped queue, deactivated)."""
    release_hold(s, entry)
    entry.usage = {}
    entry.admission = None
    s.claims.pop(entry.key, None)
    for victim_key in entry.victims_pending:
        victim = s.entries.get(victim_key)
        if victim is not None and victim.claimed_by == entry.key:
            victim.claimed_by = None
    entry.victims_pending = frozenset()


def release_placement(s: Scheduler, entry: Entry) -> None:
    if s.placement is None or entry.admission is None:
        return
    for flavor in sorted({f for ps in entry.admission.pod_sets for f in ps.flavors.values()}):
        if s.placement.has_topology(flavor):
            s.placement.release(flavor=flavor, key=entry.key)


def evict(s: Scheduler, entry: Entry, reason: EvictionReason, message: str) -> None:
    """Ask the operator to evict an admitted workload; usage counts until it confirms."""
    if entry.phase != Phase.ADMITTED:
        return
    entry.phase = Phase.EVICTING
    s.evicting[entry.key] = entry
    s.pending_evictions.append(Evict(entry.key, reason, message, s.now))


def deactivate(s: Scheduler, entry: Entry) -> None:
    if entry.phase == Phase.ADMITTED:
        evict(s, entry, EvictionReason.DEACTIVATED, "the workload was deactivated")
    elif entry.phase == Phase.CLAIMING:
        release_claim(s, entry)
        entry.phase = Phase.PENDING
        routing.route(s, entry)


def stop_policy_changed(s: Scheduler, state: ClusterQueueState) -> None:
    for entry in [e for e in s.claims.values() if e.cluster_queue == state.name]:
        release_claim(s, entry)
        entry.phase = Phase.PENDING
        routing.route(s, entry)
    if state.spec.stop_policy == StopPolicy.HOLD_AND_DRAIN:
        for entry in sorted(state.admitted.values(), key=lambda e: e.seq):
            evict(
                s,
                entry,
                EvictionReason.CLUSTER_QUEUE_STOPPED,
                f"ClusterQueue {state.name} is stopped with HoldAndDrain",
            )
    s.explain_queues.add(state.name)
    if state.can_admit:
        s.active.add(state.name)
        s.dirty_roots.add(state.node.root)
        routing.retry_explanations(s, state)


def local_queue_changed(s: Scheduler, lq: LocalQueue) -> None:
    stopped = lq.stop_policy != StopPolicy.NONE
    for entry in sorted(s.entries.values(), key=lambda e: e.seq):
        if entry.local_queue != lq.key:
            continue
        if entry.phase == Phase.PENDING:
            routing.unqueue(s, entry)
            routing.route(s, entry)
        elif entry.phase == Phase.CLAIMING and stopped:
            release_claim(s, entry)
            entry.phase = Phase.PENDING
            routing.route(s, entry)
        elif entry.phase == Phase.ADMITTED and lq.stop_policy == StopPolicy.HOLD_AND_DRAIN:
            evict(
                s,
                entry,
                EvictionReason.LOCAL_QUEUE_STOPPED,
                f"LocalQueue {lq.name} is stopped with HoldAndDrain",
            )
