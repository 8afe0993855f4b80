"""The topology gate remover: sends each gated pod of an admitted gang to its domain.

On a flavor with a Topology, admission records where the gang goes (the pod set's
``topologyAssignment``: domains and pod counts) and the Job's pods are created with the
scheduling gate ``kueue.x-k8s.io/topology``. For each gated pod this controller picks a domain
that still has room, adds the domain's node labels to the pod's nodeSelector and removes the
gate; the kube-scheduler then binds the pod inside that domain. Indexed Jobs keep rank order:
pod ``i`` goes to the domain covering index ``i``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from phalanx.operator.jobs import PODSET_LABEL, TOPOLOGY_GATE, WORKLOAD_ANNOTATION
from phalanx.operator.kube import JSON_PATCH, PODS, ApiError, KubeApi
from phalanx.operator.metrics import Metrics
from phalanx.operator.state import ClusterState
from phalanx.placement import decode_topology_assignment

__all__ = ["GateRemover", "assign_domains"]

logger = logging.getLogger(__name__)

INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
Domain = tuple[tuple[str, ...], int]


def assign_domains(
    levels: Sequence[str],
    domains: Sequence[Domain],
    placed: Sequence[Mapping[str, str]],
    gated: Sequence[tuple[str, int | None]],
) -> dict[str, dict[str, str]]:
    """Node selectors for gated pods: ``gated`` is (pod name, completion index or None),
    ``placed`` the nodeSelectors of the pod set's pods already released. A pod whose index
    falls in domain ``d`` gets ``d``; others fill the domains with room left, in order."""
    remaining = [count for _, count in domains]
    for selector in placed:
        for i, (values, _) in enumerate(domains):
            if all(
                selector.get(level) == value for level, value in zip(levels, values, strict=True)
            ):
                remaining[i] -= 1
                break
    bounds: list[int] = []
    total = 0
    for _, count in domains:
        total += count
        bounds.append(total)
    out: dict[str, dict[str, str]] = {}
    for name, index in sorted(gated, key=lambda g: (g[1] is None, g[1] or 0, g[0])):
        chosen: int | None = None
        if index is not None:
            chosen = next((i for i, bound in enumerate(bounds) if index < bound), None)
        if chosen is None or remaining[chosen] <= 0:
            chosen = next((i for i, left in enumerate(remaining) if left > 0), None)
        if chosen is None:
            continue  # more pods than the assignment holds (e.g. a replacement): wait
        remaining[chosen] -= 1
        out[name] = dict(zip(levels, domains[chosen][0], strict=True))
    return out


class GateRemover:
    def __init__(self, api: KubeApi, state: ClusterState, metrics: Metrics) -> None:
        self.api = api
        self.state = state
        self.metrics = metrics
        self._pods_of: dict[str, set[str]] = {}  # workload key -> pod keys (gated or not)
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        state.subscribe(self._on_change)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="phalanx-ungate")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _on_change(self, kind: str, key: str, obj: dict[str, Any] | None) -> None:
        if kind == "Pod":
            namespace = key.partition("/")[0]
            workload = None
            if obj is not None:
                workload = ((obj.get("metadata") or {}).get("annotations") or {}).get(
                    WORKLOAD_ANNOTATION
                )
            if workload is None:
                for pods in self._pods_of.values():
                    pods.discard(key)
                return
            wl_key = f"{namespace}/{workload}"
            self._pods_of.setdefault(wl_key, set()).add(key)
            if obj is not None and _gated(obj):
                self._mark(wl_key)
        elif kind == "Workload" and key in self._pods_of:
            if obj is None:
                self._pods_of.pop(key, None)
            else:
                self._mark(key)

    def _mark(self, wl_key: str) -> None:
        self._dirty.add(wl_key)
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            dirty, self._dirty = self._dirty, set()
            await asyncio.gather(*(self._ungate(key) for key in sorted(dirty)))

    async def _ungate(self, wl_key: str) -> None:
        workload = self.state.get("Workload", wl_key)
        if workload is None:
            return
        admission = (workload.get("status") or {}).get("admission") or {}
        pods = [self.state.get("Pod", k) for k in sorted(self._pods_of.get(wl_key, ()))]
        for psa in admission.get("podSetAssignments") or ():
            assignment = psa.get("topologyAssignment")
            if not assignment:
                continue
            members = [
                p
                for p in pods
                if p is not None
                and ((p["metadata"].get("labels") or {}).get(PODSET_LABEL, "main")) == psa["name"]
            ]
            gated = [p for p in members if _gated(p)]
            if not gated:
                continue
            levels, domains = decode_topology_assignment(assignment)
            placed = [
                (p.get("spec") or {}).get("nodeSelector") or {} for p in members if not _gated(p)
            ]
            selectors = assign_domains(
                levels,
                domains,
                placed,
                [(p["metadata"]["name"], _index(p)) for p in gated],
            )
            for pod in gated:
                selector = selectors.get(pod["metadata"]["name"])
                if selector is not None:
                    await self._release(pod, selector)

    async def _release(self, pod: dict[str, Any], selector: Mapping[str, str]) -> None:
        spec = pod.get("spec") or {}
        gates = spec.get("schedulingGates") or []
        index = next(i for i, g in enumerate(gates) if g.get("name") == TOPOLOGY_GATE)
        ops: list[dict[str, Any]] = []
        if spec.get("nodeSelector"):
            for label, value in selector.items():
                ops.append(
                    {"op": "add", "path": f"/spec/nodeSelector/{_escape(label)}", "value": value}
                )
        else:
            ops.append({"op": "add", "path": "/spec/nodeSelector", "value": dict(selector)})
        ops.append(
            {"op": "test", "path": f"/spec/schedulingGates/{index}/name", "value": TOPOLOGY_GATE}
        )
        ops.append({"op": "remove", "path": f"/spec/schedulingGates/{index}"})
        metadata = pod["metadata"]
        try:
            updated = await self.api.patch(
                PODS,
                metadata["name"],
                ops,
                namespace=metadata["namespace"],
                content_type=JSON_PATCH,
            )
        except ApiError as error:
            self.metrics.api_write("Pod", "ungate", ok=False)
            if not error.not_found:
                logger.warning("event=ungate_failed pod=%s error=%r", metadata["name"], str(error))
            return
        self.metrics.api_write("Pod", "ungate", ok=True)
        self.state.apply("Pod", "MODIFIED", updated)


def _gated(pod: Mapping[str, Any]) -> bool:
    return any(
        g.get("name") == TOPOLOGY_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or ()
    )


def _index(pod: Mapping[str, Any]) -> int | None:
    value = (pod["metadata"].get("labels") or {}).get(INDEX_LABEL)
    return int(value) if value is not None and str(value).isdigit() else None


def _escape(label: str) -> str:
    return label.replace("~", "~0").replace("/", "~1")
