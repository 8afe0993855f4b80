"""Fixtures for the operator's integration tests (imported by tests/integration/test_operator_*).

``kueue_crds`` installs the CRDs generated from the API models; ``phalanx_operator`` runs
``phalanx operator`` as a subprocess against the devcluster, with its log in a file that a
failing test prints. Small sync helpers wrap kubectl for assertions on real objects.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from phalanx.bench.proc import free_port, webhook_args
from phalanx.devcluster.handle import ClusterHandle

REPO = Path(__file__).resolve().parents[2]
PHALANX = Path(sys.executable).with_name("phalanx")
T = TypeVar("T")


@pytest.fixture(scope="session")
def kueue_crds(cluster: ClusterHandle, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Kueue CRDs, generated from the models (the same bytes as crds/), installed."""
    out = tmp_path_factory.mktemp("crds")
    subprocess.run([str(PHALANX), "crds", "--output", str(out)], check=True)
    cluster.apply_crds(p.read_text() for p in sorted(out.glob("*.yaml")))
    return out


@dataclass
class OperatorProcess:
    process: subprocess.Popen[bytes]
    log: Path
    metrics_port: int

    def cert_dir(self) -> Path:
        """The folder of its webhook (and HTTPS metrics) certificate: the last one given."""
        args = [str(a) for a in self.process.args]  # type: ignore[union-attr]
        return Path([a for a in args if a.startswith("--webhook-cert-dir=")][-1].split("=", 1)[1])

    def log_tail(self, lines: int = 80) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics") as r:
            return str(r.read().decode())

    def stop(self) -> int | None:
        """SIGTERM, then the exit code; None if it had to be killed after 30 s."""
        if self.process.poll() is not None:
            return self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return None


def _refuse_if_demo_operator_runs() -> None:
    """Two operators on one cluster would both schedule and fight over the webhooks."""
    pid_file = Path.home() / ".cache" / "phalanx" / "demo" / "operator.pid"
    if not pid_file.exists():
        return
    pid = pid_file.read_text().strip()
    cmdline = Path(f"/proc/{pid}/cmdline")
    if pid and cmdline.exists() and b"operator" in cmdline.read_bytes():
        raise AssertionError(
            f"the operator of `phalanx demo` (pid {pid}) runs against this cluster; stop it "
            f"first: kill {pid}"
        )


def start_operator(
    cluster: ClusterHandle, workdir: Path, *extra: str, name: str = "operator"
) -> OperatorProcess:
    _refuse_if_demo_operator_runs()
    metrics_port = free_port()
    log = workdir / f"{name}.log"
    cmd = [
        str(PHALANX),
        "operator",
        f"--kubeconfig={cluster.kubeconfig}",
        f"--metrics-port={metrics_port}",
        "--metrics-secure=false",  # plain HTTP on loopback: scraped without a token
        *webhook_args(cluster.kubeconfig, workdir, webhook_port=None, extra=extra),
        *extra,
    ]
    handle = open(log, "wb")  # noqa: SIM115 - the child writes it for its whole life
    process = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=dict(os.environ))
    op = OperatorProcess(process=process, log=log, metrics_port=metrics_port)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the operator exited ({process.returncode}):\n{op.log_tail()}")
        text = log.read_text(errors="replace")
        if "event=scheduler_ready" in text and _webhooks_ready(cluster):
            return op
        time.sleep(0.3)
    op.stop()
    raise AssertionError(f"the operator did not become ready in 60s:\n{op.log_tail()}")


def _webhooks_ready(cluster: ClusterHandle) -> bool:
    proc = cluster.kubectl(
        "get", "mutatingwebhookconfiguration", "phalanx.kueue.x-k8s.io", "-o", "json"
    )
    if proc.returncode != 0:
        return False
    return bool(json.loads(proc.stdout).get("webhooks"))


