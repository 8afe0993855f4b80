"""Kubeflow Trainer v2 on the local control plane: its real controller manager (and JobSet's)
beside the cluster runs a TrainJob from a ClusterTrainingRuntime as a JobSet whose pods run on
KWOK nodes to completion; a TrainJob created suspended runs no pod, and its pods land where a
``kueue.x-k8s.io/manager`` runtime patch puts them once it is resumed. That is the path a
queueing integration admits a TrainJob through (Kueue's, through the same patch).

Named to run late: on a machine with no cached builds, ``make test`` builds the addons in the
background while the earlier tests run, and the trainer is among the last."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from operator_fixtures import *  # noqa: F403
from operator_fixtures import apply, get, get_list, wait_for

from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

TRAINJOBS = "trainjobs.trainer.kubeflow.org"
RUNTIME = "phx-torch-small"


def a_runtime() -> dict[str, Any]:
    """A one-step torch runtime, the shape of the trainer's own torch-distributed one."""
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": RUNTIME, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "metadata": {
                                    "labels": {
                                        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"
                                    }
                                },
                                "spec": {
                                    "template": {
                                        "spec": {
                                            "containers": [
                                                {"name": "node", "image": "pytorch/pytorch:2"}
                                            ]
                                        }
                                    }
                                },
                            },
                        }
                    ]
                }
            },
        },
    }


def a_trainjob(name: str, *, nodes: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "runtimeRef": {"name": RUNTIME},
            "trainer": {"numNodes": nodes, "resourcesPerNode": {"requests": {"cpu": "1"}}},
            **spec,
        },
    }


def pods_of(cluster: ClusterHandle, namespace: str, name: str) -> list[dict[str, Any]]:
    return get_list(cluster, "pods", namespace, "-l", f"jobset.sigs.k8s.io/jobset-name={name}")


def complete(cluster: ClusterHandle, namespace: str, name: str) -> bool:
    conditions = get(cluster, TRAINJOBS, name, namespace).get("status", {}).get("conditions", [])
    return any(c["type"] == "Complete" and c["status"] == "True" for c in conditions)


def test_a_trainjob_runs_as_a_jobset_whose_pods_complete_on_kwok(
    cluster: ClusterHandle, trainer_controller: Path, namespace: str
) -> None:
    apply(cluster, a_runtime())
    apply(cluster, a_trainjob("tj", nodes=3), namespace=namespace)
    wait_for(
        "the TrainJob Complete",
        lambda: complete(cluster, namespace, "tj"),
        timeout=90,
        log=lambda: trainer_controller.read_text()[-3000:],
    )
    jobset = get(cluster, "jobsets.jobset.x-k8s.io", "tj", namespace)
    assert [r["name"] for r in jobset["spec"]["replicatedJobs"]] == ["node"]
    pods = pods_of(cluster, namespace, "tj")
    assert len(pods) == 3, [p["metadata"]["name"] for p in pods]
    assert all(p["status"]["phase"] == "Succeeded" and p["spec"]["nodeName"] for p in pods)


def test_a_suspended_trainjob_runs_nothing_and_resumes_where_its_runtime_patch_says(
    cluster: ClusterHandle, trainer_controller: Path, namespace: str
) -> None:
    apply(cluster, a_runtime())
    patch = {"manager": "kueue.x-k8s.io/manager"}
    apply(
        cluster,
        a_trainjob("held", nodes=2, suspend=True, runtimePatches=[patch]),
        namespace=namespace,
    )
    wait_for(
        "the JobSet, suspended",
        lambda: (
            get_list(cluster, "jobsets.jobset.x-k8s.io", namespace)
            and get(cluster, "jobsets.jobset.x-k8s.io", "held", namespace)["spec"].get("suspend")
        ),
        log=lambda: trainer_controller.read_text()[-3000:],
    )
    assert not pods_of(cluster, namespace, "held")
    node = sorted(
        n["metadata"]["name"]
        for n in get_list(cluster, "nodes")
        if not n["spec"].get("taints") and not n["spec"].get("unschedulable")
    )[-1]  # other tests of the session may have added tainted nodes
    patch["trainingRuntimeSpec"] = {
        "template": {
            "spec": {
                "replicatedJobs": [
                    {
                        "name": "node",
                        "template": {
                            "spec": {
                                "template": {
                                    "metadata": {"labels": {"kueue.x-k8s.io/podset": "node"}},
                                    "spec": {"nodeSelector": {"kubernetes.io/hostname": node}},
                                }
                            }
                        },
                    }
                ]
            }
        }
    }
    apply(
        cluster,
        a_trainjob("held", nodes=2, suspend=False, runtimePatches=[patch]),
        namespace=namespace,
    )
    wait_for("the resumed TrainJob Complete", lambda: complete(cluster, namespace, "held"))
    pods = pods_of(cluster, namespace, "held")
    assert len(pods) == 2
    assert {p["spec"]["nodeName"] for p in pods} == {node}
    assert all(p["metadata"]["labels"]["kueue.x-k8s.io/podset"] == "node" for p in pods)
