"""``phalanx bench e2e`` on a tiny TAS scenario (1 block x 2 racks x 4 nodes, 48 Workloads)
against the local control plane, with the operator the bench starts.

First run with ``--keep``: every Workload finished, and every admission of the run (watched
here, apart from the bench's own check: a Workload evicted as it finishes ends without
``status.admission``) has a ``topologyAssignment`` on the scenario's KWOK nodes for all its
pods, the ``required`` ones within one rack; the devcluster's nodes are untouched. Second run
without it: it removes the first run's leftovers (nodes included), runs again and deletes
every node it created.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from bench_tas import RACK_LABEL, write_tiny_tas

from phalanx.devcluster import cluster as devcluster
from phalanx.devcluster.handle import ClusterHandle
from phalanx.placement import HOSTNAME_LABEL, decode_topology_assignment

pytestmark = pytest.mark.integration

PHALANX = Path(sys.executable).with_name("phalanx")
CLEANUP = "kueue.x-k8s.io/performance-scheduler-cleanup=true"


def _bench(config: Path, *extra: str) -> dict[str, Any]:
    run = subprocess.run(
        [
            str(PHALANX),
            "bench",
            "e2e",
            "--config",
            str(config),
            "--state-dir",
            # the cluster fixture's (conftest.py)
            os.environ.get("PHALANX_TEST_STATE_DIR") or str(devcluster.default_state_dir()),
            "--concurrency",
            "16",
            "--json",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode in (0, 1), run.stderr[-4000:]
    result: dict[str, Any] = json.loads(run.stdout)
    return result


def _items(cluster: ClusterHandle, *args: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(cluster.kubectl_ok("get", *args, "-o", "json"))[
        "items"
    ]
    return items


class _Admissions:
    """Every Workload version with ``status.admission`` from a watch of the run's Workloads."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client, watch

        self.api = client.CustomObjectsApi(api_client)
        self.watch = watch.Watch()
        self.seen: list[dict[str, Any]] = []
        self.stopped = False
        self.error: BaseException | None = None
        listed = self.api.list_cluster_custom_object(
            "kueue.x-k8s.io", "v1beta2", "workloads", label_selector=CLEANUP
        )
        self.resource_version = listed["metadata"]["resourceVersion"]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self._stream()
        except Exception as error:  # the connection closes under a stopped watch
            if not self.stopped:
                self.error = error

    def _stream(self) -> None:
        for event in self.watch.stream(
            self.api.list_cluster_custom_object,
            "kueue.x-k8s.io",
            "v1beta2",
            "workloads",
            label_selector=CLEANUP,
            resource_version=self.resource_version,
            timeout_seconds=900,
        ):
            obj = event["object"]
            if event["type"] != "DELETED" and (obj.get("status") or {}).get("admission"):
                self.seen.append(obj)

    def stop(self, *, expect: int) -> list[dict[str, Any]]:
        """Once ``expect`` Workloads were seen admitted (the watch may trail the bench)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            names = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in self.seen}
            if len(names) >= expect:
                break
            time.sleep(0.5)
        assert self.error is None, f"the watch broke during the run: {self.error!r}"
        self.stopped = True
        self.watch.stop()
        self.thread.join(timeout=60)
        return self.seen


def test_bench_e2e_places_a_tas_scenario_and_removes_its_nodes(
    cluster: ClusterHandle, kube_api_client: Any, tmp_path: Path
) -> None:
    config = write_tiny_tas(tmp_path)
    own_nodes = {n["metadata"]["name"] for n in _items(cluster, "nodes") if not _scenario_node(n)}

    watched = _Admissions(kube_api_client)
    result = _bench(config, "--keep")
    assert result["finished"] == result["workloads"] == 48, result
    assert result["create_errors"] == 0
    assert result["invariant_problems"] == []
    assert result["tas"]["nodes"] == 8
    assert result["tas"]["assignments_checked"] >= 48
    # The operator ran as an installed one does: its own ServiceAccount's token, not the
    # admin's client certificate (phalanx.bench.identity).
    operator_kubeconfig = cluster.kubeconfig.parent / "phalanx-bench-operator.yaml"
    assert f"--kubeconfig={operator_kubeconfig}" in Path(result["operator_log"]).read_text()
    who = cluster.kubectl(
        "auth",
        "whoami",
        "-o",
        "jsonpath={.status.userInfo.username}",
        kubeconfig=operator_kubeconfig,
    )
    assert who.stdout == "system:serviceaccount:kube-system:phalanx-bench-operator", who.stderr

    nodes = {n["metadata"]["name"]: n for n in _items(cluster, "nodes", "-l", CLEANUP)}
    assert sorted(nodes) == [f"node-b0-r{r}-n{i}" for r in range(2) for i in range(4)]
    assert nodes["node-b0-r1-n2"]["status"]["allocatable"]["cpu"] == "4"
    assert nodes["node-b0-r1-n2"]["metadata"]["labels"][RACK_LABEL] == "rack-1"
    rack_of = {
        n["metadata"]["labels"][HOSTNAME_LABEL]: n["metadata"]["labels"][RACK_LABEL]
        for n in nodes.values()
    }
    workloads = _items(cluster, "workloads", "-A", "-l", CLEANUP)
    assert len(workloads) == 48
    for wl in workloads:
        conditions = {c["type"]: c["status"] for c in wl["status"]["conditions"]}
        assert conditions.get("Finished") == "True", wl["metadata"]["name"]
    admissions = watched.stop(expect=48)
    admitted: set[str] = set()
    racks_used: set[str] = set()
    for wl in admissions:
        name = wl["metadata"]["name"]
        (psa,) = wl["status"]["admission"]["podSetAssignments"]
        levels, domains = decode_topology_assignment(psa["topologyAssignment"])
        assert levels == (HOSTNAME_LABEL,), name
        assert sum(count for _, count in domains) == wl["spec"]["podSets"][0]["count"], name
        racks = {rack_of[values[-1]] for values, _ in domains}
        if name.startswith("required-rack"):
            assert len(racks) == 1, (name, domains)
        racks_used |= racks
        admitted.add(f"{wl['metadata']['namespace']}/{name}")
    assert len(admitted) == 48
    assert racks_used == {"rack-0", "rack-1"}
    assert own_nodes <= {n["metadata"]["name"] for n in _items(cluster, "nodes")}

    again = _bench(config)
    assert again["finished"] == 48 and again["invariant_problems"] == []
    assert _items(cluster, "nodes", "-l", CLEANUP) == []
    assert _items(cluster, "topologies.kueue.x-k8s.io", "-l", CLEANUP) == []
    deadline = time.monotonic() + 300
    while _items(cluster, "workloads", "-A", "-l", CLEANUP):  # namespaces take them along
        assert time.monotonic() < deadline, "the run's Workloads outlived their namespaces"
        time.sleep(1.0)
    assert {n["metadata"]["name"] for n in _items(cluster, "nodes")} == own_nodes


def _scenario_node(node: dict[str, Any]) -> bool:
    """A node of a bench run (this one's, or one a failed run kept)."""
    return "kueue.x-k8s.io/performance-scheduler-cleanup" in node["metadata"].get("labels", {})
