"""``phalanx what-if``: what the next cycle would decide for a workload not yet created.

A dry run of the cycle's own decision for that one workload, on the live books: the same
flavor assignment (``cycle.assign``), the same victim search (``cycle.preemption_targets``,
which restores the quota tree it edits) and a placement what-if (never a reservation). The
workload gets no entry in the books and no place in a queue; nothing is changed. Its
position is where it would be queued now; ``ahead`` counts the workloads the cycle would try
first that are not parked, so "admitted now" holds for it as the head of its ClusterQueue.

When the full count does not fit, partial admission (``minCount``) is tried as the cycle
tries it (``cycle.partial_fit``). What the dry run leaves out: the cycle's earlier steps
(backoffs expiring, preemptors whose victims are gone being admitted), which change the books
the real cycle decides on.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from phalanx.admission import cycle, explaining, insight, placing, routing
from phalanx.admission.decisions import Explanation, FitMode, PendingReason, Victim
from phalanx.admission.flavors import Assignment
from phalanx.admission.model import Admission, QueueingStrategy, StopPolicy, Workload
from phalanx.admission.preemption import Target
from phalanx.admission.queues import QueueClass
from phalanx.admission.records import Entry

if TYPE_CHECKING:
    from phalanx.admission.scheduler import Scheduler

__all__ = ["Verdict", "WhatIf", "what_if"]


class Verdict(enum.StrEnum):
    ADMIT = "Admit"
    PREEMPT = "Preempt"
    PENDING = "Pending"
    HELD = "Held"
    """Never reaches a ClusterQueue's queue (no LocalQueue, namespace not selected, ...)."""


@dataclass(frozen=True, slots=True)
class WhatIf:
    workload: str
    local_queue: str
    cluster_queue: str | None
    verdict: Verdict
    message: str
    admission: Admission | None = None
    """Flavors (and topology placement) it would get: for ADMIT, or PREEMPT once the victims
    are gone."""
    victims: tuple[Victim, ...] = ()
    position: insight.Position | None = None
    ahead: int = 0
    """Workloads in its ClusterQueue the cycle would try before it (not parked)."""
    explanation: Explanation | None = None
    """For PENDING: why, as ``explain`` would say it."""

    def text(self) -> str:
        lines = [f"What if {self.workload} were created in LocalQueue {self.local_queue}:"]
        if self.cluster_queue:
            lines.append(f"  ClusterQueue: {self.cluster_queue}")
        lines.append(f"  Decision: {self.verdict.value}: {self.message}")
        if self.admission is not None:
            for ps in self.admission.pod_sets:
                flavors = ", ".join(f"{r}={f}" for r, f in sorted(ps.flavors.items()))
                lines.append(f"  pod set {ps.name} (count {ps.count}): {flavors}")
                if ps.topology_assignment is not None:
                    lines.append(f"    placed: {_placement_text(ps.topology_assignment)}")
        for v in self.victims:
            where = f"ClusterQueue {v.cluster_queue}, {v.reason}"
            lines.append(f"  would preempt {v.workload} ({where})")
        if self.position is not None:
            lines.append(
                f"  Position: {self.position.local_queue} in its LocalQueue,"
                f" {self.position.cluster_queue} in the ClusterQueue; {self.ahead} tried before it"
            )
        if self.explanation is not None and self.explanation.pod_sets:
            lines.append("  Flavors tried:")
            lines.extend(f"  {line}" for line in insight.pod_set_lines(self.explanation))
        return "\n".join(lines)


