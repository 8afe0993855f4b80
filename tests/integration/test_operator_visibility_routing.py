"""Kueue's visibility API always answered by the leader, with the manifests' two replicas.

On the local control plane, in-cluster-shaped (``incluster_support``): the overlay applied, the
Service ``phalanx-visibility`` (its selector: the app label and
``phalanx.kueue.x-k8s.io/visibility=serving``) and the APIServices of
``manifests/controller/visibility.yaml``, two replicas started with the Deployment's
arguments, each with a Pod object named as it is and ``POD_NAME``/``POD_NAMESPACE``. The
harness follows the Service's selector over those Pods into EndpointSlices (the devcluster's
pods have no addresses), so the API server's aggregator reaches exactly the replicas whose Pod
carries the label.

Asserted: the leader's Pod carries the label and the standby's does not; every
``kubectl get --raw`` of a ClusterQueue's pending workloads is answered 200 (none 503), in
v1beta2 and, through the shipped v1beta1 APIService, in v1beta1; after
SIGTERM of the leader, the new leader's Pod carries the label, the old one's does not, and the
calls are answered 200 again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from incluster_support import (
    NAMESPACE,
    InClusterInstall,
    installed,
    wait_ready,
)
from operator_fixtures import *  # noqa: F403
from operator_fixtures import REPO, apply, is_true, wait_for

from phalanx.devcluster.handle import ClusterHandle
from phalanx.operator.podlabel import SERVING_LABEL, SERVING_VALUE

pytestmark = pytest.mark.integration

APISERVICE = "v1beta2.visibility.kueue.x-k8s.io"
APISERVICE_V1BETA1 = "v1beta1.visibility.kueue.x-k8s.io"
CQ = "phx-visl"
PENDING = f"/apis/visibility.kueue.x-k8s.io/v1beta2/clusterqueues/{CQ}/pendingworkloads"
CALLS = 8
CLUSTER_QUEUE = {
    "apiVersion": "kueue.x-k8s.io/v1beta2",
    "kind": "ClusterQueue",
    "metadata": {"name": CQ},
    "spec": {"namespaceSelector": {}},
}


@pytest.fixture
def install(cluster: ClusterHandle, kueue_crds: Path, tmp_path: Path) -> Iterator[InClusterInstall]:
    shipped = [
        d
        for d in yaml.safe_load_all((REPO / "manifests/controller/visibility.yaml").read_text())
        if d
    ]
    with installed(cluster, tmp_path) as inst:
        try:
            apply(cluster, *shipped)
            yield inst
        finally:
            # The APIServices first (Kueue's and Phalanx's explain/what-if group): an
            # unavailable aggregated API stalls namespace deletion.
            services = [d["metadata"]["name"] for d in shipped if d["kind"] == "APIService"]
            cluster.kubectl("delete", "apiservice", *services, "--ignore-not-found")
            cluster.kubectl("delete", "service", "phalanx-visibility", "-n", NAMESPACE)
            cluster.kubectl("delete", "clusterqueue", CQ, "--ignore-not-found")


def _serving(install: InClusterInstall, name: str) -> bool:
    return install.pod_labels(name).get(SERVING_LABEL) == SERVING_VALUE


def _answered(install: InClusterInstall) -> dict[str, Any] | None:
    """A 200 from the leader through the aggregator, after routing as the Service says."""
    install.route_visibility()
    proc = install.cluster.kubectl("get", "--raw", PENDING)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def _every_call_answered(install: InClusterInstall) -> None:
    wait_for(
        "the APIService Available",
        lambda: is_true(
            json.loads(install.cluster.kubectl_ok("get", "apiservice", APISERVICE, "-o", "json")),
            "Available",
        ),
        timeout=60,
    )
    wait_for("the leader to answer through the Service", lambda: _answered(install), timeout=30)
    failed = []
    for _ in range(CALLS):
        proc = install.cluster.kubectl("get", "--raw", PENDING)
        if proc.returncode != 0:
            failed.append(proc.stderr.strip())
        else:
            assert json.loads(proc.stdout)["kind"] == "PendingWorkloadsSummary"
    assert not failed, f"{len(failed)} of {CALLS} calls failed: {failed}"
    # Kueue's v1beta1, through the shipped APIService to the same Service.
    wait_for(
        "the v1beta1 APIService Available",
        lambda: is_true(
            json.loads(
                install.cluster.kubectl_ok("get", "apiservice", APISERVICE_V1BETA1, "-o", "json")
            ),
            "Available",
        ),
        timeout=60,
    )
    old = install.cluster.kubectl_ok("get", "--raw", PENDING.replace("/v1beta2/", "/v1beta1/"))
    assert json.loads(old)["apiVersion"] == "visibility.kueue.x-k8s.io/v1beta1"


def test_the_service_routes_to_the_leaders_pod_through_a_hand_over(install: InClusterInstall):
    started = time.monotonic()
    a = install.start("phalanx-visl-a", pod=True)
    wait_ready(a, leader=True)
    apply(install.cluster, CLUSTER_QUEUE)  # the webhooks answer now
    b = install.start("phalanx-visl-b", pod=True)
    wait_ready(b, leader=False)
    wait_for("the leader's pod labelled", lambda: _serving(install, a.name), timeout=20)
    # The standby cleared its label at start and never set it.
    wait_for("the standby's clear", lambda: "event=serving_label_written" in b.text(), timeout=20)
    assert not _serving(install, b.name)
    assert install.route_visibility() == [a.name]
    _every_call_answered(install)

    # The leader goes as the kubelet stops a pod: SIGTERM. It takes its label off and releases
    # the Lease; the standby takes over and labels its own Pod once it schedules.
    assert a.stop() == 0
    assert not _serving(install, a.name), a.tail()
    wait_ready(b, leader=True)
    wait_for("the new leader's pod labelled", lambda: _serving(install, b.name), timeout=20)
    assert not _serving(install, a.name)
    assert install.route_visibility() == [b.name]
    _every_call_answered(install)
    assert "serving_label_failed" not in a.text() + b.text()
    print(f"\nhand-over and routing checked in {time.monotonic() - started:.1f}s")
