"""The scheduler's bookkeeping for one workload: where it is and what it holds.

A workload moves through ``PENDING`` (queued, parked, held or backing off) -> ``ADMITTED``,
or ``PENDING`` -> ``CLAIMING`` (a preemptor waiting for its victims to terminate) ->
``ADMITTED``; ``EVICTING`` is an admitted workload told to stop, until the operator reports
its pods gone. ``usage`` is exactly what the workload currently counts in the quota tree, so
finishing or evicting it can return usage to where it was: an ADMITTED or EVICTING
workload counts its whole admission (the API still shows it reserving), a CLAIMING one
nothing of its own; what it holds for itself meanwhile is in ``held``.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable

from phalanx.admission.budgets import PREEMPTIBLE_RANK
from phalanx.admission.decisions import Explanation
from phalanx.admission.model import Admission, Workload
from phalanx.quotas.resources import FlavorResource

__all__ = ["Entry", "Phase", "Where", "shape_of"]

_NO_VICTIMS: frozenset[str] = frozenset()


class Phase(enum.IntEnum):
    PENDING = 0
    ADMITTED = 1
    CLAIMING = 2
    EVICTING = 3


class Where(enum.IntEnum):
    """Where a PENDING workload waits."""

    NOWHERE = 0
    QUEUED = 1
    """In its ClusterQueue's queue (possibly in a parked class)."""
    UNROUTABLE = 2
    """Its LocalQueue or ClusterQueue is missing, or its namespace is not selected."""
    HELD = 3
    """Its LocalQueue is stopped, or the workload is inactive."""
    BACKOFF = 4
    """Waiting for its requeue time after an eviction."""
    BUDGET = 5
    """Waiting for the window of a used-up budget to reset."""


def shape_of(workload: Workload, priority: int) -> Hashable:
    """Workloads with equal shapes in one ClusterQueue get the same answer from the flavor
    assigner and preemption (Kueue's scheduling equivalence): if the oldest of them cannot
    be admitted now, none of them can, until something changes."""
    parts: list[Hashable] = [priority]
    for ps in workload.pod_sets:
        # Dict order is insertion order: equal requests written in another order only lose
        # the sharing, never correctness.
        parts.append((ps.name, ps.count, ps.min_count, tuple(ps.requests.items())))
        if ps.node_selector or ps.node_affinity or ps.tolerations or ps.topology is not None:
            parts.append(
                (
                    tuple(sorted(ps.node_selector.items())),
                    ps.node_affinity,
                    ps.tolerations,
                    ps.topology,
                )
            )
    return tuple(parts)


class Entry:
    """Mutable record of one workload (internal to ``phalanx.admission``)."""

    __slots__ = (
        "admission",
        "admitted_at",
        "admitted_cycle",
        "claimed_by",
        "cluster_queue",
        "estimate",
        "explanation",
        "held",
        "key",
        "local_queue",
        "order_time",
        "over_budget",
        "phase",
        "priority",
        "queue_class",
        "queue_token",
        "requeue_at",
        "requeue_count",
        "seq",
        "shape",
        "usage",
        "victims_pending",
        "where",
        "workload",
    )

    def __init__(self, workload: Workload, *, priority: int, seq: int) -> None:
        self.workload = workload
        self.key = workload.key
        self.priority = priority
        self.seq = seq
        self.order_time = workload.creation_time
        self.shape = shape_of(workload, priority)
        self.local_queue = f"{workload.namespace}/{workload.queue_name}"
        self.cluster_queue: str | None = None
        self.phase = Phase.PENDING
        self.where = Where.NOWHERE
        self.queue_class: object | None = None
        self.queue_token = 0
        self.admission: Admission | None = None
        self.admitted_at = 0
        # The scheduler's cycle number at admission: like Kueue, a workload admitted in the
        # current cycle is not a preemption candidate in that same cycle.
        self.admitted_cycle = 0
        self.usage: dict[FlavorResource, int] = {}
        # Only preemptors need a set; the shared empty frozenset keeps the 50,000 others from
        # each carrying a (garbage-collector tracked) empty set.
        self.victims_pending: set[str] | frozenset[str] = _NO_VICTIMS
        self.claimed_by: str | None = None
        # A preemptor's hold on the quota tree while its victims terminate: (ClusterQueue,
        # usage) counted there for it, never more than was available, so the tree stays
        # within limits. A victim's usage moves here when its eviction completes.
        self.held: tuple[tuple[str, dict[FlavorResource, int]], ...] = ()
        self.requeue_count = 0
        self.requeue_at = 0
        self.explanation: Explanation | None = None
        # Admitted (or to be) over a Preemptible budget: that budget's message. As a victim it
        # ranks below every priority (``budgets.PREEMPTIBLE_RANK``).
        self.over_budget = ""
        # (ClusterQueue spec, usage if every resource got its group's first flavor): the
        # scheduler's cheap ordering estimate, valid while that spec object is current.
        self.estimate: tuple[object, dict[FlavorResource, int]] | None = None

    def __repr__(self) -> str:
        return f"<Entry {self.key} {self.phase.name} prio={self.priority}>"

    @property
    def victim_priority(self) -> int:
        """The priority it counts with in preemption: its own, or below every priority when
        admitted over a ``Preemptible`` budget (set before it is admitted and kept while it
        is: the ClusterQueue's counts by priority rely on that). Used on both sides, so such a
        workload is preempted first and preempts nobody: with its own priority as preemptor it
        and the workload it preempted would evict each other in turn."""
        return PREEMPTIBLE_RANK if self.over_budget else self.priority
