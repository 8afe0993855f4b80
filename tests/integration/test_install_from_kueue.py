"""docs/install.md's "Upgrading from Kueue", performed on the local control plane.

Kueue cannot run here, so the test builds what a Kueue installation leaves behind: the
``kueue-system`` namespace with a stand-in ``kueue-controller-manager`` Deployment and its
Services, Kueue's two webhook configurations (fail closed, nothing serving them), its visibility
APIServices, CRDs whose conversion webhook Kueue's installer owns (field manager ``helm``, with
cert-manager's CA-injection annotation), queues carrying Kueue's finalizer, and three Jobs with
the Workloads Kueue made for them (its name, owner reference, ``job-uid`` label and finalizer):
one admitted and running (``status.admission`` and the ``QuotaReserved``/``Admitted``
conditions written through the status subresource as Kueue writes them), two left pending.

Then it runs the section's commands, read from the page (the Deployment of
``manifests/default`` is the operator process beside the local control plane, as everywhere in
these tests), and checks what step 4 says: the admitted Workload keeps its admission and its
conditions, its Job keeps running, the ClusterQueue counts it (8 GPUs of quota, 6 held: a
4-GPU Job stays pending on quota, a 2-GPU one is admitted), and once the admitted Job is
deleted the 4-GPU one is admitted.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_fixtures import *  # noqa: F403
from operator_fixtures import (
    REPO,
    OperatorProcess,
    apply,
    cluster_queue,
    condition,
    delete_cluster_objects,
    flavor,
    get,
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

DOC = REPO / "docs" / "install.md"
SECTION = "## Upgrading from Kueue"
POOL = "phx-kueueup"
KUEUE_NS = "kueue-system"
MUTATING = "kueue-mutating-webhook-configuration"
VALIDATING = "kueue-validating-webhook-configuration"
APISERVICES = ("v1beta1.visibility.kueue.x-k8s.io", "v1beta2.visibility.kueue.x-k8s.io")
CONVERTED = ("clusterqueues", "cohorts", "localqueues", "workloads")
RESOURCE_IN_USE = "kueue.x-k8s.io/resource-in-use"
CERT_MANAGER = "cert-manager.io/inject-ca-from"


def section_commands() -> list[list[str]]:
    """The shell commands of the section, in order (every ``sh`` block up to the next ``##``)."""
    text = DOC.read_text()
    start = text.index(f"\n{SECTION}\n")
    end = text.find("\n## ", start + 1)
    body = text[start : end if end != -1 else len(text)]
    blocks = re.findall(r"^```sh\n(.*?)^```", body, re.M | re.S)
    return [shlex.split(line) for block in blocks for line in block.splitlines() if line]


def kueue_workload_name(job_name: str, job_uid: str) -> str:
    """Kueue's name for a Job's Workload (``GetWorkloadNameForOwnerWithGVK``): ``job-<name>-``
    and 5 hex of the SHA-1 of kind, group, name and UID; written out here, not imported from
    Phalanx, so a Phalanx that names them differently fails this test."""
    digest = hashlib.sha1(f"Job\nbatch\n{job_name}\n{job_uid}".encode()).hexdigest()
    return f"job-{job_name}"[:247] + "-" + digest[:5]


# -- what Kueue leaves --------------------------------------------------------------------------


def _kueue_webhook(name: str, path: str, resources: list[str], ops: list[str]) -> dict[str, Any]:
    hook: dict[str, Any] = {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": {
            "service": {"name": "kueue-webhook-service", "namespace": KUEUE_NS, "path": path}
        },
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "rules": [
            {
                "apiGroups": ["batch" if resources == ["jobs"] else "kueue.x-k8s.io"],
                "apiVersions": ["v1" if resources == ["jobs"] else "v1beta2"],
                "operations": ops,
                "resources": resources,
            }
        ],
    }
    if resources == ["jobs"]:
        hook["namespaceSelector"] = {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": ["kube-system", KUEUE_NS],
                }
            ]
        }
    return hook


