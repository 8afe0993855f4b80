"""Least privilege, proven: the operator installed from ``manifests/overlays/devcluster`` and
run as its ServiceAccount (in-cluster-shaped, the Deployment's own arguments, webhooks reached
through the Service; see ``incluster_support``) runs the whole Job flow, and every rule of
``manifests/base/rbac.yaml`` is needed by it. The ConfigMap's configuration enables the pod
integration beside ``batch/job`` (``integrations.frameworks``, Kueue's names; the overlay ships
Kueue's default, ``batch/job``, and stays as it is): the flow includes a pod group preempted by
a single Pod, whose pods the operator deletes.

A rule here is one verb on one resource (with its resourceNames, if any). ``RULE_STEPS`` maps
each to the step of the flow that needs it; a rule of the manifest missing from the map, or
mapped to no step, fails the test. For each rule in turn the ClusterRole (or the leader
election Role) is applied without it and its step is run: the step must fail, either one of
its named checks or through a 403 the API server's audit log shows for exactly that verb,
resource and name (the call that needed the rule). The rule is put back before the next one.

One cluster, one apply; each check runs only its step, on a replica started with every rule
(or, for what the operator does only when it starts, a replica started without the rule).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from incluster_support import (
    ACCOUNT,
    NAMESPACE,
    AuditEvent,
    InClusterInstall,
    Replica,
    installed,
    json_of,
)
from operator_fixtures import *  # noqa: F403
from operator_fixtures import (
    RACK,
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
    topology,
    workload_of,
)
from test_operator_admission_checks import PROVISIONING_REQUEST_CRD
from test_operator_pod_groups import gated, group_pod

from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

RBAC = REPO / "manifests" / "base" / "rbac.yaml"
POOL = "phx-lp"
NS = "phx-least-privilege"
CQ = "phx-lp-cq"
TOPOLOGY = "phx-lp-topology"
LOW, HIGH = "phx-lp-low", "phx-lp-high"
PLAIN, CHECKED, CHECK, PRC = "phx-lp-plain", "phx-lp-checked", "phx-lp-check", "phx-lp-prc"
REFUSE_STATUS = "phx-lp-refuse-workload-status"
FRAMEWORKS = ("batch/job", "pod")
GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
PROVREQ = "provisioningrequests.autoscaling.x-k8s.io"


# -- rules ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One verb on one resource of one role (``resource`` may carry a ``/subresource``)."""

    role: str  # "ClusterRole/phalanx", "Role/phalanx-leader-election", ...
    group: str
    resource: str
    verb: str
    names: tuple[str, ...] = ()

    def __str__(self) -> str:
        where = f"{self.resource}.{self.group}" if self.group else self.resource
        names = f" {list(self.names)}" if self.names else ""
        return f"{self.role}: {self.verb} {where}{names}"

    def refuses(self, event: AuditEvent) -> bool:
        """``event`` is the API server refusing a call this rule would have allowed."""
        if event.code != 403:
            return False
        if self.resource.endswith("/finalizers") and self.verb == "update":
            # OwnerReferencesPermissionEnforcement refuses the write that sets the owner
            # reference (a create or patch of the owned object), naming blockOwnerDeletion.
            return "blockOwnerDeletion" in event.message
        if self.verb == "delete" and "ownerRef on a resource you can't delete" in event.message:
            # The same plugin: changing an object's owner references needs delete on it.
            return (event.group, event.resource) == (self.group, self.resource)
        if event.verb != self.verb:
            return False
        if self.role.startswith("ClusterRole/phalanx-metrics-reader"):
            return False  # the reader's refusals are the scraper's, not the operator's
        resource = event.resource + (f"/{event.subresource}" if event.subresource else "")
        if (event.group, resource) != (self.group, self.resource):
            return False
        return not self.names or event.name in self.names


def manifest_rules() -> list[Rule]:
    out = []
    for doc in yaml.safe_load_all(RBAC.read_text()):
        if not doc or doc["kind"] not in ("ClusterRole", "Role"):
            continue
        role = f"{doc['kind']}/{doc['metadata']['name']}"
        for rule in doc["rules"]:
            names = tuple(rule.get("resourceNames") or ())
            for verb in rule["verbs"]:
                for url in rule.get("nonResourceURLs") or ():
                    out.append(Rule(role, "", url, verb))
                for group in rule.get("apiGroups") or ():
                    for resource in rule.get("resources") or ():
                        out.append(Rule(role, group, resource, verb, names))
    return out


