"""One scheduling cycle, as numbered steps (Kueue's ``schedule()``, reshaped).

1. Requeue workloads whose backoff expired, and those whose used-up budget's window reset.
2. Admit preemptors whose victims are gone (their claim already holds the quota).
3. Hand over evictions decided by events (stop policies, deactivation).
4. Wake parked workloads in cohort trees where quota was freed or a spec changed.
5. Explain the workloads of queues that cannot admit (stopped, inactive).
6. Nominate: the head of every ClusterQueue that may admit, with its flavor assignment; a
   head whose LocalQueue or ClusterQueue used up a budget waits for its window to reset.
7. Admit in order — not borrowing before borrowing (or lowest fair share first), then
   priority, then FIFO. Each admission updates the live quota tree; an entry nominated
   before the tree changed is re-assigned before it is acted on. After a ClusterQueue's
   head is admitted, preempts, or is parked, its next head is nominated, so deep queues
   drain within one cycle.
8. Explain the workloads queued since the last cycle that were not tried: parked with a
   class whose head did not fit (they get its explanation), or behind a StrictFIFO head.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import TYPE_CHECKING

from phalanx.admission import explaining, ordering, placing, routing, stopping
from phalanx.admission.budgets import WhenExceeded
from phalanx.admission.decisions import (
    Admit,
    CycleResult,
    Evict,
    Explanation,
    FitMode,
    PendingReason,
    Preempt,
    Victim,
)
from phalanx.admission.flavors import Assignment, assign_flavors
from phalanx.admission.model import PreemptionPolicy
from phalanx.admission.preemption import Target, find_targets
from phalanx.admission.records import Entry, Phase, Where
from phalanx.admission.state import ClusterQueueState
from phalanx.quotas.fairshare import share_path
from phalanx.quotas.resources import FlavorResource

if TYPE_CHECKING:
    from phalanx.admission.scheduler import Scheduler

__all__ = ["assign", "partial_fit", "preemption_targets", "run"]


class _Out:
    __slots__ = (
        "admitted",
        "attempts",
        "decayed_first",
        "evicted",
        "fair_first",
        "now",
        "preempted",
    )

    def __init__(self, now: int) -> None:
        self.now = now
        self.admitted: list[Admit] = []
        self.preempted: list[Preempt] = []
        self.evicted: list[Evict] = []
        self.attempts = 0
        self.fair_first: dict[str, dict[str, float]] = {}
        """ClusterQueue -> LocalQueue -> its lowest usage when one of its workloads was
        admitted in this cycle (admission fair sharing; for explanations)."""
        self.decayed_first: dict[str, tuple[int, ...]] = {}
        """ClusterQueue -> its lowest decayed share path when one of its workloads was
        admitted in this cycle (decayed fair sharing; for explanations)."""


def run(s: Scheduler, now: int) -> CycleResult:
    s.now = now
    s.cycle_number += 1
    out = _Out(now)
    _requeue_backoffs(s, now)  # 1
    _requeue_budget_waits(s, now)
    _admit_ready_claims(s, out)  # 2
    out.evicted, s.pending_evictions = s.pending_evictions, []  # 3
    _wake_dirty_trees(s)  # 4
    _explain_stopped_queues(s)  # 5
    _admit_heads(s, out)  # 6, 7
    _explain_untried(s)  # 8
    pending, s.fresh = s.fresh, {}
    return CycleResult(
        time=now,
        admitted=tuple(out.admitted),
        preempted=tuple(out.preempted),
        evicted=tuple(out.evicted),
        pending=pending,
        attempts=out.attempts,
    )


# -- steps 1-5 ---------------------------------------------------------------------------


def _requeue_backoffs(s: Scheduler, now: int) -> None:
    while s.backoff and s.backoff[0][0] <= now:
        due, _, entry = heapq.heappop(s.backoff)
        if entry.where == Where.BACKOFF and entry.requeue_at == due and entry.key in s.entries:
            entry.where = Where.NOWHERE
            routing.route(s, entry)


def _requeue_budget_waits(s: Scheduler, now: int) -> None:
    while s.budget_waits and s.budget_waits[0][0] <= now:
        _, _, entry = heapq.heappop(s.budget_waits)
        if entry.where == Where.BUDGET and s.entries.get(entry.key) is entry:
            entry.where = Where.NOWHERE
            routing.route(s, entry)


def _waits_for_budget(s: Scheduler, state: ClusterQueueState, entry: Entry) -> bool:
    """Take ``entry``, the head of ``state``, out of its queue when a budget of its
    LocalQueue or ClusterQueue is used up, until that budget's window resets."""
    if s.budgets is None:
        return False
    over = s.budgets.exceeded(local_queue=entry.local_queue, cluster_queue=state.name, now=s.now)
    if over is None:
        preemptible = s.budgets.exceeded(
            local_queue=entry.local_queue,
            cluster_queue=state.name,
            now=s.now,
            when=WhenExceeded.PREEMPTIBLE,
        )
        entry.over_budget = "" if preemptible is None else preemptible.message
        return False
    state.queue.pop(entry)
    entry.where = Where.BUDGET
    s._backoff_seq += 1
    heapq.heappush(s.budget_waits, (over.window[1], s._backoff_seq, entry))
    routing.explain(s, entry, PendingReason.BUDGET_EXCEEDED, over.message)
    return True