def kueue_installation() -> list[dict[str, Any]]:
    labels = {"app.kubernetes.io/name": "kueue", "control-plane": "controller-manager"}
    port = {"port": 443, "protocol": "TCP", "targetPort": 9443}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NS}},
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "kueue-controller-manager", "namespace": KUEUE_NS},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"control-plane": "controller-manager"}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        # A stand-in: no node matches, so its pod waits, never serving.
                        "nodeSelector": {"phalanx.dev/test-pool": "none"},
                        "containers": [
                            {"name": "manager", "image": "registry.k8s.io/kueue/kueue:v0.16.0"}
                        ],
                    },
                },
            },
        },
        *(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "namespace": KUEUE_NS},
                "spec": {"selector": {"control-plane": "controller-manager"}, "ports": [port]},
            }
            for name in ("kueue-webhook-service", "kueue-visibility-server")
        ),
        *(
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": name},
                "spec": {
                    "group": "visibility.kueue.x-k8s.io",
                    "version": name.split(".")[0],
                    "groupPriorityMinimum": 100,
                    "versionPriority": 100,
                    "insecureSkipTLSVerify": True,
                    "service": {"name": "kueue-visibility-server", "namespace": KUEUE_NS},
                },
            }
            for name in APISERVICES
        ),
    ]


def kueue_webhook_configurations() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": MUTATING},
            "webhooks": [
                _kueue_webhook("mjob.kb.io", "/mutate-batch-v1-job", ["jobs"], ["CREATE"]),
                _kueue_webhook(
                    "mworkload.kb.io",
                    "/mutate-kueue-x-k8s-io-v1beta2-workload",
                    ["workloads"],
                    ["CREATE"],
                ),
            ],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": VALIDATING},
            "webhooks": [
                _kueue_webhook(
                    "vjob.kb.io", "/validate-batch-v1-job", ["jobs"], ["CREATE", "UPDATE"]
                ),
                _kueue_webhook(
                    "vworkload.kb.io",
                    "/validate-kueue-x-k8s-io-v1beta2-workload",
                    ["workloads", "workloads/status"],
                    ["CREATE", "UPDATE"],
                ),
                _kueue_webhook(
                    "vclusterqueue.kb.io",
                    "/validate-kueue-x-k8s-io-v1beta2-clusterqueue",
                    ["clusterqueues"],
                    ["CREATE", "UPDATE"],
                ),
            ],
        },
    ]


def take_crds_as_kueue_installed_them(cluster: ClusterHandle) -> None:
    """Kueue's CRDs have the same names and versions as Phalanx's; what differs is who owns
    them: the conversion of the four converting kinds names Kueue's webhook Service (with
    Kueue's CA, here the cluster's), set by another field manager (Helm's), and cert-manager's
    annotation asks for Kueue's CA to be injected."""
    ca = json.loads(cluster.kubectl_ok("config", "view", "--raw", "-o", "json"))["clusters"][0][
        "cluster"
    ]["certificate-authority-data"]
    conversion = {
        "strategy": "Webhook",
        "webhook": {
            "conversionReviewVersions": ["v1"],
            "clientConfig": {
                "caBundle": ca,
                "service": {
                    "name": "kueue-webhook-service",
                    "namespace": KUEUE_NS,
                    "path": "/convert",
                },
            },
        },
    }
    for kind in CONVERTED:
        patch = [
            {"op": "replace", "path": "/spec/conversion", "value": conversion},
            {
                "op": "add",
                "path": "/metadata/annotations",
                "value": {CERT_MANAGER: f"{KUEUE_NS}/kueue-serving-cert"},
            },
        ]
        cluster.kubectl_ok(
            "patch",
            f"crd/{kind}.kueue.x-k8s.io",
            "--field-manager=helm",
            "--type=json",
            "-p",
            json.dumps(patch),
        )


def kueue_job(name: str, gpus: int) -> dict[str, Any]:
    """A queued Job as Kueue's webhook left it: suspended at creation."""
    return gpu_job(name, queue="lq", gpus=gpus, suspend=True)


