"""The scheduling core's façade: events in, ``run_cycle(now)`` out.

The operator (and the bench) tell a ``Scheduler`` what changed — queues, cohorts, flavors,
namespaces, workloads — and call ``run_cycle(now)``, which returns the decisions as data.
Everything is synchronous and deterministic: time comes in as ``now`` (int milliseconds),
iteration is in name or sequence order, nothing is random and nothing does I/O.

The cycle itself lives in ``cycle.py``; this module keeps the books (which workload is
where, what counts against which quota) for every event.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from phalanx.admission import cycle, insight, routing, stopping, whatif
from phalanx.admission.budgets import Budget, BudgetLedger
from phalanx.admission.cache import QuotaBooks
from phalanx.admission.decisions import (
    CycleResult,
    Evict,
    Explanation,
    PendingReason,
)
from phalanx.admission.fair_usage import (
    AdmissionFairSharing,
    DecayedUsage,
    UsageLedger,
    base_units,
    kueue_amount,
)
from phalanx.admission.model import (
    Admission,
    ClusterQueue,
    Cohort,
    LocalQueue,
    ResourceFlavor,
    Workload,
    WorkloadPriorityClass,
)
from phalanx.admission.placement_hook import PlacementOracle
from phalanx.admission.preemption import FairSharingStrategy
from phalanx.admission.records import Entry, Phase
from phalanx.admission.state import ClusterQueueState
from phalanx.quotas.fairshare import DECAYED_SCALE, DecayedUsageOf, dominant_resource_share
from phalanx.quotas.resources import FlavorResource
from phalanx.quotas.tree import CohortCycleError, QuotaNode, ResourceTree

__all__ = ["ClusterQueueStatus", "Scheduler", "SchedulerConfig"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Kueue Configuration knobs the core honours."""

    fair_sharing: bool = False
    fair_sharing_strategies: tuple[FairSharingStrategy, ...] = (
        FairSharingStrategy.LESS_THAN_OR_EQUAL_TO_FINAL_SHARE,
        FairSharingStrategy.LESS_THAN_INITIAL_SHARE,
    )
    backoff_base_ms: int = 60_000
    """``waitForPodsReady.requeuingStrategy.backoffBaseSeconds`` (x1000)."""
    backoff_max_ms: int = 3_600_000
    blocking_limit: int = 5
    """How many blocking workloads an explanation names."""
    admission_fair_sharing: AdmissionFairSharing | None = None
    """Kueue's ``admissionFairSharing`` (with its feature gate on): ClusterQueues with
    ``usage_based_fair_sharing`` serve their LocalQueues by decayed usage. None: off."""
    budgets: tuple[Budget, ...] = ()
    """Phalanx's usage budgets (``phalanx.admission.budgets``); none: no limit."""
    decayed_fair_sharing: AdmissionFairSharing | None = None
    """Phalanx's ``decayedFairSharing`` (with ``fair_sharing``): the fair-sharing order
    between ClusterQueues of a cohort uses each one's decayed usage, or what it holds now
    when that is more (``decayed_of``; ``resource_weights`` unused). Quota checks and
    preemption keep the real usage."""


@dataclass(frozen=True, slots=True)
class ClusterQueueStatus:
    name: str
    active: bool
    reason: str
    pending: int
    reserving: int
    admitted: int
    usage: Mapping[FlavorResource, int] = field(default_factory=dict)
    borrowed: Mapping[FlavorResource, int] = field(default_factory=dict)
    weighted_share: int = 0