def _admit_ready_claims(s: Scheduler, out: _Out) -> None:
    """Preemptors whose victims are all gone: what they held becomes their usage.

    Nothing ran between the last victim's release and this step, so the victims' quota is
    still in the hold; if the preemptor does not fit anyway (it counted on free quota that a
    higher-ordered workload took meanwhile), it goes back to its queue and tries again."""
    for entry in s.books.take_ready_claims():
        if entry.phase != Phase.CLAIMING or entry.victims_pending or entry.admission is None:
            continue
        state = s.queues.get(entry.cluster_queue or "")
        if state is None:
            continue
        admission = entry.admission
        topology: dict[str, object] = {}
        if s.placement is not None and placing.needs_placement(s.placement, admission.pod_sets):
            ok, topology, reason = placing.place_admission(
                s.placement, entry.workload, admission, reserve=True
            )
            if not ok:
                _back_to_queue(s, entry, PendingReason.TOPOLOGY_PLACEMENT_FAILED, reason)
                continue
        if topology:
            entry.admission = placing.with_topology(admission, topology)
        short = s.books.settle_claim(entry, state)
        if short:
            if topology:
                stopping.release_placement(s, entry)
            _back_to_queue(
                s,
                entry,
                PendingReason.WAITING_FOR_QUOTA,
                f"its preempted workloads are gone, but {short[0][1]} in flavor {short[0][0]}"
                " was taken meanwhile; trying again",
            )
            continue
        entry.admitted_at = out.now
        _admitted_now(s, entry, out)
        assert entry.admission is not None
        out.admitted.append(Admit(entry.key, entry.admission, out.now, entry.over_budget))


def _back_to_queue(s: Scheduler, entry: Entry, reason: PendingReason, message: str) -> None:
    stopping.release_claim(s, entry)
    entry.phase = Phase.PENDING
    routing.route(s, entry)
    routing.explain(s, entry, reason, message)


def _wake_dirty_trees(s: Scheduler) -> None:
    for root in s.books.take_dirty_roots():
        for state in s.members(root):
            if state.queue.waiting and state.queue.wake():
                s.active.add(state.name)


def _explain_stopped_queues(s: Scheduler) -> None:
    names = sorted(s.explain_queues)
    s.explain_queues = set()
    for name in names:
        state = s.queues.get(name)
        if state is None or state.can_admit:
            continue
        text = routing.inactive_text(s, state)
        for entry in state.queue.entries():
            routing.explain(s, entry, PendingReason.CLUSTER_QUEUE_INACTIVE, text)


# -- step 8 ------------------------------------------------------------------------------


def _explain_untried(s: Scheduler) -> None:
    untried, s.untried = s.untried, []
    for entry in untried:
        if (
            entry.phase != Phase.PENDING
            or entry.where != Where.QUEUED
            or entry.explanation is not None
        ):
            continue
        state = s.queues.get(entry.cluster_queue or "")
        if state is None:
            continue
        why = state.queue.why_waiting(entry)
        if why is None:
            s.untried.append(entry)  # not reached this cycle (cannot happen today): retry
            continue
        if state.queue.blocked:
            routing.explain(
                s,
                entry,
                PendingReason.BLOCKED_BY_HEAD,
                f"waiting for {why.workload} ahead of it in ClusterQueue {state.name}"
                f" (StrictFIFO), which is pending: {why.message}",
            )
            continue
        # An equivalent workload (same shape) was tried and did not fit: same answer.
        found = Explanation(
            workload=entry.key,
            cluster_queue=why.cluster_queue,
            reason=why.reason,
            message=why.message,
            time=s.now,
            pod_sets=why.pod_sets,
            blocking=why.blocking,
        )
        entry.explanation = found
        s.fresh[entry.key] = found