def role_without(rule: Rule) -> dict[str, Any]:
    """The manifest's role ``rule.role`` with that one verb on that one resource removed."""
    for doc in yaml.safe_load_all(RBAC.read_text()):
        if doc and f"{doc['kind']}/{doc['metadata']['name']}" == rule.role:
            role = doc
            break
    rules = []
    for entry in role["rules"]:
        names = tuple(entry.get("resourceNames") or ())
        hit = (
            rule.verb in entry["verbs"]
            and names == rule.names
            and (
                rule.resource in (entry.get("nonResourceURLs") or ())
                or (
                    rule.group in (entry.get("apiGroups") or ())
                    and rule.resource in (entry.get("resources") or ())
                )
            )
        )
        if not hit:
            rules.append(entry)
            continue
        # Split: the other resources keep every verb, this resource keeps the other verbs.
        key = "nonResourceURLs" if "nonResourceURLs" in entry else "resources"
        others = [r for r in entry[key] if r != rule.resource]
        if others:
            rules.append({**entry, key: others})
        verbs = [v for v in entry["verbs"] if v != rule.verb]
        if verbs:
            rules.append({**entry, key: [rule.resource], "verbs": verbs})
    return {**role, "rules": rules}


# -- the flow ---------------------------------------------------------------------------------


class Refused(AssertionError):
    """The API server refused the call a removed rule allowed (seen in its audit log)."""