@pytest.fixture(scope="module")
def phalanx_operator(
    cluster: ClusterHandle, kueue_crds: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """One operator for the test module; its log tail is printed if the module fails."""
    workdir = tmp_path_factory.mktemp("operator")
    op = start_operator(cluster, workdir)
    try:
        yield op
    finally:
        op.stop()
        sys.stderr.write(f"\n[operator log: {op.log}]\n")


# -- kubectl helpers ----------------------------------------------------------------------------


def apply(cluster: ClusterHandle, *objects: dict[str, Any], namespace: str | None = None) -> None:
    args = ["apply", "-f", "-"]
    if namespace:
        args[1:1] = ["-n", namespace]
    cluster.kubectl_ok(*args, input=yaml.safe_dump_all(objects))


def get(
    cluster: ClusterHandle, kind: str, name: str, namespace: str | None = None
) -> dict[str, Any]:
    args = ["get", kind, name, "-o", "json"]
    if namespace:
        args += ["-n", namespace]
    return dict(json.loads(cluster.kubectl_ok(*args)))


def get_list(
    cluster: ClusterHandle, kind: str, namespace: str | None = None, *selectors: str
) -> list[dict[str, Any]]:
    args = ["get", kind, "-o", "json", *selectors]
    if namespace:
        args += ["-n", namespace]
    return list(json.loads(cluster.kubectl_ok(*args))["items"])


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    *,
    timeout: float = 60.0,
    interval: float = 0.5,
    log: Callable[[], str] | None = None,
) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    extra = f"\noperator log:\n{log()}" if log else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r}){extra}")


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") == kind:
            return dict(c)
    return None


def is_true(obj: dict[str, Any], kind: str) -> bool:
    c = condition(obj, kind)
    return c is not None and c.get("status") == "True"


# -- dedicated KWOK node pools ------------------------------------------------------------------
# Each test module schedules onto its own tainted nodes, selected by its own flavor, so its
# quotas and capacity are exact whatever else runs on the shared devcluster.

POOL_LABEL = "phalanx.dev/test-pool"
BLOCK = "cloud.provider.com/topology-block"
RACK = "cloud.provider.com/topology-rack"
HOST = "kubernetes.io/hostname"


def pool_nodes(pool: str, *, racks: int, hosts: int, gpus: int = 8) -> list[dict[str, Any]]:
    nodes = []
    for r in range(racks):
        for h in range(hosts):
            name = f"{pool}-r{r}-h{h}"
            resources = {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": str(gpus), "pods": "110"}
            nodes.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "labels": {
                            POOL_LABEL: pool,
                            BLOCK: f"{pool}-b0",
                            RACK: f"{pool}-r{r}",
                            HOST: name,
                            "type": "kwok",
                        },
                        "annotations": {"kwok.x-k8s.io/node": "fake"},
                    },
                    "spec": {
                        "taints": [{"key": POOL_LABEL, "value": pool, "effect": "NoSchedule"}]
                    },
                    "status": {"allocatable": resources, "capacity": dict(resources)},
                }
            )
    return nodes


@contextlib.contextmanager
def node_pool(cluster: ClusterHandle, pool: str, *, racks: int, hosts: int) -> Iterator[list[str]]:
    nodes = pool_nodes(pool, racks=racks, hosts=hosts)
    names = [n["metadata"]["name"] for n in nodes]
    cluster.kubectl("delete", "nodes", "-l", f"{POOL_LABEL}={pool}", "--wait=true")
    for node in nodes:
        cluster.kubectl_ok("create", "-f", "-", input=json.dumps(node))
    wait_for(
        f"{len(names)} Ready nodes in pool {pool}",
        lambda: (
            all(
                is_true(n, "Ready")
                for n in get_list(cluster, "nodes", None, "-l", f"{POOL_LABEL}={pool}")
            )
            and len(get_list(cluster, "nodes", None, "-l", f"{POOL_LABEL}={pool}")) == len(names)
        ),
        timeout=60,
    )
    try:
        yield names
    finally:
        cluster.kubectl("delete", "nodes", "-l", f"{POOL_LABEL}={pool}", "--wait=false")


def topology(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Topology",
        "metadata": {"name": name},
        "spec": {"levels": [{"nodeLabel": BLOCK}, {"nodeLabel": RACK}, {"nodeLabel": HOST}]},
    }


def flavor(name: str, *, pool: str, topology_name: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeLabels": {POOL_LABEL: pool},
        "tolerations": [
            {"key": POOL_LABEL, "operator": "Equal", "value": pool, "effect": "NoSchedule"}
        ],
    }
    if topology_name:
        spec["topologyName"] = topology_name
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": spec,
    }