def kueue_workload(job: dict[str, Any]) -> dict[str, Any]:
    """The Workload Kueue's Job reconciler creates for ``job`` (as fetched from the API)."""
    metadata = job["metadata"]
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": kueue_workload_name(metadata["name"], metadata["uid"]),
            "namespace": metadata["namespace"],
            "labels": {"kueue.x-k8s.io/job-uid": metadata["uid"]},
            "finalizers": [RESOURCE_IN_USE],
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": metadata["name"],
                    "uid": metadata["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "queueName": "lq",
            "priority": 0,
            "active": True,
            "podSets": [
                {
                    "name": "main",
                    "count": job["spec"]["parallelism"],
                    "template": copy.deepcopy(job["spec"]["template"]),
                }
            ],
        },
    }


def _stamp(seconds_ago: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - seconds_ago))


def admitted_status(cq: str, gpus: int, generation: int) -> dict[str, Any]:
    """``status`` as Kueue's scheduler writes it on admission (``SetQuotaReservation``, then
    ``Admitted`` once no admission check is left), an hour ago."""
    then = _stamp(3600)
    return {
        "admission": {
            "clusterQueue": cq,
            "podSetAssignments": [
                {
                    "name": "main",
                    "flavors": {"cpu": POOL, "nvidia.com/gpu": POOL},
                    "resourceUsage": {"cpu": "1", "nvidia.com/gpu": str(gpus)},
                    "count": 1,
                }
            ],
        },
        "conditions": [
            {
                "type": "QuotaReserved",
                "status": "True",
                "reason": "QuotaReserved",
                "message": f"Quota reserved in ClusterQueue {cq}",
                "observedGeneration": generation,
                "lastTransitionTime": then,
            },
            {
                "type": "Admitted",
                "status": "True",
                "reason": "Admitted",
                "message": "The workload is admitted",
                "observedGeneration": generation,
                "lastTransitionTime": then,
            },
        ],
    }


def pending_status(generation: int, more: int) -> dict[str, Any]:
    """What Kueue writes on a Workload it tried and could not fit."""
    return {
        "conditions": [
            {
                "type": "QuotaReserved",
                "status": "False",
                "reason": "Pending",
                "message": (
                    "couldn't assign flavors to pod set main: insufficient unused quota for"
                    f" nvidia.com/gpu in flavor {POOL}, {more} more needed"
                ),
                "observedGeneration": generation,
                "lastTransitionTime": _stamp(1800),
            }
        ]
    }


def write_status(cluster: ClusterHandle, resource: str, name: str, ns: str | None, status: Any):
    where = ["-n", ns] if ns else []
    cluster.kubectl_ok(
        "patch",
        resource,
        name,
        *where,
        "--subresource=status",
        "--field-manager=kueue",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )


def start_as_kueue_does(cluster: ClusterHandle, job: dict[str, Any]) -> None:
    """Kueue starts an admitted Job: the flavor's node labels and tolerations into the pod
    template, then ``suspend: false``, in one update."""
    fl = flavor(POOL, pool=POOL)["spec"]
    patch = {
        "spec": {
            "suspend": False,
            "template": {
                "spec": {"nodeSelector": fl["nodeLabels"], "tolerations": fl["tolerations"]}
            },
        }
    }
    cluster.kubectl_ok(
        "patch",
        "job",
        job["metadata"]["name"],
        "-n",
        job["metadata"]["namespace"],
        "--field-manager=kueue",
        "--type=merge",
        "-p",
        json.dumps(patch),
    )


# -- running the section ------------------------------------------------------------------------


def run_section(
    cluster: ClusterHandle, workdir: Path, operators: list[OperatorProcess]
) -> list[str]:
    ran = []
    for argv in section_commands():
        assert argv[0] == "kubectl", f"{SECTION}: not a kubectl command: {shlex.join(argv)}"
        args = argv[1:]
        if "-k" in args:
            folder = args[args.index("-k") + 1]
            if folder == "manifests/default":
                # The Deployment of the tree, as the local control plane runs it: the operator
                # beside the cluster (its webhooks and conversion pointed at this process).
                operators.append(start_operator(cluster, workdir, name="phalanx"))
                ran.append(shlex.join(argv))
                continue
            args[args.index("-k") + 1] = str(REPO / folder)
        cluster.kubectl_ok(*args)
        ran.append(shlex.join(argv))
        if "get" in args and "pods" in args:
            # "Go on once get pods lists none": the scale took the stand-in's pod away.
            wait_for("Kueue's pods gone", lambda: not kueue_pods(cluster), timeout=60)
    return ran