class Scheduler:
    """Kueue's scheduler and cache as one pure object. Not thread-safe: one caller."""

    def __init__(
        self, *, config: SchedulerConfig | None = None, placement: PlacementOracle | None = None
    ) -> None:
        self.config = config or SchedulerConfig()
        self.placement = placement
        self.tree = ResourceTree()
        self.flavors: dict[str, ResourceFlavor] = {}
        self.admission_checks: dict[str, bool] = {}
        """AdmissionCheck name -> whether it is active."""
        self.cohorts: dict[str, Cohort] = {}
        self.queues: dict[str, ClusterQueueState] = {}
        self.local_queues: dict[str, LocalQueue] = {}
        self.priority_classes: dict[str, int] = {}
        self.namespaces: dict[str, Mapping[str, str]] = {}
        self.entries: dict[str, Entry] = {}
        # The same entries by LocalQueue key and by namespace: a queue or namespace change
        # touches only its own workloads, not every workload the scheduler knows.
        self.by_local_queue: dict[str, dict[str, Entry]] = {}
        self.by_namespace: dict[str, dict[str, Entry]] = {}
        self.held: dict[str, Entry] = {}
        self.books = QuotaBooks(self.tree, self.queues)
        """Everything about who holds quota; the aliases below are read-only views."""
        self.claims = self.books.claims
        self.evicting = self.books.evicting
        self.orphans = self.books.orphans
        self.backoff: list[tuple[int, int, Entry]] = []
        self.active: set[str] = set()
        self.pending_evictions: list[Evict] = []
        self.fresh: dict[str, Explanation] = {}
        self.untried: list[Entry] = []
        """Queued since the last cycle without an explanation; each gets one at its end."""
        self.explain_queues: set[str] = set()
        self.members_cache: dict[QuotaNode, list[ClusterQueueState]] = {}
        self.mismatch_cache: dict[tuple[str, object], str | None] = {}
        self.lendable_cache: dict[str, dict[str, int]] = {}
        self.cycle_errors: dict[str, str] = {}
        afs = self.config.admission_fair_sharing
        self.fair_usage: UsageLedger | None = None if afs is None else UsageLedger(afs)
        """Decayed usage per LocalQueue (admission fair sharing), None when it is off."""
        decay = self.config.decayed_fair_sharing if self.config.fair_sharing else None
        self.decayed_usage: UsageLedger | None = None if decay is None else UsageLedger(decay)
        """Decayed usage per ClusterQueue (decayed fair sharing), None when it is off."""
        self._decayed_nodes: tuple[tuple[int, int], dict[str, dict[str, int]]] = ((-1, -1), {})
        """((ledger version, tree version), node name -> usage) memo of ``decayed_of``."""
        self.budgets: BudgetLedger | None = (
            BudgetLedger(self.config.budgets) if self.config.budgets else None
        )
        """Resource-time per budget, None without budgets."""
        self._orphans_over_budget: dict[str, str] = {}
        """Orphans (``restore_admitted`` before their ClusterQueue) admitted over a
        Preemptible budget."""
        self.budget_waits: list[tuple[int, int, Entry]] = []
        """(window end, sequence, entry): workloads waiting for a used-up budget to reset."""
        self._fair_local_queues: list[str] | None = None
        """``fair_sharing_local_queues()`` until a ClusterQueue or LocalQueue changes."""
        self.now = 0
        self.cycle_number = 0
        self._seq = 0
        self._backoff_seq = 0

    # -- admin objects -----------------------------------------------------------------------

    def apply_resource_flavor(self, flavor: ResourceFlavor) -> None:
        self.flavors[flavor.name] = flavor
        self._flavors_changed()

    def delete_resource_flavor(self, name: str) -> None:
        if self.flavors.pop(name, None) is not None:
            self._flavors_changed()

    def _flavors_changed(self) -> None:
        self.mismatch_cache.clear()
        for state in self.queues.values():
            routing.refresh_active(self, state)
        self._wake_everything()

    def apply_admission_check(self, name: str, *, active: bool) -> None:
        """An AdmissionCheck exists; ``active`` is its ``Active`` condition. A ClusterQueue
        naming a missing or inactive check admits nothing."""
        if self.admission_checks.get(name) == active:
            return
        self.admission_checks[name] = active
        self._admission_checks_changed()

    def delete_admission_check(self, name: str) -> None:
        if self.admission_checks.pop(name, None) is not None:
            self._admission_checks_changed()

    def _admission_checks_changed(self) -> None:
        for state in self.queues.values():
            if state.spec.admission_checks:
                routing.refresh_active(self, state)

    def apply_cluster_queue(self, spec: ClusterQueue) -> None:
        self._fair_local_queues = None
        state = self.queues.get(spec.name)
        old_root = state.node.root if state is not None else None
        self.tree.set_cluster_queue(
            spec.name, cohort=spec.cohort, quotas=spec.quotas(), fair_weight=spec.fair_weight
        )
        node = self.tree.cluster_queue(spec.name)
        if state is None:
            state = ClusterQueueState(spec, node)
            self.queues[spec.name] = state
        else:
            # Applied again while Terminating: it is the live queue again; the old admitted
            # workloads keep counting in its usage, and their finishing no longer deletes it.
            state.terminating = False
            was_stopped = state.spec.stop_policy
            state.update(spec, node)
            if spec.stop_policy != was_stopped:
                stopping.stop_policy_changed(self, state)
        self._structure_changed(old_root, node)
        fair = self.fair_usage is not None and spec.usage_based_fair_sharing
        state.queue.set_fair(self.local_queue_usage if fair else None)
        routing.refresh_active(self, state)
        routing.reroute_held(self)
        for workload, admission in self.books.orphans_of(spec.name):
            over_budget = self._orphans_over_budget.pop(workload.key, "")
            self.restore_admitted(workload, admission, over_budget=over_budget)

    def delete_cluster_queue(self, name: str) -> None:
        state = self.queues.get(name)
        if state is None:
            return
        claimers = self.books.claimers(name)
        reserving = self.books.reserving(name)
        if reserving or claimers:
            # Kueue keeps a ClusterQueue (finalizer) until no workload holds its quota: the
            # admitted ones and the ones still being evicted.
            state.terminating = True
            routing.refresh_active(self, state)
            # Nothing is admitted into a queue being deleted: preemptors give up their claim
            # and wait for a ClusterQueue of that name like any other pending workload.
            for entry in claimers:
                stopping.release_claim(self, entry)
                entry.phase = Phase.PENDING
                routing.route(self, entry)
            if reserving:
                return
        root = state.node.root
        for entry in list(state.queue.entries()):
            state.queue.discard(entry)
            entry.cluster_queue = None
            routing.hold(
                self,
                entry,
                PendingReason.CLUSTER_QUEUE_NOT_FOUND,
                f"ClusterQueue {name} was deleted",
            )
        del self.queues[name]
        if self.decayed_usage is not None:
            self.decayed_usage.forget(name)
        self._fair_local_queues = None
        self.active.discard(name)
        self.tree.remove_cluster_queue(name)
        self._structure_changed(root, None)

    def apply_cohort(self, spec: Cohort) -> None:
        node = self.tree.cohort(spec.name)
        old_root = node.root if node is not None else None
        try:
            self.tree.set_cohort(
                spec.name, parent=spec.parent, quotas=spec.quotas(), fair_weight=spec.fair_weight
            )
        except CohortCycleError as exc:
            self.cycle_errors[spec.name] = str(exc)
            log.warning("event=cohort_cycle cohort=%s error=%r", spec.name, str(exc))
            routing.refresh_all_active(self)
            return
        self.cycle_errors.pop(spec.name, None)
        self.cohorts[spec.name] = spec
        self._structure_changed(old_root, self.tree.cohort(spec.name))
        routing.refresh_all_active(self)

    def delete_cohort(self, name: str) -> None:
        node = self.tree.cohort(name)
        self.cohorts.pop(name, None)
        self.cycle_errors.pop(name, None)
        if node is None:
            return
        old_root = node.root
        self.tree.remove_cohort(name)
        self._structure_changed(old_root, self.tree.cohort(name))
        routing.refresh_all_active(self)

    def apply_local_queue(self, spec: LocalQueue) -> None:
        old = self.local_queues.get(spec.key)
        self.local_queues[spec.key] = spec
        self._fair_local_queues = None
        if old is not None and (
            old.stop_policy != spec.stop_policy or old.cluster_queue != spec.cluster_queue
        ):
            stopping.local_queue_changed(self, spec)
        routing.reroute_held(self)

    def delete_local_queue(self, namespace: str, name: str) -> None:
        key = f"{namespace}/{name}"
        if self.local_queues.pop(key, None) is None:
            return
        self._fair_local_queues = None
        if self.fair_usage is not None:
            self.fair_usage.forget(key)
        for entry in self.entries_of_local_queue(key):
            if entry.phase == Phase.PENDING:
                routing.unqueue(self, entry)
                routing.route(self, entry)

    def apply_priority_class(self, spec: WorkloadPriorityClass) -> None:
        # Like Kueue, a workload's priority is fixed when it is created.
        self.priority_classes[spec.name] = spec.value

    def delete_priority_class(self, name: str) -> None:
        self.priority_classes.pop(name, None)

    def set_namespace(self, name: str, labels: Mapping[str, str]) -> None:
        self.namespaces[name] = dict(labels)
        for entry in sorted(self.by_namespace.get(name, {}).values(), key=lambda e: e.seq):
            if entry.phase == Phase.PENDING:
                routing.unqueue(self, entry)
                routing.route(self, entry)

    def delete_namespace(self, name: str) -> None:
        self.set_namespace(name, {})
        self.namespaces.pop(name, None)

    # -- workloads ---------------------------------------------------------------------------

    def add_workload(self, workload: Workload) -> None:
        """A new workload, or a new version of one (re-queued if still pending)."""
        entry = self.entries.get(workload.key)
        if entry is None:
            self._seq += 1
            entry = Entry(workload, priority=self._priority_of(workload), seq=self._seq)
            self._put(entry)
            routing.route(self, entry)
            return
        if entry.phase == Phase.PENDING:
            routing.unqueue(self, entry)
            seq, requeue_at, count = entry.seq, entry.requeue_at, entry.requeue_count
            order_time = entry.order_time
            fresh = Entry(workload, priority=self._priority_of(workload), seq=seq)
            fresh.order_time = max(order_time, workload.creation_time)
            fresh.requeue_at, fresh.requeue_count = requeue_at, count
            self._drop(entry)
            self._put(fresh)
            routing.route(self, fresh)
            return
        entry.workload = workload
        if not workload.active:
            stopping.deactivate(self, entry)

    def delete_workload(self, key: str, *, now: int | None = None) -> None:
        """The workload is gone (deleted, or finished): release whatever it holds. ``now``
        (when the operator saw it go) ends its reservation for the budgets."""
        if now is not None:
            self.now = max(self.now, now)
        # An orphan (restored admitted, its ClusterQueue missing) must not come back with
        # the ClusterQueue once it is gone.
        self.books.forget_orphan(key)
        entry = self.entries.pop(key, None)
        if entry is None:
            return
        self._drop(entry)
        if entry.phase == Phase.PENDING:
            routing.unqueue(self, entry)
        elif entry.phase == Phase.CLAIMING:
            stopping.release_claim(self, entry)
        else:
            stopping.release_admitted(self, entry)
        self.fresh.pop(key, None)

    def finish_workload(self, key: str, *, now: int | None = None) -> None:
        """The workload completed; its quota is free (Kueue's ``Finished`` condition)."""
        self.delete_workload(key, now=now)

    def workload_evicted(
        self, key: str, *, now: int, backoff: bool = False, requeue_at: int | None = None
    ) -> None:
        """The operator finished evicting ``key`` (its pods are gone): release and requeue.

        ``backoff`` applies Kueue's exponential requeue backoff (waitForPodsReady timeouts).
        ``requeue_at`` holds the workload back until then instead, its count unchanged: an
        admission check in ``Retry`` says when it may be tried again.
        """
        entry = self.entries.get(key)
        if entry is None or entry.phase == Phase.PENDING:
            return
        self.now = max(self.now, now)
        if entry.phase == Phase.CLAIMING:
            stopping.release_claim(self, entry)
        else:
            stopping.release_admitted(self, entry)
        if backoff:
            entry.requeue_count, entry.requeue_at = self.next_requeue(key, now=now)
        if requeue_at is not None:
            entry.requeue_at = max(entry.requeue_at, requeue_at)
        if backoff or requeue_at is not None:
            # Kueue orders a workload requeued after a PodsReady timeout or an admission
            # check's retry by its eviction time.
            entry.order_time = now
        entry.phase = Phase.PENDING
        routing.route(self, entry)

    def next_requeue(self, key: str, *, now: int) -> tuple[int, int]:
        """The (requeue count, requeue time in ms) that evicting ``key`` with backoff at
        ``now`` would give it; the operator writes them before the core releases."""
        entry = self.entries.get(key)
        count = (entry.requeue_count if entry is not None else 0) + 1
        delay = self.config.backoff_base_ms * (2 ** (count - 1))
        return count, now + min(delay, self.config.backoff_max_ms)

    def restore_admitted(
        self, workload: Workload, admission: Admission, *, over_budget: str = ""
    ) -> None:
        """After a restart: ``workload`` is already admitted; count it without a cycle.
        ``over_budget``: it was admitted over a ``Preemptible`` budget (that message)."""
        state = self.queues.get(admission.cluster_queue)
        if state is None:
            self.books.park_orphan(workload, admission)
            if over_budget:
                self._orphans_over_budget[workload.key] = over_budget
            return
        old = self.entries.get(workload.key)
        if old is not None:
            self.delete_workload(workload.key)
        self._seq += 1
        entry = Entry(workload, priority=self._priority_of(workload), seq=self._seq)
        self._put(entry)
        entry.admitted_at = self.now
        entry.over_budget = over_budget
        self.books.admit(entry, state, admission)
        self.budget_started(entry, self.now)

    def capacity_changed(self) -> None:
        """Free capacity on flavors with a topology changed (nodes, or pods the placement
        oracle counts): retry the workloads parked because their gang could not be placed.

        Workloads waiting for quota are left parked; capacity does not help them.
        """
        for state in self.queues.values():
            if state.queue.waiting and state.queue.wake_for(
                PendingReason.TOPOLOGY_PLACEMENT_FAILED
            ):
                self.active.add(state.name)

    # -- admission fair sharing --------------------------------------------------------------

    def local_queue_usage(self, key: str) -> float:
        """LocalQueue ``key``'s weighted decayed usage (0 with admission fair sharing off)."""
        if self.fair_usage is None:
            return 0.0
        lq = self.local_queues.get(key)
        return self.fair_usage.usage(key, lq.fair_weight if lq is not None else 1.0)

    def restore_local_queue_usage(
        self, key: str, consumed: Mapping[str, float], last_update: int
    ) -> None:
        """Seed LocalQueue ``key``'s decayed usage (Kueue units: CPU in cores) as persisted:
        its ``admissionFairSharingStatus``, or rebuilt from the store. No-op when off."""
        if self.fair_usage is not None:
            self.fair_usage.restore(key, consumed, last_update)

    def admitted_usage(self, key: str) -> dict[str, float]:
        """What LocalQueue ``key``'s admitted workloads hold now, per resource (Kueue units)."""
        return {r: kueue_amount(r, n) for r, n in self.books.local_usage.get(key, {}).items()}

    def fair_sharing_local_queues(self) -> list[str]:
        """The LocalQueues (keys, in order) of ClusterQueues with
        ``UsageBasedAdmissionFairSharing``, when admission fair sharing is configured."""
        if self.fair_usage is None:
            return []
        if self._fair_local_queues is None:  # sorted once per change, not every pass
            found = []
            for key in sorted(self.local_queues):
                state = self.queues.get(self.local_queues[key].cluster_queue)
                if state is not None and state.spec.usage_based_fair_sharing:
                    found.append(key)
            self._fair_local_queues = found
        return list(self._fair_local_queues)

    def sample_fair_usage(self, now: int, *, every: int = 0) -> dict[str, DecayedUsage]:
        """Decay each LocalQueue of a ClusterQueue with ``UsageBasedAdmissionFairSharing``
        towards what it holds now (Kueue's LocalQueue reconcile), those last updated at least
        ``every`` ms ago (the sampling interval; 0: all). Returns the sampled ones."""
        ledger = self.fair_usage
        if ledger is None:
            return {}
        sampled: dict[str, DecayedUsage] = {}
        for key in self.fair_sharing_local_queues():
            entry = ledger.get(key)
            if entry is not None and now - entry.last_update < every:
                continue
            sampled[key] = ledger.sample(key, self.admitted_usage(key), now)
        return sampled

    def charge_fair_usage(self, entry: Entry, now: int) -> None:
        """``entry`` was just admitted: its LocalQueue pays the entry penalty (cycle.py)."""
        ledger = self.fair_usage
        state = self.queues.get(entry.cluster_queue or "")
        if ledger is None or state is None or not state.spec.usage_based_fair_sharing:
            return
        requests: dict[str, float] = {}
        for (_, resource), amount in entry.usage.items():
            requests[resource] = requests.get(resource, 0.0) + kueue_amount(resource, amount)
        ledger.charge(entry.local_queue, requests, self.admitted_usage(entry.local_queue), now)

    # -- decayed fair sharing between ClusterQueues ------------------------------------------

    @property
    def share_usage(self) -> DecayedUsageOf | None:
        """What fair-sharing ordering computes shares on: ``decayed_of`` with decayed fair
        sharing, else None (what each node holds now)."""
        return None if self.decayed_usage is None else self.decayed_of

    def decayed_of(self, node: QuotaNode) -> dict[str, int]:
        """``node``'s usage for decayed fair sharing, per resource in thousandths of base
        units (``DECAYED_SCALE``): for each of its ClusterQueues (a ClusterQueue: itself) and
        resource, the larger of its decayed usage and what it holds now, summed.

        What it holds now is the floor: decayed usage moves by a small entry penalty per
        admission, so on decayed usage alone a ClusterQueue with little history would take
        every free GPU of the cohort in one cycle; with the floor it is never served ahead
        of where plain DRS puts it for what it holds, and its history orders it beyond that."""
        ledger = self.decayed_usage
        if ledger is None:
            return {}
        stamp = (ledger.version, node.root.version)
        if self._decayed_nodes[0] != stamp:
            self._decayed_nodes = (stamp, {})
        known = self._decayed_nodes[1]
        found = known.get(node.name)
        if found is None:
            total: dict[str, float] = {}
            for leaf in node.cluster_queues():
                history = self.history_of(leaf)
                held = _per_resource(leaf.usage)
                for resource in history.keys() | held.keys():
                    amount = max(history.get(resource, 0.0), held.get(resource, 0.0))
                    total[resource] = total.get(resource, 0.0) + amount
            found = {r: round(amount * DECAYED_SCALE) for r, amount in total.items()}
            known[node.name] = found
        return found

    def history_of(self, node: QuotaNode) -> dict[str, float]:
        """``node``'s decayed usage alone, per resource in base units (a Cohort: the sum of
        its ClusterQueues'); empty with decayed fair sharing off."""
        ledger = self.decayed_usage
        total: dict[str, float] = {}
        if ledger is None:
            return total
        for leaf in node.cluster_queues():
            usage = ledger.get(leaf.name)
            for resource, amount in (usage.consumed if usage is not None else {}).items():
                total[resource] = total.get(resource, 0.0) + base_units(resource, amount)
        return total

    def cluster_queue_current(self, name: str) -> dict[str, float]:
        """What ClusterQueue ``name`` holds now, per resource (Kueue units, flavors summed)."""
        state = self.queues.get(name)
        held = _per_resource(state.node.usage) if state is not None else {}
        return {r: kueue_amount(r, n) for r, n in held.items()}

    def restore_cluster_queue_usage(
        self, name: str, consumed: Mapping[str, float], last_update: int
    ) -> None:
        """Seed ClusterQueue ``name``'s decayed usage (Kueue units) as persisted: its
        ``status.fairSharing.admissionFairSharingStatus``, or rebuilt from the store."""
        if self.decayed_usage is not None:
            self.decayed_usage.restore(name, consumed, last_update)

    def sample_decayed_usage(self, now: int, *, every: int = 0) -> dict[str, DecayedUsage]:
        """Decay each ClusterQueue's usage towards what it holds now, those last updated at
        least ``every`` ms ago (the sampling interval; 0: all). Returns the sampled ones."""
        ledger = self.decayed_usage
        if ledger is None:
            return {}
        sampled: dict[str, DecayedUsage] = {}
        for name in sorted(self.queues):
            entry = ledger.get(name)
            if entry is not None and now - entry.last_update < every:
                continue
            sampled[name] = ledger.sample(name, self.cluster_queue_current(name), now)
        return sampled

    def charge_decayed_usage(self, entry: Entry, now: int) -> None:
        """``entry`` was just admitted: its ClusterQueue pays the entry penalty (cycle.py)."""
        ledger = self.decayed_usage
        name = entry.cluster_queue
        if ledger is None or name is None or name not in self.queues:
            return
        requests: dict[str, float] = {}
        for (_, resource), amount in entry.usage.items():
            requests[resource] = requests.get(resource, 0.0) + kueue_amount(resource, amount)
        ledger.charge(name, requests, self.cluster_queue_current(name), now)

    # -- usage budgets ----------------------------------------------------------------------

    def budget_started(self, entry: Entry, now: int) -> None:
        """``entry`` reserved quota at ``now``: its budgets count it from then (cycle.py)."""
        if self.budgets is None:
            return
        amounts: dict[str, float] = {}
        for (_, resource), amount in entry.usage.items():
            amounts[resource] = amounts.get(resource, 0.0) + kueue_amount(resource, amount)
        self.budgets.start(
            entry.key,
            local_queue=entry.local_queue,
            cluster_queue=entry.cluster_queue,
            amounts=amounts,
            now=now,
        )

    def restore_budget_usage(self, index: int, used_hours: float, at: int) -> None:
        """Seed budget ``index`` (in ``SchedulerConfig.budgets`` order) with what it used in
        ``at``'s window up to ``at`` (the store's history); admitted workloads count from
        ``at`` on. Without it, a budget counts from the time 0. No-op without budgets."""
        if self.budgets is not None:
            self.budgets.restore(index, used_hours, at)

    def budget_usage(self, now: int) -> list[tuple[Budget, float]]:
        """Each budget with its resource-hours used in ``now``'s window (for metrics)."""
        ledger = self.budgets
        if ledger is None:
            return []
        return [(b, ledger.used_hours(i, now)) for i, b in enumerate(ledger.budgets)]

    # -- the cycle ---------------------------------------------------------------------------

    def run_cycle(self, now: int) -> CycleResult:
        """Admit as much as fits at ``now``; see ``cycle.run``."""
        return cycle.run(self, now)

    # -- queries -----------------------------------------------------------------------------

    def explain(self, key: str) -> Explanation | None:
        """The latest explanation for a pending workload (None if admitted or unknown)."""
        entry = self.entries.get(key)
        if entry is None or entry.phase != Phase.PENDING:
            return None
        if entry.explanation is not None:
            return entry.explanation
        return Explanation(
            workload=key,
            cluster_queue=entry.cluster_queue,
            reason=PendingReason.WAITING_FOR_QUOTA,
            message="waiting in the queue; not tried yet",
            time=self.now,
        )

    def explain_report(self, key: str) -> insight.Report | None:
        """``explain`` with position, shortfalls, borrowers and hints (``insight.report``)."""
        return insight.report(self, key)

    def what_if(self, workload: Workload) -> whatif.WhatIf:
        """What the next cycle would decide for ``workload`` were it created now; changes
        nothing (``whatif.what_if``)."""
        return whatif.what_if(self, workload)

    def phase(self, key: str) -> Phase | None:
        entry = self.entries.get(key)
        return entry.phase if entry is not None else None

    def admission_of(self, key: str) -> Admission | None:
        entry = self.entries.get(key)
        if entry is None or entry.phase not in (Phase.ADMITTED, Phase.EVICTING):
            return None
        return entry.admission

    def cluster_queue_status(self, name: str) -> ClusterQueueStatus:
        state = self.queues[name]
        node = state.node
        usage = dict(node.usage)
        borrowed = {
            fr: used - node.nominal(fr) for fr, used in usage.items() if used > node.nominal(fr)
        }
        reserving = len(state.admitted) + sum(
            1 for e in self.claims.values() if e.cluster_queue == name
        )
        share = dominant_resource_share(node, lendable_cache=self.lendable_cache)
        return ClusterQueueStatus(
            name=name,
            active=state.can_admit,
            reason=state.inactive_reason or ("Stopped" if state.stopped else "Ready"),
            pending=state.queue.pending,
            reserving=reserving,
            admitted=len(state.admitted),
            usage=usage,
            borrowed=borrowed,
            weighted_share=share.weighted_share,
        )

    # -- bookkeeping helpers (used by cycle.py too) -------------------------------------------

    def entries_of_local_queue(self, key: str) -> list[Entry]:
        """The workloads of LocalQueue ``key`` (namespace/name), in arrival order."""
        return sorted(self.by_local_queue.get(key, {}).values(), key=lambda e: e.seq)

    def _put(self, entry: Entry) -> None:
        self.entries[entry.key] = entry
        self.by_local_queue.setdefault(entry.local_queue, {})[entry.key] = entry
        self.by_namespace.setdefault(entry.workload.namespace, {})[entry.key] = entry

    def _drop(self, entry: Entry) -> None:
        for index, name in (
            (self.by_local_queue, entry.local_queue),
            (self.by_namespace, entry.workload.namespace),
        ):
            group = index.get(name)
            if group is not None and group.get(entry.key) is entry:
                del group[entry.key]
                if not group:
                    del index[name]

    def _priority_of(self, workload: Workload) -> int:
        if workload.priority is not None:
            return workload.priority
        if workload.priority_class is not None:
            return self.priority_classes.get(workload.priority_class, 0)
        return 0

    @property
    def dirty_roots(self) -> set[QuotaNode]:
        """Roots whose parked workloads are woken at the next cycle (the books own it)."""
        return self.books.dirty_roots

    def _structure_changed(self, old_root: QuotaNode | None, node: QuotaNode | None) -> None:
        self.members_cache.clear()
        self.lendable_cache.clear()
        if old_root is not None:
            self.dirty_roots.add(old_root.root)
        if node is not None:
            self.dirty_roots.add(node.root)

    def _wake_everything(self) -> None:
        for root in self.tree.roots():
            self.dirty_roots.add(root)

    def members(self, root: QuotaNode) -> list[ClusterQueueState]:
        """The ClusterQueues of the tree under ``root``, in name order."""
        found = self.members_cache.get(root)
        if found is None:
            found = [self.queues[n.name] for n in root.cluster_queues() if n.name in self.queues]
            self.members_cache[root] = found
        return found


def _per_resource(usage: Mapping[FlavorResource, int]) -> dict[str, float]:
    """Usage by flavor and resource, summed over flavors (base units)."""
    held: dict[str, float] = {}
    for (_, resource), amount in usage.items():
        held[resource] = held.get(resource, 0.0) + amount
    return held
