"""From the cached API objects to the scheduling core: one ``sync`` per cycle.

The state hands over the keys that changed since the last cycle; the bridge converts those
objects (``phalanx.api.convert``) and tells the core's ``Scheduler`` and the placement oracle
what changed. It runs only between cycles, on the event loop thread, so the core is never
touched by two threads.

Restart rule: a Workload that holds ``status.admission`` with ``QuotaReserved=True`` is
*restored* (its usage counted, its placement re-held), never admitted again; a Workload with
``Finished=True`` is terminal and holds nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from phalanx.admission import model as core
from phalanx.admission.budgets import PREEMPTIBLE_NOTE
from phalanx.admission.records import Phase
from phalanx.admission.scheduler import Scheduler
from phalanx.api import convert
from phalanx.operator import conditions as cond
from phalanx.operator.oracle import TopologyOracle
from phalanx.operator.state import ClusterState

__all__ = ["CoreBridge", "SyncResult"]

logger = logging.getLogger(__name__)

# Admin kinds in the order their dependencies need (flavors before the queues naming them).
_ADMIN_ORDER = (
    "Namespace",
    "ResourceFlavor",
    "Topology",
    "Cohort",
    "ClusterQueue",
    "LocalQueue",
    "WorkloadPriorityClass",
    "AdmissionCheck",
)


@dataclass
class SyncResult:
    restored: list[str] = field(default_factory=list)
    """Workloads restored as admitted (after a restart)."""
    evicted_elsewhere: list[str] = field(default_factory=list)
    """Admitted Workloads whose reservation someone else removed (an eviction finished by
    Kueue's performance runner, for example): the core has released them."""
    resume_eviction: dict[str, str] = field(default_factory=dict)
    """Restored Workloads that were being evicted (Evicted=True): key -> reason."""
    invalid: dict[str, str] = field(default_factory=dict)
    """Workloads the core cannot take: key -> message naming the field."""
    finished: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    """Workloads new to the core in this sync (the cycle explains each one it leaves pending)."""


class CoreBridge:
    def __init__(
        self,
        scheduler: Scheduler,
        oracle: TopologyOracle,
        state: ClusterState,
        *,
        validator: Callable[[dict[str, Any]], list[str]] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.oracle = oracle
        self.state = state
        self.validator = validator
        self.flavors: dict[str, core.ResourceFlavor] = {}
        self.topologies: dict[str, tuple[str, ...]] = {}
        self.invalid_admin: dict[str, str] = {}
        """``Kind/name`` -> why the object is ignored (it failed validation)."""
        self._generation: dict[str, tuple[str, int]] = {}  # workload key -> (uid, generation)
        self._terminal: set[str] = set()
        self._pod_uids: dict[str, str] = {}
        self._admin_seen: dict[tuple[str, str], object] = {}
        self._deleting_queues: set[str] = set()
        self.in_flight_admissions: set[str] = set()
        """Workloads whose admission write is in flight: their cached object does not show
        the reservation yet, which must not be read as an eviction."""
        self.in_flight_releases: set[str] = set()
        """Workloads whose eviction-done write is in flight: the loop releases their quota
        when the write lands, so a watch event that shows it first is not an eviction."""

    # -- one sync -------------------------------------------------------------------------------

    def sync(self, deltas: Mapping[str, set[str]], *, now_ms: int) -> SyncResult:
        result = SyncResult()
        topology_dirty = False
        for kind in _ADMIN_ORDER:
            for key in sorted(deltas.get(kind, ())):
                topology_dirty |= self._admin(kind, key)
        if topology_dirty:
            self.oracle.configure(self.flavors, self.topologies)
            # A tree built or removed changes which ClusterQueues are active; re-applying a
            # flavor makes the core re-check every queue against the oracle.
            first = min(self.flavors, default=None)
            if first is not None:
                self.scheduler.apply_resource_flavor(self.flavors[first])
        capacity_changed = False
        for key in deltas.get("Node", ()):
            obj = self.state.get("Node", key)
            if obj is None:
                self.oracle.remove_node(key)
            else:
                self.oracle.upsert_node(obj)
            capacity_changed = True
        for key in deltas.get("Pod", ()):
            obj = self.state.get("Pod", key)
            if obj is None:
                uid = self._pod_uids.pop(key, None)
                if uid is not None:
                    self.oracle.remove_pod(uid)
                    capacity_changed = True
                continue
            uid = obj["metadata"]["uid"]
            old_uid = self._pod_uids.get(key)
            if old_uid is not None and old_uid != uid:
                self.oracle.remove_pod(old_uid)
            self._pod_uids[key] = uid
            if (obj.get("spec") or {}).get("nodeName"):
                self.oracle.upsert_pod(obj)
                capacity_changed = True
        if capacity_changed and self.oracle.flavors:
            # Free capacity changed: gangs parked because they could not be placed retry.
            self.scheduler.capacity_changed()
        workload_keys = deltas.get("Workload", set())
        for key in sorted(workload_keys, key=self._order):
            self._workload(key, now_ms=now_ms, result=result)
        for name in sorted(self._deleting_queues):
            self.scheduler.delete_cluster_queue(name)
        self._deleting_queues.clear()
        return result

    def _order(self, key: str) -> tuple[str, str]:
        obj = self.state.get("Workload", key)
        created = ((obj or {}).get("metadata") or {}).get("creationTimestamp") or ""
        return (created, key)

    # -- admin kinds ----------------------------------------------------------------------------

    def _admin(self, kind: str, key: str) -> bool:
        """Apply one admin object; True when the flavor topology trees need a rebuild."""
        obj = self.state.get(kind, key)
        # Status writes (Phalanx's own, every second) change neither the generation nor the
        # labels: only a new spec reaches the core, which would otherwise re-evaluate every
        # queue of the cohort tree each time.
        fingerprint = _fingerprint(kind, obj)
        if self._admin_seen.get((kind, key)) == fingerprint:
            return False
        if fingerprint is None:
            self._admin_seen.pop((kind, key), None)
        else:
            self._admin_seen[(kind, key)] = fingerprint
        s = self.scheduler
        if obj is not None and self.validator is not None and kind != "Namespace":
            errors = self.validator({"kind": kind, **obj})
            if errors:
                self.invalid_admin[f"{kind}/{key}"] = "; ".join(errors)
                logger.warning("event=invalid_object kind=%s name=%s errors=%r", kind, key, errors)
                obj = None
            else:
                self.invalid_admin.pop(f"{kind}/{key}", None)
        try:
            if kind == "Namespace":
                if obj is None:
                    s.delete_namespace(key)
                else:
                    s.set_namespace(key, (obj.get("metadata") or {}).get("labels") or {})
            elif kind == "ResourceFlavor":
                if obj is None:
                    self.flavors.pop(key, None)
                    s.delete_resource_flavor(key)
                else:
                    flavor = convert.resource_flavor(obj)
                    self.flavors[key] = flavor
                    s.apply_resource_flavor(flavor)
                return True
            elif kind == "Topology":
                if obj is None:
                    self.topologies.pop(key, None)
                else:
                    self.topologies[key] = convert.topology_levels(obj)
                return True
            elif kind == "Cohort":
                if obj is None:
                    s.delete_cohort(key)
                else:
                    s.apply_cohort(convert.cohort(obj))
            elif kind == "ClusterQueue":
                if obj is None:
                    self._deleting_queues.discard(key)
                    s.delete_cluster_queue(key)
                else:
                    s.apply_cluster_queue(convert.cluster_queue(obj))
                    if (obj.get("metadata") or {}).get("deletionTimestamp"):
                        # Deleted, held by the resource-in-use finalizer: terminating once
                        # this sync's Workloads are in (after a restart, the restored ones
                        # are what keeps it).
                        self._deleting_queues.add(key)
            elif kind == "LocalQueue":
                namespace, _, name = key.partition("/")
                if obj is None:
                    s.delete_local_queue(namespace, name)
                else:
                    s.apply_local_queue(convert.local_queue(obj))
            elif kind == "WorkloadPriorityClass":
                if obj is None:
                    s.delete_priority_class(key)
                else:
                    s.apply_priority_class(convert.workload_priority_class(obj))
            elif kind == "AdmissionCheck":
                if obj is None:
                    s.delete_admission_check(key)
                else:
                    s.apply_admission_check(key, active=_active(obj))
        except convert.ConversionError as error:
            self.invalid_admin[f"{kind}/{key}"] = str(error)
            logger.warning("event=invalid_object kind=%s name=%s error=%r", kind, key, str(error))
        return False

    # -- workloads ------------------------------------------------------------------------------

    def _workload(self, key: str, *, now_ms: int, result: SyncResult) -> None:
        s = self.scheduler
        obj = self.state.get("Workload", key)
        if obj is None:
            self._generation.pop(key, None)
            self._terminal.discard(key)
            s.delete_workload(key, now=now_ms)
            result.deleted.append(key)
            return
        metadata = obj["metadata"]
        uid = metadata.get("uid", "")
        generation = int(metadata.get("generation") or 0)
        known = self._generation.get(key)
        if known is not None and known[0] != uid:
            # Deleted and re-created under the same name between two cycles.
            s.delete_workload(key, now=now_ms)
            self._terminal.discard(key)
            known = None
        status = obj.get("status") or {}
        conditions = status.get("conditions") or []
        if cond.is_true(conditions, cond.FINISHED):
            if key not in self._terminal:
                self._terminal.add(key)
                s.finish_workload(key, now=now_ms)
                result.finished.append(key)
            self._generation[key] = (uid, generation)
            return
        if key in self._terminal:
            return
        reserved = cond.is_true(conditions, cond.QUOTA_RESERVED) and bool(status.get("admission"))
        phase = s.phase(key)
        if phase is None:
            try:
                workload = convert.workload(obj)
            except convert.ConversionError as error:
                result.invalid[key] = str(error)
                self._generation[key] = (uid, generation)
                return
            if reserved:
                self._restore(
                    key, workload, status["admission"], over_budget=_over_budget(conditions)
                )
                result.restored.append(key)
                if cond.is_true(conditions, cond.EVICTED):
                    evicted = cond.condition(conditions, cond.EVICTED) or {}
                    result.resume_eviction[key] = str(evicted.get("reason") or "Preempted")
            else:
                s.add_workload(workload)
                result.added.append(key)
            self._generation[key] = (uid, generation)
            return
        if known is None or known[1] != generation:
            try:
                s.add_workload(convert.workload(obj))
            except convert.ConversionError as error:
                result.invalid[key] = str(error)
            self._generation[key] = (uid, generation)
        if (
            phase in (Phase.ADMITTED, Phase.EVICTING)
            and not reserved
            and key not in self.in_flight_admissions
            and key not in self.in_flight_releases
        ):
            s.workload_evicted(key, now=now_ms)
            result.evicted_elsewhere.append(key)

    def _restore(
        self,
        key: str,
        workload: core.Workload,
        admission: Mapping[str, Any],
        *,
        over_budget: str = "",
    ) -> None:
        restored = convert.admission_from_status(admission)
        requests = {ps.name: ps.requests for ps in workload.pod_sets}
        by_flavor: dict[str, list[tuple[Mapping[str, int], Mapping[str, Any]]]] = {}
        for psa in restored.pod_sets:
            if psa.topology_assignment is None:
                continue
            for flavor in sorted(set(psa.flavors.values())):
                if self.oracle.has_topology(flavor):
                    by_flavor.setdefault(flavor, []).append(
                        (requests.get(psa.name, {}), psa.topology_assignment)  # type: ignore[arg-type]
                    )
        for flavor, pod_sets in by_flavor.items():
            self.oracle.restore(key=key, flavor=flavor, pod_sets=pod_sets)
        self.scheduler.restore_admitted(workload, restored, over_budget=over_budget)
        logger.info(
            "event=workload_restored workload=%s cluster_queue=%s", key, restored.cluster_queue
        )


def _active(obj: Mapping[str, Any]) -> bool:
    """An AdmissionCheck's ``Active`` condition (Kueue: only an active check may be used)."""
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") == "Active":
            return bool(c.get("status") == "True")
    return False


def _fingerprint(kind: str, obj: Mapping[str, Any] | None) -> object:
    if obj is None:
        return None
    metadata = obj.get("metadata") or {}
    if kind == "Namespace":
        return tuple(sorted((metadata.get("labels") or {}).items()))
    if kind == "AdmissionCheck":
        # Its controller reports Active in its status, which moves no generation.
        return (metadata.get("uid"), metadata.get("generation"), _active(obj))
    if "generation" not in metadata:
        # Kinds without a status subresource: any new version may carry a new spec.
        return metadata.get("resourceVersion")
    return (
        metadata.get("uid"),
        metadata.get("generation"),
        bool(metadata.get("deletionTimestamp")),
    )


def _over_budget(conditions: Sequence[Mapping[str, Any]] | None) -> str:
    """The budget message a Workload admitted over a Preemptible budget carries in its
    QuotaReserved message after ``; `` (written at admission: the only record of it a restarted
    scheduler has), or ''."""
    reserved = cond.condition(conditions, cond.QUOTA_RESERVED) or {}
    message = str(reserved.get("message") or "")
    _, _, note = message.partition("; ")
    return note if note.startswith(PREEMPTIBLE_NOTE) else ""
