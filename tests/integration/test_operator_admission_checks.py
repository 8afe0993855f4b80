"""Admission checks end to end: a ClusterQueue with Kueue's ProvisioningRequest admission check.

The ProvisioningRequest CRD (autoscaling.x-k8s.io/v1) is installed from a copy of the
cluster-autoscaler's published schema (structural, with its bounds and immutability rules);
no autoscaler runs: the tests answer for it by setting the request's conditions, as the
cluster-autoscaler would. A Job is QuotaReserved (its quota counted) but stays suspended
until the request is Provisioned; a Failed request is retried per the config's retryStrategy
and then Rejected, which deactivates the Workload.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_fixtures import *  # noqa: F403
from operator_fixtures import (
    POOL_LABEL,
    OperatorProcess,
    apply,
    cluster_queue,
    condition,
    delete_cluster_objects,
    flavor,
    get,
    get_list,
    gpu_job,
    is_true,
    local_queue,
    node_pool,
    start_operator,
    wait_for,
    workload_of,
)

from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

POOL = "phx-checks"
CQ = "phx-checks-cq"
CHECK = "phx-prov"
CONFIG = "phx-prov-config"
CLASS = "check-capacity.autoscaling.x-k8s.io"
PROVREQ = "provisioningrequests.autoscaling.x-k8s.io"

_CONDITION = {
    "type": "object",
    "required": ["lastTransitionTime", "message", "reason", "status", "type"],
    "properties": {
        "lastTransitionTime": {"type": "string", "format": "date-time"},
        "message": {"type": "string", "maxLength": 32768},
        "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
        "reason": {"type": "string", "maxLength": 1024, "minLength": 1},
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "type": {"type": "string", "maxLength": 316},
    },
}
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_IMMUTABLE = [{"rule": "self == oldSelf", "message": "Value is immutable"}]

# The cluster-autoscaler's ProvisioningRequest CRD (autoscaling.x-k8s.io/v1,
# apis/provisioningrequest/autoscaling.x-k8s.io/v1/types.go), its structural schema.
PROVISIONING_REQUEST_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": PROVREQ},
    "spec": {
        "group": "autoscaling.x-k8s.io",
        "names": {
            "kind": "ProvisioningRequest",
            "listKind": "ProvisioningRequestList",
            "plural": "provisioningrequests",
            "singular": "provisioningrequest",
            "shortNames": ["provreq", "provreqs"],
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
                ],
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "required": ["spec"],
                        "properties": {
                            "apiVersion": {"type": "string"},
                            "kind": {"type": "string"},
                            "metadata": {"type": "object"},
                            "spec": {
                                "type": "object",
                                "required": ["podSets", "provisioningClassName"],
                                "properties": {
                                    "podSets": {
                                        "type": "array",
                                        "minItems": 1,
                                        "maxItems": 32,
                                        "x-kubernetes-validations": _IMMUTABLE,
                                        "items": {
                                            "type": "object",
                                            "required": ["count", "podTemplateRef"],
                                            "properties": {
                                                "count": {
                                                    "type": "integer",
                                                    "format": "int32",
                                                    "minimum": 1,
                                                },
                                                "podTemplateRef": {
                                                    "type": "object",
                                                    "required": ["name"],
                                                    "properties": {
                                                        "name": {
                                                            "type": "string",
                                                            "maxLength": 253,
                                                            "pattern": _DNS_SUBDOMAIN,
                                                        }
                                                    },
                                                },
                                            },
                                        },
                                    },
                                    "provisioningClassName": {
                                        "type": "string",
                                        "maxLength": 253,
                                        "pattern": _DNS_SUBDOMAIN,
                                        "x-kubernetes-validations": _IMMUTABLE,
                                    },
                                    "parameters": {
                                        "type": "object",
                                        "maxProperties": 100,
                                        "additionalProperties": {
                                            "type": "string",
                                            "maxLength": 255,
                                        },
                                        "x-kubernetes-validations": _IMMUTABLE,
                                    },
                                },
                            },
                            "status": {
                                "type": "object",
                                "properties": {
                                    "conditions": {
                                        "type": "array",
                                        "items": _CONDITION,
                                        "x-kubernetes-list-type": "map",
                                        "x-kubernetes-list-map-keys": ["type"],
                                    },
                                    "provisioningClassDetails": {
                                        "type": "object",
                                        "maxProperties": 64,
                                        "additionalProperties": {
                                            "type": "string",
                                            "maxLength": 32768,
                                        },
                                    },
                                },
                            },
                        },
                    }
                },
            }
        ],
    },
}


@pytest.fixture(scope="module")
def phalanx_operator(
    cluster: ClusterHandle, kueue_crds: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """This module's operator, started once the ProvisioningRequest CRD is installed."""
    cluster.apply_crds([yaml.safe_dump(PROVISIONING_REQUEST_CRD)])
    op = start_operator(cluster, tmp_path_factory.mktemp("operator"))
    try:
        yield op
    finally:
        op.stop()


