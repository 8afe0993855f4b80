"""Kueue's own published examples, applied to Phalanx as a Kueue user would apply them.

The manifests are the tests' own copies, checked in under ``tests/integration/kueue_examples/``;
each file's header names its source in kubernetes-sigs/kueue and the release it was copied
from. ``v1beta2/`` holds Kueue v0.19.2's examples (``site/static/examples/`` and the YAML of
the concept and task pages under ``site/content/en/docs/``); ``v1beta1/`` holds the same
examples as Kueue v0.14.8 published them, its last release whose examples were written in
``kueue.x-k8s.io/v1beta1`` (with ``cohort``, ``priorityClassSource``...). Namespaced objects
are applied in each test's namespace instead of ``default``; nothing else is changed.

Each test applies a group of examples to one shared operator and cluster and asserts what
Kueue's docs say happens:

- getting started (``getting-started/``): the Job gets a Workload, is admitted to
  ``cluster-queue``, runs and finishes, and its quota is freed;
- jobs (``admin/single-clusterqueue-setup.yaml``, ``jobs/``): the sample Job runs; the partial
  admission Job (20 pods, at least 5) starts with the 9 that fit; the CronJob's Job is queued
  and admitted; the elastic Job is admitted at its parallelism (Kueue's
  ``ElasticJobsViaWorkloadSlices`` gate is off by default, and Phalanx does not implement it);
- cohorts and borrowing (``concepts/cluster_queue.md``, ``concepts/cohort.md``): with
  ``lendingLimit: 1`` team-a-cq borrows exactly one CPU; a ClusterQueue without quota runs on
  its Cohort's; the borrowingLimit snippet is refused, as by Kueue's own CRD (it covers
  ``memory`` without giving a quota for it);
- priority and preemption (``run_job_with_workload_priority.md``, the ``preemption`` snippet
  applied onto team-a-cq): the Workload of the labelled Job carries the class and its value; a
  Job of that class preempts a lower-priority Job of its ClusterQueue (``InClusterQueue``);
- TAS (``tas/``, on 8 KWOK nodes shaped as ``tas/kind-cluster.yaml``): the required Job's pods
  share one rack, the preferred Job's one block, the unconstrained Job runs;
- admission checks (``provisioning/``, ``sample-admission-check.yaml``, ``minimal-cq.yaml``):
  the Job waits with quota reserved until its ProvisioningRequest (class and
  ``provreq.kueue.x-k8s.io/`` parameters from the example) is Provisioned, then runs;
- what Phalanx refuses or treats differently, as docs/api.md says: ``concurrentAdmissionPolicy``
  is refused naming the field; the admission fair sharing setup (``admissionScope``) is
  accepted and stored as written; the shared-quota example is accepted and
  its Job admitted, but ``cpu_credits`` is never charged (Kueue's resource transformations are
  a Configuration feature Phalanx does not implement);
- every Kueue object of the examples, written in v1beta1 (Kueue's v0.14.8 copies, and Phalanx's
  own conversion for the kinds those lack), is accepted, stored as v1beta2 and reads back
  through v1beta1 as written (Kueue's one-way ``whenCanPreempt: Preempt`` excepted).

Skipped by design (Phalanx serves batch/v1 Jobs and Workloads only; these are not pytest skips,
they are not applied at all): JobSet (``jobs/sample-jobset*.yaml``), Kubeflow
(``sample-{jax,mpi,paddle,pytorch,tf,xgboost}job.yaml``, ``appwrapper/``), Spark
(``sample-sparkapplication.yaml``), Ray (``jobs/ray-*.yaml``), plain Pods and pod groups
(``pods-kueue/``, ``pod-based-workloads/``), serving workloads (Deployment, StatefulSet,
LeaderWorkerSet: ``serving-workloads/``), MultiKueue (``multikueue/``), DRA (``dra/``, needs
Kueue's DRA support), admission fair sharing jobs (``admission-fs/lq-*-simple-job.yaml``: the
ordering they show is tested in test_operator_admission_fair_sharing.py), the visibility API
(``visibility/``), Kueue's Python client scripts (``python/``) and the ValidatingAdmissionPolicy
samples (``sample-*-policy*.yaml``, policies on Kueue's own Jobs, not Kueue objects). Fair
sharing between ClusterQueues needs ``fairSharing.enable`` in the operator's configuration: the
Cohort weights of ``cohort-hierarchy.yaml`` are only checked to be accepted and stored.
"""

from __future__ import annotations