# -- steps 6-7 ---------------------------------------------------------------------------


def _admit_heads(s: Scheduler, out: _Out) -> None:
    heap: list[tuple[ordering.Key, int, int, ClusterQueueState, Entry, Assignment | None]] = []
    counter = 0

    def nominate(state: ClusterQueueState) -> None:
        # The key is estimated cheaply here; the flavor assignment is computed once, when
        # the entry reaches the top of the heap (the tree changes with every admission, so
        # an assignment computed earlier would mostly be stale by then).
        nonlocal counter
        entry = state.queue.head()
        if entry is None:
            s.active.discard(state.name)
            return
        counter += 1
        heapq.heappush(heap, (_estimated_key(s, state, entry), counter, -1, state, entry, None))

    for name in sorted(s.active):
        state = s.queues.get(name)
        if state is None or not state.can_admit:
            s.active.discard(name)
            continue
        nominate(state)

    while heap:
        _, _, version, state, entry, assignment = heapq.heappop(heap)
        if state.queue.head() is not entry or not state.can_admit:
            if state.can_admit:
                nominate(state)
            continue
        if _waits_for_budget(s, state, entry):
            nominate(state)
            continue
        if assignment is None or version != state.node.root.version:
            assignment = assign(s, state, entry, out)
            fresh = _key(s, state, entry, assignment)
            if heap and fresh > heap[0][0]:
                # No longer first once its real key is known: let the better one go first.
                counter += 1
                heapq.heappush(
                    heap, (fresh, counter, state.node.root.version, state, entry, assignment)
                )
                continue
        _process(s, state, entry, assignment, out)
        nominate(state)


def _key(
    s: Scheduler, state: ClusterQueueState, entry: Entry, assignment: Assignment
) -> ordering.Key:
    return ordering.key(
        entry,
        state,
        assignment,
        fair_sharing=s.config.fair_sharing,
        lendable_cache=s.lendable_cache,
        decayed=s.share_usage,
    )


def _estimated_key(s: Scheduler, state: ClusterQueueState, entry: Entry) -> ordering.Key:
    return ordering.estimated_key(
        entry,
        state,
        fair_sharing=s.config.fair_sharing,
        lendable_cache=s.lendable_cache,
        decayed=s.share_usage,
    )


def assign(
    s: Scheduler,
    state: ClusterQueueState,
    entry: Entry,
    out: _Out | None = None,
    counts: Sequence[int] | None = None,
) -> Assignment:
    """The flavor assignment of ``entry`` in ``state`` on the live books (reads only; a dry
    run passes no ``out``)."""
    if out is not None:
        out.attempts += 1
    placement = s.placement

    def can_preempt(fr: FlavorResource, amount: int, nominal: int) -> bool:
        return _can_preempt(s, state, entry, fr, amount, nominal)

    def has_topology(flavor: str) -> bool:
        return placement is not None and placement.has_topology(flavor)

    return assign_flavors(
        cluster_queue=state.spec,
        node=state.node,
        group_of=state.group_of,
        flavors=s.flavors,
        pod_sets=entry.workload.pod_sets,
        counts=counts,
        can_preempt=can_preempt,
        has_topology=has_topology,
        mismatch_cache=s.mismatch_cache,
    )


def _can_preempt(
    s: Scheduler,
    state: ClusterQueueState,
    entry: Entry,
    fr: FlavorResource,
    amount: int,
    nominal: int,
) -> bool:
    """Kueue's test for trying preemption on a flavor-resource that does not fit now."""
    node = state.node
    policy = state.spec.preemption
    reclaim = policy.reclaim_within_cohort != PreemptionPolicy.NEVER and node.parent is not None
    while_borrowing = policy.borrow_within_cohort.policy != PreemptionPolicy.NEVER or (
        s.config.fair_sharing and reclaim
    )
    may_reclaim = node.parent is not None and not node.borrowing_with(fr, amount)
    if not (amount <= nominal or may_reclaim or while_borrowing):
        return False
    if state.may_have_victims(entry.victim_priority, entry.order_time):
        return True
    if not reclaim or not (while_borrowing or node.usage.get(fr, 0) < nominal):
        # Classic reclaim only applies below nominal quota (Kueue's
        # queueUnderNominalInResourcesNeedingPreemption).
        return False
    borrowers = node.root.borrowers.get(fr)
    return borrowers is not None and (len(borrowers) > 1 or node not in borrowers)


