"""Kueue's ProvisioningRequest admission check, as pure functions.

For a workload holding quota, each check served by ``kueue.x-k8s.io/provisioning-request``
gets a ProvisioningRequest (``autoscaling.x-k8s.io/v1``) named
``<workload>-<check>-<attempt>``, with a PodTemplate ``ppt-<request>-<pod set>`` per pod set
that uses the config's managed resources, counted as admitted. The cluster-autoscaler answers
in the request's conditions, and the check follows (Kueue's ``syncCheckStates``):

- ``Provisioned``: Ready, with ``podSetUpdates`` (the request's annotations on the pods, and
  the config's node selector values read from ``provisioningClassDetails``);
- ``Failed`` (and ``BookingExpired`` before admission): Retry while the attempt is within
  ``retryStrategy.backoffLimitCount`` (``requeueAfterSeconds`` doubling from
  ``backoffBaseSeconds``, capped), then Rejected;
- ``CapacityRevoked``: Rejected;
- ``Accepted`` or nothing yet: Pending.

The retry itself goes through eviction (:mod:`phalanx.operator.checks`): when quota is
reserved again, the next attempt's request is made.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from phalanx.api.admissioncheck import PROVISIONING_REQUEST_CONTROLLER
from phalanx.operator import admission_checks as ac

__all__ = [
    "CHECK_INACTIVE",
    "CONSUME_ANNOTATION",
    "MANAGED_LABEL",
    "NO_REQUEST_NEEDED",
    "PROVISIONING_CLASS_ANNOTATION",
    "Config",
    "MergedPodSet",
    "attempt_of",
    "check_active",
    "check_update",
    "config_for",
    "merged_pod_sets",
    "pod_template",
    "pod_template_name",
    "provisioning_request",
    "request_name",
    "request_needed",
]

CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
PROVISIONING_CLASS_ANNOTATION = "autoscaling.x-k8s.io/provisioning-class-name"
MANAGED_LABEL = "kueue.x-k8s.io/managed"
PARAMETER_ANNOTATION_PREFIX = "provreq.kueue.x-k8s.io/"
CHECK_INACTIVE = "the check is not active"
NO_REQUEST_NEEDED = "the provisioning request is not needed"
CONFIG_GROUP = "kueue.x-k8s.io"
CONFIG_KIND = "ProvisioningRequestConfig"

_NAME_HASH = 5
_NAME_PREFIX_MAX = 252 - _NAME_HASH

Obj = Mapping[str, Any]


def _limit_name(full: str) -> str:
    """Kueue's ``limitObjectName``: a long name keeps its prefix and gains a hash."""
    if len(full) <= _NAME_PREFIX_MAX:
        return full
    digest = hashlib.sha1(full.encode(), usedforsecurity=False).hexdigest()
    return f"{full[:_NAME_PREFIX_MAX]}-{digest[:_NAME_HASH]}"


def request_name(workload: str, check: str, attempt: int) -> str:
    return _limit_name(f"{workload}-{check}-{attempt}")


def pod_template_name(request: str, pod_set: str) -> str:
    return _limit_name(f"ppt-{request}-{pod_set}")


