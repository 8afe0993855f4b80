"""The API objects of a Kueue scheduler-performance scenario, named as Kueue's generator
names them (``test/performance/scheduler/runner/generator``).

Per cohort set and index ``c``: cohort ``{class}-{c}`` (implicit, no Cohort object, as
Kueue's generator). Per queue set ``s`` and index ``q``: ClusterQueue, Namespace and
LocalQueue all named ``{class}-{s}-{q}-{cohort}``. Per workload set ``w`` of that queue:
Workloads ``{class}-{w}-{i}-{t}`` created one ``creationIntervalMs`` after the previous one
of the same set, the sets of a queue running in parallel. Everything carries Kueue's
cleanup label, so the run's objects are found (and deleted) by label. In a TAS scenario the
ResourceFlavor selects the scenario's nodes and names its Topology, and each Workload's pod
set carries the template's ``topologyRequest`` (see :mod:`phalanx.bench.tas`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from phalanx.bench.core_replay import RESOURCE, Scenario
from phalanx.bench.tas import topology_request_object
from phalanx.placement import TopologyRequest
from phalanx.quotas.quantity import format_quantity

__all__ = [
    "CLASS_LABEL",
    "CLEANUP_LABEL",
    "RUNTIME_LABEL",
    "PlannedQueue",
    "PlannedWorkload",
    "cluster_queue_object",
    "flavor_object",
    "local_queue_object",
    "namespace_object",
    "plan",
    "workload_object",
]

CLASS_LABEL = "kueue.x-k8s.io/performance-scheduler-class"
RUNTIME_LABEL = "kueue.x-k8s.io/performance-scheduler-running-ms"
CLEANUP_LABEL = "kueue.x-k8s.io/performance-scheduler-cleanup"
API = "kueue.x-k8s.io/v1beta2"


@dataclass(frozen=True, slots=True)
class PlannedQueue:
    name: str
    cohort: str
    cq_class: str
    nominal: int
    """Base units (milli-CPU)."""
    borrowing_limit: int | None
    reclaim_within_cohort: str
    within_cluster_queue: str


@dataclass(frozen=True, slots=True)
class PlannedWorkload:
    namespace: str
    name: str
    at_ms: int
    """Scheduled creation time, from the start of the run (the generator's timeline)."""
    class_name: str
    cq_class: str
    runtime_ms: int
    priority: int
    request: int
    """Per pod, milli-CPU."""
    pod_count: int
    cohort: str = ""
    topology: TopologyRequest | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def usage(self) -> int:
        return self.request * self.pod_count

    def scheduled_at(self, start: float) -> float:
        """When the scenario creates this Workload, on the clock of ``start`` (seconds):
        the time its creation is due, and that time to admission counts from."""
        return start + self.at_ms / 1000


def plan(scenario: Scenario) -> tuple[list[PlannedQueue], list[PlannedWorkload]]:
    """Queues and workloads of ``scenario``, workloads sorted by creation time."""
    queues: list[PlannedQueue] = []
    workloads: list[PlannedWorkload] = []
    for cohort_set in scenario.cohorts:
        for ci in range(cohort_set.count):
            cohort = f"{cohort_set.class_name}-{ci}"
            for qsi, qset in enumerate(cohort_set.queue_sets):
                for qi in range(qset.count):
                    name = f"{qset.class_name}-{qsi}-{qi}-{cohort}"
                    queues.append(
                        PlannedQueue(
                            name=name,
                            cohort=cohort,
                            cq_class=qset.class_name,
                            nominal=qset.nominal,
                            borrowing_limit=qset.borrowing_limit,
                            reclaim_within_cohort=qset.reclaim_within_cohort.value,
                            within_cluster_queue=qset.within_cluster_queue.value,
                        )
                    )
                    for wsi, wset in enumerate(qset.workload_sets):
                        at = 0
                        for si in range(wset.count):
                            for ti, template in enumerate(wset.workloads):
                                at += wset.interval_ms  # the generator waits, then creates
                                workloads.append(
                                    PlannedWorkload(
                                        namespace=name,
                                        name=f"{template.class_name}-{wsi}-{si}-{ti}",
                                        at_ms=at,
                                        class_name=template.class_name,
                                        cq_class=qset.class_name,
                                        runtime_ms=template.runtime_ms,
                                        priority=template.priority,
                                        request=template.request,
                                        pod_count=template.pod_count,
                                        cohort=cohort,
                                        topology=template.topology,
                                    )
                                )
    workloads.sort(key=lambda w: (w.at_ms, w.namespace, w.name))
    return queues, workloads


def _labels(cq_class: str | None = None) -> dict[str, str]:
    labels = {CLEANUP_LABEL: "true"}
    if cq_class is not None:
        labels[CLASS_LABEL] = cq_class
    return labels


def flavor_object(scenario: Scenario) -> dict[str, Any]:
    flavor = scenario.flavor
    spec: dict[str, Any] = {}
    if flavor.node_labels:
        spec["nodeLabels"] = dict(flavor.node_labels)
    if flavor.topology_name:
        spec["topologyName"] = flavor.topology_name
    return {
        "apiVersion": API,
        "kind": "ResourceFlavor",
        "metadata": {"name": flavor.name, "labels": _labels()},
        "spec": spec,
    }


def cluster_queue_object(queue: PlannedQueue, *, flavor: str) -> dict[str, Any]:
    cpu: dict[str, Any] = {
        "name": RESOURCE,
        "nominalQuota": format_quantity(queue.nominal, resource=RESOURCE),
    }
    if queue.borrowing_limit is not None:
        cpu["borrowingLimit"] = format_quantity(queue.borrowing_limit, resource=RESOURCE)
    return {
        "apiVersion": API,
        "kind": "ClusterQueue",
        "metadata": {"name": queue.name, "labels": _labels(queue.cq_class)},
        "spec": {
            "cohortName": queue.cohort,
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": [RESOURCE],
                    "flavors": [{"name": flavor, "resources": [cpu]}],
                }
            ],
            "preemption": {
                "reclaimWithinCohort": queue.reclaim_within_cohort,
                "withinClusterQueue": queue.within_cluster_queue,
            },
        },
    }


def namespace_object(queue: PlannedQueue) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": queue.name, "labels": _labels()},
    }


def local_queue_object(queue: PlannedQueue) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "LocalQueue",
        "metadata": {"name": queue.name, "namespace": queue.name, "labels": _labels()},
        "spec": {"clusterQueue": queue.name},
    }


def workload_object(workload: PlannedWorkload) -> dict[str, Any]:
    labels = _labels()
    labels[CLASS_LABEL] = workload.class_name
    labels[RUNTIME_LABEL] = str(workload.runtime_ms)
    pod_set: dict[str, Any] = {
        "name": "main",
        "count": workload.pod_count,
        "template": {
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "c",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {
                            "requests": {
                                RESOURCE: format_quantity(workload.request, resource=RESOURCE)
                            }
                        },
                    }
                ],
            }
        },
    }
    if workload.topology is not None:
        pod_set["topologyRequest"] = topology_request_object(workload.topology)
    return {
        "apiVersion": API,
        "kind": "Workload",
        "metadata": {"name": workload.name, "namespace": workload.namespace, "labels": labels},
        "spec": {
            "queueName": workload.namespace,
            "priority": workload.priority,
            "podSets": [pod_set],
        },
    }
