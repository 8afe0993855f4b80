"""Choosing victims: the smallest set of admitted workloads whose eviction lets one fit.

Kueue's classic preemption (``pkg/scheduler/preemption``):

1. Candidates are admitted workloads that use a flavor-resource the preemptor must preempt
   for: in its own ClusterQueue those allowed by ``withinClusterQueue``; in other
   ClusterQueues of the cohort tree, those of queues borrowing that resource, allowed by
   ``reclaimWithinCohort``. They are ordered: other queues first, lower priority first,
   most recently admitted first. A workload admitted over a ``Preemptible`` budget (Phalanx's
   usage budgets) counts with a priority below every other (``Entry.victim_priority``).
2. Candidates are removed from the quota tree one by one until the preemptor fits; then,
   in reverse order, each is added back if the preemptor still fits without it. What is
   left is the victim set.
3. Which candidates may be used and whether the preemptor may borrow depends on whether it
   fits within its nominal quota and on ``borrowWithinCohort``.

"Fits" means quota **and**, on a flavor with a topology, a physical placement of the whole
gang with the removed workloads' placements released (``placement_fits``, a what-if), as
Kueue does with TAS: a preemptor that still could not be placed evicts nobody.

With fair sharing, candidates in other queues are taken from the queue with the highest
dominant resource share first, while the strategies (``LessThanOrEqualToFinalShare``,
``LessThanInitialShare``) allow it.

The search edits the live quota tree and always restores it before returning (an undoable
snapshot without a copy).
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Callable, Collection, Mapping, Sequence

from phalanx.admission.decisions import PreemptionReason
from phalanx.admission.model import PreemptionPolicy
from phalanx.admission.records import Entry
from phalanx.admission.state import ClusterQueueState
from phalanx.quotas.fairshare import dominant_resource_share
from phalanx.quotas.resources import FlavorResource
from phalanx.quotas.tree import QuotaNode, ResourceTree

__all__ = ["FairSharingStrategy", "PlacementFits", "Target", "find_targets"]

Target = tuple[Entry, PreemptionReason]
PlacementFits = Callable[[Collection[str]], bool]
"""Whether the preemptor can be placed once the workloads with these keys are gone."""


class FairSharingStrategy(enum.StrEnum):
    LESS_THAN_OR_EQUAL_TO_FINAL_SHARE = "LessThanOrEqualToFinalShare"
    LESS_THAN_INITIAL_SHARE = "LessThanInitialShare"


class _Search:
    """One preemptor's search; owns the tree edits and undoes them."""

    def __init__(
        self,
        *,
        tree: ResourceTree,
        cq: ClusterQueueState,
        states: Mapping[str, ClusterQueueState],
        request: Mapping[FlavorResource, int],
        frs: set[FlavorResource],
        placement_fits: PlacementFits | None,
        pledged: Mapping[FlavorResource, int],
    ) -> None:
        self.tree = tree
        self.pledged = pledged
        self.cq = cq
        self.states = states
        self.request = request
        self.frs = frs
        self.placement_fits = placement_fits
        # Entries whose usage is currently taken out of the tree, by id.
        self.removed: dict[int, Entry] = {}

    def node_of(self, entry: Entry) -> QuotaNode:
        assert entry.cluster_queue is not None
        return self.states[entry.cluster_queue].node

    def remove(self, entry: Entry) -> None:
        self.tree.remove_usage(self.node_of(entry), entry.usage)
        self.removed[id(entry)] = entry

    def add(self, entry: Entry) -> None:
        self.tree.add_usage(self.node_of(entry), entry.usage)
        del self.removed[id(entry)]

    def restore(self) -> None:
        """Undo every removal: the tree is exactly as before the search."""
        for entry in list(self.removed.values()):
            self.add(entry)

    def fits(self, allow_borrowing: bool) -> bool:
        node = self.cq.node
        for fr, amount in self.request.items():
            if amount > node.available(fr):
                return False
            # What the queue's waiting preemptors will add counts against its own limits
            # (the books' invariant 6). Not against the cohort: their victims still count
            # there until they are gone.
            after = amount + self.pledged.get(fr, 0)
            if not allow_borrowing and node.borrowing_with(fr, after):
                return False
            limit = node.borrow_limit.get(fr)
            if limit is not None and node.borrowing_with(fr, after - limit):
                return False
        if self.placement_fits is None:
            return True
        # Only once the quota fits: placement is the expensive half of the question.
        return self.placement_fits([entry.key for entry in self.removed.values()])

    def minimal(
        self,
        candidates: Sequence[Entry],
        *,
        allow_borrowing: bool,
        threshold: int | None = None,
    ) -> list[Target]:
        """Remove until it fits, then add back what is not needed (Kueue's heuristic)."""
        targets: list[Target] = []
        fits = False
        try:
            for cand in candidates:
                state = self.states[cand.cluster_queue or ""]
                same = state is self.cq
                reason = PreemptionReason.IN_CLUSTER_QUEUE
                if not same:
                    if not state.borrowing_on(self.frs):
                        continue
                    reason = PreemptionReason.IN_COHORT_RECLAMATION
                    if threshold is not None:
                        if cand.victim_priority >= threshold:
                            # A victim above the threshold means reclaiming, not borrowing.
                            allow_borrowing = False
                        else:
                            reason = PreemptionReason.IN_COHORT_RECLAIM_WHILE_BORROWING
                self.remove(cand)
                targets.append((cand, reason))
                if self.fits(allow_borrowing):
                    fits = True
                    break
            if not fits:
                return []
            return self.fill_back(targets, allow_borrowing)
        finally:
            self.restore()

    def fill_back(self, targets: list[Target], allow_borrowing: bool) -> list[Target]:
        """With every target removed, add back (newest removal first, sparing the last one,
        which made it fit) those the preemptor does not need."""
        kept = list(targets)
        for index in range(len(kept) - 2, -1, -1):
            cand = kept[index][0]
            self.add(cand)
            if self.fits(allow_borrowing):
                del kept[index]
            else:
                self.remove(cand)
        return kept