def what_if(s: Scheduler, workload: Workload) -> WhatIf:
    """What the next cycle would decide for ``workload`` if it were created now, on the
    current books; the books, queues and placements are left exactly as they were."""
    entry = Entry(workload, priority=s._priority_of(workload), seq=s._seq + 1)
    entry.order_time = max(workload.creation_time, s.now)
    lq_key = entry.local_queue

    def held(message: str) -> WhatIf:
        return WhatIf(workload.key, lq_key, None, Verdict.HELD, message)

    lq = s.local_queues.get(lq_key)
    if not workload.active:
        return held("the workload is deactivated")
    if lq is None:
        return held(
            f"LocalQueue {workload.queue_name} doesn't exist in namespace {workload.namespace}"
        )
    if lq.stop_policy != StopPolicy.NONE:
        return held(f"LocalQueue {lq.name} is stopped")
    state = s.queues.get(lq.cluster_queue)
    if state is None or state.terminating:
        return held(f"ClusterQueue {lq.cluster_queue} doesn't exist")
    selector = state.spec.namespace_selector
    if selector is None or not selector.matches(s.namespaces.get(workload.namespace, {})):
        return held(
            f"the workload's namespace {workload.namespace} is not selected by"
            f" ClusterQueue {state.name} (spec.namespaceSelector)"
        )
    entry.cluster_queue = state.name
    position, ahead = _queue_place(s, entry)

    def answer(
        verdict: Verdict,
        message: str,
        *,
        admission: Admission | None = None,
        victims: tuple[Victim, ...] = (),
        explanation: Explanation | None = None,
    ) -> WhatIf:
        return WhatIf(
            workload.key,
            lq_key,
            state.name,
            verdict,
            message,
            admission=admission,
            victims=victims,
            position=position,
            ahead=ahead,
            explanation=explanation,
        )

    if not state.can_admit:
        return answer(Verdict.PENDING, routing.inactive_text(s, state))
    assignment = cycle.assign(s, state, entry)
    failure = ""
    reason: PendingReason | None = None
    if assignment.mode == FitMode.FIT:
        ok, topology, failure = placing.place_assignment(
            s.placement, entry.key, assignment, reserve=False
        )
        if ok:
            return answer(
                Verdict.ADMIT,
                _first(ahead, "fits now", "admitted"),
                admission=assignment.admission(state.name, topology),
            )
        reason = PendingReason.TOPOLOGY_PLACEMENT_FAILED
    elif assignment.mode == FitMode.PREEMPT:
        targets, probe = cycle.preemption_targets(
            s, state, entry, assignment, cycle=s.cycle_number + 1
        )
        if targets:
            victims = tuple(Victim(v.key, v.cluster_queue or "", why) for v, why in targets)
            return answer(
                Verdict.PREEMPT,
                _first(ahead, f"fits after preempting {len(victims)} workload(s)", "preempts"),
                admission=assignment.admission(state.name),
                victims=victims,
            )
        if probe is not None and probe.failure:
            reason = PendingReason.TOPOLOGY_PLACEMENT_FAILED
            failure = f"no preemption can make room: {probe.failure}"
        else:
            failure = "no workloads to preempt"
    partial = cycle.partial_fit(s, state, entry, cycle=s.cycle_number + 1)
    if partial is not None:
        return _partial_answer(s, entry, state.name, partial, answer)
    blocking: list[str] = []
    if assignment.mode != FitMode.NO_FIT or assignment.reason == PendingReason.WAITING_FOR_QUOTA:
        blocking = explaining.holders(state, assignment, limit=s.config.blocking_limit)
    found = explaining.explanation(
        entry=entry,
        state=state,
        assignment=assignment,
        reason=reason,
        extra=failure,
        blocking=blocking,
        now=s.now,
    )
    return answer(
        Verdict.PENDING,
        f"{found.reason.value}: {found.message}",
        explanation=found,
    )


def _partial_answer(
    s: Scheduler,
    entry: Entry,
    cluster_queue: str,
    partial: tuple[Assignment, list[Target]],
    answer: Callable[..., WhatIf],
) -> WhatIf:
    """The full count does not fit but ``minCount`` lets fewer pods in: as the cycle would."""
    assignment, targets = partial
    counts = ", ".join(
        f"{c.pod_set.name} {c.count} of {c.pod_set.count}" for c in assignment.pod_sets
    )
    if targets:
        victims = tuple(Victim(v.key, v.cluster_queue or "", why) for v, why in targets)
        return answer(
            Verdict.PREEMPT,
            f"partial admission ({counts} pods) after preempting {len(victims)} workload(s)",
            admission=assignment.admission(cluster_queue),
            victims=victims,
        )
    _, topology, _ = placing.place_assignment(s.placement, entry.key, assignment, reserve=False)
    return answer(
        Verdict.ADMIT,
        f"partial admission ({counts} pods)",
        admission=assignment.admission(cluster_queue, topology),
    )


def _first(ahead: int, what: str, does: str) -> str:
    if ahead == 0:
        return f"{what}: {does} in the next cycle"
    return f"{what} on the current books, but {ahead} workload(s) ahead of it are tried first"


def _queue_place(s: Scheduler, entry: Entry) -> tuple[insight.Position, int]:
    """Where ``entry`` would be queued (the queue's order: priority, then creation, after
    equal ones already queued; by LocalQueue usage first with admission fair sharing), and
    how many of those ahead of it the cycle would try first."""
    state = s.queues[entry.cluster_queue or ""]
    strict = state.spec.queueing_strategy == QueueingStrategy.STRICT_FIFO
    in_cq = in_lq = tried_first = 0
    for other in state.queue.ahead_of(
        entry.priority, entry.order_time, entry.seq, entry.local_queue
    ):
        in_cq += 1
        in_lq += other.local_queue == entry.local_queue
        cls = other.queue_class
        if strict or not (isinstance(cls, QueueClass) and cls.parked):
            tried_first += 1
    return insight.Position(in_cq, in_lq), tried_first


def _placement_text(placement: object) -> str:
    counts = getattr(placement, "domain_counts", None)
    if counts is None:
        return str(placement)
    return ", ".join(f"{'/'.join(values)}: {n} pod(s)" for values, n in counts())
