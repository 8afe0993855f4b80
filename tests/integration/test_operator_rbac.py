"""The ClusterRole in manifests/base/rbac.yaml is enough: the operator, authenticated as
its ServiceAccount's token (RBAC on), runs a queued Job from submission to finish and is
refused nothing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from operator_fixtures import *  # noqa: F403
from operator_fixtures import (
    REPO,
    apply,
    cluster_queue,
    delete_cluster_objects,
    flavor,
    gpu_job,
    gpu_usage,
    is_true,
    local_queue,
    node_pool,
    start_operator,
    wait_for,
    workload_of,
)

from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

POOL = "phx-rbac"
MANIFESTS = REPO / "manifests" / "base"


def _service_account_kubeconfig(cluster: ClusterHandle, path: Path) -> None:
    token = cluster.kubectl_ok(
        "create", "token", "phalanx", "-n", "phalanx-system", "--duration=1h"
    ).strip()
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    config["users"] = [{"name": "phalanx", "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = "phalanx"
    path.write_text(yaml.safe_dump(config))


def test_operator_runs_with_the_manifests_cluster_role_only(
    cluster: ClusterHandle,
    kueue_crds: Path,
    tmp_path: Path,
    namespace: str,
    cleanup: list[str],
) -> None:
    cluster.kubectl_ok("apply", "-f", str(MANIFESTS / "namespace.yaml"))
    cluster.kubectl_ok("apply", "-f", str(MANIFESTS / "rbac.yaml"))
    kubeconfig = tmp_path / "sa.yaml"
    _service_account_kubeconfig(cluster, kubeconfig)
    whoami = cluster.kubectl("auth", "whoami", kubeconfig=kubeconfig)
    assert "system:serviceaccount:phalanx-system:phalanx" in whoami.stdout, whoami.stderr
    denied = cluster.kubectl("get", "secrets", "-A", kubeconfig=kubeconfig)
    assert denied.returncode != 0 and "Forbidden" in denied.stderr, "the role is too broad"

    cq = f"{namespace}-{int(time.time()) % 100000}"
    with node_pool(cluster, POOL, racks=1, hosts=1):
        cleanup += [f"clusterqueue.kueue.x-k8s.io/{cq}", f"resourceflavor.kueue.x-k8s.io/{POOL}"]
        apply(cluster, flavor(POOL, pool=POOL), cluster_queue(cq, flavor_name=POOL, gpus=8))
        # The operator runs on the ServiceAccount's kubeconfig (the later --kubeconfig wins);
        # the harness's own readiness checks read as the admin, since the operator itself
        # never reads its webhook configurations and the role does not let it.
        op = start_operator(cluster, tmp_path, f"--kubeconfig={kubeconfig}", name="rbac")
        try:
            apply(cluster, local_queue("lq", cluster_queue_name=cq), namespace=namespace)
            apply(cluster, gpu_job("train", queue="lq", run_seconds="3"), namespace=namespace)
            wait_for(
                "the Job's Workload finished",
                lambda: (w := workload_of(cluster, namespace, "train")) and is_true(w, "Finished"),
                timeout=90,
                log=op.log_tail,
            )
            wait_for("quota released", lambda: gpu_usage(cluster, cq) == ("0", 0), log=op.log_tail)
            log = op.log.read_text()
            assert "Forbidden" not in log and " 403 " not in log, op.log_tail()
        finally:
            op.stop()
            delete_cluster_objects(
                cluster,
                f"clusterqueue.kueue.x-k8s.io/{cq}",
                f"resourceflavor.kueue.x-k8s.io/{POOL}",
            )
