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
    "release_placement",
    "stop_policy_changed",
]


def release_admitted(s: Scheduler, entry: Entry) -> None:
    """An ADMITTED or EVICTING workload is gone from the API's reservation: the books stop
    counting it (see ``QuotaBooks.release``), its placement is freed, and a ClusterQueue
    deleted while it held quota there goes once nothing holds any."""
    release_placement(s, entry)
    s.books.release(entry)
    if s.budgets is not None:
        s.budgets.stop(entry.key, s.now)
    state = s.queues.get(entry.cluster_queue or "")
    if state is not None and state.terminating and not s.books.reserving(state.name):
        s.delete_cluster_queue(state.name)


def release_claim(s: Scheduler, entry: Entry) -> None:
    """A preemptor gives up its claim (deleted, stopped queue, deactivated)."""
    s.books.release_claim(entry)


def release_placement(s: Scheduler, entry: Entry) -> None:
    if s.placement is None or entry.admission is None:
        return
    for flavor in sorted({f for ps in entry.admission.pod_sets for f in ps.flavors.values()}):
        if s.placement.has_topology(flavor):
            s.placement.release(flavor=flavor, key=entry.key)


def evict(s: Scheduler, entry: Entry, reason: EvictionReason, message: str) -> None:
    """Ask the operator to evict an admitted workload; usage counts until it confirms."""
    if not s.books.evict(entry):
        return
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
    for entry in s.entries_of_local_queue(lq.key):
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