import copy
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
    condition,
    delete_cluster_objects,
    get,
    get_list,
    is_true,
    job_pods,
    start_operator,
    wait_for,
    workload_of,
)
from test_operator_admission_checks import PROVISIONING_REQUEST_CRD, PROVREQ, answer

from phalanx.api.v1beta1.convert import to_v1beta1, to_v1beta2
from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).parent / "kueue_examples"
V1 = "kueue.x-k8s.io/v1beta1"
V2 = "kueue.x-k8s.io/v1beta2"
KUEUE_KINDS = {
    "ClusterQueue": "clusterqueues",
    "LocalQueue": "localqueues",
    "Cohort": "cohorts",
    "ResourceFlavor": "resourceflavors",
    "Topology": "topologies",
    "WorkloadPriorityClass": "workloadpriorityclasses",
    "Workload": "workloads",
    "AdmissionCheck": "admissionchecks",
    "ProvisioningRequestConfig": "provisioningrequestconfigs",
}
NAMESPACED = {"LocalQueue", "Workload", "Job", "CronJob"}
TAS_POOL = "kueue-tas"
LONG_RUN = {"phalanx.dev/run-seconds": "600"}


@pytest.fixture(scope="module")
def phalanx_operator(
    cluster: ClusterHandle, kueue_crds: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """One operator for every example, started once the ProvisioningRequest CRD exists."""
    cluster.apply_crds([yaml.safe_dump(PROVISIONING_REQUEST_CRD)])
    op = start_operator(cluster, tmp_path_factory.mktemp("operator"))
    try:
        yield op
    finally:
        op.stop()


@pytest.fixture
def owned(cluster: ClusterHandle, namespace: str) -> Iterator[list[str]]:
    """Cluster-scoped objects (``plural.kueue.x-k8s.io/name``) the test applied. Afterwards
    the namespace's Jobs go first (foreground: their Workloads with them), so no workload of
    this test is counted when the next one applies a ClusterQueue of the same name."""
    refs: list[str] = []
    yield refs
    cluster.kubectl(
        "delete",
        "cronjobs,jobs,workloads.kueue.x-k8s.io",
        "--all",
        "-n",
        namespace,
        "--cascade=foreground",
        "--wait=true",
    )
    wait_for(
        "the test's Workloads to be gone",
        lambda: not get_list(cluster, "workloads.kueue.x-k8s.io", namespace),
        timeout=60,
    )
    delete_cluster_objects(cluster, *refs)


# -- the examples -------------------------------------------------------------------------------


def load(rel: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / rel).read_text()) if d]


def placed(objects: list[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    """The objects with the test's namespace for Kueue's ``default``."""
    out = copy.deepcopy(objects)
    for obj in out:
        if obj["kind"] in NAMESPACED:
            obj["metadata"]["namespace"] = namespace
    return out


def ref(obj: dict[str, Any]) -> str:
    return f"{KUEUE_KINDS[obj['kind']]}.kueue.x-k8s.io/{obj['metadata']['name']}"


def apply_example(
    cluster: ClusterHandle, rel: str, namespace: str, owned: list[str]
) -> list[dict[str, Any]]:
    objects = placed(load(rel), namespace)
    owned += [ref(o) for o in objects if o["kind"] in KUEUE_KINDS and o["kind"] not in NAMESPACED]
    cluster.kubectl_ok("apply", "-f", "-", input=yaml.safe_dump_all(objects))
    return objects


def refused(cluster: ClusterHandle, obj: dict[str, Any]) -> str:
    proc = cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))
    assert proc.returncode != 0, f"{obj['kind']}/{obj['metadata']['name']} was accepted"
    return proc.stderr


def create_job(
    cluster: ClusterHandle,
    rel: str,
    namespace: str,
    *,
    name: str | None = None,
    pods: int | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    cpu_only: bool = False,
) -> str:
    """Create the example's Job (``kubectl create``, as Kueue's docs do for generateName);
    the keywords are the few changes a test makes to a copy, none by default."""
    (job,) = placed(load(rel), namespace)
    if name:
        job["metadata"].pop("generateName", None)
        job["metadata"]["name"] = name
    if pods:
        job["spec"]["parallelism"] = job["spec"]["completions"] = pods
    job["metadata"].setdefault("labels", {}).update(labels or {})
    template = job["spec"]["template"].setdefault("metadata", {})
    template.setdefault("annotations", {}).update(annotations or {})
    if cpu_only:  # for a ClusterQueue covering cpu only: memory would be inadmissible there
        for container in job["spec"]["template"]["spec"]["containers"]:
            container["resources"]["requests"].pop("memory", None)
    created = json.loads(
        cluster.kubectl_ok("create", "-o", "json", "-f", "-", input=json.dumps(job))
    )
    # Suspended at creation, whatever the example says, by the mutating webhook as by Kueue's.
    assert created["spec"]["suspend"] is True, created["metadata"]
    return str(created["metadata"]["name"])