def _candidates(
    preemptor: Entry,
    cq: ClusterQueueState,
    states: Mapping[str, ClusterQueueState],
    frs: set[FlavorResource],
    *,
    include_cohort: bool,
    cycle: int,
) -> list[Entry]:
    """Step 1: admitted workloads that policy allows to be preempted, in preference order."""
    policy = cq.spec.preemption
    found: list[tuple[int, int, int, int, Entry]] = []
    priority = preemptor.victim_priority  # over a Preemptible budget: preempts nobody
    within = policy.within_cluster_queue
    if within != PreemptionPolicy.NEVER:
        newer_equal = within == PreemptionPolicy.LOWER_OR_NEWER_EQUAL_PRIORITY
        for cand in cq.running(before_cycle=cycle):
            if cand.victim_priority > priority:
                continue
            if cand.victim_priority == priority and not (
                newer_equal and preemptor.order_time < cand.order_time
            ):
                continue
            if not any(fr in cand.usage for fr in frs):
                continue
            found.append((1, cand.victim_priority, -cand.admitted_at, -cand.seq, cand))
    reclaim = policy.reclaim_within_cohort
    if include_cohort and cq.node.parent is not None and reclaim != PreemptionPolicy.NEVER:
        only_lower = reclaim == PreemptionPolicy.LOWER_PRIORITY
        borrowers = cq.node.root.borrowers
        others = {node.name for fr in frs for node in borrowers.get(fr, ())}
        others.discard(cq.name)
        for name in sorted(others):
            other = states.get(name)
            if other is None:
                continue
            for cand in other.running(before_cycle=cycle):
                if only_lower and cand.victim_priority >= priority:
                    continue
                if not any(fr in cand.usage for fr in frs):
                    continue
                found.append((0, cand.victim_priority, -cand.admitted_at, -cand.seq, cand))
    found.sort(key=lambda item: item[:4])
    return [item[4] for item in found]


def find_targets(
    *,
    preemptor: Entry,
    request: Mapping[FlavorResource, int],
    frs: set[FlavorResource],
    tree: ResourceTree,
    cq: ClusterQueueState,
    states: Mapping[str, ClusterQueueState],
    fair_sharing: Sequence[FairSharingStrategy] | None = None,
    lendable_cache: dict[str, dict[str, int]] | None = None,
    cycle: int = 1 << 62,
    placement_fits: PlacementFits | None = None,
    pledged: Mapping[FlavorResource, int] | None = None,
) -> list[Target]:
    """Victims for ``preemptor`` (empty when preemption cannot make it fit).

    ``request`` is its usage per flavor-resource, ``frs`` those that need preemption,
    ``states`` every ClusterQueue by name. ``fair_sharing`` None selects classic
    preemption, else the fair-sharing strategies in order. Workloads admitted in cycle
    ``cycle`` (the current one) are not candidates. ``placement_fits`` (on a flavor with a
    topology) must also hold for the victims: without it, no victim is chosen.
    ``pledged`` is what ``cq``'s waiting preemptors will add to its usage: counted as used,
    so that a queue reclaims up to its nominal quota once, not once per preemptor.
    """
    pledged = pledged or {}
    borrow_policy = cq.spec.preemption.borrow_within_cohort
    # Workloads of other queues only ever help when reclaiming below nominal quota,
    # borrowing within the cohort, or fair sharing; skip collecting them otherwise.
    include_cohort = (
        fair_sharing is not None
        or borrow_policy.policy != PreemptionPolicy.NEVER
        or _under_nominal(cq, frs, pledged)
    )
    candidates = _candidates(preemptor, cq, states, frs, include_cohort=include_cohort, cycle=cycle)
    if not candidates:
        return []
    if placement_fits is not None and not placement_fits([c.key for c in candidates]):
        # Not even with every candidate gone: skip the search (a gang wider than any domain
        # would otherwise ask placement once per candidate, for nothing).
        return []
    search = _Search(
        tree=tree,
        cq=cq,
        states=states,
        request=request,
        frs=frs,
        placement_fits=placement_fits,
        pledged=pledged,
    )
    same_queue = [c for c in candidates if c.cluster_queue == cq.name]
    if len(same_queue) == len(candidates):
        # Only our own queue's workloads: preempt them, borrowing if need be.
        return search.minimal(candidates, allow_borrowing=True)
    if fair_sharing is not None:
        return _fair_preemptions(search, candidates, preemptor, fair_sharing, lendable_cache)
    if borrow_policy.policy != PreemptionPolicy.NEVER:
        threshold = preemptor.victim_priority
        limit = borrow_policy.max_priority_threshold
        if limit is not None and limit < threshold:
            threshold = limit + 1
        if not _under_nominal(cq, frs, pledged):
            candidates = [
                c for c in candidates if c.cluster_queue == cq.name or c.victim_priority < threshold
            ]
        return search.minimal(candidates, allow_borrowing=True, threshold=threshold)
    if _under_nominal(cq, frs, pledged):
        targets = search.minimal(candidates, allow_borrowing=False)
        if targets:
            return targets
    return search.minimal(same_queue, allow_borrowing=True)