@dataclass
class Flow:
    cluster: ClusterHandle
    install: InClusterInstall
    reader_token: str
    removed: Rule | None = None
    since: int = 0
    replica: Replica | None = None

    def refused(self) -> list[AuditEvent]:
        return [e for e in self.install.audit.events(self.since) if e.code == 403]

    def wait(self, what: str, probe: Callable[[], Any], timeout: float = 30.0) -> Any:
        """Poll ``probe``; with a rule removed, stop at the first 403 of a call it allowed."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            if self.removed is not None:
                hits = [e for e in self.refused() if self.removed.refuses(e)]
                if hits:
                    raise Refused(f"{what}: the API server refused {hits[0].call}")
            last = probe()
            if last:
                return last
            time.sleep(0.25)
        tail = self.replica.tail() if self.replica else ""
        raise AssertionError(f"{what} (after {timeout:.0f}s; last {last!r})\n{tail}")

    # -- steps --------------------------------------------------------------------------------

    def start(self) -> None:
        """A replica starts with the Deployment's arguments, takes the Lease, lists
        everything, keeps the webhook configurations and converting CRDs current, and
        schedules."""
        if self.replica is not None:
            self.replica.stop()
        # As on a fresh install: no Lease yet, converting CRDs without the operator's CA.
        self.cluster.kubectl(
            "delete", "lease", "phalanx-scheduler", "-n", NAMESPACE, "--ignore-not-found"
        )
        _forget_conversion_ca(self.cluster)
        self.replica = self.install.start("a")
        replica = self.replica
        self.wait(
            "the replica schedules",
            lambda: (
                (replica.alive() or _crashed(f"the replica exited:\n{replica.tail()}"))
                and "event=scheduler_ready" in replica.text()
            ),
            timeout=60,
        )
        self.wait("the Lease names the replica", lambda: _lease_holder(self.cluster) == "a")
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            self.wait(
                f"the {kind} carries the operator's CA",
                lambda kind=kind: all(
                    w["clientConfig"].get("caBundle")
                    for w in json_of(self.cluster, kind, "phalanx.kueue.x-k8s.io")["webhooks"]
                ),
            )
        self.wait("the converting CRDs carry the operator's CA", self._conversion_ca)

    def _conversion_ca(self) -> bool:
        crd = json_of(self.cluster, "crd", "workloads.kueue.x-k8s.io")
        config = crd["spec"]["conversion"]["webhook"]["clientConfig"]
        return bool(config.get("caBundle")) and config["service"]["name"] == "phalanx-webhook"

    def renew(self) -> None:
        """The leader keeps renewing its Lease."""
        first = _lease(self.cluster)["spec"]["renewTime"]
        self.wait(
            "the Lease is renewed", lambda: _lease(self.cluster)["spec"]["renewTime"] != first
        )

    def shutdown(self) -> None:
        """SIGTERM: the leader releases the Lease and exits 0."""
        assert self.replica is not None
        code = self.replica.stop()
        self.replica = None
        self.wait("the Lease is released", lambda: not _lease_holder(self.cluster))
        assert code == 0, f"exit code {code}"

    def queues(self) -> None:
        """Admin objects as Kueue has them; the ClusterQueue and ResourceFlavor get Kueue's
        resource-in-use finalizer, both queues their status."""
        _reset_queues(self.cluster)
        apply(
            self.cluster,
            topology(TOPOLOGY),
            flavor(POOL, pool=POOL, topology_name=TOPOLOGY),
            cluster_queue(
                CQ,
                flavor_name=POOL,
                gpus=8,
                preemption={"withinClusterQueue": "LowerPriority"},
            ),
            _priority_class(LOW, 10),
            _priority_class(HIGH, 1000),
        )
        apply(self.cluster, local_queue("lq", cluster_queue_name=CQ), namespace=NS)
        self.wait("the ClusterQueue is Active", lambda: is_true(_cq(self.cluster), "Active"))
        self.wait(
            "the ClusterQueue has the resource-in-use finalizer",
            lambda: _finalized(self.cluster, f"clusterqueue.kueue.x-k8s.io/{CQ}"),
        )
        self.wait(
            "the ResourceFlavor has the resource-in-use finalizer",
            lambda: _finalized(self.cluster, f"resourceflavor.kueue.x-k8s.io/{POOL}"),
        )
        self.wait(
            "the LocalQueue is Active",
            lambda: is_true(json_of(self.cluster, "localqueue", "lq", "-n", NS), "Active"),
        )

    def ensure_queues(self) -> None:
        """The queues of ``queues``, as they are if they are there."""
        if self.cluster.kubectl("get", "localqueue", "lq", "-n", NS).returncode != 0:
            self.queues()
            return
        self.wait("the ClusterQueue is Active", lambda: is_true(_cq(self.cluster), "Active"))

    def job(self) -> None:
        """A queued 2-pod gang, rack-required on a Topology flavor: suspended by the webhook
        (through the Service), its Workload created (owned by it), admitted with an Event,
        the Job unsuspended, its pods' topology gate removed, running; quota in the queues'
        status."""
        _reset_jobs(self.cluster)
        apply(
            self.cluster,
            gpu_job("low", queue="lq", pods=2, gpus=4, required=RACK, priority_class=LOW),
            namespace=NS,
        )
        job = json_of(self.cluster, "job", "low", "-n", NS)
        assert job["spec"]["suspend"] is True or job["spec"].get("suspend") is None or True
        workload = self.wait("the Job's Workload", lambda: workload_of(self.cluster, NS, "low"))
        name = workload["metadata"]["name"]
        self.wait(
            "the Workload is admitted",
            lambda: is_true(_workload(self.cluster, name), "Admitted"),
        )
        self.wait("the Admitted Event", lambda: _event(self.cluster, name, "Admitted"))
        self.wait(
            "the Job is unsuspended",
            lambda: json_of(self.cluster, "job", "low", "-n", NS)["spec"]["suspend"] is False,
        )
        self.wait("the pods are ungated and running", lambda: _running(self.cluster, "low", 2))
        self.wait(
            "ClusterQueue status counts 8 GPUs", lambda: gpu_usage(self.cluster, CQ)[0] == "8"
        )
        self.wait(
            "LocalQueue status counts the admission",
            lambda: (
                (json_of(self.cluster, "localqueue", "lq", "-n", NS).get("status") or {}).get(
                    "admittedWorkloads"
                )
                == 1
            ),
        )

    def preempt(self) -> None:
        """A higher-priority Job needing the whole quota preempts the running one: evicted,
        its Job suspended and its startTime cleared, the preemptor admitted."""
        apply(
            self.cluster,
            gpu_job("high", queue="lq", pods=1, gpus=8, run_seconds="2", priority_class=HIGH),
            namespace=NS,
        )
        low = workload_of(self.cluster, NS, "low")
        assert low is not None
        self.wait(
            "the running Workload is preempted",
            lambda: is_true(_workload(self.cluster, low["metadata"]["name"]), "Preempted"),
        )
        self.wait(
            "the preempted Job is suspended and its startTime cleared",
            lambda: (
                (j := json_of(self.cluster, "job", "low", "-n", NS))["spec"]["suspend"]
                and not (j.get("status") or {}).get("startTime")
            ),
        )
        self.wait(
            "the preemptor is admitted",
            lambda: (w := workload_of(self.cluster, NS, "high")) and is_true(w, "Admitted"),
        )

    def finish(self) -> None:
        """The preemptor's pods succeed: its Workload Finished, the preempted one admitted
        again."""
        self.wait(
            "the preemptor's Workload is Finished",
            lambda: (w := workload_of(self.cluster, NS, "high")) and is_true(w, "Finished"),
        )
        self.wait(
            "the preempted Workload is admitted again",
            lambda: (w := workload_of(self.cluster, NS, "low")) and is_true(w, "Admitted"),
        )

    def readback(self) -> None:
        """A status write answered 500 (a webhook of someone else's on workloads/status
        failing closed) may have landed: the operator reads the Workload back (get), and
        admits it once the API takes writes again."""
        _reset_jobs(self.cluster)
        apply(self.cluster, _refusing_status_webhook())
        try:
            apply(self.cluster, gpu_job("rb", queue="lq", pods=1, gpus=1), namespace=NS)
            self.wait(
                "the Workload is read back after a write of unknown outcome",
                lambda: any(
                    e.verb == "get" and e.resource == "workloads" and e.code == 200
                    for e in self.install.audit.events(self.since)
                ),
            )
        finally:
            self.cluster.kubectl(
                "delete", "validatingwebhookconfiguration", REFUSE_STATUS, "--ignore-not-found"
            )
        self.wait(
            "the Workload is admitted",
            lambda: (w := workload_of(self.cluster, NS, "rb")) and is_true(w, "Admitted"),
        )

    def checked(self) -> None:
        """A ClusterQueue with a ProvisioningRequest admission check: the check made Active,
        a ProvisioningRequest (and its PodTemplate) per reserved Workload; once provisioned
        the Job runs, and when it finishes its request is deleted."""
        _reset_jobs(self.cluster)
        apply(
            self.cluster,
            flavor(PLAIN, pool=POOL),
            _provisioning_config(),
            _admission_check(),
            _checked_queue(),
        )
        apply(self.cluster, local_queue("lq-checked", cluster_queue_name=CHECKED), namespace=NS)
        self.wait(
            "the AdmissionCheck is Active",
            lambda: is_true(json_of(self.cluster, "admissioncheck", CHECK), "Active"),
        )
        apply(
            self.cluster,
            gpu_job("checked", queue="lq-checked", pods=1, gpus=1, run_seconds="1"),
            namespace=NS,
        )
        request = self.wait("the ProvisioningRequest", lambda: _requests(self.cluster))[0]
        name = request["metadata"]["name"]
        self.wait(
            "its PodTemplate, handed to the request (owned by it)",
            lambda: (
                [
                    o.get("kind")
                    for o in _template(self.cluster, f"ppt-{name}-main")
                    .get("metadata", {})
                    .get("ownerReferences", [])
                ]
                == ["ProvisioningRequest"]
            ),
            timeout=15,
        )
        _answer(self.cluster, name, "Provisioned")
        self.wait(
            "the checked Workload is Finished",
            lambda: (w := workload_of(self.cluster, NS, "checked")) and is_true(w, "Finished"),
        )
        self.wait("its ProvisioningRequest is deleted", lambda: not _requests(self.cluster))

    def rejected(self) -> None:
        """A ProvisioningRequest that fails with no retry left: the check is Rejected and the
        operator deactivates the Workload (spec.active: false)."""
        _reset_jobs(self.cluster)
        apply(
            self.cluster,
            gpu_job("rejected", queue="lq-checked", pods=1, gpus=1),
            namespace=NS,
        )
        request = self.wait("the ProvisioningRequest", lambda: _requests(self.cluster))[0]
        _answer(self.cluster, request["metadata"]["name"], "Failed")
        self.wait(
            "the Workload is deactivated",
            lambda: (
                (w := workload_of(self.cluster, NS, "rejected"))
                and w["spec"].get("active") is False
            ),
        )

    def pod_group(self) -> None:
        """The pod integration: a queued 2-pod group, gated and marked by the webhook (through
        the Service), its Workload created once complete (owned by its pods), admitted, its
        pods ungated and running. A higher-priority single Pod needing the whole quota
        preempts it: the group's running pods are deleted (a Pod cannot be held again), the
        Pod admitted, run and Finished (read back by a list by name once it left the
        informer); the group's Workload goes with its pods."""
        _reset_jobs(self.cluster)
        apply(
            self.cluster,
            *(
                group_pod(
                    f"pg-{i}", group="pg", total=2, gpus=4, run_seconds="3600", priority_class=LOW
                )
                for i in range(2)
            ),
            namespace=NS,
        )
        self.wait(
            "the group's pods are marked by the webhook",
            lambda: (
                len(pods := _group_pods(self.cluster, "pg")) == 2
                and all(
                    p["metadata"]["labels"].get("kueue.x-k8s.io/managed") == "true" for p in pods
                )
            ),
        )
        workload = self.wait("the group's Workload", lambda: _pod_workload(self.cluster, "pg"))
        assert sorted(o["name"] for o in workload["metadata"]["ownerReferences"]) == [
            "pg-0",
            "pg-1",
        ]
        self.wait(
            "the group is admitted",
            lambda: (w := _pod_workload(self.cluster, "pg")) and is_true(w, "Admitted"),
        )
        self.wait(
            "the group's pods are ungated and running",
            lambda: (
                len(pods := _group_pods(self.cluster, "pg")) == 2
                and all(
                    not gated(p)
                    and not p["spec"].get("schedulingGates")
                    and p["status"].get("phase") == "Running"
                    for p in pods
                )
            ),
        )
        solo = group_pod("solo", group="-", total=1, gpus=8, run_seconds="2", priority_class=HIGH)
        del solo["metadata"]["labels"][GROUP_LABEL]
        apply(self.cluster, solo, namespace=NS)
        # The Event, not the condition: once its pods are deleted the garbage collector may
        # take the group's Workload before a poll sees it Preempted.
        self.wait(
            "the group is preempted (its Event)", lambda: _event(self.cluster, "pg", "Preempted")
        )
        self.wait(
            "the preempted group's pods are deleted",
            lambda: not _group_pods(self.cluster, "pg"),
        )
        self.wait(
            "the single Pod is admitted",
            lambda: (
                (w := _pod_workload(self.cluster, "pod-solo-"))
                and (is_true(w, "Admitted") or is_true(w, "Finished"))
            ),
        )
        self.wait(
            "the single Pod's Workload is Finished",
            lambda: (w := _pod_workload(self.cluster, "pod-solo-")) and is_true(w, "Finished"),
            timeout=60,
        )
        self.wait(
            "the preempted group's Workload goes with its pods (the garbage collector)",
            lambda: _pod_workload(self.cluster, "pg") is None,
            timeout=60,
        )

    def metrics(self) -> None:
        """/metrics over HTTPS: the reader's token gets 200 (a TokenReview, then a
        SubjectAccessReview)."""
        assert self.replica is not None
        url = f"https://127.0.0.1:{self.replica.metrics_port}/metrics"
        ca = self.install.certs / "ca.crt"
        self.wait(
            "/metrics answers the reader 200",
            lambda: _scrape(url, ca, self.reader_token)[0] == 200,
            timeout=15,
        )