def admitted(cluster: ClusterHandle, namespace: str, job: str, op: OperatorProcess) -> Any:
    return wait_for(
        f"Job {job} admitted",
        lambda: (w := workload_of(cluster, namespace, job)) and is_true(w, "Admitted") and w,
        timeout=60,
        log=op.log_tail,
    )


def finished(cluster: ClusterHandle, namespace: str, job: str, op: OperatorProcess) -> Any:
    return wait_for(
        f"Job {job} complete and its Workload Finished",
        lambda: (
            is_true(get(cluster, "job", job, namespace), "Complete")
            and (w := workload_of(cluster, namespace, job))
            and is_true(w, "Finished")
            and w
        ),
        timeout=60,
        log=op.log_tail,
    )


def usage(cluster: ClusterHandle, cq: str, resource: str = "cpu") -> tuple[str, str]:
    """(total, borrowed) of ``resource`` in the ClusterQueue's status.flavorsReservation."""
    status = get(cluster, "clusterqueues.kueue.x-k8s.io", cq).get("status") or {}
    for fl in status.get("flavorsReservation") or ():
        for res in fl.get("resources") or ():
            if res["name"] == resource:
                return str(res.get("total", "0")), str(res.get("borrowed", "0"))
    return "0", "0"


def local_queue(name: str, cq: str, namespace: str) -> dict[str, Any]:
    """A LocalQueue the docs leave to the reader (the cohort pages name ClusterQueues only)."""
    return {
        "apiVersion": V2,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cq},
    }


# -- getting started and jobs -------------------------------------------------------------------


def test_getting_started_job_gets_a_workload_is_admitted_runs_and_frees_its_quota(
    cluster: ClusterHandle, phalanx_operator: OperatorProcess, namespace: str, owned: list[str]
) -> None:
    op = phalanx_operator
    apply_example(cluster, "v1beta2/getting-started/quick-start-setup.yaml", namespace, owned)
    wait_for(
        "cluster-queue Active",
        lambda: is_true(get(cluster, "clusterqueues.kueue.x-k8s.io", "cluster-queue"), "Active"),
        log=op.log_tail,
    )
    job = create_job(cluster, "v1beta2/getting-started/quick-start-job.yaml", namespace)
    wl = admitted(cluster, namespace, job, op)
    assert wl["spec"]["queueName"] == "user-queue"
    assert wl["status"]["admission"]["clusterQueue"] == "cluster-queue"
    (assignment,) = wl["status"]["admission"]["podSetAssignments"]
    assert assignment["count"] == 3 and assignment["flavors"]["cpu"] == "default-flavor"
    finished(cluster, namespace, job, op)
    assert {p["status"]["phase"] for p in job_pods(cluster, namespace, job)} == {"Succeeded"}
    wait_for("the quota freed", lambda: usage(cluster, "cluster-queue") == ("0", "0"))


