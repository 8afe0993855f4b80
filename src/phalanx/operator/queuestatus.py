"""ClusterQueue and LocalQueue status, batched: at most one write per queue per interval.

The scheduling loop takes a snapshot from the core between cycles (the core is only read
there); a flusher task writes each queue whose status differs from what it last wrote, by
server-side apply. Kueue writes queue status on every change; during a burst that is one
write per admission per queue, which Phalanx avoids.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

import aiohttp

from phalanx.admission.records import Phase
from phalanx.admission.scheduler import Scheduler
from phalanx.operator import conditions as cond
from phalanx.operator.kube import CLUSTER_QUEUES, LOCAL_QUEUES, ApiError, KubeApi, Resource
from phalanx.operator.metrics import Metrics
from phalanx.operator.state import ClusterState
from phalanx.operator.writer import APPLY_PATCH, FIELD_MANAGER
from phalanx.quotas.quantity import format_quantity

__all__ = ["QueueStatus", "cluster_queue_status", "local_queue_counts"]

logger = logging.getLogger(__name__)

Usage = Mapping[tuple[str, str], int]


def _flavor_list(
    usage: Usage, *, flavors: list[tuple[str, list[str]]], borrowed: Usage | None
) -> list[dict[str, Any]]:
    """Kueue lists every flavor and resource of the queue, zeros included."""
    out = []
    for flavor, resources in flavors:
        entries = []
        for resource in resources:
            entry: dict[str, Any] = {
                "name": resource,
                "total": format_quantity(usage.get((flavor, resource), 0), resource=resource),
            }
            if borrowed is not None:
                entry["borrowed"] = format_quantity(
                    borrowed.get((flavor, resource), 0), resource=resource
                )
            entries.append(entry)
        out.append({"name": flavor, "resources": entries})
    return out


def _spec_flavors(cq: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    flavors: list[tuple[str, list[str]]] = []
    for group in (cq.get("spec") or {}).get("resourceGroups") or ():
        for flavor in group.get("flavors") or ():
            flavors.append((flavor["name"], [r["name"] for r in flavor.get("resources") or ()]))
    return flavors


def cluster_queue_status(
    scheduler: Scheduler, cq: Mapping[str, Any], *, invalid: str | None = None
) -> dict[str, Any]:
    """The status Phalanx owns on a ClusterQueue (without condition timestamps)."""
    name = cq["metadata"]["name"]
    if invalid is not None or name not in scheduler.queues:
        return {
            "active": ("False", "InvalidSpec" if invalid else "Pending", invalid or "Not ready"),
            "pendingWorkloads": 0,
            "reservingWorkloads": 0,
            "admittedWorkloads": 0,
        }
    st = scheduler.cluster_queue_status(name)
    flavors = _spec_flavors(cq)
    if st.active:
        active = ("True", "Ready", "Can admit new workloads")
    else:
        reason, _, detail = st.reason.partition(": ")
        active = ("False", reason or "Inactive", detail or st.reason)
    return {
        "active": active,
        "pendingWorkloads": st.pending,
        "reservingWorkloads": st.reserving,
        "admittedWorkloads": st.admitted,
        "flavorsReservation": _flavor_list(st.usage, flavors=flavors, borrowed=st.borrowed),
        "flavorsUsage": _flavor_list(st.usage, flavors=flavors, borrowed=st.borrowed),
        "fairSharing": {"weightedShare": st.weighted_share},
    }


def local_queue_counts(scheduler: Scheduler) -> dict[str, dict[str, Any]]:
    """Per LocalQueue key: pending / reserving / admitted counts and usage by flavor."""
    out: dict[str, dict[str, Any]] = {}
    for entry in list(scheduler.entries.values()):
        lq = out.setdefault(
            entry.local_queue, {"pending": 0, "reserving": 0, "admitted": 0, "usage": {}}
        )
        if entry.phase == Phase.PENDING:
            lq["pending"] += 1
            continue
        lq["reserving"] += 1
        if entry.phase in (Phase.ADMITTED, Phase.EVICTING):
            lq["admitted"] += 1
        for fr, amount in entry.usage.items():
            lq["usage"][fr] = lq["usage"].get(fr, 0) + amount
    return out


class QueueStatus:
    def __init__(
        self,
        api: KubeApi,
        state: ClusterState,
        metrics: Metrics,
        *,
        interval: float = 1.0,
    ) -> None:
        self.api = api
        self.state = state
        self.metrics = metrics
        self.interval = interval
        self._snapshot: dict[tuple[str, str], dict[str, Any]] = {}
        self._written: dict[tuple[str, str], dict[str, Any]] = {}
        self._taken = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="phalanx-qstatus")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def snapshot(
        self, scheduler: Scheduler, invalid: Mapping[str, str], *, force: bool = False
    ) -> None:
        """Called by the scheduling loop between cycles (at most once per interval)."""
        now = time.monotonic()
        if not force and now - self._taken < self.interval:
            return
        self._taken = now
        snapshot: dict[tuple[str, str], dict[str, Any]] = {}
        for kind, name in self._snapshot:
            if kind == "ClusterQueue" and name not in self.state.objects["ClusterQueue"]:
                self.metrics.forget_queue(name)  # deleted: its series must not linger
                self._written.pop((kind, name), None)
        for name, cq in self.state.objects["ClusterQueue"].items():
            status = cluster_queue_status(
                scheduler, cq, invalid=invalid.get(f"ClusterQueue/{name}")
            )
            snapshot[("ClusterQueue", name)] = status
            self._metrics(scheduler, name, cq, status)
        counts = local_queue_counts(scheduler)
        for key, lq in self.state.objects["LocalQueue"].items():
            snapshot[("LocalQueue", key)] = self._local_queue_status(scheduler, key, lq, counts)
        self._snapshot = snapshot

    def _local_queue_status(
        self,
        scheduler: Scheduler,
        key: str,
        lq: Mapping[str, Any],
        counts: Mapping[str, Mapping[str, Any]],
    ) -> dict[str, Any]:
        cq_name = (lq.get("spec") or {}).get("clusterQueue", "")
        mine = counts.get(key, {"pending": 0, "reserving": 0, "admitted": 0, "usage": {}})
        cq = self.state.get("ClusterQueue", cq_name)
        if cq is None or cq_name not in scheduler.queues:
            active = (
                "False",
                "ClusterQueueDoesNotExist",
                f"Can't submit new workloads to clusterQueue {cq_name}",
            )
        elif not scheduler.cluster_queue_status(cq_name).active:
            active = ("False", "ClusterQueueIsInactive", f"ClusterQueue {cq_name} is inactive")
        elif ((lq.get("spec") or {}).get("stopPolicy") or "None") != "None":
            active = ("False", "Stopped", "LocalQueue is stopped")
        else:
            active = ("True", "Ready", "Can submit new workloads to localQueue")
        flavors = _spec_flavors(cq) if cq is not None else []
        usage = _flavor_list(mine["usage"], flavors=flavors, borrowed=None)
        return {
            "active": active,
            "pendingWorkloads": mine["pending"],
            "reservingWorkloads": mine["reserving"],
            "admittedWorkloads": mine["admitted"],
            "flavorsReservation": usage,
            "flavorsUsage": usage,
        }

    def _metrics(
        self, scheduler: Scheduler, name: str, cq: Mapping[str, Any], status: Mapping[str, Any]
    ) -> None:
        if name not in scheduler.queues:
            self.metrics.forget_queue(name)
            return
        st = scheduler.cluster_queue_status(name)
        cohort = (cq.get("spec") or {}).get("cohortName") or ""
        nominal = {
            (flavor, resource): float(scheduler.queues[name].node.nominal((flavor, resource)))
            for flavor, resources in _spec_flavors(cq)
            for resource in resources
        }
        self.metrics.queue_state(
            name,
            cohort=cohort,
            active=st.active,
            pending_active=st.pending,
            pending_inadmissible=0,
            reserving=st.reserving,
            admitted=st.admitted,
            usage={fr: float(v) for fr, v in st.usage.items()},
            nominal=nominal,
        )

    async def _run(self) -> None:
        # Never ends on an error: a status writer that died quietly would leave every queue
        # reporting what it held at that moment (found by the API-server restart fault test).
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self._write_changed()
            except asyncio.CancelledError:
                raise
            except Exception as error:
                logger.error("event=queue_status_pass_failed error=%r", error)

    async def _write_changed(self) -> None:
        for (kind, key), status in list(self._snapshot.items()):
            if self._written.get((kind, key)) == status:
                continue
            try:
                written = await self._write(kind, key, status)
            except (aiohttp.ClientError, OSError, TimeoutError) as error:
                # The API server is unreachable: stop this pass, the next one retries.
                self.metrics.api_write(kind, "status", ok=False)
                logger.warning(
                    "event=queue_status_failed kind=%s name=%s error=%r", kind, key, error
                )
                return
            if written:
                self._written[(kind, key)] = status

    async def _write(self, kind: str, key: str, status: Mapping[str, Any]) -> bool:
        current = self.state.get(kind, key)
        if current is None:
            return False
        active_status, reason, message = status["active"]
        conditions = cond.set_condition(
            [
                c
                for c in (current.get("status") or {}).get("conditions") or ()
                if c.get("type") == "Active"
            ],
            "Active",
            status=active_status == "True",
            reason=reason,
            message=message,
            now_ms=int(time.time() * 1000),
        )
        body_status = {k: v for k, v in status.items() if k != "active"}
        body_status["conditions"] = conditions
        resource: Resource = CLUSTER_QUEUES if kind == "ClusterQueue" else LOCAL_QUEUES
        namespace, _, name = key.rpartition("/")
        metadata: dict[str, str] = {"name": name}
        if namespace:
            metadata["namespace"] = namespace
        body = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": kind,
            "metadata": metadata,
            "status": body_status,
        }
        try:
            response = await self.api.request(
                "PATCH",
                resource.path(namespace=namespace or None, name=name) + "/status",
                params={"fieldManager": FIELD_MANAGER, "force": "true"},
                body=body,
                content_type=APPLY_PATCH,
            )
        except ApiError as error:
            self.metrics.api_write(kind, "status", ok=False)
            if not error.not_found:
                logger.warning(
                    "event=queue_status_failed kind=%s name=%s error=%r", kind, key, str(error)
                )
            return False
        self.metrics.api_write(kind, "status", ok=True)
        self.state.apply(kind, "MODIFIED", response)
        return True