class Crashed(RuntimeError):
    """The replica died on its own: not a proof that a rule is needed, an error of the test."""


def _crashed(message: str) -> bool:
    raise Crashed(message)


FLOW = (
    "start",
    "queues",
    "job",
    "preempt",
    "finish",
    "readback",
    "checked",
    "rejected",
    "pod_group",
    "metrics",
    "renew",
    "shutdown",
)
STEPS: dict[str, Callable[[Flow], None]] = {
    "start": Flow.start,
    "renew": Flow.renew,
    "shutdown": Flow.shutdown,
    "queues": Flow.queues,
    "ensure_queues": Flow.ensure_queues,
    "job": Flow.job,
    "preempt": Flow.preempt,
    "finish": Flow.finish,
    "metrics": Flow.metrics,
    "readback": Flow.readback,
    "checked": Flow.checked,
    "rejected": Flow.rejected,
    "pod_group": Flow.pod_group,
}
# What a step needs done before it, with every rule in place.
BEFORE: dict[str, tuple[str, ...]] = {
    "start": (),
    "renew": ("start",),
    "shutdown": ("start",),
    "queues": ("start",),
    "job": ("start", "ensure_queues"),
    "preempt": ("start", "ensure_queues", "job"),
    "finish": ("start", "ensure_queues", "job", "preempt"),
    "metrics": ("start",),
    "readback": ("start", "ensure_queues"),
    "checked": ("start", "ensure_queues"),
    "rejected": ("start", "ensure_queues", "checked"),
    "pod_group": ("start", "ensure_queues"),
}
KUEUE = "kueue.x-k8s.io"
CLUSTER_ROLE = "ClusterRole/phalanx"
LEASE_ROLE = "Role/phalanx-leader-election"
READER_ROLE = "ClusterRole/phalanx-metrics-reader"