def _process(
    s: Scheduler, state: ClusterQueueState, entry: Entry, assignment: Assignment, out: _Out
) -> None:
    """Act on a nominated head: admit it, preempt for it, admit part of it, or park it."""
    failure = ""
    reason: PendingReason | None = None
    blocking: Sequence[str] = ()
    if assignment.mode == FitMode.FIT:
        ok, topology, failure = placing.place_assignment(
            s.placement, entry.key, assignment, reserve=True
        )
        if ok:
            _admit(s, state, entry, assignment, topology, out)
            return
        reason = PendingReason.TOPOLOGY_PLACEMENT_FAILED
    elif assignment.mode == FitMode.PREEMPT:
        targets, probe = preemption_targets(s, state, entry, assignment)
        if targets:
            _preempt(s, state, entry, assignment, targets, out)
            return
        if probe is not None and probe.failure:
            # Quota could be freed, but the gang would still not fit physically: evicting
            # anyone would be for nothing (and would repeat every time the victim returns).
            reason = PendingReason.TOPOLOGY_PLACEMENT_FAILED
            failure = f"no preemption can make room: {probe.failure}"
        else:
            failure = "no workloads to preempt"
    if _partial_admission(s, state, entry, out):
        return
    if assignment.mode != FitMode.NO_FIT or assignment.reason == PendingReason.WAITING_FOR_QUOTA:
        blocking = explaining.holders(state, assignment, limit=s.config.blocking_limit)
    notes = []
    went_first = out.fair_first.get(state.name)
    if went_first and s.fair_usage is not None:
        notes.append(explaining.fair_usage_note(s, state, entry, went_first))
    if out.decayed_first and s.decayed_usage is not None:
        # A head that fits nowhere has no assignment usage: its request on first flavors.
        usage = assignment.usage or ordering.first_flavor_usage(state, entry)
        notes.append(explaining.decayed_share_note(s, state, usage, out.decayed_first))
    fair_note = "; ".join(note for note in notes if note)
    found = explaining.explanation(
        entry=entry,
        state=state,
        assignment=assignment,
        reason=reason,
        extra=failure,
        blocking=blocking,
        now=s.now,
        fair_sharing=fair_note,
    )
    entry.explanation = found
    s.fresh[entry.key] = found
    # Its equivalents get ``found`` too (``_explain_untried``); its reason decides what wakes
    # the class (``Scheduler.capacity_changed`` wakes only placement failures).
    state.queue.park_head_class(entry, found)


def preemption_targets(
    s: Scheduler,
    state: ClusterQueueState,
    entry: Entry,
    assignment: Assignment,
    *,
    cycle: int | None = None,
) -> tuple[list[Target], placing.PlacementProbe | None]:
    """Victims that let the preemptor fit, quota and (on a TAS flavor) placement; and the
    placement probe used, whose ``failure`` says why placement did not fit. The search
    restores the tree before returning. ``cycle``: the cycle it decides for (default the
    running one; a dry run between cycles asks for the next)."""
    probe = None
    placement = s.placement
    if placement is not None and any(
        placement.has_topology(f) for c in assignment.pod_sets for f in c.flavors.values()
    ):
        probe = placing.PlacementProbe(placement, entry.key, assignment)
    targets = find_targets(
        preemptor=entry,
        request=assignment.usage,
        frs=assignment.preempt_frs,
        tree=s.tree,
        cq=state,
        states=s.queues,
        fair_sharing=s.config.fair_sharing_strategies if s.config.fair_sharing else None,
        lendable_cache=s.lendable_cache,
        cycle=s.cycle_number if cycle is None else cycle,
        placement_fits=probe,
        pledged=s.books.pledged(state.name),
    )
    return targets, probe


