"""The topology gate remover: sends each gated pod of an admitted gang to its domain.

On a flavor with a Topology, admission records where the gang goes (the pod set's
``topologyAssignment``: domains and pod counts) and the Job's pods are created with the
scheduling gate ``kueue.x-k8s.io/topology``. For each gated pod this controller picks a domain
that still has room, adds the domain's node labels to the pod's nodeSelector and removes the
gate; the kube-scheduler then binds the pod inside that domain. Indexed Jobs keep rank order:
pod ``i`` goes to the domain covering index ``i`` (the index is read from the label the pod
set's topology request names, ``podIndexLabel``: a PyTorchJob's replica index, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from phalanx.operator.jobs import PODSET_LABEL, TOPOLOGY_GATE, WORKLOAD_ANNOTATION
from phalanx.operator.kube import JSON_PATCH, PODS, ApiError, KubeApi
from phalanx.operator.metrics import Metrics
from phalanx.operator.retry import TRANSIENT_ERRORS, Backoff
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


class _Outcome(enum.Enum):
    RELEASED = "released"
    GONE = "gone"  # the pod was deleted: nothing to do
    RETRY = "retry"  # not released: look at the workload again later


# Errors of the transport rather than of the request: the API server was not reached or did
# not answer in time. aiohttp raises TimeoutError (asyncio's) for a ClientTimeout.
_TRANSIENT = TRANSIENT_ERRORS


class GateRemover:
    """Releases the gated pods of admitted workloads; one task, fed by state changes.

    A workload whose pods could not all be released (network error, server error, a pod
    that changed under the JSON patch) is looked at again after a capped exponential
    backoff, from the state as it is then: a gated pod is never dropped.
    """

    def __init__(
        self,
        api: KubeApi,
        state: ClusterState,
        metrics: Metrics,
        *,
        retry_base: float = 0.5,
        retry_max: float = 30.0,
    ) -> None:
        self.api = api
        self.state = state
        self.metrics = metrics
        self.retry_base = retry_base
        self.retry_max = retry_max
        self._pods_of: dict[str, set[str]] = {}  # workload key -> pod keys (gated or not)
        # pod key -> workload key: the reverse index, so that a pod's removal is O(1).
        self._workload_of: dict[str, str] = {}
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failures: dict[str, int] = {}  # workload key -> consecutive failed passes
        self._retries: dict[str, asyncio.TimerHandle] = {}  # workload key -> pending retry
        state.subscribe(self._on_change)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="phalanx-ungate")

    async def stop(self) -> None:
        for handle in self._retries.values():
            handle.cancel()
        self._retries.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _on_change(self, kind: str, key: str, obj: dict[str, Any] | None) -> None:
        if kind == "Pod":
            workload = None
            if obj is not None:
                workload = ((obj.get("metadata") or {}).get("annotations") or {}).get(
                    WORKLOAD_ANNOTATION
                )
            wl_key = None if workload is None else f"{key.partition('/')[0]}/{workload}"
            previous = self._workload_of.get(key)
            if previous is not None and previous != wl_key:
                self._forget_pod(key, previous)
            if wl_key is None:
                return
            self._pods_of.setdefault(wl_key, set()).add(key)
            self._workload_of[key] = wl_key
            if obj is not None and _gated(obj):
                self._mark(wl_key)
        elif kind == "Workload" and key in self._pods_of:
            if obj is None:
                for pod_key in self._pods_of.pop(key, ()):
                    self._workload_of.pop(pod_key, None)
                self._failures.pop(key, None)
                handle = self._retries.pop(key, None)
                if handle is not None:
                    handle.cancel()
            else:
                self._mark(key)

    def _forget_pod(self, pod_key: str, wl_key: str) -> None:
        del self._workload_of[pod_key]
        pods = self._pods_of.get(wl_key)
        if pods is not None:
            pods.discard(pod_key)
            if not pods:
                del self._pods_of[wl_key]

    def _mark(self, wl_key: str) -> None:
        self._dirty.add(wl_key)
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            dirty, self._dirty = self._dirty, set()
            await asyncio.gather(*(self._pass(key) for key in sorted(dirty)))

    async def _pass(self, wl_key: str) -> None:
        try:
            done = await self._ungate(wl_key)
        except Exception:
            # A malformed object must cost this workload a retry, not every workload the
            # release of its pods (the task ending would stop all of them).
            logger.exception("event=ungate_error workload=%s", wl_key)
            done = False
        if done:
            self._failures.pop(wl_key, None)
        else:
            self._retry_later(wl_key)

    def _retry_later(self, wl_key: str) -> None:
        if wl_key in self._retries:
            return  # a retry is already due; it will read the state as it is then
        failures = self._failures.get(wl_key, 0) + 1
        self._failures[wl_key] = failures
        delay = self.retry_delay(failures)
        logger.info("event=ungate_retry workload=%s attempt=%d in=%.2f", wl_key, failures, delay)
        self._retries[wl_key] = asyncio.get_running_loop().call_later(
            delay, self._retry_due, wl_key
        )

    def retry_delay(self, failures: int) -> float:
        """Seconds before the next look at a workload after ``failures`` failed passes."""
        return Backoff(initial=self.retry_base, maximum=self.retry_max).delay(failures - 1)

    def _retry_due(self, wl_key: str) -> None:
        self._retries.pop(wl_key, None)
        self._mark(wl_key)

    async def _ungate(self, wl_key: str) -> bool:
        """Release what can be released now; False if a pod must be retried later."""
        workload = self.state.get("Workload", wl_key)
        if workload is None:
            return True
        admission = (workload.get("status") or {}).get("admission") or {}
        pods = [self.state.get("Pod", k) for k in sorted(self._pods_of.get(wl_key, ()))]
        # Each kind numbers its pods with its own label (a Job's completion index, a
        # PyTorchJob's replica index): the pod set's topology request names it, as in Kueue.
        index_labels = {
            str(ps.get("name")): (ps.get("topologyRequest") or {}).get("podIndexLabel")
            or INDEX_LABEL
            for ps in (workload.get("spec") or {}).get("podSets") or ()
        }
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
                [
                    (p["metadata"]["name"], _index(p, index_labels.get(psa["name"], INDEX_LABEL)))
                    for p in gated
                ],
            )
            for pod in gated:
                selector = selectors.get(pod["metadata"]["name"])
                if selector is None:
                    continue
                if await self._release(pod, selector) is _Outcome.RETRY:
                    # The next pass recomputes every domain from the state: the pods
                    # released so far count as placed there.
                    return False
        return True

    async def _release(self, pod: dict[str, Any], selector: Mapping[str, str]) -> _Outcome:
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
            if error.not_found:
                return _Outcome.GONE
            # 409/422: the pod changed under the patch (its gates moved, the ``test`` op
            # failed); the retry reads it again from the state. Others (5xx, 429): the
            # server could not take it now.
            logger.warning(
                "event=ungate_failed pod=%s/%s status=%d error=%r",
                metadata["namespace"],
                metadata["name"],
                error.status,
                str(error),
            )
            return _Outcome.RETRY
        except _TRANSIENT as error:
            self.metrics.api_write("Pod", "ungate", ok=False)
            logger.warning(
                "event=ungate_failed pod=%s/%s error=%r",
                metadata["namespace"],
                metadata["name"],
                error,
            )
            return _Outcome.RETRY
        self.metrics.api_write("Pod", "ungate", ok=True)
        self.state.apply("Pod", "MODIFIED", updated)
        return _Outcome.RELEASED


def _gated(pod: Mapping[str, Any]) -> bool:
    return any(
        g.get("name") == TOPOLOGY_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or ()
    )


def _index(pod: Mapping[str, Any], label: str) -> int | None:
    value = (pod["metadata"].get("labels") or {}).get(label)
    return int(value) if value is not None and str(value).isdigit() else None


def _escape(label: str) -> str:
    return label.replace("~", "~0").replace("/", "~1")