def cluster_queue(
    name: str,
    *,
    flavor_name: str,
    gpus: int | str,
    cohort: str | None = None,
    borrowing_limit: int | None = None,
    lending_limit: int | None = None,
    preemption: dict[str, Any] | None = None,
    strategy: str | None = None,
) -> dict[str, Any]:
    gpu: dict[str, Any] = {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)}
    if borrowing_limit is not None:
        gpu["borrowingLimit"] = str(borrowing_limit)
    if lending_limit is not None:
        gpu["lendingLimit"] = str(lending_limit)
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": ["cpu", "nvidia.com/gpu"],
                "flavors": [
                    {
                        "name": flavor_name,
                        "resources": [{"name": "cpu", "nominalQuota": "1000"}, gpu],
                    }
                ],
            }
        ],
    }
    if cohort:
        spec["cohortName"] = cohort
    if preemption:
        spec["preemption"] = preemption
    if strategy:
        spec["queueingStrategy"] = strategy
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": spec,
    }


def local_queue(name: str, *, cluster_queue_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": name},
        "spec": {"clusterQueue": cluster_queue_name},
    }


def gpu_job(
    name: str,
    *,
    queue: str | None,
    pods: int = 1,
    gpus: int = 8,
    run_seconds: str = "3600",
    required: str | None = None,
    priority_class: str | None = None,
    suspend: bool | None = None,
) -> dict[str, Any]:
    labels = {"kueue.x-k8s.io/queue-name": queue} if queue else {}
    if priority_class:
        labels["kueue.x-k8s.io/priority-class"] = priority_class
    annotations = {"phalanx.dev/run-seconds": run_seconds}
    if required:
        annotations["kueue.x-k8s.io/podset-required-topology"] = required
    spec: dict[str, Any] = {
        "parallelism": pods,
        "completions": pods,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "template": {
            "metadata": {"annotations": annotations},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "train",
                        "image": "example.invalid/train:1",
                        "resources": {
                            "requests": {"cpu": "1", "nvidia.com/gpu": str(gpus)},
                            "limits": {"nvidia.com/gpu": str(gpus)},
                        },
                    }
                ],
            },
        },
    }
    if suspend is not None:
        spec["suspend"] = suspend
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }


def workload_of(
    cluster: ClusterHandle, namespace: str, name: str, *, kind: str = "Job"
) -> dict[str, Any] | None:
    """The Workload owned by the ``kind`` ``name`` (None until the operator created it)."""
    for wl in get_list(cluster, "workloads.kueue.x-k8s.io", namespace):
        for owner in wl["metadata"].get("ownerReferences") or ():
            if owner.get("kind") == kind and owner.get("name") == name:
                return wl
    return None


def priority_classes(namespace: str, cleanup: list[str]) -> tuple[str, str, list[dict[str, Any]]]:
    """A low (10) and a high (1000) WorkloadPriorityClass named after ``namespace``, added to
    ``cleanup``: their names and the objects to apply."""
    low, high = f"{namespace[:40]}-low", f"{namespace[:40]}-high"
    cleanup += [f"workloadpriorityclass.kueue.x-k8s.io/{n}" for n in (low, high)]
    objects = [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": n},
            "value": v,
        }
        for n, v in ((low, 10), (high, 1000))
    ]
    return low, high, objects


def job_pods(cluster: ClusterHandle, namespace: str, job: str) -> list[dict[str, Any]]:
    return get_list(cluster, "pods", namespace, "-l", f"job-name={job}")


def gpu_usage(cluster: ClusterHandle, cq: str) -> tuple[str, int]:
    """(total GPUs in use, reserving workloads) from the ClusterQueue's status."""
    status = get(cluster, "clusterqueues.kueue.x-k8s.io", cq).get("status") or {}
    total = "0"
    for fl in status.get("flavorsUsage") or ():
        for res in fl.get("resources") or ():
            if res["name"] == "nvidia.com/gpu":
                total = res.get("total", "0")
    return total, int(status.get("reservingWorkloads") or 0)


def delete_cluster_objects(cluster: ClusterHandle, *refs: str) -> None:
    """Delete cluster-scoped test objects. ClusterQueues and ResourceFlavors carry Phalanx's
    resource-in-use finalizer, which only a running operator removes: the test's cleanup
    strips it, as an admin would after uninstalling, so none lingers terminating."""
    for ref in refs:
        cluster.kubectl("delete", ref, "--ignore-not-found", "--wait=false")
        if ref.startswith(("clusterqueue", "resourceflavor")):
            cluster.kubectl("patch", ref, "--type=merge", "-p", '{"metadata":{"finalizers":null}}')