def _admit(
    s: Scheduler,
    state: ClusterQueueState,
    entry: Entry,
    assignment: Assignment,
    topology: dict[str, object],
    out: _Out,
) -> None:
    state.queue.pop(entry)
    decayed = s.share_usage
    if decayed is not None and state.node.parent is not None:
        # Its key as it was ordered (before the books count it, and before its penalty).
        path = share_path(
            state.node, assignment.usage, lendable_cache=s.lendable_cache, decayed=decayed
        )
        lowest = out.decayed_first.get(state.name)
        out.decayed_first[state.name] = path if lowest is None else min(lowest, path)
    s.books.admit(entry, state, assignment.admission(state.name, topology))
    entry.admitted_at = out.now
    _admitted_now(s, entry, out)
    assert entry.admission is not None
    out.admitted.append(Admit(entry.key, entry.admission, out.now, entry.over_budget))


def _admitted_now(s: Scheduler, entry: Entry, out: _Out) -> None:
    entry.admitted_cycle = s.cycle_number
    entry.explanation = None
    entry.requeue_at = 0
    s.fresh.pop(entry.key, None)
    s.budget_started(entry, out.now)
    if s.decayed_usage is not None:
        s.charge_decayed_usage(entry, out.now)
    if s.fair_usage is not None and entry.cluster_queue in s.queues:
        state = s.queues[entry.cluster_queue]
        if state.spec.usage_based_fair_sharing:
            first = out.fair_first.setdefault(state.name, {})
            usage = s.local_queue_usage(entry.local_queue)
            first[entry.local_queue] = min(usage, first.get(entry.local_queue, usage))
            s.charge_fair_usage(entry, out.now)


def _preempt(
    s: Scheduler,
    state: ClusterQueueState,
    entry: Entry,
    assignment: Assignment,
    targets: list[Target],
    out: _Out,
) -> None:
    """Issue preemptions. The victims keep counting until their eviction has completed
    (the API shows them reserving until then); the preemptor holds the free quota it
    counts on beyond its own ClusterQueue's victims, and receives each victim's quota as
    that victim goes, so no one else takes it meanwhile."""
    state.queue.pop(entry)
    s.books.claim(entry, state, assignment.admission(state.name), [v for v, _ in targets])
    victims = [Victim(v.key, v.cluster_queue or "", why) for v, why in targets]
    routing.explain(
        s,
        entry,
        PendingReason.WAITING_FOR_PREEMPTED_WORKLOADS,
        f"pending the preemption of {len(victims)} workload(s)",
    )
    out.preempted.append(Preempt(entry.key, state.name, tuple(victims), out.now))


def partial_fit(
    s: Scheduler,
    state: ClusterQueueState,
    entry: Entry,
    out: _Out | None = None,
    *,
    cycle: int | None = None,
) -> tuple[Assignment, list[Target]] | None:
    """``minCount``: the largest pod counts that fit (binary search), with the victims they
    need (none: it fits as is); None when not even the minimum fits. Reads only (placement
    what-ifs, the victim search restores the tree); ``cycle`` as for ``preemption_targets``."""
    pod_sets = entry.workload.pod_sets
    mins = [ps.count if ps.min_count is None else min(ps.min_count, ps.count) for ps in pod_sets]
    deltas = [ps.count - low for ps, low in zip(pod_sets, mins, strict=True)]
    top = max(deltas, default=0)
    if top <= 0:
        return None

    def attempt(step: int) -> tuple[Assignment, list[Target]] | None:
        counts = [low + delta * step // top for low, delta in zip(mins, deltas, strict=True)]
        assignment = assign(s, state, entry, out, counts)
        if assignment.mode == FitMode.FIT:
            if placing.place_assignment(s.placement, entry.key, assignment, reserve=False)[0]:
                return assignment, []
            return None
        if assignment.mode == FitMode.PREEMPT:
            targets, _ = preemption_targets(s, state, entry, assignment, cycle=cycle)
            if targets:
                return assignment, targets
        return None

    best = attempt(0)
    if best is None:
        return None
    low, high = 0, top - 1
    while low < high:
        mid = (low + high + 1) // 2
        found = attempt(mid)
        if found is None:
            high = mid - 1
        else:
            low, best = mid, found
    return best


def _partial_admission(s: Scheduler, state: ClusterQueueState, entry: Entry, out: _Out) -> bool:
    """``minCount``: admit (or preempt for) the largest pod counts that fit, if any do."""
    best = partial_fit(s, state, entry, out)
    if best is None:
        return False
    assignment, targets = best
    if targets:
        _preempt(s, state, entry, assignment, targets, out)
        return True
    ok, topology, _ = placing.place_assignment(s.placement, entry.key, assignment, reserve=True)
    if not ok:
        return False
    _admit(s, state, entry, assignment, topology, out)
    return True
