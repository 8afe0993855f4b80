"""``list resourceflavor`` and ``list pods --for job/NAME|workload/NAME``, as kueuectl lists them.

A Job's pods are those its controller labels with the Job's uid
(``batch.kubernetes.io/controller-uid``, the Job's own pod selector, as kueuectl selects them); a
Workload's are its owner Job's. Pods print as ``kubectl get pods`` prints them: NAME, READY,
STATUS, RESTARTS, AGE.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from phalanx.operator.kube import JOBS, PODS, WORKLOADS, ApiError, KubeApi

RF_COLUMNS = ("NAME", "NODE LABELS", "AGE")
POD_COLUMNS = ("NAME", "READY", "STATUS", "RESTARTS", "AGE")
FOR_KINDS = {
    "job": "Job",
    "jobs": "Job",
    "job.batch": "Job",
    "workload": "Workload",
    "workloads": "Workload",
    "wl": "Workload",
    "workload.kueue.x-k8s.io": "Workload",
}
JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"


class ForError(Exception):
    """``--for`` names something whose pods cannot be found; the message says why."""


def parse_for(text: str) -> tuple[str, str]:
    """``job/NAME`` or ``workload/NAME`` into (Job|Workload, NAME)."""
    kind, slash, name = text.partition("/")
    if not slash or not name or kind.lower() not in FOR_KINDS:
        raise ForError(
            f"--for: {text!r} is not job/NAME or workload/NAME (the Job or Workload whose pods "
            "to list)"
        )
    return FOR_KINDS[kind.lower()], name


async def pods_for(api: KubeApi, target: str, namespace: str) -> list[dict[str, Any]]:
    kind, name = parse_for(target)
    if kind == "Workload":
        try:
            workload = await api.get(WORKLOADS, name, namespace=namespace)
        except ApiError as error:
            raise ForError(_message(error, f"workload {name}")) from None
        jobs = [
            ref["name"]
            for ref in workload["metadata"].get("ownerReferences") or ()
            if ref.get("kind") == "Job" and str(ref.get("apiVersion")) == "batch/v1"
        ]
        if not jobs:
            raise ForError(f"workload {name} is not owned by a Job: no pods to list")
        name = jobs[0]
    try:
        job = await api.get(JOBS, name, namespace=namespace)
    except ApiError as error:
        raise ForError(_message(error, f"job {name}")) from None
    selector = f"{JOB_UID_LABEL}={job['metadata']['uid']}"
    try:
        return await api.list_all(PODS, namespace=namespace, label_selector=selector)
    except ApiError as error:
        raise ForError(_message(error, "pods")) from None


def _message(error: ApiError, what: str) -> str:
    return f"{what} not found" if error.not_found else str(error.body.get("message") or error)


def resource_flavor_row(flavor: Mapping[str, Any]) -> list[str]:
    """NAME and NODE LABELS (sorted ``k=v``); the caller adds AGE."""
    labels = ((flavor.get("spec") or {}).get("nodeLabels") or {}).items()
    return [flavor["metadata"]["name"], ", ".join(sorted(f"{k}={v}" for k, v in labels))]


def pod_row(pod: Mapping[str, Any]) -> list[str]:
    """kubectl's pod columns but AGE (the caller adds it); STATUS is the reason a container
    waits or ended, else the phase."""
    status = pod.get("status") or {}
    containers = status.get("containerStatuses") or ()
    total = len((pod.get("spec") or {}).get("containers") or ()) or len(containers)
    ready = sum(1 for c in containers if c.get("ready"))
    restarts = sum(int(c.get("restartCount") or 0) for c in containers)
    shown = status.get("reason") or status.get("phase") or "Unknown"
    for container in containers:
        state = container.get("state") or {}
        for key in ("waiting", "terminated"):
            reason = (state.get(key) or {}).get("reason")
            if reason:
                shown = reason
    if pod["metadata"].get("deletionTimestamp"):
        shown = "Terminating"
    return [pod["metadata"]["name"], f"{ready}/{total}", shown, str(restarts)]