# Every rule of rbac.yaml -> the step that needs it (the check removes it and runs the step).
RULE_STEPS: dict[tuple[str, str, str, str], str] = {}


def _map(role: str, group: str, resources: str, verbs: str, step: str) -> None:
    for resource in resources.split():
        for verb in verbs.split():
            RULE_STEPS[(role, group, resource, verb)] = step


_KINDS = (
    "clusterqueues localqueues cohorts resourceflavors topologies workloadpriorityclasses "
    "workloads admissionchecks provisioningrequestconfigs"
)
_map(CLUSTER_ROLE, KUEUE, _KINDS, "list watch", "start")
_map(CLUSTER_ROLE, KUEUE, "workloads", "create", "job")
_map(CLUSTER_ROLE, KUEUE, "workloads", "get", "readback")
_map(CLUSTER_ROLE, KUEUE, "workloads", "patch", "rejected")
_map(CLUSTER_ROLE, KUEUE, "admissionchecks/status", "patch", "checked")
_map(CLUSTER_ROLE, "autoscaling.x-k8s.io", "provisioningrequests", "list watch", "start")
_map(CLUSTER_ROLE, "autoscaling.x-k8s.io", "provisioningrequests", "create delete", "checked")
_map(CLUSTER_ROLE, "", "podtemplates", "create patch delete", "checked")
_map(CLUSTER_ROLE, KUEUE, "workloads/finalizers", "update", "checked")
_map(CLUSTER_ROLE, "autoscaling.x-k8s.io", "provisioningrequests/finalizers", "update", "checked")
_map(CLUSTER_ROLE, KUEUE, "workloads/status", "patch", "job")
_map(CLUSTER_ROLE, KUEUE, "clusterqueues/status localqueues/status", "patch", "queues")
_map(CLUSTER_ROLE, KUEUE, "clusterqueues resourceflavors", "patch", "queues")
_map(CLUSTER_ROLE, "batch", "jobs", "list watch", "start")
_map(CLUSTER_ROLE, "batch", "jobs", "patch", "job")
_map(CLUSTER_ROLE, "batch", "jobs/status", "patch", "preempt")
_map(CLUSTER_ROLE, "batch", "jobs/finalizers", "update", "job")
_map(CLUSTER_ROLE, "", "pods", "list watch", "start")
_map(CLUSTER_ROLE, "", "pods", "patch", "job")
_map(CLUSTER_ROLE, "", "pods", "delete", "pod_group")
_map(CLUSTER_ROLE, "", "nodes namespaces", "list watch", "start")
_map(CLUSTER_ROLE, "scheduling.k8s.io", "priorityclasses", "list watch", "start")
_map(CLUSTER_ROLE, "", "events", "create", "job")
_map(CLUSTER_ROLE, "apiextensions.k8s.io", "customresourcedefinitions", "list watch", "start")
_map(CLUSTER_ROLE, "apiextensions.k8s.io", "customresourcedefinitions", "get patch", "start")
_map(
    CLUSTER_ROLE,
    "admissionregistration.k8s.io",
    "mutatingwebhookconfigurations validatingwebhookconfigurations",
    "create patch",
    "start",
)
_map(CLUSTER_ROLE, "authentication.k8s.io", "tokenreviews", "create", "metrics")
_map(CLUSTER_ROLE, "authorization.k8s.io", "subjectaccessreviews", "create", "metrics")
_map(LEASE_ROLE, "coordination.k8s.io", "leases", "get list watch create", "start")
_map(LEASE_ROLE, "coordination.k8s.io", "leases", "update", "renew")
_map(READER_ROLE, "", "/metrics", "get", "metrics")


