"""Explanations for workloads the cycle could not admit: what was tried, and who holds it."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice

from phalanx.admission.decisions import Explanation, PendingReason
from phalanx.admission.flavors import Assignment
from phalanx.admission.records import Entry
from phalanx.admission.state import ClusterQueueState

__all__ = ["explanation", "holders"]


def holders(state: ClusterQueueState, assignment: Assignment, *, limit: int) -> list[str]:
    """Who holds the quota the workload needs: its queue's workloads, borrowing queues."""
    frs = set(assignment.usage) or assignment.tried()
    if limit <= 0:
        return []
    using = (e for e in state.running() if any(fr in e.usage for fr in frs))
    mine = list(islice(using, limit * 4))
    mine.sort(key=lambda e: (e.priority, -e.admitted_at, e.seq))
    names = [e.key for e in mine[:limit]]
    if state.node.parent is not None and len(names) < limit:
        borrowers = state.node.root.borrowers
        # In the order they started borrowing: deterministic, and no sort of a big cohort.
        others = (
            n.name for fr in sorted(frs) for n in borrowers.get(fr, ()) if n is not state.node
        )
        seen = dict.fromkeys(islice(others, limit - len(names)))
        names.extend(f"ClusterQueue/{name} (borrowing)" for name in seen)
    return names


def explanation(
    *,
    entry: Entry,
    state: ClusterQueueState,
    assignment: Assignment,
    reason: PendingReason | None,
    extra: str,
    blocking: Sequence[str],
    now: int,
) -> Explanation:
    """Why ``entry`` is not admitted, from the flavor assignment that failed."""
    message = assignment.message or extra
    if extra and assignment.message:
        message = f"{assignment.message}; {extra}"
    return Explanation(
        workload=entry.key,
        cluster_queue=state.name,
        reason=reason or assignment.reason or PendingReason.WAITING_FOR_QUOTA,
        message=message or "does not fit",
        time=now,
        pod_sets=assignment.explain(),
        blocking=tuple(blocking),
    )
