"""The dashboard's data: informers on the objects it shows, and pending positions.

The same code runs in the operator (``--dashboard-port``, on its API client) and on a
workstation (``phalanx dashboard --kubeconfig``): both watch the API server, so both show
what the API says, not one replica's memory. Positions come from the visibility API
(``visibility.kueue.x-k8s.io/v1beta2``, one call per ClusterQueue with pending Workloads),
as ``phalanx list workload`` reads them.

Changes are coalesced: every informer event only marks the data dirty; :meth:`Source.run`
publishes a new version at most once per ``interval`` and wakes the viewers' streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

from phalanx.dashboard.model import Coalescer, Objects, workload_state
from phalanx.operator.informer import Informer, object_key
from phalanx.operator.kube import (
    CLUSTER_QUEUES,
    LOCAL_QUEUES,
    NODES,
    WORKLOADS,
    ApiError,
    KubeApi,
    Resource,
)

__all__ = ["VISIBILITY", "Source"]

logger = logging.getLogger(__name__)

VISIBILITY = "/apis/visibility.kueue.x-k8s.io/v1beta2"
COHORTS = Resource("kueue.x-k8s.io", "v1beta2", "cohorts", namespaced=False)
TOPOLOGIES = Resource("kueue.x-k8s.io", "v1beta2", "topologies", namespaced=False)
RESOURCE_FLAVORS = Resource("kueue.x-k8s.io", "v1beta2", "resourceflavors", namespaced=False)


class Source:
    def __init__(
        self, api: KubeApi, *, interval: float = 1.0, positions_interval: float = 2.0
    ) -> None:
        self.api = api
        self.objects = Objects()
        self.positions: dict[str, int] = {}
        self.positions_problem = ""
        """Why positions could not be read (shown on the page), empty when they could."""
        self.coalescer = Coalescer(interval)
        self.positions_interval = positions_interval
        self.version = 0
        """Bumped on each published change; viewers wait for it to move."""
        self._changed = asyncio.Condition()
        self._workloads_changed = True
        self.informers = [
            Informer(api, CLUSTER_QUEUES, self._into(self.objects.cluster_queues)),
            Informer(api, LOCAL_QUEUES, self._into(self.objects.local_queues)),
            Informer(api, COHORTS, self._into(self.objects.cohorts)),
            Informer(api, WORKLOADS, self._into(self.objects.workloads, workloads=True)),
            Informer(api, NODES, self._into(self.objects.nodes)),
            Informer(api, TOPOLOGIES, self._into(self.objects.topologies)),
            Informer(api, RESOURCE_FLAVORS, self._into(self.objects.flavors)),
        ]
        self._tasks: list[asyncio.Task[None]] = []

    def _into(self, store: dict[str, Any], *, workloads: bool = False) -> Any:
        def handle(kind: str, obj: dict[str, Any]) -> None:
            key = object_key(obj)
            if kind == "DELETED":
                store.pop(key, None)
            else:
                store[key] = obj
            if workloads:
                self._workloads_changed = True
            self.coalescer.touch()

        return handle

    async def start(self) -> None:
        for informer in self.informers:
            self._tasks.append(informer.start())
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._publish(), name="phalanx-dashboard-publish"))
        self._tasks.append(loop.create_task(self._positions(), name="phalanx-dashboard-positions"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

    async def synced(self, timeout: float) -> None:
        await asyncio.wait_for(
            asyncio.gather(*(i.synced.wait() for i in self.informers)), timeout=timeout
        )

    async def wait_changed(self, after: int, timeout: float) -> int:
        """The version once it is past ``after`` (or the same one after ``timeout``)."""
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self.version > after), timeout
                )
            return self.version

    async def _publish(self) -> None:
        tick = min(0.2, self.coalescer.interval / 5)
        while True:
            await asyncio.sleep(tick)
            if self.coalescer.due(time.monotonic()):
                async with self._changed:
                    self.version += 1
                    self._changed.notify_all()

    async def _positions(self) -> None:
        while True:
            if self._workloads_changed:
                self._workloads_changed = False
                try:
                    await self.refresh_positions()
                except Exception as error:  # shown on the page, retried
                    self.positions_problem = f"positions not available: {error}"
                self.coalescer.touch()
            await asyncio.sleep(self.positions_interval)

    async def refresh_positions(self) -> None:
        """Every pending Workload's position in its ClusterQueue, from the visibility API."""
        queues = sorted(
            {
                str(((w.get("status") or {}).get("admission") or {}).get("clusterQueue") or "")
                or self._cluster_queue(w)
                for w in list(self.objects.workloads.values())
                if workload_state(w) == "PENDING"
            }
            - {""}
        )
        found: dict[str, int] = {}
        problems = []
        for queue in queues:
            path = f"{VISIBILITY}/clusterqueues/{queue}/pendingworkloads"
            try:
                body = await self.api.request("GET", path, params={"limit": "100000"})
            except ApiError as error:
                problems.append(f"{queue}: {error.status} {error}")
                continue
            for item in body.get("items") or ():
                metadata = item.get("metadata") or {}
                key = f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"
                found[key] = int(item.get("positionInClusterQueue", 0))
        self.positions = found
        self.positions_problem = (
            "positions not available for " + "; ".join(problems) + " (the visibility API needs "
            "the operator's --visibility-port and the caller's right to read it)"
            if problems
            else ""
        )

    def _cluster_queue(self, workload: Mapping[str, Any]) -> str:
        queue = str((workload.get("spec") or {}).get("queueName") or "")
        namespace = str((workload.get("metadata") or {}).get("namespace") or "")
        lq = self.objects.local_queues.get(f"{namespace}/{queue}")
        return str((lq.get("spec") or {}).get("clusterQueue") or "") if lq else ""