def kueue_pods(cluster: ClusterHandle) -> list[str]:
    return cluster.kubectl_ok("-n", KUEUE_NS, "get", "pods", "-o", "name").split()


def _refused_by_kueue(proc: Any) -> bool:
    return proc.returncode != 0 and "kueue-webhook-service" in proc.stderr


@pytest.fixture
def leftovers(cluster: ClusterHandle, kueue_crds: Path) -> Iterator[None]:
    """Whatever the test got to, nothing of Kueue's stays on the shared cluster: no webhook
    configuration refusing later tests' Jobs, no unavailable APIService, the CRDs as the
    session installed them."""
    try:
        yield
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration", MUTATING, "--ignore-not-found")
        cluster.kubectl(
            "delete", "validatingwebhookconfiguration", VALIDATING, "--ignore-not-found"
        )
        cluster.kubectl("delete", "apiservice", *APISERVICES, "--ignore-not-found")
        cluster.kubectl("delete", "namespace", KUEUE_NS, "--ignore-not-found", "--wait=false")
        for kind in CONVERTED:
            cluster.kubectl("annotate", f"crd/{kind}.kueue.x-k8s.io", f"{CERT_MANAGER}-")
        cluster.apply_crds(p.read_text() for p in sorted(kueue_crds.glob("*.yaml")))