def test_sample_jobs_partial_admission_cronjob_and_elastic_job(
    cluster: ClusterHandle, phalanx_operator: OperatorProcess, namespace: str, owned: list[str]
) -> None:
    op = phalanx_operator
    apply_example(cluster, "v1beta2/admin/single-clusterqueue-setup.yaml", namespace, owned)
    # The CronJob runs every minute: it is applied suspended (Kueue's example as published
    # otherwise) and resumed after the partial-admission check, whose count would change
    # with a CronJob Job holding 3 of the 9 CPUs when it is admitted.
    cron = placed(load("v1beta2/jobs/sample-cronjob.yaml"), namespace)
    for doc in cron:
        doc["spec"]["suspend"] = True
    cluster.kubectl_ok("apply", "-f", "-", input=yaml.safe_dump_all(cron))

    job = create_job(cluster, "v1beta2/jobs/sample-job.yaml", namespace)
    assert job.startswith("sample-job-")
    assert admitted(cluster, namespace, job, op)["status"]["admission"]["clusterQueue"] == (
        "cluster-queue"
    )
    finished(cluster, namespace, job, op)

    # 20 pods of 1 CPU, at least 5, against 9 CPUs: Kueue admits the largest count that fits.
    partial = create_job(cluster, "v1beta2/jobs/sample-job-partial-admission.yaml", namespace)
    wl = admitted(cluster, namespace, partial, op)
    assert wl["spec"]["podSets"][0]["minCount"] == 5
    assert wl["status"]["admission"]["podSetAssignments"][0]["count"] == 9
    assert get(cluster, "job", partial, namespace)["spec"]["parallelism"] == 9
    finished(cluster, namespace, partial, op)

    elastic = create_job(cluster, "v1beta2/jobs/sample-scalable-job.yaml", namespace)
    wl = admitted(cluster, namespace, elastic, op)
    assert wl["status"]["admission"]["podSetAssignments"][0]["count"] == 3
    cluster.kubectl_ok("delete", "job", elastic, "-n", namespace, "--wait=false")

    cluster.kubectl_ok(
        "patch", "cronjob", "sample-cronjob", "-n", namespace, "--type=merge",
        "-p", '{"spec":{"suspend":false}}',
    )  # fmt: skip

    def cron_job() -> str | None:
        for j in get_list(cluster, "jobs", namespace):
            owners = j["metadata"].get("ownerReferences") or ()
            if any(o.get("kind") == "CronJob" for o in owners):
                return str(j["metadata"]["name"])
        return None

    scheduled = wait_for("the CronJob's first Job", cron_job, timeout=90, log=op.log_tail)
    assert admitted(cluster, namespace, scheduled, op)["spec"]["queueName"] == "user-queue"
    cluster.kubectl_ok("delete", "cronjob", "sample-cronjob", "-n", namespace)


# -- cohorts, borrowing, priority and preemption ------------------------------------------------


def test_cohort_examples_borrow_within_their_limits(
    cluster: ClusterHandle, phalanx_operator: OperatorProcess, namespace: str, owned: list[str]
) -> None:
    op = phalanx_operator
    apply_example(cluster, "v1beta2/admin/resource-flavor-empty.yaml", namespace, owned)
    # Kueue's CRD refuses the borrowingLimit snippet too: it covers cpu and memory and gives a
    # quota for cpu only ("flavors must have the same number of resources as the
    # coveredResources").
    for cq in load("v1beta2/docs/cohort-borrowing-limit.yaml"):
        assert "coveredResources" in refused(cluster, cq)

    # lendingLimit: 1 on team-b-cq: team-a-cq may use 9 + 1 CPUs.
    apply_example(cluster, "v1beta2/docs/cohort-lending-limit.yaml", namespace, owned)
    cluster.kubectl_ok(
        "apply", "-f", "-", input=yaml.safe_dump(local_queue("team-a", "team-a-cq", namespace))
    )
    sample = "v1beta2/jobs/sample-job.yaml"
    big = create_job(
        cluster,
        sample,
        namespace,
        name="borrows",
        pods=10,
        labels={"kueue.x-k8s.io/queue-name": "team-a"},
        annotations=LONG_RUN,
        cpu_only=True,
    )
    admitted(cluster, namespace, big, op)
    assert wait_for("team-a-cq to borrow 1 CPU", lambda: usage(cluster, "team-a-cq") == ("10", "1"))
    over = create_job(
        cluster,
        sample,
        namespace,
        name="over",
        pods=1,
        labels={"kueue.x-k8s.io/queue-name": "team-a"},
        cpu_only=True,
    )
    pending = wait_for(
        "the Job over the lending limit to be explained",
        lambda: (
            (w := workload_of(cluster, namespace, over))
            and (c := condition(w, "QuotaReserved"))
            and c["status"] == "False"
            and c
        ),
        log=op.log_tail,
    )
    assert "cpu" in pending["message"], pending

    # A Cohort with quota: my-cluster-queue has none of its own and runs on the Cohort's 12.
    apply_example(cluster, "v1beta2/docs/cohort-with-quota.yaml", namespace, owned)
    cluster.kubectl_ok(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump(local_queue("mine", "my-cluster-queue", namespace)),
    )
    # The snippet leaves namespaceSelector out, which matches no namespace (in Kueue too).
    cluster.kubectl_ok(
        "patch",
        "clusterqueues.kueue.x-k8s.io",
        "my-cluster-queue",
        "--type=merge",
        "-p",
        '{"spec":{"namespaceSelector":{}}}',
    )
    mine = create_job(
        cluster,
        sample,
        namespace,
        name="on-cohort-quota",
        labels={"kueue.x-k8s.io/queue-name": "mine"},
        annotations=LONG_RUN,
        cpu_only=True,
    )
    admitted(cluster, namespace, mine, op)
    wait_for(
        "3 CPUs borrowed from the Cohort", lambda: usage(cluster, "my-cluster-queue") == ("3", "3")
    )


