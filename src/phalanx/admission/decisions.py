"""What the scheduling core answers: decisions and explanations, as frozen data.

A cycle returns a ``CycleResult``: workloads to admit (with flavors and counts), workloads to
preempt (and for whom), workloads to evict (stop policies, deactivation), and for every
workload whose pending reason was (re)computed, an ``Explanation``. The operator applies the
decisions; the explanation's ``message`` is the one line for the ``QuotaReserved`` condition,
the rest is what ``phalanx explain`` prints.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from phalanx.admission.model import Admission
from phalanx.quotas.quantity import format_quantity

__all__ = [
    "Admit",
    "CycleResult",
    "Evict",
    "EvictionReason",
    "Explanation",
    "FitMode",
    "FlavorAttempt",
    "PendingReason",
    "PodSetExplanation",
    "Preempt",
    "PreemptionReason",
    "ResourceCheck",
    "Victim",
]


class FitMode(enum.IntEnum):
    """How a flavor can take a pod set; ordered so that ``max`` picks the best."""

    NO_FIT = 0
    PREEMPT = 1
    FIT = 2


class PreemptionReason(enum.StrEnum):
    """The ``Preempted`` condition's reason, as Kueue names them."""

    IN_CLUSTER_QUEUE = "InClusterQueue"
    IN_COHORT_RECLAMATION = "InCohortReclamation"
    IN_COHORT_FAIR_SHARING = "InCohortFairSharing"
    IN_COHORT_RECLAIM_WHILE_BORROWING = "InCohortReclaimWhileBorrowing"


class EvictionReason(enum.StrEnum):
    CLUSTER_QUEUE_STOPPED = "ClusterQueueStopped"
    LOCAL_QUEUE_STOPPED = "LocalQueueStopped"
    DEACTIVATED = "Deactivated"
    REQUEUE_LIMIT_EXCEEDED = "RequeuingLimitExceeded"


class PendingReason(enum.StrEnum):
    """Why a workload is not admitted (``QuotaReserved=False`` reason where Kueue has one)."""

    LOCAL_QUEUE_NOT_FOUND = "LocalQueueDoesNotExist"
    CLUSTER_QUEUE_NOT_FOUND = "ClusterQueueDoesNotExist"
    CLUSTER_QUEUE_INACTIVE = "Inactive"
    LOCAL_QUEUE_STOPPED = "LocalQueueStopped"
    NAMESPACE_MISMATCH = "NamespaceMismatch"
    INACTIVE_WORKLOAD = "Deactivated"
    BACKOFF = "Backoff"
    NO_MATCHING_FLAVOR = "NoMatchingFlavor"
    EXCEEDS_MAX_QUOTA = "ExceedsMaxQuota"
    WAITING_FOR_QUOTA = "WaitingForQuota"
    TOPOLOGY_PLACEMENT_FAILED = "TopologyPlacementFailed"
    BLOCKED_BY_HEAD = "StrictFIFO"
    WAITING_FOR_PREEMPTED_WORKLOADS = "WaitingForPreemptedWorkloads"
    BUDGET_EXCEEDED = "BudgetExceeded"
    """Phalanx's usage budgets: the workload's LocalQueue or ClusterQueue used its budget up."""


@dataclass(frozen=True, slots=True)
class ResourceCheck:
    """One resource of one flavor, as the ClusterQueue saw it when the pod set was tried.

    ``requested`` includes what earlier pod sets of the same workload already took in this
    flavor. ``available`` is what could be used now without preempting (borrowing included);
    ``borrowable`` is the part of ``available`` that would come from the cohort;
    ``max_capacity`` is the most the ClusterQueue could ever get with the cohort empty.
    """

    resource: str
    requested: int
    nominal: int
    used: int
    available: int
    borrowable: int
    max_capacity: int


@dataclass(frozen=True, slots=True)
class FlavorAttempt:
    flavor: str
    mode: FitMode
    reason: str = ""
    """Empty when the flavor fits; else why not, one clause."""
    resources: tuple[ResourceCheck, ...] = ()
    borrowing: int = 0
    """Kueue's borrowing level: 0 within nominal quota, higher means from further away."""


@dataclass(frozen=True, slots=True)
class PodSetExplanation:
    name: str
    count: int
    attempts: tuple[FlavorAttempt, ...]


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why ``workload`` is still pending, computed at ``time``."""

    workload: str
    cluster_queue: str | None
    reason: PendingReason
    message: str
    """One line, for the condition message."""
    time: int
    pod_sets: tuple[PodSetExplanation, ...] = ()
    blocking: tuple[str, ...] = ()
    """Workloads that hold the quota it needs, or that would have to be preempted."""
    fair_sharing: str = ""
    """With admission fair sharing: which LocalQueue went first because its decayed usage
    was lower, with the numbers (also at the end of ``message``)."""

    def details(self) -> str:
        """The multi-line form: one block per pod set and flavor tried."""
        lines = [f"{self.workload}: {self.reason.value}: {self.message}"]
        for ps in self.pod_sets:
            lines.append(f"  pod set {ps.name} (count {ps.count}):")
            for attempt in ps.attempts:
                head = f"    flavor {attempt.flavor}: {attempt.mode.name}"
                lines.append(f"{head} ({attempt.reason})" if attempt.reason else head)
                for check in attempt.resources:
                    r = check.resource

                    def q(amount: int, r: str = r) -> str:
                        return format_quantity(amount, resource=r)

                    lines.append(
                        f"      {r}: requested {q(check.requested)}, nominal"
                        f" {q(check.nominal)}, used {q(check.used)}, available"
                        f" {q(check.available)} (borrowable {q(check.borrowable)}),"
                        f" max {q(check.max_capacity)}"
                    )
        if self.blocking:
            lines.append(f"  blocked by: {', '.join(self.blocking)}")
        if self.fair_sharing:
            lines.append(f"  {self.fair_sharing}")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Admit:
    """Reserve quota for ``workload`` in ``admission.cluster_queue``."""

    workload: str
    admission: Admission
    time: int
    over_budget: str = ""
    """Admitted over a ``Preemptible`` budget: that budget's message (the workload may be
    preempted by any workload allowed to preempt in its ClusterQueue)."""


@dataclass(frozen=True, slots=True)
class Victim:
    workload: str
    cluster_queue: str
    reason: PreemptionReason


@dataclass(frozen=True, slots=True)
class Preempt:
    """Evict ``victims`` so that ``preemptor`` can be admitted; its claim is held meanwhile."""

    preemptor: str
    cluster_queue: str
    victims: tuple[Victim, ...]
    time: int

    @property
    def message(self) -> str:
        names = ", ".join(v.workload for v in self.victims)
        return f"preempting {len(self.victims)} workload(s) for {self.preemptor}: {names}"


@dataclass(frozen=True, slots=True)
class Evict:
    workload: str
    reason: EvictionReason
    message: str
    time: int


@dataclass(frozen=True, slots=True)
class CycleResult:
    """Everything one ``Scheduler.run_cycle(now)`` decided."""

    time: int
    admitted: tuple[Admit, ...] = ()
    preempted: tuple[Preempt, ...] = ()
    evicted: tuple[Evict, ...] = ()
    pending: Mapping[str, Explanation] = field(default_factory=dict)
    """Explanations computed in this cycle, by workload key; earlier ones still hold for
    workloads not listed."""
    attempts: int = 0
    """Flavor assignments evaluated (the unit of ``us_per_decision`` in the bench)."""

    @property
    def decisions(self) -> int:
        return len(self.admitted) + len(self.preempted) + len(self.evicted)
