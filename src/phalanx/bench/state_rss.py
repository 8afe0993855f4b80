"""The operator's memory with a scenario's objects in its state, without a cluster.

The objects are the ones ``bench e2e`` creates (ResourceFlavor, Topology, Nodes,
Namespaces, ClusterQueues, LocalQueues, Workloads), given the fields the API server adds
(uid, resourceVersion, generation, creationTimestamp, managedFields), and go through the
operator's own path: the informers' cache (``ClusterState``, which drops managedFields),
the bridge into the core, and one scheduling cycle over the whole queue. What is measured is
the process's resident memory (``VmRSS``) after that, against before the objects were made.
"""

from __future__ import annotations

import asyncio
import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.bench.core_replay import Scenario
from phalanx.bench.objects import (
    cluster_queue_object,
    flavor_object,
    local_queue_object,
    namespace_object,
    plan,
    workload_object,
)
from phalanx.bench.proc import read_memory
from phalanx.bench.tas import TopologySpec, node_object, plan_nodes, topology_object
from phalanx.operator.finalizers import RESOURCE_IN_USE

__all__ = ["StateFigures", "measure_state"]

_SELF = Path("/proc/self/status")


@dataclass(frozen=True)
class StateFigures:
    workloads: int
    cluster_queues: int
    nodes: int
    objects: int
    rss_before_mib: float
    rss_after_mib: float
    peak_mib: float
    ingest_s: float
    """Objects into the cache and through the bridge into the core."""
    cycle_s: float
    """One scheduling cycle over everything pending (decisions only, nothing written)."""
    admitted_in_cycle: int

    def to_json(self) -> dict[str, Any]:
        return {
            "workloads": self.workloads,
            "cluster_queues": self.cluster_queues,
            "nodes": self.nodes,
            "objects": self.objects,
            "rss_mib": {
                "before": round(self.rss_before_mib, 1),
                "after": round(self.rss_after_mib, 1),
                "peak": round(self.peak_mib, 1),
                "state": round(self.rss_after_mib - self.rss_before_mib, 1),
            },
            "ingest_s": round(self.ingest_s, 2),
            "cycle_s": round(self.cycle_s, 2),
            "admitted_in_cycle": self.admitted_in_cycle,
        }


def _as_served(obj: dict[str, Any], n: int) -> dict[str, Any]:
    """``obj`` with what the API server adds to every object it returns."""
    metadata = obj["metadata"]
    metadata["uid"] = f"00000000-0000-4000-8000-{n:012x}"
    metadata["resourceVersion"] = str(1000 + n)
    metadata["generation"] = 1
    metadata["creationTimestamp"] = "2026-12-04T00:00:00Z"
    if obj.get("kind") == "Node":  # Ready, as KWOK reports the nodes it manages
        obj["status"]["conditions"] = [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kwok"}
        ]
    if obj.get("kind") in ("ClusterQueue", "ResourceFlavor"):
        metadata["finalizers"] = [RESOURCE_IN_USE]  # as the operator has put it on them
    metadata["managedFields"] = [
        {
            "manager": "phalanx-bench",
            "operation": "Update",
            "apiVersion": obj.get("apiVersion", "v1"),
            "time": "2026-12-04T00:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {".": {}}},
        }
    ]
    return obj


def _objects(scenario: Scenario, topology: TopologySpec | None) -> list[tuple[str, dict[str, Any]]]:
    queues, workloads = plan(scenario)
    out: list[tuple[str, dict[str, Any]]] = [("ResourceFlavor", flavor_object(scenario))]
    if topology is not None:
        out.append(("Topology", topology_object(topology, labels={})))
        out += [("Node", node_object(n, extra_labels={})) for n in plan_nodes(topology)]
    for q in queues:
        out.append(("Namespace", namespace_object(q)))
        out.append(("ClusterQueue", cluster_queue_object(q, flavor=scenario.flavor.name)))
        out.append(("LocalQueue", local_queue_object(q)))
    out += [("Workload", workload_object(w)) for w in workloads]
    return [(kind, _as_served(obj, i)) for i, (kind, obj) in enumerate(out)]


def measure_state(scenario: Scenario, topology: TopologySpec | None) -> StateFigures:
    """Fill an operator's state with ``scenario``'s objects and measure its memory."""
    # Imported here: the operator package is heavy, and its import belongs to "before".
    from phalanx.operator.config import OperatorConfig
    from phalanx.operator.loop import SchedulingLoop
    from phalanx.operator.metrics import Metrics
    from phalanx.operator.state import ClusterState
    from phalanx.operator.writer import StatusWriter

    gc.collect()
    before = read_memory(_SELF)
    if before is None:
        raise RuntimeError("no /proc/self/status: the memory figures need Linux's /proc")
    objects = _objects(scenario, topology)
    counts: dict[str, int] = {}
    for kind, _ in objects:
        counts[kind] = counts.get(kind, 0) + 1

    async def run() -> tuple[Any, float, float, int]:
        state = ClusterState()
        metrics = Metrics()
        writer = StatusWriter(None, state, metrics)  # type: ignore[arg-type]  # nothing is written
        loop = SchedulingLoop(
            api=None,  # type: ignore[arg-type]
            state=state,
            writer=writer,
            jobs=None,
            metrics=metrics,
            config=OperatorConfig(),
        )
        started = time.perf_counter()
        for kind, obj in objects:
            state.apply(kind, None, obj)
        objects.clear()  # what stays is what the state keeps
        loop._sync()
        ingested = time.perf_counter() - started
        started = time.perf_counter()
        result = loop.scheduler.run_cycle(int(time.time() * 1000))
        return loop, ingested, time.perf_counter() - started, len(result.admitted)

    kept, ingest_s, cycle_s, admitted = asyncio.run(run())
    gc.collect()
    after = read_memory(_SELF)
    del kept  # held until measured: the state is what the operator would keep
    if after is None:
        raise RuntimeError("no /proc/self/status: the memory figures need Linux's /proc")
    return StateFigures(
        workloads=counts.get("Workload", 0),
        cluster_queues=counts.get("ClusterQueue", 0),
        nodes=counts.get("Node", 0),
        objects=sum(counts.values()),
        rss_before_mib=before.rss_kib / 1024,
        rss_after_mib=after.rss_kib / 1024,
        peak_mib=(after.hwm_kib or after.rss_kib) / 1024,
        ingest_s=ingest_s,
        cycle_s=cycle_s,
        admitted_in_cycle=admitted,
    )