def test_priority_class_example_and_a_higher_priority_job_preempts(
    cluster: ClusterHandle, phalanx_operator: OperatorProcess, namespace: str, owned: list[str]
) -> None:
    op = phalanx_operator
    apply_example(cluster, "v1beta2/admin/resource-flavor-empty.yaml", namespace, owned)
    apply_example(cluster, "v1beta2/docs/workload-priority-class.yaml", namespace, owned)
    apply_example(cluster, "v1beta2/docs/cohort-team-ab.yaml", namespace, owned)
    # The preemption snippet names team-a-cq: merged onto it, as a user completing the
    # cohort example would.
    (fragment,) = load("v1beta2/docs/clusterqueue-preemption.yaml")
    cluster.kubectl_ok(
        "patch",
        "clusterqueues.kueue.x-k8s.io",
        "team-a-cq",
        "--type=merge",
        "-p",
        json.dumps({"spec": fragment["spec"]}),
    )
    cq = get(cluster, "clusterqueues.kueue.x-k8s.io", "team-a-cq")["spec"]
    assert cq["preemption"]["withinClusterQueue"] == "LowerPriority" and cq["resourceGroups"]
    cluster.kubectl_ok(
        "apply", "-f", "-", input=yaml.safe_dump(local_queue("user-queue", "team-a-cq", namespace))
    )

    # The docs' Job with the priority-class label: its Workload is the one the docs show.
    job = create_job(cluster, "v1beta2/docs/job-with-priority.yaml", namespace)
    wl = admitted(cluster, namespace, job, op)
    (expected,) = load("v1beta2/docs/workload-with-priority.yaml")
    for key in ("priorityClassRef", "priority", "queueName"):
        assert wl["spec"][key] == expected["spec"][key], key
    cluster.kubectl_ok("delete", "job", job, "-n", namespace, "--cascade=foreground")

    # The whole cohort (9 + 12 CPUs) taken by a Job of priority 0 in team-a-cq, then a Job of
    # the sample class: it preempts within the ClusterQueue (withinClusterQueue: LowerPriority).
    sample = "v1beta2/jobs/sample-job.yaml"
    low = create_job(
        cluster,
        sample,
        namespace,
        name="low",
        pods=21,
        labels={"kueue.x-k8s.io/queue-name": "user-queue"},
        annotations=LONG_RUN,
    )
    admitted(cluster, namespace, low, op)
    wait_for(
        "the cohort's 21 CPUs in use, 12 borrowed",
        lambda: usage(cluster, "team-a-cq") == ("21", "12"),
    )
    high = create_job(
        cluster,
        sample,
        namespace,
        name="high",
        labels={
            "kueue.x-k8s.io/queue-name": "user-queue",
            "kueue.x-k8s.io/priority-class": "sample-priority",
        },
        annotations=LONG_RUN,
    )
    assert admitted(cluster, namespace, high, op)["spec"]["priority"] == 10000
    victim = wait_for(
        "the low-priority Workload preempted",
        lambda: (w := workload_of(cluster, namespace, low)) and condition(w, "Preempted"),
        log=op.log_tail,
    )
    assert (victim["status"], victim["reason"]) == ("True", "InClusterQueue"), victim
    assert get(cluster, "job", low, namespace)["spec"]["suspend"] is True


# -- topology-aware scheduling ------------------------------------------------------------------


def tas_nodes() -> list[dict[str, Any]]:
    """The 8 workers of Kueue's tas/kind-cluster.yaml (blocks b1, b2 x racks r1, r2 x 2 hosts)
    as KWOK nodes, with room for the required Job in a rack and the preferred one in a block."""
    nodes = []
    for block in ("b1", "b2"):
        for rack in ("r1", "r2"):
            for host in (0, 1):
                name = f"{TAS_POOL}-{block}-{rack}-{host}"
                capacity = {"cpu": "20", "memory": "64Gi", "pods": "110"}
                nodes.append(
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "metadata": {
                            "name": name,
                            "labels": {
                                "cloud.provider.com/node-group": "tas-group",
                                "cloud.provider.com/topology-block": block,
                                "cloud.provider.com/topology-rack": rack,
                                "kubernetes.io/hostname": name,
                                POOL_LABEL: TAS_POOL,
                                "type": "kwok",
                            },
                            "annotations": {"kwok.x-k8s.io/node": "fake"},
                        },
                        "status": {"allocatable": capacity, "capacity": dict(capacity)},
                    }
                )
    return nodes


