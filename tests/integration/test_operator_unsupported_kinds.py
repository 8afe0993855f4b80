"""Queued objects of kinds Kueue integrates and Phalanx does not, on the local control plane:
a Deployment labelled with a queue name runs as if unlabelled and is told why by an
``IntegrationNotSupported`` Event, once; no Workload is made and none of its pods is held."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from operator_fixtures import *  # noqa: F403
from operator_fixtures import apply, get_list, start_operator, wait_for

from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration


def a_deployment(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {
                            "name": "serve",
                            "image": "example.invalid/serve:1",
                            "resources": {"requests": {"cpu": "100m"}},
                        }
                    ]
                },
            },
        },
    }


def test_a_queued_deployment_runs_unqueued_and_is_told_why(
    cluster: ClusterHandle, kueue_crds: Path, tmp_path: Path, namespace: str
) -> None:
    # Catches: no watch of unsupported kinds (no Event), an Event per ReplicaSet or per
    # update (not once per object), or the Deployment's pods held.
    op = start_operator(cluster, tmp_path, name="unsupported")
    try:
        apply(cluster, a_deployment("web"), namespace=namespace)

        def told() -> list[dict[str, Any]]:
            return [
                e
                for e in get_list(cluster, "events", namespace)
                if e.get("reason") == "IntegrationNotSupported"
            ]

        (event,) = wait_for("the IntegrationNotSupported event", told, log=op.log_tail)
        assert event["involvedObject"]["kind"] == "Deployment"
        assert event["involvedObject"]["name"] == "web"
        assert event["type"] == "Warning"
        assert "no integration for 'deployment'" in event["message"]
        assert "batch/job" in event["message"], "the message names what is integrated"
        wait_for(
            "the Deployment's 2 pods created, ungated",
            lambda: (
                len(pods := get_list(cluster, "pods", namespace, "-l", "app=web")) == 2
                and not any(p["spec"].get("schedulingGates") for p in pods)
            ),
            log=op.log_tail,
        )
        # An update of the Deployment is not told again.
        cluster.kubectl_ok("scale", "deployment", "web", "-n", namespace, "--replicas=3")
        wait_for(
            "the third pod",
            lambda: len(get_list(cluster, "pods", namespace, "-l", "app=web")) == 3,
            log=op.log_tail,
        )
        assert len(told()) == 1, told()
        assert not get_list(cluster, "workloads.kueue.x-k8s.io", namespace)
        log = op.log_tail(400)
        assert "event=task_failed" not in log and "Traceback" not in log, log
    finally:
        op.stop()