def attempt_of(name: str, workload: str, check: str) -> int | None:
    """The attempt number in a request's name, None when it is not this check's."""
    prefix = _limit_name(f"{workload}-{check}-")
    match = re.fullmatch(re.escape(prefix) + r"([0-9]+)", name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class Config:
    """A ProvisioningRequestConfig's spec with Kueue's defaults applied."""

    class_name: str
    parameters: Mapping[str, str]
    managed_resources: frozenset[str]
    backoff_limit_count: int
    backoff_base_seconds: int
    backoff_max_seconds: int
    node_selector: tuple[tuple[str, str], ...]
    """(node label key, provisioningClassDetails key) pairs."""
    merge_policy: str | None

    @classmethod
    def of(cls, obj: Obj) -> Config:
        spec = obj.get("spec") or {}
        retry = spec.get("retryStrategy") or {}
        updates = spec.get("podSetUpdates") or {}
        return cls(
            class_name=str(spec.get("provisioningClassName") or ""),
            parameters=dict(spec.get("parameters") or {}),
            managed_resources=frozenset(spec.get("managedResources") or ()),
            backoff_limit_count=int(retry.get("backoffLimitCount", 3)),
            backoff_base_seconds=int(retry.get("backoffBaseSeconds", 60)),
            backoff_max_seconds=int(retry.get("backoffMaxSeconds", 1800)),
            node_selector=tuple(
                (str(n["key"]), str(n["valueFromProvisioningClassDetail"]))
                for n in updates.get("nodeSelector") or ()
            ),
            merge_policy=spec.get("podSetMergePolicy"),
        )

    def backoff_seconds(self, retry: int) -> int:
        """Kueue's wait before retry number ``retry`` (1-based): base x 2^(retry-1), capped."""
        return int(min(self.backoff_base_seconds * 2 ** (retry - 1), self.backoff_max_seconds))


def config_for(check: Obj | None, configs: Mapping[str, Obj]) -> tuple[Config | None, str]:
    """The config a check's ``parameters`` names, or None and Kueue's reason it is unusable."""
    if check is None:
        return None, "the AdmissionCheck does not exist"
    ref = (check.get("spec") or {}).get("parameters")
    if not ref:
        return None, "missing parameters reference"
    if ref.get("apiGroup") != CONFIG_GROUP:
        return None, (
            f'wrong group "{ref.get("apiGroup")}", expecting "{CONFIG_GROUP}":'
            " bad parameters reference"
        )
    if ref.get("kind") != CONFIG_KIND:
        return None, (
            f'wrong kind "{ref.get("kind")}", expecting "{CONFIG_KIND}": bad parameters reference'
        )
    obj = configs.get(str(ref.get("name")))
    if obj is None:
        return None, f'provisioningrequestconfigs.kueue.x-k8s.io "{ref.get("name")}" not found'
    return Config.of(obj), ""


def check_active(check: Obj, configs: Mapping[str, Obj]) -> dict[str, Any] | None:
    """The ``Active`` condition Kueue's provisioning controller gives one of its checks
    (status, reason, message), None for a check of another controller."""
    if (check.get("spec") or {}).get("controllerName") != PROVISIONING_REQUEST_CONTROLLER:
        return None
    config, why = config_for(check, configs)
    if config is None:
        return {"status": "False", "reason": "BadParametersRef", "message": why}
    return {"status": "True", "reason": "Active", "message": "The admission check is active"}


def _containers(template: Obj) -> Iterable[Obj]:
    spec = template.get("spec") or {}
    yield from spec.get("initContainers") or ()
    yield from spec.get("containers") or ()


def _uses(template: Obj, resources: frozenset[str]) -> bool:
    if not resources:
        return True
    for c in _containers(template):
        res = c.get("resources") or {}
        if resources & (set(res.get("requests") or {}) | set(res.get("limits") or {})):
            return True
    return False


@dataclass(frozen=True)
class MergedPodSet:
    name: str
    pod_set: Obj
    assignment: Obj
    count: int


def _assignments(workload: Obj) -> dict[str, Obj]:
    admission = (workload.get("status") or {}).get("admission") or {}
    return {str(a.get("name")): a for a in admission.get("podSetAssignments") or ()}


def _count(pod_set: Obj, assignment: Obj | None) -> int:
    if assignment is not None and assignment.get("count") is not None:
        return int(assignment["count"])
    return int(pod_set.get("count", 1))


def request_needed(workload: Obj, config: Config) -> bool:
    """Whether some admitted pod set uses a managed resource (else the check is Ready at
    once, Kueue's "the provisioning request is not needed")."""
    assignments = _assignments(workload)
    for ps in (workload.get("spec") or {}).get("podSets") or ():
        if int(ps.get("count", 1)) <= 0 or not _uses(
            ps.get("template") or {}, config.managed_resources
        ):
            continue
        if _count(ps, assignments.get(str(ps.get("name", "main")))) > 0:
            return True
    return False


def _similar(a: Obj, b: Obj) -> bool:
    """Kueue's ``IdenticalWorkloadSchedulingRequirements``: same requests per container and
    the same scheduling fields."""
    sa, sb = a.get("spec") or {}, b.get("spec") or {}
    for field in ("containers", "initContainers"):
        ca, cb = sa.get(field) or [], sb.get(field) or []
        if len(ca) != len(cb) or any(
            (x.get("resources") or {}).get("requests") != (y.get("resources") or {}).get("requests")
            for x, y in zip(ca, cb, strict=True)
        ):
            return False
    return all(
        sa.get(f) == sb.get(f)
        for f in ("resources", "nodeSelector", "tolerations", "affinity", "resourceClaims")
    )


def merged_pod_sets(workload: Obj, config: Config) -> list[MergedPodSet]:
    """The pod sets a request carries, merged per the config's ``podSetMergePolicy``."""
    assignments = _assignments(workload)
    merged: list[MergedPodSet] = []
    for ps in (workload.get("spec") or {}).get("podSets") or ():
        name = str(ps.get("name", "main"))
        template = ps.get("template") or {}
        if int(ps.get("count", 1)) <= 0 or not _uses(template, config.managed_resources):
            continue
        assignment = assignments.get(name) or {}
        count = _count(ps, assignment)
        if count <= 0:
            continue
        for i, existing in enumerate(merged):
            other = existing.pod_set.get("template") or {}
            if (config.merge_policy == "IdenticalPodTemplates" and other == template) or (
                config.merge_policy == "IdenticalWorkloadSchedulingRequirements"
                and _similar(other, template)
            ):
                merged[i] = MergedPodSet(
                    existing.name, existing.pod_set, existing.assignment, existing.count + count
                )
                break
        else:
            merged.append(MergedPodSet(name, ps, assignment, count))
    return merged


def _owner(obj: Obj, *, api_version: str, kind: str) -> dict[str, Any]:
    metadata = obj["metadata"]
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": metadata["name"],
        "uid": metadata["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def workload_owner(workload: Obj) -> dict[str, Any]:
    return _owner(workload, api_version="kueue.x-k8s.io/v1beta2", kind="Workload")


def request_owner(request: Obj) -> dict[str, Any]:
    return _owner(request, api_version="autoscaling.x-k8s.io/v1", kind="ProvisioningRequest")


def pod_template(
    workload: Obj, merged: MergedPodSet, *, name: str, flavors: Mapping[str, Obj]
) -> dict[str, Any]:
    """The PodTemplate of one request pod set: the pod set's template with what its
    assigned flavors add (node labels, tolerations) and limits standing in for missing
    requests, as Kueue builds it."""
    template = copy.deepcopy(dict(merged.pod_set.get("template") or {}))
    spec = template.setdefault("spec", {})
    for flavor_name in sorted(set((merged.assignment.get("flavors") or {}).values())):
        fspec = (flavors.get(flavor_name) or {}).get("spec") or {}
        if fspec.get("nodeLabels"):
            spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **fspec["nodeLabels"]}
        for toleration in fspec.get("tolerations") or ():
            spec.setdefault("tolerations", [])
            if toleration not in spec["tolerations"]:
                spec["tolerations"].append(dict(toleration))
    for field in ("initContainers", "containers"):
        for container in spec.get(field) or ():
            resources = container.setdefault("resources", {})
            limits = resources.get("limits") or {}
            if limits:
                resources["requests"] = {**limits, **(resources.get("requests") or {})}
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {
            "name": name,
            "namespace": workload["metadata"]["namespace"],
            "labels": {MANAGED_LABEL: "true"},
            "ownerReferences": [workload_owner(workload)],
        },
        "template": template,
    }


