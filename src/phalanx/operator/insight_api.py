"""Phalanx's own aggregated API beside Kueue's visibility API: ``explain`` and ``what-if``.

``visibility.phalanx.kueue.x-k8s.io/v1alpha1`` (APIService ``v1alpha1.visibility.phalanx.kueue.
x-k8s.io``), served by the same HTTPS server and replica as ``visibility.kueue.x-k8s.io``,
with the same front-proxy authentication and a SubjectAccessReview per request:

* ``GET namespaces/{ns}/workloads/{name}/explanation`` (``get`` on ``workloads/explanation``):
  a ``WorkloadExplanation``: why it waits, per pod set, flavor and resource; what it lacks;
  which ClusterQueues borrow that; its positions; what would let it in (the core's
  ``insight.Report``, with its words in ``status.text``).
* ``POST namespaces/{ns}/whatifs`` (``create`` on ``whatifs``), body a ``batch/v1`` Job or a
  ``kueue.x-k8s.io`` Workload: a ``WhatIf`` with what the next cycle would decide for it, were
  it created now (the core's dry run: same flavor assignment, victim search and placement as
  the cycle). Nothing is stored, as with a SubjectAccessReview. A Job becomes the Workload the
  Job integration would create for it (``jobs.workload_for_job``), priority included.

Both read the live core between two cycles, like the positions of the pending workloads; a
replica that does not schedule answers 503.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from typing import Any

from phalanx.admission.decisions import Explanation
from phalanx.admission.scheduler import Scheduler
from phalanx.admission.whatif import WhatIf
from phalanx.api import convert
from phalanx.api.convert import ConversionError
from phalanx.operator import jobs
from phalanx.quotas.quantity import format_quantity

__all__ = [
    "GROUP",
    "VERSION",
    "BadRequest",
    "api_group",
    "api_resource_list",
    "decode",
    "explanation_body",
    "group_entry",
    "what_if",
    "whatif_body",
    "workload_for_request",
]

GROUP = "visibility.phalanx.kueue.x-k8s.io"
VERSION = "v1alpha1"
GROUP_VERSION = f"{GROUP}/{VERSION}"
_PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"


class BadRequest(ValueError):
    """The what-if body cannot be read as a Job or a Workload; the message says why."""


def _group_body() -> dict[str, Any]:
    version = {"groupVersion": GROUP_VERSION, "version": VERSION}
    return {"name": GROUP, "versions": [version], "preferredVersion": version}


def api_group() -> dict[str, Any]:
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_body()}


def group_entry() -> dict[str, Any]:
    """This group's entry in the server's ``/apis`` list."""
    return _group_body()


def api_resource_list() -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": GROUP_VERSION,
        "resources": [
            {
                "name": "workloads",
                "singularName": "workload",
                "namespaced": True,
                "kind": "WorkloadExplanation",
                "verbs": [],
            },
            {
                "name": "workloads/explanation",
                "singularName": "",
                "namespaced": True,
                "kind": "WorkloadExplanation",
                "verbs": ["get"],
            },
            {
                "name": "whatifs",
                "singularName": "whatif",
                "namespaced": True,
                "kind": "WhatIf",
                "verbs": ["create"],
            },
        ],
    }


# -- explanation ----------------------------------------------------------------------------------


def explanation_body(scheduler: Scheduler, namespace: str, name: str) -> dict[str, Any] | None:
    """The ``WorkloadExplanation`` of Workload ``namespace/name``; None: the core does not know
    it (not created, or not queued by Phalanx). Call between cycles."""
    key = f"{namespace}/{name}"
    body: dict[str, Any] = {
        "kind": "WorkloadExplanation",
        "apiVersion": GROUP_VERSION,
        "metadata": {"name": name, "namespace": namespace},
    }
    report = scheduler.explain_report(key)
    if report is None:
        phase = scheduler.phase(key)
        if phase is None:
            return None
        admission = scheduler.admission_of(key)
        cq = admission.cluster_queue if admission is not None else ""
        text = f"Workload {key} is not pending ({phase.name.lower()})"
        body["status"] = {
            "pending": False,
            "phase": phase.name.capitalize(),
            "clusterQueue": cq,
            "text": text + (f" in ClusterQueue {cq}" if cq else ""),
        }
        return body
    status: dict[str, Any] = {"pending": True, **_explanation(report.explanation)}
    if report.position is not None:
        status["positionInClusterQueue"] = report.position.cluster_queue
        status["positionInLocalQueue"] = report.position.local_queue
    status["shortfalls"] = [
        {
            "flavor": s.flavor,
            "resource": s.resource,
            "requested": _q(s.resource, s.requested),
            "available": _q(s.resource, s.available),
            "missing": _q(s.resource, s.missing),
        }
        for s in report.shortfalls
    ]
    status["borrowers"] = [
        {
            "clusterQueue": b.cluster_queue,
            "flavor": b.flavor,
            "resource": b.resource,
            "borrowed": _q(b.resource, b.borrowed),
        }
        for b in report.borrowers
    ]
    status["hints"] = list(report.hints)
    status["text"] = report.text()
    body["status"] = status
    return body


def _explanation(e: Explanation) -> dict[str, Any]:
    return {
        "clusterQueue": e.cluster_queue or "",
        "reason": e.reason.value,
        "message": e.message,
        "blocking": list(e.blocking),
        "fairSharing": e.fair_sharing,
        "podSets": [
            {
                "name": ps.name,
                "count": ps.count,
                "flavors": [
                    {
                        "flavor": a.flavor,
                        "mode": a.mode.name,
                        "reason": a.reason,
                        "borrowing": a.borrowing,
                        "resources": [
                            {
                                "resource": c.resource,
                                "requested": _q(c.resource, c.requested),
                                "nominal": _q(c.resource, c.nominal),
                                "used": _q(c.resource, c.used),
                                "available": _q(c.resource, c.available),
                                "borrowable": _q(c.resource, c.borrowable),
                                "maxCapacity": _q(c.resource, c.max_capacity),
                            }
                            for c in a.resources
                        ],
                    }
                    for a in ps.attempts
                ],
            }
            for ps in e.pod_sets
        ],
    }


# -- what-if --------------------------------------------------------------------------------------


def workload_for_request(
    body: Any,
    namespace: str,
    *,
    objects: Callable[[str], Mapping[str, Mapping[str, Any]]],
) -> dict[str, Any]:
    """The Workload a what-if body stands for, in ``namespace``: a Workload as given, or the
    one the Job integration would create for a Job. Raises :class:`BadRequest`."""
    if not isinstance(body, Mapping):
        raise BadRequest("the body must be a JSON object: a batch/v1 Job or a Workload")
    kind, api_version = body.get("kind"), str(body.get("apiVersion") or "")
    obj = copy.deepcopy(dict(body))
    metadata = obj.setdefault("metadata", {})
    if not isinstance(metadata, dict):
        raise BadRequest("metadata must be an object")
    given = metadata.get("namespace")
    if given and given != namespace:
        raise BadRequest(
            f"metadata.namespace {given!r} does not match the request's namespace"
            f" {namespace!r}: drop it or use -n {given}"
        )
    metadata["namespace"] = namespace
    metadata.setdefault("name", metadata.get("generateName") or "what-if")
    metadata.setdefault("uid", _PLACEHOLDER_UID)
    if kind == "Workload" and api_version.startswith("kueue.x-k8s.io/"):
        return obj
    if kind != "Job" or api_version != "batch/v1":
        raise BadRequest(
            f"kind {kind!r} (apiVersion {api_version!r}) is not supported: send a batch/v1 Job"
            " or a kueue.x-k8s.io Workload"
        )
    if jobs.queue_name(obj) is None:
        raise BadRequest(
            f"the Job has no label {jobs.QUEUE_LABEL}: add it with the LocalQueue to queue in"
        )
    try:
        priority = jobs.resolve_priority(
            obj,
            workload_priority_classes={
                n: int(o.get("value", 0)) for n, o in objects("WorkloadPriorityClass").items()
            },
            priority_classes={
                n: int(o.get("value", 0)) for n, o in objects("PriorityClass").items()
            },
        )
        return jobs.workload_for_job(obj, priority=priority)
    except (jobs.InvalidJob, jobs.WorkloadPriorityClassNotFound) as error:
        raise BadRequest(str(error)) from error


def what_if(scheduler: Scheduler, workload: Mapping[str, Any]) -> WhatIf:
    """Run the core's dry run for a Workload manifest. Raises :class:`BadRequest` when the
    Workload's spec cannot be read. Call between cycles."""
    try:
        core_workload = convert.workload(workload)
    except (ConversionError, ValueError, KeyError, TypeError) as error:
        raise BadRequest(f"the Workload cannot be read: {error}") from error
    return scheduler.what_if(core_workload)


