"""Who holds quota: the one owner of the scheduler's usage bookkeeping (Kueue's cache).

Every change to what counts in the quota tree goes through :class:`QuotaBooks`; the cycle,
the stop policies and the event methods say *what happened* (admitted, claimed, evicting,
gone, restored) and the books keep these invariants:

1. A ClusterQueue's usage in the tree is the sum of its ADMITTED and EVICTING workloads'
   admissions, plus what its CLAIMING preemptors hold.
2. An ADMITTED or EVICTING workload's ``usage`` is its admission's usage (the API shows it
   reserving); any other workload's is empty.
3. A workload stops counting only when it is gone from the API's reservation (finished,
   deleted, or its eviction completed) — never when an eviction is decided. A preemption
   victim's usage then moves into its preemptor's hold rather than being freed, so nothing
   else takes it before the preemptor is admitted.
4. A preemptor's hold is taken only from quota available at that moment, so the tree never
   counts more than the limits allow; releasing it wakes the tree.
5. An admitted workload whose ClusterQueue is missing (after a restart) is an orphan: it
   counts once its ClusterQueue exists, and never once it is gone.
6. What a ClusterQueue's CLAIMING preemptors will add to it once their victims are gone is
   its ``pledged`` quota: preemption decisions for that ClusterQueue count it as used (as
   Kueue counts a waiting preemptor's usage in its ClusterQueue), so several preemptors
   cannot each reclaim up to the same nominal quota.

``problems()`` recomputes invariants 1 and 2 from the entries; the tests call it after every
step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from phalanx.admission.model import Admission, Workload
from phalanx.admission.records import Entry, Phase
from phalanx.admission.state import ClusterQueueState
from phalanx.quotas.resources import FlavorResource, add_into
from phalanx.quotas.tree import QuotaNode, ResourceTree

__all__ = ["QuotaBooks"]


class QuotaBooks:
    """Usage per ClusterQueue, preemptors' claims and holds, evictions in progress, orphans.

    Shares the scheduler's ``tree`` and ``queues`` (structure is the scheduler's to change);
    owns everything else here. Not thread-safe: one caller."""

    def __init__(self, tree: ResourceTree, queues: Mapping[str, ClusterQueueState]) -> None:
        self.tree = tree
        self.queues = queues
        self.claims: dict[str, Entry] = {}
        """CLAIMING preemptors by key."""
        self.evicting: dict[str, Entry] = {}
        """EVICTING workloads by key: told to stop, still counting."""
        self.orphans: dict[str, tuple[Workload, Admission]] = {}
        self.ready_claims: list[Entry] = []
        """Preemptors whose last victim just went: the next cycle admits them first."""
        self.dirty_roots: set[QuotaNode] = set()
        """Roots of trees where quota was freed: their parked workloads may fit now."""
        self.local_usage: dict[str, dict[str, int]] = {}
        """LocalQueue key -> resource -> what its ADMITTED and EVICTING workloads count,
        flavors summed (Kueue's LocalQueue admitted usage, which admission fair sharing
        samples)."""

    # -- transitions -------------------------------------------------------------------------

    def admit(self, entry: Entry, state: ClusterQueueState, admission: Admission) -> None:
        """A PENDING workload is admitted into ``state`` (or restored as admitted)."""
        entry.phase = Phase.ADMITTED
        entry.cluster_queue = state.name
        entry.admission = admission
        entry.usage = admission.usage()
        self.tree.add_usage(state.node, entry.usage)
        state.add_admitted(entry)
        self._local_usage(entry, 1)

    def claim(
        self,
        entry: Entry,
        state: ClusterQueueState,
        admission: Admission,
        victims: Iterable[Entry],
    ) -> None:
        """A PENDING workload preempts ``victims``: they start evicting (still counting),
        and it holds the free quota it counts on beyond its own ClusterQueue's victims."""
        entry.phase = Phase.CLAIMING
        entry.cluster_queue = state.name
        entry.usage = {}
        entry.admission = admission
        pending: set[str] = set()
        from_own_queue: dict[FlavorResource, int] = {}
        for victim in victims:
            vstate = self.queues[victim.cluster_queue or ""]
            if vstate is state:
                add_into(from_own_queue, victim.usage)
            self._start_evicting(victim, vstate)
            vstate.remove_admitted(victim)  # no longer a preemption candidate
            victim.claimed_by = entry.key
            pending.add(victim.key)
        entry.victims_pending = pending
        hold = {}
        for fr, amount in admission.usage().items():
            free = min(amount - from_own_queue.get(fr, 0), state.node.available(fr))
            if free > 0:
                hold[fr] = free
        if hold:
            self.tree.add_usage(state.node, hold)
            entry.held = ((state.name, hold),)
        self.claims[entry.key] = entry

    def evict(self, entry: Entry) -> bool:
        """An ADMITTED workload is told to stop (stop policy, deactivation, timeout); it
        counts until ``release``. False if it was not admitted."""
        if entry.phase != Phase.ADMITTED:
            return False
        self._start_evicting(entry, self.queues.get(entry.cluster_queue or ""))
        return True

    def release(self, entry: Entry) -> None:
        """An ADMITTED or EVICTING workload is gone from the API's reservation: it stops
        counting; a waiting preemptor's victim hands its usage to that preemptor's hold."""
        state = self.queues.get(entry.cluster_queue or "")
        claimer = self.claims.get(entry.claimed_by or "")
        waiting = claimer is not None and entry.key in claimer.victims_pending
        self._local_usage(entry, -1)
        if entry.usage and state is not None:
            if claimer is not None and waiting:
                claimer.held = (*claimer.held, (state.name, entry.usage))
            else:
                self.tree.remove_usage(state.node, entry.usage)
                self.dirty_roots.add(state.node.root)
        entry.usage = {}
        if state is not None:
            state.remove_admitted(entry)
        self.evicting.pop(entry.key, None)
        if claimer is not None and waiting:
            claimer.victims_pending = claimer.victims_pending - {entry.key}
            if not claimer.victims_pending:
                self.ready_claims.append(claimer)
        entry.claimed_by = None
        entry.admission = None

    def _local_usage(self, entry: Entry, sign: int) -> None:
        if not entry.usage:
            return
        totals = self.local_usage.setdefault(entry.local_queue, {})
        for (_, resource), amount in entry.usage.items():
            left = totals.get(resource, 0) + sign * amount
            if left:
                totals[resource] = left
            else:
                totals.pop(resource, None)
        if not totals:
            del self.local_usage[entry.local_queue]

    def release_claim(self, entry: Entry) -> None:
        """A preemptor gives up (deleted, deactivated, its queue stopped or deleted, or it
        does not fit when its victims are gone): its hold is freed, its victims carry on
        being evicted for nobody."""
        self._release_hold(entry)
        entry.usage = {}
        entry.admission = None
        self.claims.pop(entry.key, None)
        for victim in entry.victims_pending:
            evicting = self.evicting.get(victim)
            if evicting is not None and evicting.claimed_by == entry.key:
                evicting.claimed_by = None
        entry.victims_pending = frozenset()

    def settle_claim(self, entry: Entry, state: ClusterQueueState) -> list[FlavorResource]:
        """A preemptor's victims are all gone: swap its hold for its admission's usage.
        Returns the flavor-resources that do not fit (then nothing is counted for it and the
        caller requeues it); empty when it is ADMITTED."""
        assert entry.admission is not None and not entry.victims_pending
        self._release_hold(entry)
        usage = entry.admission.usage()
        short = [fr for fr, amount in usage.items() if amount > state.node.available(fr)]
        if short:
            return short
        self.claims.pop(entry.key, None)
        self.admit(entry, state, entry.admission)
        return []

    def take_ready_claims(self) -> list[Entry]:
        ready = sorted({id(e): e for e in self.ready_claims}.values(), key=lambda e: e.seq)
        self.ready_claims = []
        return ready

    def take_dirty_roots(self) -> list[QuotaNode]:
        roots = sorted(self.dirty_roots, key=lambda n: (n.name, n.is_cohort))
        self.dirty_roots.clear()
        return roots

    # -- orphans -----------------------------------------------------------------------------

    def park_orphan(self, workload: Workload, admission: Admission) -> None:
        self.orphans[workload.key] = (workload, admission)

    def forget_orphan(self, key: str) -> None:
        self.orphans.pop(key, None)

    def orphans_of(self, cluster_queue: str) -> list[tuple[Workload, Admission]]:
        """Take the orphans admitted to ``cluster_queue`` (it exists now)."""
        keys = sorted(
            k for k, (_, adm) in self.orphans.items() if adm.cluster_queue == cluster_queue
        )
        return [self.orphans.pop(k) for k in keys]

    # -- queries -----------------------------------------------------------------------------

    def reserving(self, cluster_queue: str) -> bool:
        """Whether any workload holds quota in ``cluster_queue`` in the API's eyes."""
        state = self.queues.get(cluster_queue)
        if state is not None and state.admitted:
            return True
        return any(e.cluster_queue == cluster_queue for e in self.evicting.values())

    def pledged(self, cluster_queue: str) -> dict[FlavorResource, int]:
        """What the CLAIMING preemptors of ``cluster_queue`` will add to its usage when they
        are admitted: their admissions' usage, less what they already hold there and what
        their pending victims in the same ClusterQueue count there."""
        pledged: dict[FlavorResource, int] = {}
        for claim in self.claims.values():
            if claim.cluster_queue != cluster_queue or claim.admission is None:
                continue
            coming = dict(claim.admission.usage())
            for name, held in claim.held:
                if name == cluster_queue:
                    _subtract(coming, held)
            for key in claim.victims_pending:
                victim = self.evicting.get(key)
                if victim is not None and victim.cluster_queue == cluster_queue:
                    _subtract(coming, victim.usage)
            add_into(pledged, {fr: n for fr, n in coming.items() if n > 0})
        return pledged

    def claimers(self, cluster_queue: str) -> list[Entry]:
        return sorted(
            (e for e in self.claims.values() if e.cluster_queue == cluster_queue),
            key=lambda e: e.seq,
        )

    def problems(self, entries: Iterable[Entry]) -> list[str]:
        """Invariants 1 and 2, recomputed from ``entries``: what differs, as messages."""
        found: list[str] = []
        expected: dict[str, dict[FlavorResource, int]] = {}
        local: dict[str, dict[str, int]] = {}
        for entry in entries:
            if entry.phase in (Phase.ADMITTED, Phase.EVICTING):
                if entry.admission is None or entry.usage != entry.admission.usage():
                    found.append(f"{entry.key} {entry.phase.name}: usage is not its admission's")
                add_into(expected.setdefault(entry.cluster_queue or "", {}), entry.usage)
                totals = local.setdefault(entry.local_queue, {})
                for (_, resource), amount in entry.usage.items():
                    totals[resource] = totals.get(resource, 0) + amount
            elif entry.usage:
                found.append(f"{entry.key} {entry.phase.name}: counts {entry.usage}")
            for name, held in entry.held:
                add_into(expected.setdefault(name, {}), held)
        for name, state in self.queues.items():
            want = {fr: n for fr, n in expected.get(name, {}).items() if n}
            have = {fr: n for fr, n in state.node.usage.items() if n}
            if want != have:
                found.append(f"ClusterQueue {name}: tree {have} != workloads {want}")
        local = {k: {r: n for r, n in v.items() if n} for k, v in local.items()}
        if {k: v for k, v in local.items() if v} != self.local_usage:
            found.append(f"LocalQueue usage {self.local_usage} != workloads {local}")
        return found

    # -- internals ---------------------------------------------------------------------------

    def _start_evicting(self, entry: Entry, state: ClusterQueueState | None) -> None:
        entry.phase = Phase.EVICTING
        self.evicting[entry.key] = entry

    def _release_hold(self, entry: Entry) -> None:
        for name, usage in entry.held:
            state = self.queues.get(name)
            if state is not None and usage:
                self.tree.remove_usage(state.node, usage)
                self.dirty_roots.add(state.node.root)
        entry.held = ()


def _subtract(into: dict[FlavorResource, int], usage: Mapping[FlavorResource, int]) -> None:
    for fr, amount in usage.items():
        if fr in into:
            into[fr] -= amount