def provisioning_request(
    workload: Obj, config: Config, *, name: str, pod_sets: Sequence[tuple[str, int]]
) -> dict[str, Any]:
    """The request: the config's class and parameters (and the workload's
    ``provreq.kueue.x-k8s.io/`` annotations), a pod set per (PodTemplate, count)."""
    parameters = dict(config.parameters)
    for key, value in ((workload.get("metadata") or {}).get("annotations") or {}).items():
        if key.startswith(PARAMETER_ANNOTATION_PREFIX):
            parameters[key[len(PARAMETER_ANNOTATION_PREFIX) :]] = value
    return {
        "apiVersion": "autoscaling.x-k8s.io/v1",
        "kind": "ProvisioningRequest",
        "metadata": {
            "name": name,
            "namespace": workload["metadata"]["namespace"],
            "labels": {MANAGED_LABEL: "true"},
            "ownerReferences": [workload_owner(workload)],
        },
        "spec": {
            "provisioningClassName": config.class_name,
            "parameters": parameters,
            "podSets": [
                {"podTemplateRef": {"name": template}, "count": count}
                for template, count in pod_sets
            ],
        },
    }


def synced_with_config(request: Obj, config: Config) -> bool:
    spec = request.get("spec") or {}
    if spec.get("provisioningClassName") != config.class_name:
        return False
    params = spec.get("parameters") or {}
    return all(params.get(k) == v for k, v in config.parameters.items())


def _true(request: Obj, kind: str) -> Obj | None:
    for c in (request.get("status") or {}).get("conditions") or ():
        if c.get("type") == kind and c.get("status") == "True":
            return dict(c)
    return None


def _condition(request: Obj, kind: str) -> Obj | None:
    for c in (request.get("status") or {}).get("conditions") or ():
        if c.get("type") == kind:
            return dict(c)
    return None


