"""Setting up and tearing down a benchmark scenario's objects on the API server.

Everything the run creates carries Kueue's cleanup label, so a later run (or a crashed one)
finds and deletes it by label. Writes right after start-up are retried: freshly installed
CRDs answer 429 ("storage is (re)initializing") for a moment, and the webhook may still be
settling.

A TAS scenario also gets its nodes (KWOK nodes: KWOK reports them Ready and keeps their
leases, no kubelet runs), created with bounded concurrency before the Topology and the
ResourceFlavor, and deleted with the rest. Their names (``node-b0-r2-n15``) and the flavor's
node label keep them apart from the local control plane's own nodes.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import copy
import time
from collections.abc import Sequence
from typing import Any

import aiohttp

from phalanx.bench.core_replay import Scenario
from phalanx.bench.objects import (
    CLEANUP_LABEL,
    PlannedQueue,
    cluster_queue_object,
    flavor_object,
    local_queue_object,
    namespace_object,
)
from phalanx.bench.tas import PlannedNode, TopologySpec, node_object, topology_object
from phalanx.devcluster.handle import keep_conversion_url
from phalanx.operator.kube import (
    CLUSTER_QUEUES,
    LOCAL_QUEUES,
    ApiError,
    KubeApi,
    Resource,
    gather_limited,
)

__all__ = ["CRDS", "FLAVORS", "NAMESPACES", "NODES", "SELECTOR", "TOPOLOGIES", "ScenarioObjects"]

NAMESPACES = Resource("", "v1", "namespaces", namespaced=False)
FLAVORS = Resource("kueue.x-k8s.io", "v1beta2", "resourceflavors", namespaced=False)
TOPOLOGIES = Resource("kueue.x-k8s.io", "v1beta2", "topologies", namespaced=False)
NODES = Resource("", "v1", "nodes", namespaced=False)
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)
SELECTOR = f"{CLEANUP_LABEL}=true"
APPLY_PATCH = "application/apply-patch+yaml"


_UNFINALIZE = {"metadata": {"finalizers": None}}


class ScenarioObjects:
    def __init__(
        self,
        api: KubeApi,
        scenario: Scenario,
        queues: Sequence[PlannedQueue],
        *,
        concurrency: int,
        topology: TopologySpec | None = None,
        nodes: Sequence[PlannedNode] = (),
    ) -> None:
        self.api = api
        self.scenario = scenario
        self.queues = queues
        self.concurrency = concurrency
        self.topology = topology
        self.nodes = nodes

    async def install_crds(self, crds: Sequence[dict[str, Any]]) -> None:
        for crd in crds:
            name = crd["metadata"]["name"]
            try:
                live: dict[str, Any] | None = await self.api.get(CRDS, name)
            except ApiError as error:
                if error.status != 404:
                    raise
                live = None
            crd = copy.deepcopy(crd)
            keep_conversion_url(crd, live)
            await self.api.request(
                "PATCH",
                CRDS.path(name=name),
                params={"fieldManager": "phalanx-bench", "force": "true"},
                body=crd,
                content_type=APPLY_PATCH,
            )
        deadline = time.monotonic() + 60
        for crd in crds:
            name = crd["metadata"]["name"]
            while True:
                obj = await self.api.get(CRDS, name)
                conditions = (obj.get("status") or {}).get("conditions") or ()
                if any(
                    c.get("type") == "Established" and c.get("status") == "True" for c in conditions
                ):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"CRD {name} not Established after 60 s")
                await asyncio.sleep(0.2)

    async def remove_leftovers(self) -> None:
        """A previous run's objects (same names) must be gone before this one creates them."""
        await self.delete_everything()
        deadline = time.monotonic() + 600
        while True:
            left = await self.list(NAMESPACES, label_selector=SELECTOR)
            queues = await self.list(CLUSTER_QUEUES, label_selector=SELECTOR)
            nodes = await self.list(NODES, label_selector=SELECTOR)
            topologies = await self.list(TOPOLOGIES, label_selector=SELECTOR)
            if not left and not queues and not nodes and not topologies:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{len(left)} namespaces, {len(queues)} ClusterQueues, {len(nodes)} nodes"
                    f" and {len(topologies)} Topologies of an earlier run are still"
                    " terminating after 10 minutes"
                )
            await asyncio.sleep(1.0)

    async def create_topology(self, *, timeout: float = 300.0) -> None:
        """The scenario's nodes, Ready (KWOK's doing), then its Topology."""
        if self.topology is None:
            return
        labels = {CLEANUP_LABEL: "true"}
        results = await gather_limited(
            [self.create(NODES, node_object(n, extra_labels=labels)) for n in self.nodes],
            limit=self.concurrency,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise RuntimeError(f"{len(errors)} nodes could not be created: {errors[0]!r}")
        wanted = {n.name for n in self.nodes}
        deadline = time.monotonic() + timeout
        while True:
            ready = {
                n["metadata"]["name"]
                for n in await self.list(NODES, label_selector=SELECTOR)
                if _ready(n)
            }
            if wanted <= ready:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{len(wanted - ready)} of the scenario's {len(wanted)} nodes not Ready after"
                    f" {timeout:.0f} s; KWOK (the local control plane's, or one that manages"
                    " nodes annotated kwok.x-k8s.io/node=fake) must run in the cluster"
                )
            await asyncio.sleep(1.0)
        await self.create(TOPOLOGIES, topology_object(self.topology, labels=labels))

    async def create_queues(self) -> None:
        flavor = self.scenario.flavor.name
        await self.create(FLAVORS, flavor_object(self.scenario))

        async def one(queue: PlannedQueue) -> None:
            await self.create(CLUSTER_QUEUES, cluster_queue_object(queue, flavor=flavor))
            await self.create(NAMESPACES, namespace_object(queue))
            await self.create(LOCAL_QUEUES, local_queue_object(queue), namespace=queue.name)

        results = await gather_limited([one(q) for q in self.queues], limit=self.concurrency)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise RuntimeError(f"{len(errors)} queue objects could not be created: {errors[0]!r}")

    async def list(
        self, resource: Resource, *, label_selector: str | None = None
    ) -> builtins.list[dict[str, Any]]:
        """A list that waits out 429 "storage is (re)initializing" right after CRDs appear."""
        for attempt in range(30):
            try:
                return await self.api.list_all(resource, label_selector=label_selector)
            except ApiError as error:
                if attempt == 29 or error.status not in (429, 500, 503, 504):
                    raise
            except (aiohttp.ClientError, TimeoutError):
                if attempt == 29:
                    raise
            await asyncio.sleep(0.5)
        raise AssertionError("unreachable")

    async def create(
        self, resource: Resource, body: dict[str, Any], *, namespace: str | None = None
    ) -> None:
        for attempt in range(10):
            try:
                await self.api.create(resource, body, namespace=namespace)
                return
            except ApiError as error:
                if error.status == 409:
                    return
                # The webhook or the API server may still be settling right after start-up.
                if attempt == 9 or error.status not in (429, 500, 503, 504):
                    raise
            except (aiohttp.ClientError, TimeoutError):
                if attempt == 9:
                    raise
            await asyncio.sleep(0.5 * (attempt + 1))

    async def wait_active(self, timeout: float = 180.0) -> None:
        names = {q.name for q in self.queues}
        deadline = time.monotonic() + timeout
        while True:
            active = {
                cq["metadata"]["name"]
                for cq in await self.list(CLUSTER_QUEUES, label_selector=SELECTOR)
                if any(
                    c.get("type") == "Active" and c.get("status") == "True"
                    for c in (cq.get("status") or {}).get("conditions") or ()
                )
            }
            if names <= active:
                return
            if time.monotonic() > deadline:
                missing = sorted(names - active)
                raise RuntimeError(
                    f"{len(missing)} ClusterQueues not Active after {timeout:.0f} s"
                    f" (first: {missing[:3]}); is an operator running against this cluster?"
                )
            await asyncio.sleep(0.5)

    async def delete_everything(self) -> None:
        """Delete the run's objects by label (namespaces take their Workloads with them)."""
        queue_names = [
            cq["metadata"]["name"]
            for cq in await self.list(CLUSTER_QUEUES, label_selector=SELECTOR)
        ]
        namespaces = [
            ns["metadata"]["name"] for ns in await self.list(NAMESPACES, label_selector=SELECTOR)
        ]
        flavors = [f["metadata"]["name"] for f in await self.list(FLAVORS, label_selector=SELECTOR)]
        topologies = [
            t["metadata"]["name"] for t in await self.list(TOPOLOGIES, label_selector=SELECTOR)
        ]
        nodes = [n["metadata"]["name"] for n in await self.list(NODES, label_selector=SELECTOR)]

        async def delete(resource: Resource, name: str) -> None:
            with contextlib.suppress(ApiError):
                await self.api.delete(resource, name)
            if resource is CLUSTER_QUEUES or resource is FLAVORS or resource is TOPOLOGIES:
                # No operator of this run removes the resource-in-use finalizer yet.
                with contextlib.suppress(ApiError):
                    await self.api.patch(name=name, resource=resource, patch=_UNFINALIZE)

        await gather_limited(
            [delete(NAMESPACES, n) for n in namespaces]
            + [delete(CLUSTER_QUEUES, n) for n in queue_names]
            + [delete(FLAVORS, n) for n in flavors]
            + [delete(TOPOLOGIES, n) for n in topologies]
            + [delete(NODES, n) for n in nodes],
            limit=self.concurrency,
        )


_NOT_READY_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})


def _ready(node: dict[str, Any]) -> bool:
    """Ready, and the node lifecycle controller has lifted its not-ready taint."""
    conditions = (node.get("status") or {}).get("conditions") or ()
    taints = (node.get("spec") or {}).get("taints") or ()
    return any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    ) and not any(t.get("key") in _NOT_READY_TAINTS for t in taints)