def _under_nominal(
    cq: ClusterQueueState, frs: set[FlavorResource], pledged: Mapping[FlavorResource, int]
) -> bool:
    node = cq.node
    return all(node.usage.get(fr, 0) + pledged.get(fr, 0) < node.nominal(fr) for fr in frs)


ShareRule = Callable[[int, int, int], bool]


def _rule(strategy: FairSharingStrategy) -> ShareRule:
    if strategy == FairSharingStrategy.LESS_THAN_OR_EQUAL_TO_FINAL_SHARE:
        return lambda preemptor_new, _target_old, target_new: preemptor_new <= target_new
    return lambda preemptor_new, target_old, _target_new: preemptor_new < target_old


def _fair_preemptions(
    search: _Search,
    candidates: list[Entry],
    preemptor: Entry,
    strategies: Sequence[FairSharingStrategy],
    lendable_cache: dict[str, dict[str, int]] | None,
) -> list[Target]:
    """Kueue's fair-sharing victim search (KEP-1714 rules S2-a, S2-b)."""
    cq = search.cq
    request = search.request
    rules = [_rule(s) for s in strategies] or [
        _rule(FairSharingStrategy.LESS_THAN_OR_EQUAL_TO_FINAL_SHARE),
        _rule(FairSharingStrategy.LESS_THAN_INITIAL_SHARE),
    ]

    def share(node: QuotaNode, extra: Mapping[FlavorResource, int] | None = None) -> int:
        return dominant_resource_share(node, extra, lendable_cache=lendable_cache).value

    by_queue: dict[str, list[Entry]] = {}
    for cand in candidates:
        by_queue.setdefault(cand.cluster_queue or "", []).append(cand)

    targets: list[Target] = []
    fits = False
    retry: list[Entry] = []
    try:
        new_share = share(cq.node, request)
        heap = [(-share(search.states[name].node), name) for name in sorted(by_queue)]
        heapq.heapify(heap)
        while heap and not fits:
            _, name = heapq.heappop(heap)
            state = search.states[name]
            queue = by_queue[name]
            if state is cq:
                cand = queue.pop(0)
                search.remove(cand)
                targets.append((cand, PreemptionReason.IN_CLUSTER_QUEUE))
                if search.fits(True):
                    fits = True
                    break
                new_share = share(cq.node, request)
                if queue:
                    heapq.heappush(heap, (-share(state.node), name))
                continue
            old_share = share(state.node)
            for index, cand in enumerate(queue):
                negative = {fr: -amount for fr, amount in cand.usage.items()}
                cand_new = share(state.node, negative)
                if rules[0](new_share, old_share, cand_new):
                    search.remove(cand)
                    targets.append((cand, PreemptionReason.IN_COHORT_FAIR_SHARING))
                    if search.fits(True):
                        fits = True
                        break
                    del queue[: index + 1]
                    if queue and state.borrowing_on(search.frs):
                        heapq.heappush(heap, (-share(state.node), name))
                    break
                retry.append(cand)
        if not fits and len(rules) > 1:
            first_per_queue: dict[str, Entry] = {}
            for cand in retry:
                first_per_queue.setdefault(cand.cluster_queue or "", cand)
            heap = [(-share(search.states[name].node), name) for name in sorted(first_per_queue)]
            heapq.heapify(heap)
            while heap and not fits:
                _, name = heapq.heappop(heap)
                state = search.states[name]
                if rules[1](new_share, share(state.node), 0):
                    cand = first_per_queue[name]
                    search.remove(cand)
                    targets.append((cand, PreemptionReason.IN_COHORT_FAIR_SHARING))
                    fits = search.fits(True)
        if not fits:
            return []
        return search.fill_back(targets, True)
    finally:
        search.restore()