@pytest.fixture
def cleanup(cluster: ClusterHandle) -> Iterator[list[str]]:
    """Cluster-scoped objects (``kind/name``) a test appends here are deleted after it,
    whatever happened."""
    refs: list[str] = []
    yield refs
    delete_cluster_objects(cluster, *refs)


@pytest.fixture(scope="session")
def jobset_controller(cluster: ClusterHandle) -> Path:
    """The real JobSet controller (sigs.k8s.io/jobset, built from its pinned Go module on first
    use) running beside the cluster with its CRD and webhooks installed; ``down`` stops it.
    Returns its log file."""
    from phalanx.devcluster import addons
    from phalanx.devcluster.components import Layout
    from phalanx.devcluster.state import load_state

    layout = Layout(cluster.state_dir)
    state = load_state(layout)
    assert state is not None, f"no devcluster state in {cluster.state_dir}"
    runtime = addons.ensure_started(layout, addons.JOBSET, bin_dir=state.bin_dir)
    return runtime.log


@pytest.fixture(scope="session")
def lws_controller(cluster: ClusterHandle) -> Path:
    """The real LeaderWorkerSet controller (sigs.k8s.io/lws, built from its pinned Go module
    on first use) running beside the cluster with its CRD and webhooks installed; ``down``
    stops it. Returns its log file."""
    from phalanx.devcluster import addons
    from phalanx.devcluster.components import Layout
    from phalanx.devcluster.state import load_state

    layout = Layout(cluster.state_dir)
    state = load_state(layout)
    assert state is not None, f"no devcluster state in {cluster.state_dir}"
    runtime = addons.ensure_started(layout, addons.LWS, bin_dir=state.bin_dir)
    return runtime.log


@pytest.fixture(scope="session")
def pytorch_controller(cluster: ClusterHandle) -> Path:
    """The Kubeflow training-operator's PyTorchJob controller and webhook
    (github.com/kubeflow/training-operator, built from its pinned Go module on first use)
    running beside the cluster with its CRD and webhook installed; ``down`` stops it. Returns
    its log file."""
    from phalanx.devcluster import addons
    from phalanx.devcluster.components import Layout
    from phalanx.devcluster.state import load_state

    layout = Layout(cluster.state_dir)
    state = load_state(layout)
    assert state is not None, f"no devcluster state in {cluster.state_dir}"
    runtime = addons.ensure_started(layout, addons.PYTORCH, bin_dir=state.bin_dir)
    return runtime.log


@pytest.fixture(scope="session")
def ray_controller(cluster: ClusterHandle) -> Path:
    """The real KubeRay operator (github.com/ray-project/kuberay/ray-operator, built from its
    pinned Go module on first use) running beside the cluster with its CRDs installed; ``down``
    stops it. Returns its log file."""
    from phalanx.devcluster import addons
    from phalanx.devcluster.components import Layout
    from phalanx.devcluster.state import load_state

    layout = Layout(cluster.state_dir)
    state = load_state(layout)
    assert state is not None, f"no devcluster state in {cluster.state_dir}"
    runtime = addons.ensure_started(layout, addons.RAY, bin_dir=state.bin_dir)
    return runtime.log


@pytest.fixture(scope="session")
def trainer_controller(cluster: ClusterHandle, jobset_controller: Path) -> Path:
    """The real Kubeflow Trainer v2 controller manager (github.com/kubeflow/trainer/v2, built
    from its pinned Go module on first use) running beside the cluster with its CRDs and
    webhooks installed, and JobSet's controller beside it (a TrainJob runs as a JobSet);
    ``down`` stops it. Returns its log file."""
    from phalanx.devcluster import addons
    from phalanx.devcluster.components import Layout
    from phalanx.devcluster.state import load_state

    layout = Layout(cluster.state_dir)
    state = load_state(layout)
    assert state is not None, f"no devcluster state in {cluster.state_dir}"
    runtime = addons.ensure_started(layout, addons.TRAINER, bin_dir=state.bin_dir)
    return runtime.log