def _pod_set_updates(workload: Obj, request: Obj, config: Config) -> list[dict[str, Any]]:
    name = request["metadata"]["name"]
    by_template = {
        pod_template_name(name, str(ps.get("name", "main"))): str(ps.get("name", "main"))
        for ps in (workload.get("spec") or {}).get("podSets") or ()
    }
    details = (request.get("status") or {}).get("provisioningClassDetails") or {}
    updates = []
    for ps in (request.get("spec") or {}).get("podSets") or ():
        update: dict[str, Any] = {
            "name": by_template.get(str((ps.get("podTemplateRef") or {}).get("name")), ""),
            "annotations": {
                CONSUME_ANNOTATION: name,
                PROVISIONING_CLASS_ANNOTATION: (request.get("spec") or {}).get(
                    "provisioningClassName", ""
                ),
            },
        }
        selector = {
            key: str(details[detail]) for key, detail in config.node_selector if detail in details
        }
        if selector:
            update["nodeSelector"] = selector
        updates.append(update)
    return updates


def check_update(
    workload: Obj,
    state: Obj,
    *,
    check: str,
    config: Config | None,
    request: Obj | None,
) -> dict[str, Any] | None:
    """The check's new state (a ``status.admissionChecks`` entry, without the transition
    time) from the request's conditions, None to leave it as it is."""
    current = dict(state)
    if config is None:
        return _changed(current, state=ac.PENDING, message=CHECK_INACTIVE)
    if not request_needed(workload, config):
        if current.get("state") == ac.READY:
            return None
        return {**current, "state": ac.READY, "message": NO_REQUEST_NEEDED, "podSetUpdates": None}
    if request is None:
        return None
    name = request["metadata"]["name"]
    attempt = attempt_of(name, str(workload["metadata"]["name"]), check) or 1
    retries = int(current.get("retryCount") or 0)
    status = (workload.get("status") or {}).get("conditions") or []
    admitted = any(c.get("type") == "Admitted" and c.get("status") == "True" for c in status)
    failed = _true(request, "Failed")
    expired = _true(request, "BookingExpired") if not admitted else None
    if failed is not None or expired is not None:
        cause = failed if failed is not None else expired
        assert cause is not None
        if attempt <= config.backoff_limit_count:
            what = "failure" if failed is not None else "booking expired"
            out = {**current, "message": f"Retrying after {what}: {cause.get('message', '')}"}
            if attempt > retries:
                out["state"] = ac.RETRY
                out["requeueAfterSeconds"] = config.backoff_seconds(retries + 1)
            return out if out != current else None
        return _changed(current, state=ac.REJECTED, message=str(cause.get("message", "")))
    revoked = _true(request, "CapacityRevoked")
    if revoked is not None:
        active = (workload.get("spec") or {}).get("active", True)
        finished = any(c.get("type") == "Finished" and c.get("status") == "True" for c in status)
        if active and not finished:
            return _changed(current, state=ac.REJECTED, message=str(revoked.get("message", "")))
        return None
    provisioned = _true(request, "Provisioned")
    if provisioned is not None:
        if current.get("state") == ac.READY:
            return None
        return {
            **current,
            "state": ac.READY,
            "message": str(provisioned.get("message", "")),
            "podSetUpdates": _pod_set_updates(workload, request, config),
        }
    if _true(request, "Accepted") is not None:
        condition = _condition(request, "Provisioned")
        if condition is None:
            return None
        return _changed(current, state=ac.PENDING, message=str(condition.get("message", "")))
    return _changed(current, state=ac.PENDING, message="")


def _changed(current: dict[str, Any], *, state: str, message: str) -> dict[str, Any] | None:
    if current.get("state") == state and (current.get("message") or "") == message:
        return None
    return {**current, "state": state, "message": message}


def next_attempt(
    state: Obj | None, request: Obj | None, *, workload: Obj, check: str
) -> int | None:
    """The attempt whose request must be created now, None when none (Kueue: one when there
    is no request; the next one when the last failed, or expired before admission, and the
    check is Pending again after the retry's eviction)."""
    if state is not None and state.get("state") == ac.READY:
        return None
    if request is None:
        return int((state or {}).get("retryCount") or 0) + 1
    status = (workload.get("status") or {}).get("conditions") or []
    admitted = any(c.get("type") == "Admitted" and c.get("status") == "True" for c in status)
    ended = _true(request, "Failed") is not None or (
        _true(request, "BookingExpired") is not None and not admitted
    )
    if ended and state is not None and state.get("state") == ac.PENDING:
        return (
            attempt_of(request["metadata"]["name"], str(workload["metadata"]["name"]), check) or 1
        ) + 1
    return None