def provisioning_config(*, limit: int) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ProvisioningRequestConfig",
        "metadata": {"name": CONFIG},
        "spec": {
            "provisioningClassName": CLASS,
            "managedResources": ["nvidia.com/gpu"],
            "retryStrategy": {
                "backoffLimitCount": limit,
                "backoffBaseSeconds": 1,
                "backoffMaxSeconds": 2,
            },
            "podSetUpdates": {
                "nodeSelector": [{"key": POOL_LABEL, "valueFromProvisioningClassDetail": "pool"}]
            },
        },
    }


def admission_check() -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "AdmissionCheck",
        "metadata": {"name": CHECK},
        "spec": {
            "controllerName": "kueue.x-k8s.io/provisioning-request",
            "parameters": {
                "apiGroup": "kueue.x-k8s.io",
                "kind": "ProvisioningRequestConfig",
                "name": CONFIG,
            },
        },
    }


def checked_queue(name: str, *checks: str, gpus: int = 16) -> dict[str, Any]:
    cq = cluster_queue(name, flavor_name=POOL, gpus=gpus)
    cq["spec"]["admissionChecksStrategy"] = {"admissionChecks": [{"name": c} for c in checks]}
    return cq


@pytest.fixture(scope="module")
def checks_pool(cluster: ClusterHandle, phalanx_operator: OperatorProcess) -> Iterator[None]:
    with node_pool(cluster, POOL, racks=1, hosts=2):
        apply(
            cluster,
            flavor(POOL, pool=POOL),
            provisioning_config(limit=1),
            admission_check(),
            checked_queue(CQ, CHECK),
        )
        try:
            yield
        finally:
            delete_cluster_objects(
                cluster,
                f"clusterqueue.kueue.x-k8s.io/{CQ}",
                f"admissioncheck.kueue.x-k8s.io/{CHECK}",
                f"provisioningrequestconfig.kueue.x-k8s.io/{CONFIG}",
                f"resourceflavor.kueue.x-k8s.io/{POOL}",
            )


def requests(cluster: ClusterHandle, namespace: str) -> dict[str, dict[str, Any]]:
    return {r["metadata"]["name"]: r for r in get_list(cluster, PROVREQ, namespace)}