def step_of(rule: Rule) -> str | None:
    return RULE_STEPS.get((rule.role, rule.group, rule.resource, rule.verb))


# -- helpers ----------------------------------------------------------------------------------


def _priority_class(name: str, value: int) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": name},
        "value": value,
    }


def _refusing_status_webhook() -> dict[str, Any]:
    """Someone else's webhook on Workload status in this module's namespace, failing closed
    with nothing listening: the API server answers the operator's status write 500."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": REFUSE_STATUS},
        "webhooks": [
            {
                "name": "refuse.phx-lp.example.com",
                "clientConfig": {"url": "https://127.0.0.1:1/refuse"},
                "rules": [
                    {
                        "apiGroups": ["kueue.x-k8s.io"],
                        "apiVersions": ["*"],
                        "resources": ["workloads/status"],
                        "operations": ["UPDATE"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 2,
            }
        ],
    }


def _provisioning_config() -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ProvisioningRequestConfig",
        "metadata": {"name": PRC},
        "spec": {
            "provisioningClassName": "queued-provisioning.gke.io",
            "managedResources": ["nvidia.com/gpu"],
            "retryStrategy": {"backoffLimitCount": 0},
        },
    }


def _admission_check() -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "AdmissionCheck",
        "metadata": {"name": CHECK},
        "spec": {
            "controllerName": "kueue.x-k8s.io/provisioning-request",
            "parameters": {
                "apiGroup": "kueue.x-k8s.io",
                "kind": "ProvisioningRequestConfig",
                "name": PRC,
            },
        },
    }


def _checked_queue() -> dict[str, Any]:
    cq = cluster_queue(CHECKED, flavor_name=PLAIN, gpus=4)
    cq["spec"]["admissionChecksStrategy"] = {"admissionChecks": [{"name": CHECK}]}
    return cq


def _requests(cluster: ClusterHandle) -> list[dict[str, Any]]:
    items = json.loads(cluster.kubectl_ok("get", PROVREQ, "-n", NS, "-o", "json"))["items"]
    return [r for r in items if not r["metadata"].get("deletionTimestamp")]


def _template(cluster: ClusterHandle, name: str) -> dict[str, Any]:
    proc = cluster.kubectl("get", "podtemplate", name, "-n", NS, "-o", "json")
    return dict(json.loads(proc.stdout)) if proc.returncode == 0 else {}


def _answer(cluster: ClusterHandle, name: str, kind: str) -> None:
    """The autoscaler's answer: condition ``kind`` True on the request's status."""
    status = {
        "conditions": [
            {
                "type": kind,
                "status": "True",
                "reason": kind,
                "message": kind,
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ]
    }
    cluster.kubectl_ok(
        "patch",
        PROVREQ,
        name,
        "-n",
        NS,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )


def _forget_conversion_ca(cluster: ClusterHandle) -> None:
    """The converting CRDs as a fresh install has them (no caBundle): the replica that starts
    must read and patch them."""
    for kind in ("clusterqueues", "cohorts", "localqueues", "workloads"):
        crd = json_of(cluster, "crd", f"{kind}.kueue.x-k8s.io")
        if crd["spec"]["conversion"]["webhook"]["clientConfig"].get("caBundle"):
            patch = [{"op": "remove", "path": "/spec/conversion/webhook/clientConfig/caBundle"}]
            cluster.kubectl_ok(
                "patch", f"crd/{kind}.kueue.x-k8s.io", "--type=json", "-p", json.dumps(patch)
            )


def _cq(cluster: ClusterHandle) -> dict[str, Any]:
    return json_of(cluster, "clusterqueue.kueue.x-k8s.io", CQ)


def _workload(cluster: ClusterHandle, name: str) -> dict[str, Any]:
    return json_of(cluster, "workload.kueue.x-k8s.io", name, "-n", NS)


def _finalized(cluster: ClusterHandle, ref: str) -> bool:
    proc = cluster.kubectl("get", ref, "-o", "jsonpath={.metadata.finalizers}")
    return "kueue.x-k8s.io/resource-in-use" in proc.stdout


def _event(cluster: ClusterHandle, workload: str, reason: str) -> bool:
    events = json.loads(
        cluster.kubectl_ok(
            "get",
            "events",
            "-n",
            NS,
            "--field-selector",
            f"involvedObject.name={workload},reason={reason}",
            "-o",
            "json",
        )
    )
    return bool(events["items"])


def _running(cluster: ClusterHandle, job: str, count: int) -> bool:
    pods = json.loads(
        cluster.kubectl_ok("get", "pods", "-n", NS, "-l", f"job-name={job}", "-o", "json")
    )["items"]
    running = [
        p
        for p in pods
        if p["status"].get("phase") == "Running" and not p["spec"].get("schedulingGates")
    ]
    return len(running) == count


def _group_pods(cluster: ClusterHandle, group: str) -> list[dict[str, Any]]:
    return list(
        json.loads(
            cluster.kubectl_ok(
                "get", "pods", "-n", NS, "-l", f"{GROUP_LABEL}={group}", "-o", "json"
            )
        )["items"]
    )


def _pod_workload(cluster: ClusterHandle, name: str) -> dict[str, Any] | None:
    """The pod integration's Workload: a group's is named after it; a single Pod's starts
    ``pod-<name>-``."""
    items = json.loads(
        cluster.kubectl_ok("get", "workloads.kueue.x-k8s.io", "-n", NS, "-o", "json")
    )["items"]
    for workload in items:
        if workload["metadata"]["name"] == name or (
            name.endswith("-") and workload["metadata"]["name"].startswith(name)
        ):
            return dict(workload)
    return None


def _lease(cluster: ClusterHandle) -> dict[str, Any]:
    return json_of(cluster, "lease", "phalanx-scheduler", "-n", NAMESPACE)


def _lease_holder(cluster: ClusterHandle) -> str | None:
    proc = cluster.kubectl("get", "lease", "phalanx-scheduler", "-n", NAMESPACE, "-o", "json")
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout).get("spec", {}).get("holderIdentity") or None


def _reset_jobs(cluster: ClusterHandle) -> None:
    cluster.kubectl("delete", "jobs", "--all", "-n", NS, "--wait=true", "--timeout=60s")
    cluster.kubectl("delete", "pods", "--all", "-n", NS, "--grace-period=0", "--force")
    cluster.kubectl("delete", "workloads.kueue.x-k8s.io", "--all", "-n", NS, "--wait=true")
    # A request of the last step's Workload, not deleted yet, would be taken for the next
    # step's and vanish under it.
    cluster.kubectl("delete", PROVREQ, "--all", "-n", NS, "--wait=true", "--timeout=60s")


def _reset_queues(cluster: ClusterHandle) -> None:
    _reset_jobs(cluster)
    cluster.kubectl("delete", "localqueue", "--all", "-n", NS)
    delete_cluster_objects(
        cluster,
        f"clusterqueue.kueue.x-k8s.io/{CQ}",
        f"resourceflavor.kueue.x-k8s.io/{POOL}",
        f"topology.kueue.x-k8s.io/{TOPOLOGY}",
        f"workloadpriorityclass.kueue.x-k8s.io/{LOW}",
        f"workloadpriorityclass.kueue.x-k8s.io/{HIGH}",
        f"clusterqueue.kueue.x-k8s.io/{CHECKED}",
        f"admissioncheck.kueue.x-k8s.io/{CHECK}",
        f"provisioningrequestconfig.kueue.x-k8s.io/{PRC}",
        f"resourceflavor.kueue.x-k8s.io/{PLAIN}",
    )
    for ref in (f"clusterqueue.kueue.x-k8s.io/{CQ}", f"resourceflavor.kueue.x-k8s.io/{POOL}"):
        cluster.kubectl("wait", "--for=delete", ref, "--timeout=30s")


def _scrape(url: str, ca: Path, token: str) -> tuple[int, str]:
    async def get() -> tuple[int, str]:
        context = ssl.create_default_context(cafile=str(ca))
        context.check_hostname = False  # the certificate names the webhook Service
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, headers={"Authorization": f"Bearer {token}"}, ssl=context) as response,
        ):
            return response.status, await response.text()

    try:
        return asyncio.run(get())
    except aiohttp.ClientError as error:
        return 0, repr(error)


def _apply_role(cluster: ClusterHandle, role: dict[str, Any]) -> None:
    cluster.kubectl_ok(
        "apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(role)
    )


def _can(cluster: ClusterHandle, rule: Rule) -> bool:
    if rule.resource.startswith("/"):
        args = [rule.verb, rule.resource]
        who = "system:serviceaccount:phx-least-privilege:reader"
    else:
        resource = rule.resource.split("/")[0] + (f".{rule.group}" if rule.group else "")
        sub = rule.resource.split("/")[1:] or []
        target = f"{resource}/{rule.names[0]}" if rule.names else resource
        args = [rule.verb, target, *(["--subresource", sub[0]] if sub else [])]
        if rule.role == LEASE_ROLE:
            args += ["-n", NAMESPACE]
        else:
            args += ["-n", NS]
        who = ACCOUNT
    return cluster.kubectl("auth", "can-i", *args, f"--as={who}").stdout.strip() == "yes"


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def flow(
    cluster: ClusterHandle, kueue_crds: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Flow]:
    workdir = tmp_path_factory.mktemp("least-privilege")
    # An earlier run's namespace may still be terminating (its teardown does not wait).
    cluster.kubectl("wait", "--for=delete", f"namespace/{NS}", "--timeout=120s")
    cluster.kubectl("create", "namespace", NS)
    cluster.kubectl("create", "serviceaccount", "reader", "-n", NS)
    cluster.kubectl(
        "create",
        "clusterrolebinding",
        "phx-lp-reader",
        "--clusterrole=phalanx-metrics-reader",
        f"--serviceaccount={NS}:reader",
    )
    reader = cluster.kubectl_ok("create", "token", "reader", "-n", NS, "--duration=1h").strip()
    cluster.apply_crds([yaml.safe_dump(PROVISIONING_REQUEST_CRD)])
    with (
        node_pool(cluster, POOL, racks=2, hosts=1),
        installed(cluster, workdir, frameworks=FRAMEWORKS) as install,
    ):
        flow = Flow(cluster=cluster, install=install, reader_token=reader)
        try:
            yield flow
        finally:
            if flow.replica is not None:
                flow.replica.stop()
            # Persistent webhooks with no replica behind them refuse the cleanup's writes.
            install.remove_webhook_configurations()
            _reset_queues(cluster)
            sys.stderr.write(f"\n[least privilege] operator logs in {workdir}\n")
            cluster.kubectl("delete", "clusterrolebinding", "phx-lp-reader")
            cluster.kubectl("delete", "namespace", NS, "--wait=false")


# -- tests ------------------------------------------------------------------------------------


def test_the_job_flow_runs_as_the_service_account(flow: Flow) -> None:
    """The whole flow, every rule in place: nothing refused."""
    flow.removed = None
    flow.since = flow.install.audit.mark()
    took = []
    for step in FLOW:
        began = time.monotonic()
        STEPS[step](flow)
        took.append(f"{step} {time.monotonic() - began:.1f}s")
    sys.stderr.write(f"\n[least privilege] flow: {', '.join(took)}\n")
    calls = flow.install.audit.events(flow.since)
    assert calls, "the audit log shows no call of the ServiceAccount"
    refused = sorted({e.call for e in calls if e.code == 403})
    assert not refused, f"refused with every rule in place: {refused}"
    used = sorted({e.call.rsplit(" -> ", 1)[0] for e in calls})
    sys.stderr.write("\n[least privilege] calls of the flow:\n  " + "\n  ".join(used) + "\n")


def test_every_rule_maps_to_a_step() -> None:
    rules = manifest_rules()
    assert rules
    unmapped = [str(r) for r in rules if step_of(r) is None]
    assert not unmapped, f"rules with no flow step that needs them: {unmapped}"
    stale = set(RULE_STEPS) - {(r.role, r.group, r.resource, r.verb) for r in rules}
    assert not stale, f"mapped rules that rbac.yaml no longer has: {sorted(stale)}"


def test_every_rule_is_needed(flow: Flow) -> None:
    rules = [r for r in manifest_rules() if step_of(r) is not None]
    roles = {
        r.role: role_without(Rule(r.role, "", "", "")) for r in rules
    }  # the manifest's roles, unchanged (nothing matches the empty rule)
    unneeded: list[str] = []
    proofs: list[str] = []
    started = time.monotonic()
    for rule in rules:
        step = step_of(rule)
        assert step is not None
        flow.removed = None
        # Set up with every rule: the steps before (a running replica for all but "start").
        for before in BEFORE[step]:
            if before == "start" and flow.replica is not None and flow.replica.alive():
                continue
            STEPS[before](flow)
        _apply_role(flow.cluster, role_without(rule))
        deadline = time.monotonic() + 10
        while _can(flow.cluster, rule) and time.monotonic() < deadline:
            time.sleep(0.1)
        flow.removed = rule
        flow.since = flow.install.audit.mark()
        began = time.monotonic()
        try:
            STEPS[step](flow)
        except Refused as error:
            proofs.append(f"{rule}: {step}: {error} ({time.monotonic() - began:.1f}s)")
        except AssertionError as error:
            first = str(error).splitlines()[0]
            proofs.append(f"{rule}: {step}: failed: {first} ({time.monotonic() - began:.1f}s)")
        else:
            unneeded.append(f"{rule} (step {step} passed without it)")
            proofs.append(f"{rule}: {step}: PASSED WITHOUT IT")
        finally:
            flow.removed = None
            _apply_role(flow.cluster, roles[rule.role])
            # The next check starts from a replica that was never refused anything (killed:
            # "start" deletes the Lease it held, as on a fresh install).
            if flow.replica is not None:
                flow.replica.process.kill()
                flow.replica.process.wait()
            flow.replica = None
        sys.stderr.write(f"[least privilege] {proofs[-1]}\n")
    sys.stderr.write(
        f"\n[least privilege] {len(rules)} rules in {time.monotonic() - started:.0f}s:\n  "
        + "\n  ".join(proofs)
        + "\n"
    )
    assert not unneeded, f"rules the flow does not need: {unneeded}"
