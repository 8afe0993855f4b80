"""``phalanx explain``: a pending workload's explanation, with its place in the queue, what it
lacks, who holds it, and what would let it in.

The explanation itself is the one the cycle computed (``Scheduler.explain``); this module only
reads the live books beside it (between cycles) to put numbers on it: how much is missing per
flavor and resource, which ClusterQueues of the cohort borrow it and how much, and whether its
ClusterQueue's preemption policy would reclaim that or it must wait for them to finish.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from phalanx.admission.decisions import Explanation, FitMode, PendingReason
from phalanx.admission.model import PreemptionPolicy
from phalanx.admission.records import Entry, Phase, Where
from phalanx.admission.state import ClusterQueueState
from phalanx.quotas.quantity import format_quantity

if TYPE_CHECKING:
    from phalanx.admission.scheduler import Scheduler

__all__ = [
    "Borrower",
    "Position",
    "Report",
    "Shortfall",
    "borrowers_of",
    "pending_order",
    "pod_set_lines",
    "position_of",
    "report",
]


@dataclass(frozen=True, slots=True)
class Shortfall:
    """A resource of a flavor the workload asked more of than its ClusterQueue can use now."""

    flavor: str
    resource: str
    requested: int
    available: int

    @property
    def missing(self) -> int:
        return max(self.requested - self.available, 0)


@dataclass(frozen=True, slots=True)
class Borrower:
    """A ClusterQueue of the same cohort tree using more of ``flavor``/``resource`` than its
    nominal quota: the quota a shortfall could be reclaimed from."""

    cluster_queue: str
    flavor: str
    resource: str
    borrowed: int


@dataclass(frozen=True, slots=True)
class Position:
    """From 0, in the order the scheduler takes heads (the visibility API's positions)."""

    cluster_queue: int
    local_queue: int


@dataclass(frozen=True, slots=True)
class Report:
    explanation: Explanation
    position: Position | None
    """None: not queued in a ClusterQueue (held: LocalQueue missing, deactivated, ...)."""
    shortfalls: tuple[Shortfall, ...] = ()
    borrowers: tuple[Borrower, ...] = ()
    hints: tuple[str, ...] = ()
    """What would let it in, one sentence each."""

    def text(self) -> str:
        """The words ``phalanx explain`` prints."""
        e = self.explanation
        lines = [f"Workload {e.workload} is pending: {e.reason.value}"]
        if e.cluster_queue:
            lines.append(f"  ClusterQueue: {e.cluster_queue}")
        if self.position is not None:
            lines.append(
                f"  Position: {self.position.local_queue} in its LocalQueue,"
                f" {self.position.cluster_queue} in the ClusterQueue (0 is next)"
            )
        lines.append(f"  Why: {e.message}")
        for short in self.shortfalls:
            lines.append(
                f"  Needs {_amount(short.resource, short.missing)} more {short.resource} in"
                f" flavor {short.flavor} (asks {_amount(short.resource, short.requested)},"
                f" {_amount(short.resource, short.available)} usable now)"
            )
        for b in self.borrowers:
            lines.append(
                f"  ClusterQueue {b.cluster_queue} borrows {_amount(b.resource, b.borrowed)}"
                f" {b.resource} in flavor {b.flavor}"
            )
        if e.blocking:
            lines.append(f"  Held by: {', '.join(e.blocking)}")
        if e.fair_sharing:
            lines.append(f"  {e.fair_sharing}")
        lines.extend(f"  Would let it in: {hint}" for hint in self.hints)
        if e.pod_sets:
            lines.append("  Flavors tried:")
            lines.extend(f"  {line}" for line in pod_set_lines(e))
        return "\n".join(lines)


def report(s: Scheduler, key: str) -> Report | None:
    """The explain report of pending workload ``key``; None if it is not pending (admitted,
    or unknown). Reads only; call between cycles."""
    explanation = s.explain(key)
    entry = s.entries.get(key)
    if explanation is None or entry is None:
        return None
    state = s.queues.get(entry.cluster_queue or "")
    position = position_of(s, entry) if state is not None else None
    if state is None:
        return Report(explanation, position)
    shortfalls = _shortfalls(explanation)
    borrowers = borrowers_of(state, ((x.flavor, x.resource) for x in shortfalls))
    return Report(
        explanation,
        position,
        shortfalls=shortfalls,
        borrowers=borrowers,
        hints=tuple(_hints(state, explanation, shortfalls, borrowers)),
    )


# -- positions ------------------------------------------------------------------------------------


def pending_order(s: Scheduler, cluster_queue: str) -> list[Entry] | None:
    """The pending workloads of ``cluster_queue`` in the order the scheduler takes them: its
    live queue, then those backing off by requeue time, then those waiting for a used-up
    budget by its reset time. None: no such ClusterQueue."""
    state = s.queues.get(cluster_queue)
    if state is None:
        return None
    order = list(state.queue.entries())
    seen = {entry.key for entry in order}
    for where, heap in ((Where.BACKOFF, s.backoff), (Where.BUDGET, s.budget_waits)):
        for _, _, entry in sorted(heap, key=lambda item: (item[0], item[1])):
            if (
                entry.where == where
                and entry.phase == Phase.PENDING
                and entry.cluster_queue == cluster_queue
                and entry.key not in seen
                and s.entries.get(entry.key) is entry
            ):
                seen.add(entry.key)
                order.append(entry)
    return order


def position_of(s: Scheduler, entry: Entry) -> Position | None:
    """``entry``'s place in ``pending_order``, counted without sorting the queue."""
    state = s.queues.get(entry.cluster_queue or "")
    if state is None or entry.phase != Phase.PENDING:
        return None
    if entry.where == Where.QUEUED:
        ahead = list(
            state.queue.ahead_of(entry.priority, entry.order_time, entry.seq, entry.local_queue)
        )
        in_lq = sum(1 for e in ahead if e.local_queue == entry.local_queue)
        return Position(len(ahead), in_lq)
    order = pending_order(s, state.name) or []
    in_lq = 0
    for index, other in enumerate(order):
        if other is entry:
            return Position(index, in_lq)
        if other.local_queue == entry.local_queue:
            in_lq += 1
    return None


# -- quota ----------------------------------------------------------------------------------------


def _shortfalls(explanation: Explanation) -> tuple[Shortfall, ...]:
    """Per flavor and resource, the worst shortage among the flavors tried that did not fit
    (the first flavor tried of each pod set: the one it would get first)."""
    if explanation.reason not in (
        PendingReason.WAITING_FOR_QUOTA,
        PendingReason.EXCEEDS_MAX_QUOTA,
    ):
        return ()
    found: dict[tuple[str, str], Shortfall] = {}
    for pod_set in explanation.pod_sets:
        for attempt in pod_set.attempts:
            if attempt.mode == FitMode.FIT:
                continue
            for check in attempt.resources:
                if check.requested <= check.available:
                    continue
                key = (attempt.flavor, check.resource)
                short = Shortfall(attempt.flavor, check.resource, check.requested, check.available)
                if key not in found or short.missing > found[key].missing:
                    found[key] = short
    return tuple(found.values())


def borrowers_of(state: ClusterQueueState, frs: Iterable[tuple[str, str]]) -> tuple[Borrower, ...]:
    """The other ClusterQueues of ``state``'s cohort tree borrowing these flavor-resources,
    most borrowed first."""
    node = state.node
    if node.parent is None:
        return ()
    found: list[Borrower] = []
    for fr in dict.fromkeys(frs):
        for other in node.root.borrowers.get(fr, ()):
            if other is node or other.is_cohort:
                continue
            borrowed = other.usage.get(fr, 0) - other.nominal(fr)
            if borrowed > 0:
                found.append(Borrower(other.name, fr[0], fr[1], borrowed))
    found.sort(key=lambda b: (-b.borrowed, b.cluster_queue, b.flavor, b.resource))
    return tuple(found)


def _hints(
    state: ClusterQueueState,
    explanation: Explanation,
    shortfalls: tuple[Shortfall, ...],
    borrowers: tuple[Borrower, ...],
) -> list[str]:
    hints: list[str] = []
    reclaim = state.spec.preemption.reclaim_within_cohort
    for short in shortfalls:
        mine = [b for b in borrowers if (b.flavor, b.resource) == (short.flavor, short.resource)]
        amount = _amount(short.resource, short.missing)
        need = f"{amount} more {short.resource} in flavor {short.flavor}"
        if explanation.reason == PendingReason.EXCEEDS_MAX_QUOTA:
            hints.append(
                f"it asks more than ClusterQueue {state.name} can ever get; it needs {need}:"
                " raise the quota or shrink the request"
            )
            continue
        if not mine:
            hints.append(f"{need}, freed when workloads of ClusterQueue {state.name} finish")
            continue
        named = ", ".join(
            f"{b.cluster_queue} borrows {_amount(b.resource, b.borrowed)}" for b in mine
        )
        if reclaim == PreemptionPolicy.NEVER:
            hints.append(
                f"{need}; {named}: that quota comes back when their workloads finish"
                f" (ClusterQueue {state.name} has reclaimWithinCohort: Never)"
            )
        else:
            hints.append(
                f"{need}; {named}: it would be reclaimed by preemption"
                f" (reclaimWithinCohort: {reclaim.value}) once {state.name} is within its"
                " nominal quota for it and the borrowers' workloads qualify"
            )
    if explanation.reason == PendingReason.TOPOLOGY_PLACEMENT_FAILED:
        hints.append(
            "enough free nodes in one topology domain (workloads on them finishing, or nodes"
            " added); the message says the best domain's free room"
        )
    return hints


def pod_set_lines(explanation: Explanation) -> list[str]:
    """The flavors tried, per pod set, from ``Explanation.details`` (without its summary)."""
    lines = explanation.details().splitlines()[1:]
    return [line for line in lines if line.startswith(("  pod set ", "    "))]


def _amount(resource: str, amount: int) -> str:
    return format_quantity(amount, resource=resource)