def test_upgrading_from_kueue_keeps_its_admissions_and_counts_them(
    cluster: ClusterHandle,
    kueue_crds: Path,
    leftovers: None,
    tmp_path: Path,
    namespace: str,
) -> None:
    cq = f"kueueup-{int(time.time()) % 100000}"
    cluster_refs = [f"clusterqueue.kueue.x-k8s.io/{cq}", f"resourceflavor.kueue.x-k8s.io/{POOL}"]
    operators: list[OperatorProcess] = []
    with node_pool(cluster, POOL, racks=1, hosts=2):
        try:
            # -- Kueue's cluster, as Kueue ran it ------------------------------------------------
            apply(cluster, *kueue_installation())
            take_crds_as_kueue_installed_them(cluster)
            rf = flavor(POOL, pool=POOL)
            queue = cluster_queue(cq, flavor_name=POOL, gpus=8)
            for obj in (rf, queue):
                obj["metadata"]["finalizers"] = [RESOURCE_IN_USE]  # Kueue's webhooks add it
            apply(cluster, rf, queue)
            apply(cluster, local_queue("lq", cluster_queue_name=cq), namespace=namespace)

            jobs: dict[str, dict[str, Any]] = {}
            workloads: dict[str, dict[str, Any]] = {}
            for name, gpus in (("running", 6), ("needs-4", 4), ("needs-2", 2)):
                apply(cluster, kueue_job(name, gpus), namespace=namespace)
                jobs[name] = get(cluster, "job", name, namespace)
                cluster.kubectl_ok(
                    "create",
                    "--field-manager=kueue",
                    "-f",
                    "-",
                    input=json.dumps(kueue_workload(jobs[name])),
                )
                workloads[name] = get(
                    cluster,
                    "workloads.kueue.x-k8s.io",
                    kueue_workload_name(name, jobs[name]["metadata"]["uid"]),
                    namespace,
                )
            wl_name = {j: w["metadata"]["name"] for j, w in workloads.items()}
            write_status(
                cluster,
                "workloads.kueue.x-k8s.io",
                wl_name["running"],
                namespace,
                admitted_status(cq, 6, workloads["running"]["metadata"]["generation"]),
            )
            start_as_kueue_does(cluster, jobs["running"])
            # The two others were queued just before the switch: Kueue had not tried them yet
            # (no condition), so what they say afterwards is Phalanx's judgement.
            write_status(
                cluster,
                "clusterqueues.kueue.x-k8s.io",
                cq,
                None,
                {
                    "pendingWorkloads": 2,
                    "reservingWorkloads": 1,
                    "admittedWorkloads": 1,
                    "flavorsUsage": [
                        {
                            "name": POOL,
                            "resources": [
                                {"name": "cpu", "total": "1"},
                                {"name": "nvidia.com/gpu", "total": "6"},
                            ],
                        }
                    ],
                },
            )
            apply(cluster, *kueue_webhook_configurations())
            wait_for(
                "the running Job's pod running on the pool",
                lambda: any(
                    (p.get("status") or {}).get("phase") == "Running"
                    for p in json.loads(
                        cluster.kubectl_ok(
                            "get", "pods", "-n", namespace, "-l", "job-name=running", "-o", "json"
                        )
                    )["items"]
                ),
                timeout=60,
            )
            before = get(cluster, "workloads.kueue.x-k8s.io", wl_name["running"], namespace)
            assert before["status"]["admission"]["clusterQueue"] == cq
            wait_for("the stand-in Kueue pod", lambda: kueue_pods(cluster), timeout=30)

            # Kueue stopped but its webhooks left: every queued Job and every Workload status
            # write (the operator's too) is refused. This is why step 1 deletes them.
            job = gpu_job("while-kueue-webhooks-remain", queue="lq", gpus=1)
            refused = cluster.kubectl(
                "create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(job)
            )
            assert _refused_by_kueue(refused), refused.stderr
            refused = cluster.kubectl(
                "patch",
                "workloads.kueue.x-k8s.io",
                wl_name["needs-2"],
                "-n",
                namespace,
                "--subresource=status",
                "--type=merge",
                "--dry-run=server",
                "-p",
                json.dumps({"status": pending_status(1, 0)}),
            )
            assert _refused_by_kueue(refused), refused.stderr
            # Kueue's installer owns the CRDs' conversion: without --force-conflicts, Phalanx's
            # CRDs do not apply.
            conflict = cluster.kubectl(
                "apply", "--server-side", "--dry-run=server", "-k", str(REPO / "crds")
            )
            assert conflict.returncode != 0 and "conflict" in conflict.stderr.lower(), (
                conflict.stderr
            )

            # -- the section, as written ---------------------------------------------------------
            ran = run_section(cluster, tmp_path, operators)
            assert any("manifests/default" in c for c in ran), ran
            (op,) = operators
            log = op.log_tail

            # Step 1 and 2 did what the page says.
            assert cluster.kubectl("get", "mutatingwebhookconfiguration", MUTATING).returncode
            assert cluster.kubectl("get", "validatingwebhookconfiguration", VALIDATING).returncode
            assert cluster.kubectl("get", "apiservice", APISERVICES[0]).returncode
            for kind in CONVERTED:
                crd = get(cluster, "crd", f"{kind}.kueue.x-k8s.io")
                assert CERT_MANAGER not in (crd["metadata"].get("annotations") or {})
                client = crd["spec"]["conversion"]["webhook"]["clientConfig"]
                assert "kueue-webhook-service" not in json.dumps(client), (kind, client)

            # The 2-GPU Job fits beside the restored 6 and is admitted and started.
            wait_for(
                "the 2-GPU Job admitted",
                lambda: is_true(workload_of(cluster, namespace, "needs-2") or {}, "Admitted"),
                timeout=60,
                log=log,
            )
            wait_for(
                "the 2-GPU Job started",
                lambda: get(cluster, "job", "needs-2", namespace)["spec"].get("suspend") is False,
                timeout=30,
                log=log,
            )
            # The ClusterQueue counts Kueue's admission and Phalanx's: 6 + 2 of 8, two holders
            # (an operator that ignored Kueue's admission would show 2, or admit the 4-GPU Job).
            wait_for(
                "8 GPUs in use by 2 Workloads",
                lambda: gpu_usage(cluster, cq) == ("8", 2),
                timeout=30,
                log=log,
            )

            # The 4-GPU Job waits, and says it waits on quota.
            def quota_pending() -> dict[str, Any] | None:
                c = condition(workload_of(cluster, namespace, "needs-4") or {}, "QuotaReserved")
                return c if c and c["status"] == "False" else None

            waiting = wait_for("the 4-GPU Job pending on quota", quota_pending, log=log)
            assert waiting["reason"] == "Pending", waiting
            assert "quota" in waiting["message"], waiting
            assert "nvidia.com/gpu" in waiting["message"], waiting
            assert get(cluster, "job", "needs-4", namespace)["spec"]["suspend"] is True

            # Kueue's admission is kept as it was: same admission, conditions not rewritten,
            # no eviction; its Job runs on.
            after = get(cluster, "workloads.kueue.x-k8s.io", wl_name["running"], namespace)
            assert after["metadata"]["uid"] == before["metadata"]["uid"]
            assert after["status"]["admission"] == before["status"]["admission"]
            for kind in ("QuotaReserved", "Admitted"):
                old, new = condition(before, kind), condition(after, kind)
                assert new is not None and old is not None
                assert new["status"] == "True", new
                assert new["lastTransitionTime"] == old["lastTransitionTime"], (old, new)
            assert not is_true(after, "Evicted") and not is_true(after, "Preempted")
            assert get(cluster, "job", "running", namespace)["spec"]["suspend"] is False
            key = f"{namespace}/{wl_name['running']}"
            text = op.log.read_text()
            assert f"event=workload_restored workload={key}" in text
            assert f"event=admitted workload={key}" not in text
            # Still exactly one Workload per Job: Phalanx found Kueue's by its name.
            names = {
                w["metadata"]["name"]
                for w in json.loads(
                    cluster.kubectl_ok(
                        "get", "workloads.kueue.x-k8s.io", "-n", namespace, "-o", "json"
                    )
                )["items"]
            }
            assert names == set(wl_name.values()), names
            # v1beta1 reads convert through Phalanx now (Kueue's server is gone).
            v1beta1 = json.loads(
                cluster.kubectl_ok(
                    "get",
                    "workloads.v1beta1.kueue.x-k8s.io",
                    wl_name["running"],
                    "-n",
                    namespace,
                    "-o",
                    "json",
                )
            )
            assert v1beta1["apiVersion"] == "kueue.x-k8s.io/v1beta1"

            # The restored usage is exact: the admitted Job deleted (its Workload goes with it,
            # Kueue's finalizer and all), the 4-GPU Job is admitted into the 6 GPUs freed.
            cluster.kubectl_ok("delete", "job", "running", "-n", namespace, "--wait=false")
            wait_for(
                "the 4-GPU Job admitted once the 6 GPUs are free",
                lambda: is_true(workload_of(cluster, namespace, "needs-4") or {}, "Admitted"),
                timeout=60,
                log=log,
            )
            wait_for(
                "6 GPUs in use by 2 Workloads",
                lambda: gpu_usage(cluster, cq) == ("6", 2),
                timeout=30,
                log=log,
            )
        finally:
            for op in operators:
                op.stop()
            # Kueue's finalizer on its Workloads: nothing removes it once the operator is
            # stopped, and it would hold the namespace terminating.
            for name in cluster.kubectl(
                "get", "workloads.kueue.x-k8s.io", "-n", namespace, "-o", "name"
            ).stdout.split():
                cluster.kubectl(
                    "patch",
                    name,
                    "-n",
                    namespace,
                    "--type=merge",
                    "-p",
                    '{"metadata":{"finalizers":null}}',
                )
            cluster.kubectl("delete", "namespace", namespace, "--wait=false")
            delete_cluster_objects(cluster, *cluster_refs)


def test_the_section_names_what_this_test_builds() -> None:
    """The commands the test runs are the page's (not a copy): the names they act on are the
    ones the stand-in installation uses."""
    text = " ".join(shlex.join(c) for c in section_commands())
    for name in (MUTATING, VALIDATING, *APISERVICES, "kueue-controller-manager", KUEUE_NS):
        assert name in text, name
    assert "--force-conflicts -k crds" in text