def answer(
    cluster: ClusterHandle, namespace: str, name: str, kind: str, message: str, **details: str
) -> None:
    """The autoscaler's answer: condition ``kind`` True on the request (its status)."""
    status: dict[str, Any] = {
        "conditions": [
            {
                "type": kind,
                "status": "True",
                "reason": kind,
                "message": message,
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ]
    }
    if details:
        status["provisioningClassDetails"] = details
    cluster.kubectl_ok(
        "patch",
        PROVREQ,
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )


def check_state(workload: dict[str, Any]) -> dict[str, Any]:
    states = (workload.get("status") or {}).get("admissionChecks") or []
    return next((s for s in states if s.get("name") == CHECK), {})


def test_a_queue_naming_a_missing_check_is_inactive(
    cluster: ClusterHandle, phalanx_operator: OperatorProcess, checks_pool: None, cleanup: list[str]
) -> None:
    cleanup.append("clusterqueue.kueue.x-k8s.io/phx-checks-missing")
    apply(cluster, checked_queue("phx-checks-missing", "phx-no-such-check"))
    active = wait_for(
        "the ClusterQueue's Active condition",
        lambda: condition(
            get(cluster, "clusterqueue.kueue.x-k8s.io", "phx-checks-missing"), "Active"
        ),
        log=phalanx_operator.log_tail,
    )
    assert (active["status"], active["reason"]) == ("False", "AdmissionCheckNotFound"), active
    assert "phx-no-such-check" in active["message"]
    # The provisioning controller marks its own check Active (its config exists).
    ac = wait_for(
        "the AdmissionCheck to be Active",
        lambda: (
            (c := get(cluster, "admissioncheck.kueue.x-k8s.io", CHECK))
            and is_true(c, "Active")
            and c
        ),
        log=phalanx_operator.log_tail,
    )
    assert condition(ac, "Active")["reason"] == "Active"  # type: ignore[index]


def test_job_runs_only_once_its_provisioning_request_is_provisioned(
    cluster: ClusterHandle, phalanx_operator: OperatorProcess, checks_pool: None, namespace: str
) -> None:
    log = phalanx_operator.log_tail
    apply(cluster, local_queue("lq", cluster_queue_name=CQ), namespace=namespace)
    apply(cluster, gpu_job("train", queue="lq", pods=2, gpus=8), namespace=namespace)

    reserved = wait_for(
        "quota reserved",
        lambda: (
            (w := workload_of(cluster, namespace, "train")) and is_true(w, "QuotaReserved") and w
        ),
        log=log,
    )
    admitted = condition(reserved, "Admitted")
    assert admitted is not None and admitted["status"] == "False", admitted
    assert admitted["reason"] == "UnsatisfiedAdmissionChecks"
    assert check_state(reserved)["state"] == "Pending"
    wl_name = reserved["metadata"]["name"]

    # The request Kueue would make: attempt 1, one pod set per PodTemplate, as admitted.
    request_name = f"{wl_name}-{CHECK}-1"
    request = wait_for(
        "the ProvisioningRequest", lambda: requests(cluster, namespace).get(request_name), log=log
    )
    assert request["spec"]["provisioningClassName"] == CLASS
    template_name = f"ppt-{request_name}-main"
    assert request["spec"]["podSets"] == [{"podTemplateRef": {"name": template_name}, "count": 2}]
    owner = request["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Workload", wl_name)
    template = wait_for(
        "the PodTemplate handed to its request",
        lambda: (
            (t := get(cluster, "podtemplate", template_name, namespace))
            and t["metadata"]["ownerReferences"][0]["kind"] == "ProvisioningRequest"
            and t
        ),
        log=log,
    )
    pod_spec = template["template"]["spec"]
    assert pod_spec["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "8"
    assert pod_spec["nodeSelector"] == {POOL_LABEL: POOL}  # the flavor's, as assigned

    # While the check is pending the Job stays suspended and its quota is counted: a
    # second Job that needs the same GPUs waits.
    apply(cluster, gpu_job("second", queue="lq", pods=1, gpus=8), namespace=namespace)
    second = wait_for(
        "the second Job's pending explanation",
        lambda: (
            (w := workload_of(cluster, namespace, "second"))
            and (c := condition(w, "QuotaReserved"))
            and c["status"] == "False"
            and c["reason"] == "Pending"
            and c
        ),
        log=log,
    )
    assert "insufficient" in second["message"], second
    job = get(cluster, "job", "train", namespace)
    assert job["spec"]["suspend"] is True

    def reserved_gpus() -> str:
        status = get(cluster, "clusterqueue.kueue.x-k8s.io", CQ).get("status") or {}
        for fl in status.get("flavorsReservation") or ():
            for r in fl["resources"]:
                if r["name"] == "nvidia.com/gpu":
                    return str(r["total"])
        return "0"

    wait_for("16 GPUs reserved in the ClusterQueue", lambda: reserved_gpus() == "16", log=log)

    # The autoscaler provisions: the check is Ready, the Workload Admitted, the Job starts
    # with the check's podSetUpdates.
    answer(cluster, namespace, request_name, "Provisioned", "capacity is ready", pool=POOL)
    admitted_wl = wait_for(
        "admission after the check",
        lambda: (w := workload_of(cluster, namespace, "train")) and is_true(w, "Admitted") and w,
        log=log,
    )
    state = check_state(admitted_wl)
    assert (state["state"], state["message"]) == ("Ready", "capacity is ready"), state
    assert state["podSetUpdates"] == [
        {
            "name": "main",
            "annotations": {
                "autoscaling.x-k8s.io/consume-provisioning-request": request_name,
                "autoscaling.x-k8s.io/provisioning-class-name": CLASS,
            },
            "nodeSelector": {POOL_LABEL: POOL},
        }
    ]
    started = wait_for(
        "the Job to start",
        lambda: (j := get(cluster, "job", "train", namespace)) and not j["spec"]["suspend"] and j,
        log=log,
    )
    events = {
        e["reason"]: e["message"]
        for e in get_list(
            cluster,
            "events",
            namespace,
            "--field-selector",
            f"involvedObject.name={wl_name}",
        )
    }
    assert events["QuotaReserved"].startswith(f"Quota reserved in ClusterQueue {CQ}"), events
    assert events["Admitted"].startswith(f"Admitted by ClusterQueue {CQ}, wait time since"), events
    assert "ProvisioningRequestCreated" in events and "AdmissionCheckUpdated" in events, events
    annotations = started["spec"]["template"]["metadata"]["annotations"]
    assert annotations["autoscaling.x-k8s.io/consume-provisioning-request"] == request_name
    assert started["spec"]["template"]["spec"]["nodeSelector"][POOL_LABEL] == POOL


def test_failed_request_is_retried_then_rejected_and_the_workload_deactivated(
    cluster: ClusterHandle, phalanx_operator: OperatorProcess, checks_pool: None, namespace: str
) -> None:
    log = phalanx_operator.log_tail
    apply(cluster, local_queue("lq", cluster_queue_name=CQ), namespace=namespace)
    apply(cluster, gpu_job("flaky", queue="lq", pods=1, gpus=8), namespace=namespace)
    wl = wait_for("the Workload", lambda: workload_of(cluster, namespace, "flaky"), log=log)
    first = f"{wl['metadata']['name']}-{CHECK}-1"
    wait_for("attempt 1", lambda: requests(cluster, namespace).get(first), log=log)
    answer(cluster, namespace, first, "Failed", "no capacity in the zone")

    # Retry (backoffLimitCount 1): evicted by the check, requeued after its backoff, and
    # quota reserved again with a new request, attempt 2; attempt 1 is deleted.
    second = f"{wl['metadata']['name']}-{CHECK}-2"
    wait_for("attempt 2", lambda: requests(cluster, namespace).get(second), log=log)
    assert first not in requests(cluster, namespace)
    retried = workload_of(cluster, namespace, "flaky")
    assert retried is not None
    evictions = retried["status"]["schedulingStats"]["evictions"]
    assert {"reason": "AdmissionCheck", "underlyingCause": "", "count": 1} in evictions
    state = check_state(retried)
    assert state.get("retryCount") == 1, state
    assert get(cluster, "job", "flaky", namespace)["spec"]["suspend"] is True

    # Attempt 2 fails too: past the limit, Rejected; the Workload is deactivated and
    # releases its quota, the Job never ran.
    answer(cluster, namespace, second, "Failed", "still no capacity")
    done = wait_for(
        "deactivation",
        lambda: (
            (w := workload_of(cluster, namespace, "flaky"))
            and w["spec"].get("active") is False
            and not is_true(w, "QuotaReserved")
            and w
        ),
        log=log,
    )
    assert check_state(done)["state"] in ("Rejected", "Pending")  # reset by the eviction
    evicted = condition(done, "Evicted")
    assert evicted is not None and evicted["reason"] == "Deactivated", evicted
    assert evicted["message"] == (
        'The workload is deactivated due to AdmissionCheck in Rejected state: "phx-prov"'
        " (still no capacity)"
    ), evicted
    events = get_list(
        cluster,
        "events",
        namespace,
        "--field-selector",
        f"involvedObject.name={done['metadata']['name']}",
    )
    assert any(e["reason"] == "AdmissionCheckRejected" for e in events), [
        e["reason"] for e in events
    ]
    assert get(cluster, "job", "flaky", namespace)["spec"]["suspend"] is True
    wait_for("its requests deleted", lambda: not requests(cluster, namespace), log=log)