def whatif_body(answer: WhatIf) -> dict[str, Any]:
    namespace, name = answer.workload.split("/", 1)
    status: dict[str, Any] = {
        "decision": answer.verdict.value,
        "message": answer.message,
        "localQueue": answer.local_queue.split("/", 1)[1],
        "clusterQueue": answer.cluster_queue or "",
    }
    if answer.admission is not None:
        status["admission"] = convert.admission_to_status(answer.admission)
    status["victims"] = [
        {
            "namespace": v.workload.split("/", 1)[0],
            "name": v.workload.split("/", 1)[1],
            "clusterQueue": v.cluster_queue,
            "reason": v.reason.value,
        }
        for v in answer.victims
    ]
    if answer.position is not None:
        status["positionInClusterQueue"] = answer.position.cluster_queue
        status["positionInLocalQueue"] = answer.position.local_queue
        status["triedBefore"] = answer.ahead
    if answer.explanation is not None:
        status["explanation"] = _explanation(answer.explanation)
    status["text"] = answer.text()
    return {
        "kind": "WhatIf",
        "apiVersion": GROUP_VERSION,
        "metadata": {"name": name, "namespace": namespace},
        "status": status,
    }


def decode(raw: bytes) -> Any:
    try:
        return json.loads(raw or b"null")
    except ValueError as error:
        raise BadRequest(f"the body is not JSON: {error}") from error


def _q(resource: str, amount: int) -> str:
    return format_quantity(amount, resource=resource)
