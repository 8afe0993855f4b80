"""The scheduler's view of one ClusterQueue: spec, quota node, queue and admitted workloads."""

from __future__ import annotations

from collections.abc import Iterator

from phalanx.admission.model import ClusterQueue, PreemptionPolicy, StopPolicy
from phalanx.admission.queues import ClusterQueueQueue
from phalanx.admission.records import Entry, Phase
from phalanx.quotas.resources import FlavorResource
from phalanx.quotas.tree import QuotaNode

__all__ = ["ClusterQueueState"]


class ClusterQueueState:
    """Mutable, internal. ``inactive_reason`` non-empty means nothing is admitted here."""

    __slots__ = (
        "admitted",
        "admitted_by_priority",
        "group_of",
        "inactive_reason",
        "name",
        "node",
        "queue",
        "spec",
        "terminating",
    )

    def __init__(self, spec: ClusterQueue, node: QuotaNode) -> None:
        self.name = spec.name
        self.spec = spec
        self.node = node
        self.queue = ClusterQueueQueue(spec.name, spec.queueing_strategy)
        self.admitted: dict[str, Entry] = {}
        # priority -> number of admitted (running) workloads, for a cheap "is there anything
        # lower-priority to preempt" test before a full victim search.
        self.admitted_by_priority: dict[int, int] = {}
        self.group_of: dict[str, int] = {}
        self.inactive_reason = ""
        # Deleted while workloads still hold its quota (Kueue's finalizer): kept, admitting
        # nothing, until they finish, unless a ClusterQueue of the same name is applied again.
        self.terminating = False
        self.update(spec, node)

    def update(self, spec: ClusterQueue, node: QuotaNode) -> None:
        self.spec = spec
        self.node = node
        self.queue.strategy = spec.queueing_strategy
        self.group_of = {
            res: index
            for index, group in enumerate(spec.resource_groups)
            for res in group.covered_resources
        }

    @property
    def stopped(self) -> bool:
        return self.spec.stop_policy != StopPolicy.NONE

    @property
    def can_admit(self) -> bool:
        return not self.inactive_reason and not self.stopped

    def add_admitted(self, entry: Entry) -> None:
        self.admitted[entry.key] = entry
        self.admitted_by_priority[entry.victim_priority] = (
            self.admitted_by_priority.get(entry.victim_priority, 0) + 1
        )

    def remove_admitted(self, entry: Entry) -> None:
        if self.admitted.pop(entry.key, None) is None:
            return
        left = self.admitted_by_priority.get(entry.victim_priority, 0) - 1
        if left > 0:
            self.admitted_by_priority[entry.victim_priority] = left
        else:
            self.admitted_by_priority.pop(entry.victim_priority, None)

    def running(self, *, before_cycle: int | None = None) -> Iterator[Entry]:
        """Admitted workloads not already being evicted; with ``before_cycle``, only those
        admitted before that cycle (the preemption candidates)."""
        if before_cycle is None:
            return (e for e in self.admitted.values() if e.phase == Phase.ADMITTED)
        return (
            e
            for e in self.admitted.values()
            if e.phase == Phase.ADMITTED and e.admitted_cycle < before_cycle
        )

    def may_have_victims(self, priority: int, order_time: int) -> bool:
        """Cheap necessary condition for withinClusterQueue preemption to find anyone."""
        policy = self.spec.preemption.within_cluster_queue
        if policy == PreemptionPolicy.NEVER or not self.admitted_by_priority:
            return False
        lowest = min(self.admitted_by_priority)
        if lowest < priority:
            return True
        return policy == PreemptionPolicy.LOWER_OR_NEWER_EQUAL_PRIORITY and lowest == priority

    def borrowing_on(self, frs: set[FlavorResource]) -> bool:
        node = self.node
        return node.parent is not None and any(node.is_borrowing(fr) for fr in frs)
