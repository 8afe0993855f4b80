"""The webhooks as a kubectl user meets them: objects near the API server's size limit go
through (no 413 from the webhook server), and what Kueue's webhooks refuse is refused with a
message naming the field and saying what to do."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from operator_fixtures import *  # noqa: F403
from operator_fixtures import OperatorProcess, get, get_list, wait_for

from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


@pytest.fixture(scope="module")
def namespace(cluster: ClusterHandle, phalanx_operator: OperatorProcess) -> Iterator[str]:
    name = f"phx-wh-{uuid.uuid4().hex[:6]}"
    cluster.kubectl_ok("create", "namespace", name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false")


def _pod_template(padding: int) -> dict[str, Any]:
    # The bulk sits in an env var: annotations are capped at 256 KiB, a container's env is not.
    return {
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "c",
                    "image": "registry.example/none:1",
                    "env": [{"name": "PADDING", "value": "x" * padding}],
                    "resources": {"requests": {"cpu": "1"}},
                }
            ],
        }
    }


def _job(name: str, *, queue: str, padding: int = 0, **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}, "annotations": annotations},
        "spec": {"parallelism": 2, "completions": 2, "template": _pod_template(padding)},
    }


def _create(cluster: ClusterHandle, obj: dict[str, Any], namespace: str | None = None) -> Any:
    # create, not apply: apply's last-applied annotation cannot hold an object this large.
    args = ["create", "-f", "-"] + (["-n", namespace] if namespace else [])
    return cluster.kubectl(*args, input=json.dumps(obj), timeout=60)


def test_a_1_2_mb_queued_job_is_created_and_gets_its_workload(
    cluster: ClusterHandle, namespace: str, phalanx_operator: OperatorProcess
) -> None:
    job = _job("big-job", queue="nowhere", padding=1_200_000)
    assert len(json.dumps(job)) > 1_200_000
    created = _create(cluster, job, namespace)
    assert created.returncode == 0, created.stderr
    stored = get(cluster, "job", "big-job", namespace)
    assert stored["spec"]["suspend"] is True  # through the mutating webhook
    # The operator's own create of the Workload (which copies the template) passes the
    # validating webhook too.
    workload = wait_for(
        "the big Job's Workload",
        lambda: next(
            iter(get_list(cluster, "workloads.kueue.x-k8s.io", namespace)),
            None,
        ),
        timeout=90,
        log=phalanx_operator.log_tail,
    )
    assert workload["metadata"]["ownerReferences"][0]["name"] == "big-job"


def test_a_600_kb_workload_can_be_edited(
    cluster: ClusterHandle, namespace: str, phalanx_operator: OperatorProcess
) -> None:
    workload = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "big-workload"},
        "spec": {
            "queueName": "nowhere",
            "podSets": [{"name": "main", "count": 1, "template": _pod_template(600_000)}],
        },
    }
    created = _create(cluster, workload, namespace)
    assert created.returncode == 0, created.stderr
    # An UPDATE's review carries the object twice: 1.2 MB, over aiohttp's default 1 MiB.
    edited = cluster.kubectl(
        "label", "-n", namespace, "workloads.kueue.x-k8s.io/big-workload", "edited=yes"
    )
    assert edited.returncode == 0, edited.stderr
    assert get(cluster, "workloads.kueue.x-k8s.io", "big-workload", namespace)["metadata"][
        "labels"
    ] == {"edited": "yes"}


def _refused(cluster: ClusterHandle, obj: dict[str, Any], namespace: str | None = None) -> str:
    proc = _create(cluster, obj, namespace)
    if proc.returncode == 0:
        kind, name = obj["kind"], obj["metadata"]["name"]
        cluster.kubectl("delete", kind, name, *(["-n", namespace] if namespace else []))
        raise AssertionError(f"{kind}/{name} was accepted: {proc.stdout}")
    return str(proc.stderr)


def _kueue(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    }


def test_kubectl_users_see_why_a_queued_job_is_refused(
    cluster: ClusterHandle, namespace: str, phalanx_operator: OperatorProcess
) -> None:
    bad_min = _job("min-two", queue="team-a", **{"kueue.x-k8s.io/job-min-parallelism": "two"})
    message = _refused(cluster, bad_min, namespace)
    assert "admission webhook" in message
    assert "metadata.annotations[kueue.x-k8s.io/job-min-parallelism]: 'two' is not an integer" in (
        message
    )
    too_many = _job("min-two", queue="team-a", **{"kueue.x-k8s.io/job-min-parallelism": "2"})
    assert "must be between 1 and 1" in _refused(cluster, too_many, namespace)
    bad_queue = _job("bad-queue", queue="Team_A")
    message = _refused(cluster, bad_queue, namespace)
    assert "metadata.labels[kueue.x-k8s.io/queue-name]: 'Team_A' cannot be the name" in message
    good = _job("min-one", queue="team-a", **{"kueue.x-k8s.io/job-min-parallelism": "1"})
    assert _create(cluster, good, namespace).returncode == 0


def test_kubectl_users_see_why_a_kueue_object_is_refused(
    cluster: ClusterHandle, namespace: str, phalanx_operator: OperatorProcess
) -> None:
    snowman = "gpü/☃"
    cq = _kueue(
        "ClusterQueue",
        "phx-wh-snowman",
        {
            "resourceGroups": [
                {
                    "coveredResources": [snowman],
                    "flavors": [{"name": "f", "resources": [{"name": snowman, "nominalQuota": 1}]}],
                }
            ]
        },
    )
    message = _refused(cluster, cq)
    assert "spec.resourceGroups[0].coveredResources" in message
    assert "a resource name must be a qualified name such as cpu or nvidia.com/gpu" in message

    rf = _kueue("ResourceFlavor", "phx-wh-labels", {"nodeLabels": {"gpu model": "h100"}})
    message = _refused(cluster, rf)
    assert "spec.nodeLabels" in message and "each nodeLabels key must be a label key" in message

    cohort = _kueue("Cohort", "phx-wh-loop", {"parentName": "phx-wh-loop"})
    message = _refused(cluster, cohort)
    assert "spec.parentName" in message and "a Cohort cannot be its own parent" in message

    lq = _kueue("LocalQueue", "q" * 64, {"clusterQueue": "cq"})
    message = _refused(cluster, lq, namespace)
    assert "metadata.name" in message and "at most 63 characters" in message

    # Checked by the validating webhook only (no CEL): the message comes from Phalanx.
    selector = _kueue("ClusterQueue", "phx-wh-selector", {"namespaceSelector": {}})
    selector["spec"]["namespaceSelector"] = {"matchLabels": {"team": "a/b"}}
    message = _refused(cluster, selector)
    assert "admission webhook" in message
    assert "spec.namespaceSelector.matchLabels[team]: a selector's value must be a label value" in (
        message
    )