@pytest.fixture
def tas_cluster(cluster: ClusterHandle) -> Iterator[None]:
    selector = f"{POOL_LABEL}={TAS_POOL}"
    cluster.kubectl("delete", "nodes", "-l", selector, "--wait=true")
    cluster.kubectl_ok("create", "-f", "-", input=yaml.safe_dump_all(tas_nodes()))
    wait_for(
        "8 Ready TAS nodes",
        lambda: (
            [is_true(n, "Ready") for n in get_list(cluster, "nodes", None, "-l", selector)]
            == [True] * 8
        ),
    )
    try:
        yield
    finally:
        cluster.kubectl("delete", "nodes", "-l", selector, "--wait=false")


def domains(cluster: ClusterHandle, namespace: str, job: str, pods: int) -> set[tuple[str, str]]:
    """The (block, rack) of each pod's node, once all ``pods`` are bound."""
    nodes = {
        n["metadata"]["name"]: n["metadata"]["labels"]
        for n in get_list(cluster, "nodes", None, "-l", f"{POOL_LABEL}={TAS_POOL}")
    }
    bound = wait_for(
        f"{pods} pods of {job} bound",
        lambda: (
            (p := [x["spec"].get("nodeName") for x in job_pods(cluster, namespace, job)])
            and len(p) == pods
            and all(p)
            and p
        ),
    )
    assert set(bound) <= set(nodes), f"pods outside the tas-group nodes: {bound}"
    return {
        (
            nodes[n]["cloud.provider.com/topology-block"],
            nodes[n]["cloud.provider.com/topology-rack"],
        )
        for n in bound
    }


def test_tas_examples_place_each_job_in_its_topology_domain(
    cluster: ClusterHandle,
    phalanx_operator: OperatorProcess,
    tas_cluster: None,
    namespace: str,
    owned: list[str],
) -> None:
    op = phalanx_operator
    apply_example(cluster, "v1beta2/tas/sample-queues.yaml", namespace, owned)
    wait_for(
        "tas-cluster-queue Active",
        lambda: is_true(
            get(cluster, "clusterqueues.kueue.x-k8s.io", "tas-cluster-queue"), "Active"
        ),
        log=op.log_tail,
    )
    required = create_job(cluster, "v1beta2/tas/sample-job-required.yaml", namespace)
    preferred = create_job(cluster, "v1beta2/tas/sample-job-preferred.yaml", namespace)
    free = create_job(cluster, "v1beta2/tas/sample-job-unconstrained.yaml", namespace)
    for job in (required, preferred, free):
        wl = admitted(cluster, namespace, job, op)
        assert wl["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]
    assert len(domains(cluster, namespace, required, 10)) == 1, "not in one rack"
    assert len({b for b, _ in domains(cluster, namespace, preferred, 40)}) == 1, "not one block"
    assert domains(cluster, namespace, free, 10)

    # The GPU variant of the same queues replaces them and the ClusterQueue stays usable.
    apply_example(cluster, "v1beta2/tas/sample-gpu-queues.yaml", namespace, owned)
    flavor = get(cluster, "resourceflavors.kueue.x-k8s.io", "tas-flavor")
    assert flavor["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    wait_for(
        "tas-cluster-queue Active with GPUs",
        lambda: is_true(
            get(cluster, "clusterqueues.kueue.x-k8s.io", "tas-cluster-queue"), "Active"
        ),
    )


# -- admission checks ---------------------------------------------------------------------------


def test_provisioning_example_runs_its_job_once_the_request_is_provisioned(
    cluster: ClusterHandle, phalanx_operator: OperatorProcess, namespace: str, owned: list[str]
) -> None:
    op = phalanx_operator
    apply_example(cluster, "v1beta2/provisioning/provisioning-setup.yaml", namespace, owned)
    wait_for(
        "sample-prov Active and cluster-queue Active",
        lambda: (
            is_true(get(cluster, "admissionchecks.kueue.x-k8s.io", "sample-prov"), "Active")
            and is_true(get(cluster, "clusterqueues.kueue.x-k8s.io", "cluster-queue"), "Active")
        ),
        log=op.log_tail,
    )
    job = create_job(cluster, "v1beta2/provisioning/sample-job.yaml", namespace)
    reserved = wait_for(
        "quota reserved, the check pending",
        lambda: (w := workload_of(cluster, namespace, job)) and is_true(w, "QuotaReserved") and w,
        log=op.log_tail,
    )
    assert not is_true(reserved, "Admitted")
    request = wait_for(
        "the ProvisioningRequest",
        lambda: next(iter(get_list(cluster, PROVREQ, namespace)), None),
        log=op.log_tail,
    )
    assert request["spec"]["provisioningClassName"] == "check-capacity.autoscaling.x-k8s.io"
    assert request["spec"]["parameters"] == {"maxRunDurationSeconds": "600"}
    assert request["spec"]["podSets"][0]["count"] == 3
    assert get(cluster, "job", job, namespace)["spec"]["suspend"] is True
    answer(cluster, namespace, request["metadata"]["name"], "Provisioned", "capacity is there")
    finished(cluster, namespace, job, op)

    # Kueue's minimal ClusterQueue names sample-prov (present) and sample-prov-2 (absent).
    apply_example(cluster, "v1beta2/admin/minimal-cq.yaml", namespace, owned)
    active = wait_for(
        "cluster-queue-2's Active condition",
        lambda: condition(
            get(cluster, "clusterqueues.kueue.x-k8s.io", "cluster-queue-2"), "Active"
        ),
        log=op.log_tail,
    )
    assert (active["status"], active["reason"]) == ("False", "AdmissionCheckNotFound"), active
    assert "sample-prov-2" in active["message"]
    # An AdmissionCheck for a controller Phalanx does not run is accepted and left alone.
    apply_example(cluster, "v1beta2/sample-admission-check.yaml", namespace, owned)
    assert get(cluster, "admissionchecks.kueue.x-k8s.io", "prov-test")["spec"]["controllerName"]


# -- what Phalanx refuses or does differently ---------------------------------------------------


def test_examples_of_unimplemented_features_are_refused_or_documented(
    cluster: ClusterHandle, phalanx_operator: OperatorProcess, namespace: str, owned: list[str]
) -> None:
    op = phalanx_operator
    for rel, field in (
        ("v1beta2/admin/concurrent-admission-setup.yaml", "concurrentAdmissionPolicy"),
    ):
        objects = placed(load(rel), namespace)
        for obj in objects:
            if obj["kind"] == "ClusterQueue":
                message = refused(cluster, obj)
                assert f"{field} " in message and "does not implement" in message, message
            else:  # the flavors and LocalQueues around it are accepted
                owned += [] if obj["kind"] in NAMESPACED else [ref(obj)]
                cluster.kubectl_ok("apply", "-f", "-", input=json.dumps(obj))

    # Admission fair sharing between LocalQueues: accepted and stored as written.
    apply_example(
        cluster, "v1beta2/admission-fs/admission-fair-sharing-setup.yaml", namespace, owned
    )
    scope = get(cluster, "clusterqueues.kueue.x-k8s.io", "cluster-queue")["spec"]["admissionScope"]
    assert scope == {"admissionMode": "UsageBasedAdmissionFairSharing"}, scope

    for rel in ("admin/resource-flavor-taints.yaml", "admin/resource-flavor-tolerations.yaml"):
        apply_example(cluster, f"v1beta2/{rel}", namespace, owned)
    spot = get(cluster, "resourceflavors.kueue.x-k8s.io", "spot")["spec"]
    assert spot["tolerations"][0]["key"] == "spot-taint"

    # Shared quota through virtual credits needs Kueue's resources.transformations
    # (Configuration), which Phalanx does not implement: the queues are accepted and the Job
    # admitted on CPU, but no cpu_credits are charged (docs/api.md).
    apply_example(cluster, "v1beta2/admin/shared-quota-setup.yaml", namespace, owned)
    job = create_job(cluster, "v1beta2/admin/shared-quota-sample-job.yaml", namespace)
    wl = admitted(cluster, namespace, job, op)
    usage_ = wl["status"]["admission"]["podSetAssignments"][0]["resourceUsage"]
    assert usage_.get("cpu") == "3" and "cpu_credits" not in usage_, usage_


# -- v1beta1 ------------------------------------------------------------------------------------


def _kueue_objects(version_dir: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted((EXAMPLES / version_dir).rglob("*.yaml")):
        rel = str(path.relative_to(EXAMPLES))
        out += [(rel, obj) for obj in load(rel) if obj["kind"] in KUEUE_KINDS]
    return out


def _renamed(obj: dict[str, Any], index: int, namespace: str) -> dict[str, Any]:
    """A copy under its own name (several examples share names), in the test's namespace."""
    obj = copy.deepcopy(obj)
    obj["metadata"]["name"] = f"v1b{index}-{obj['metadata']['name']}"[:63]
    # Cohorts renamed too: the copies must not join (and lend to) the examples' cohorts.
    spec = obj.get("spec") or {}
    for key in ("cohort", "cohortName", "parentName"):
        if key in spec:
            spec[key] = f"v1b-{spec[key]}"
    if obj["kind"] in NAMESPACED:
        obj["metadata"]["namespace"] = namespace
    return obj


def _written(expected: Any, actual: Any, path: str = "") -> list[str]:
    """Where ``actual`` differs from what was written (fields the API server defaulted in
    ``actual`` are not differences)."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{path}: {actual!r}"]
        return [d for k, v in expected.items() for d in _written(v, actual.get(k), f"{path}.{k}")]
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [f"{path}: {actual!r} != {expected!r}"]
        return [
            d
            for i, (e, a) in enumerate(zip(expected, actual, strict=True))
            for d in _written(e, a, f"{path}[{i}]")
        ]
    return [] if expected == actual else [f"{path}: {actual!r} != {expected!r}"]


def _body(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata", "status")}


def _read(cluster: ClusterHandle, obj: dict[str, Any], version: str) -> dict[str, Any]:
    args = ["get", f"{KUEUE_KINDS[obj['kind']]}.{version}.kueue.x-k8s.io", obj["metadata"]["name"]]
    if obj["kind"] in NAMESPACED:
        args += ["-n", obj["metadata"]["namespace"]]
    return dict(json.loads(cluster.kubectl_ok(*args, "-o", "json")))


def test_every_example_object_in_v1beta1_is_stored_as_v1beta2_and_reads_back(
    cluster: ClusterHandle, phalanx_operator: OperatorProcess, namespace: str, owned: list[str]
) -> None:
    # Kueue's own v1beta1 copies, and for the objects they lack, the v1beta2 examples in
    # v1beta1 by Phalanx's conversion (Kueue's renames).
    covered = {(o["kind"], o["metadata"]["name"]) for _, o in _kueue_objects("v1beta1")}
    objects = _kueue_objects("v1beta1") + [
        (rel, to_v1beta1(o))
        for rel, o in _kueue_objects("v1beta2")
        if (o["kind"], o["metadata"]["name"]) not in covered
        and "concurrentAdmissionPolicy" not in o.get("spec", {})  # refused in v1beta2
    ]
    accepted: list[tuple[str, dict[str, Any]]] = []
    for index, (rel, original) in enumerate(objects):
        obj = _renamed(original, index, namespace)
        assert obj["apiVersion"] == V1, rel
        proc = cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))
        # Refused in v1beta1 exactly as in v1beta2 (see the tests above).
        if "borrowing-limit" in rel:
            assert proc.returncode != 0, f"{rel}: {obj['kind']} accepted"
            continue
        assert proc.returncode == 0, f"{rel}: {proc.stderr}"
        if obj["kind"] not in NAMESPACED:
            owned.append(ref(obj))
        accepted.append((rel, obj))

    problems = []
    for rel, obj in accepted:
        where = f"{rel} {obj['kind']}/{obj['metadata']['name']}"
        stored = _read(cluster, obj, "v1beta2")
        expected_v2 = to_v1beta2(obj)
        problems += [f"{where} (v1beta2){d}" for d in _written(_body(expected_v2), _body(stored))]
        cohort = obj["spec"].get("cohort") if obj["kind"] == "ClusterQueue" else None
        if cohort and ("cohort" in stored["spec"] or stored["spec"].get("cohortName") != cohort):
            problems.append(f"{where}: stored without cohortName")
        back = _read(cluster, obj, "v1beta1")
        written = _body(obj)
        fungibility = written.get("spec", {}).get("flavorFungibility", {})
        if fungibility.get("whenCanPreempt") == "Preempt":
            # Kueue's conversion is one way here: v1beta2 has no Preempt (docs/api.md).
            fungibility["whenCanPreempt"] = "MayStopSearch"
        problems += [f"{where} (v1beta1){d}" for d in _written(written, _body(back))]
    assert not problems, "\n".join(problems)
    kinds = {obj["kind"] for _, obj in accepted}
    assert kinds == set(KUEUE_KINDS), set(KUEUE_KINDS) - kinds
