"""The integration framework: shared rules (Workload naming, injections per pod set, the
Workload manifest), the Job's adapter on it, and a disabled integration left alone."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import kopf
import pytest
from kopf._cogs.structs import references
from kopf._core.engines.admission import build_webhooks
from kopf._core.intents.causes import WebhookType
from test_operator_jobsync_flow import ScriptedApi, a_job

from phalanx.operator import integration, jobs, webhook_policy
from phalanx.operator.configfile import ConfigFileError, parse
from phalanx.operator.jobsync import JobController
from phalanx.operator.metrics import Metrics
from phalanx.operator.state import ClusterState
from phalanx.operator.webhooks import register_webhooks
from phalanx.operator.writer import StatusWriter


def admitted(*assignments: dict[str, Any], checks: list[dict[str, Any]] | None = None):
    return {
        "metadata": {"name": "wl", "namespace": "ns"},
        "spec": {
            "podSets": [
                {"name": "leader", "count": 1},
                {"name": "workers", "count": 4},
            ]
        },
        "status": {
            "admission": {"clusterQueue": "cq", "podSetAssignments": list(assignments)},
            "admissionChecks": checks or [],
        },
    }


FLAVORS = {
    "h100": {
        "metadata": {"name": "h100"},
        "spec": {
            "nodeLabels": {"gpu": "h100"},
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    },
    "cpu": {"metadata": {"name": "cpu"}, "spec": {"nodeLabels": {"pool": "cpu"}}},
}


def test_kueue_workload_naming_hashes_kind_group_name_and_uid() -> None:
    name = integration.kueue_workload_name(
        prefix="job", kind="Job", group="batch", name="train", uid="u1"
    )
    assert name == jobs.workload_name("train", "u1")
    assert name.startswith("job-train-") and len(name) == len("job-train-") + 5
    other = integration.kueue_workload_name(
        prefix="job", kind="JobSet", group="jobset.x-k8s.io", name="train", uid="u1"
    )
    assert other != name, "the kind and group are part of the hash"
    long = integration.kueue_workload_name(
        prefix="pod", kind="Pod", group="", name="x" * 300, uid="u"
    )
    assert len(long) == 253


def test_each_admitted_pod_set_gets_its_own_flavors_checks_and_gate() -> None:
    workload = admitted(
        {"name": "leader", "count": 1, "flavors": {"cpu": "cpu"}},
        {
            "name": "workers",
            "count": 3,
            "flavors": {"nvidia.com/gpu": "h100"},
            "topologyAssignment": {"levels": ["rack"], "domains": []},
        },
        checks=[
            {
                "name": "prov",
                "state": "Ready",
                "podSetUpdates": [
                    {"name": "workers", "nodeSelector": {"pool": "p1"}, "annotations": {"a": "1"}}
                ],
            }
        ],
    )
    got = integration.injections(workload, flavors=FLAVORS)
    assert set(got) == {"leader", "workers"}
    leader, workers = got["leader"], got["workers"]
    assert leader.node_labels == {"pool": "cpu"} and not leader.tolerations
    assert not leader.topology_gated and leader.count == 1
    assert workers.node_labels == {"gpu": "h100", "pool": "p1"}
    assert workers.tolerations == FLAVORS["h100"]["spec"]["tolerations"]
    assert workers.topology_gated and workers.count == 3
    assert workers.annotations == {"a": "1"} and not leader.annotations


def test_an_assignment_without_a_count_keeps_the_pod_sets_count() -> None:
    got = integration.injections(
        admitted({"name": "workers", "flavors": {"g": "missing-flavor"}}), flavors=FLAVORS
    )
    assert got["workers"].count == 4
    assert got["workers"].node_labels == {}


def test_the_workload_manifest_is_owned_by_the_object_through_its_adapter() -> None:
    job = a_job()
    body = integration.workload_manifest(
        jobs.JOB,
        job,
        pod_sets=jobs.JOB.pod_sets(job),
        priority=7,
        priority_ref={"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "p"},
    )
    (owner,) = body["metadata"]["ownerReferences"]
    assert (owner["apiVersion"], owner["kind"], owner["uid"]) == ("batch/v1", "Job", "job-uid-1")
    assert owner["controller"] and owner["blockOwnerDeletion"]
    assert body["metadata"]["name"] == jobs.workload_name("train", "job-uid-1")
    assert body["spec"]["queueName"] == "lq" and body["spec"]["priority"] == 7
    assert body["spec"]["podSets"][0]["count"] == 2
    priority = jobs.PriorityResolution(value=7, ref=body["spec"]["priorityClassRef"])
    assert jobs.workload_for_job(job, priority=priority) == body


def test_the_job_adapter_starts_and_restores_exactly() -> None:
    job = a_job()
    job["spec"]["suspend"] = True
    adapter = jobs.JOB
    assert adapter.framework == "batch/job" and adapter.suspended(job)
    assert not adapter.injected(job)
    pod_sets = adapter.pod_sets(job)
    injection = integration.FlavorInjection(
        pod_set="main", count=2, node_labels={"gpu": "h100"}, tolerations=[], topology_gated=True
    )
    assert adapter.start_patch(job, workload_name="wl", injections={"other": injection}) == []
    started = copy.deepcopy(job)
    for op in adapter.start_patch(job, workload_name="wl", injections={"main": injection}):
        target = started
        *path, last = op["path"].strip("/").split("/")
        for part in path:
            target = target.setdefault(part, {})
        target[last] = op["value"]
    assert started["spec"]["suspend"] is False
    assert adapter.injected(started)
    assert started["spec"]["template"]["spec"]["schedulingGates"] == [
        {"name": "kueue.x-k8s.io/topology"}
    ]
    restore = adapter.restore_patch(started, pod_sets=pod_sets)
    assert {"op": "add", "path": "/spec/suspend", "value": True} in restore
    assert adapter.restore_patch(started, pod_sets=[]) == []
    assert adapter.suspend_patch(started) == [{"op": "add", "path": "/spec/suspend", "value": True}]


def test_the_job_adapter_reads_the_end() -> None:
    job = a_job()
    assert jobs.JOB.finished(job) is None
    job["status"] = {"conditions": [{"type": "Failed", "status": "True", "message": "boom"}]}
    assert jobs.JOB.finished(job) == integration.Finish(False, "Failed", "boom")


def test_a_job_of_a_disabled_integration_is_left_alone_with_one_event() -> None:
    async def main() -> ScriptedApi:
        api = ScriptedApi()
        state = ClusterState()
        writer = StatusWriter(api, state, Metrics())  # type: ignore[arg-type]
        controller = JobController(
            api,  # type: ignore[arg-type]
            state,
            writer,
            Metrics(),
            frameworks=(),
        )
        job = a_job()
        job["spec"]["suspend"] = False
        api.objects[("jobs", "ns/train")] = job
        state.apply("Job", "ADDED", api._bump(job))
        await controller.reconcile("ns/train")
        await controller.reconcile("ns/train")
        return api

    api = asyncio.run(main())
    assert api.creates == 0, "a Workload was made for a Job of a disabled integration"
    assert api.job()["spec"]["suspend"] is False, "the Job was suspended"
    events = [o for (plural, _), o in api.objects.items() if plural == "events"]
    assert len(events) == 1, events
    assert events[0]["reason"] == "IntegrationNotEnabled"
    assert "'batch/job' is not enabled" in events[0]["message"]


def _job_webhooks(frameworks: tuple[str, ...]) -> list[str]:
    registry = kopf.OperatorRegistry()
    register_webhooks(registry, validator=lambda obj: [], frameworks=frameworks)
    return [
        h.id
        for h in registry._webhooks.get_all_handlers()
        if h.reason in (WebhookType.MUTATING, WebhookType.VALIDATING) and "jobs" in h.id
    ]


def test_the_job_webhooks_are_served_only_while_batch_job_is_enabled() -> None:
    assert sorted(_job_webhooks(("batch/job",))) == ["suspend-queued-jobs", "validate-queued-jobs"]
    assert _job_webhooks(()) == []


def _config(frameworks: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta1",
        "kind": "Configuration",
        "integrations": {"frameworks": frameworks},
    }


def test_integrations_frameworks_enables_kinds_by_kueues_names() -> None:
    assert parse(_config(["batch/job"])).frameworks == ("batch/job",)
    assert parse(_config([])).frameworks == ()
    assert (
        parse({"apiVersion": "config.kueue.x-k8s.io/v1beta1", "kind": "Configuration"}).frameworks
        is None
    )
    assert parse(_config(["batch/job", "jobset.x-k8s.io/jobset"])).frameworks == (
        "batch/job",
        "jobset.x-k8s.io/jobset",
    )
    with pytest.raises(
        ConfigFileError, match=r"Phalanx integrates batch/job, pod, jobset\.x-k8s\.io/jobset, ray"
    ):
        parse(_config(["batch/job", "kubeflow.org/mpijob"]))
    with pytest.raises(ConfigFileError, match="not one of Kueue's framework names"):
        parse(_config(["JobSet"]))


def test_the_pod_webhook_gates_labelled_pods_outside_system_namespaces() -> None:
    registry = kopf.OperatorRegistry()
    register_webhooks(registry, validator=lambda obj: [], frameworks=("batch/job", "pod"))
    handlers = [
        h for h in registry._webhooks.get_all_handlers() if h.reason == WebhookType.MUTATING
    ]
    resources = [
        references.Resource(group="", version="v1", plural="pods", namespaced=True),
        references.Resource(group="batch", version="v1", plural="jobs", namespaced=True),
    ]
    built = build_webhooks(
        handlers,
        resources=resources,
        name_suffix="phalanx.kueue.x-k8s.io",
        client_config={"url": "https://127.0.0.1:9443"},
    )
    policy = webhook_policy.WebhookPolicy(
        namespace_selector=webhook_policy.default_namespace_selector("phalanx-system")
    )
    (webhook,) = [w for w in policy.apply(built) if w["name"].startswith("gate-queued-pods")]
    assert webhook["rules"][0]["resources"] == ["pods"]
    assert webhook["rules"][0]["operations"] == ["CREATE"]
    assert webhook["objectSelector"] == {
        "matchExpressions": [{"key": "kueue.x-k8s.io/queue-name", "operator": "Exists"}]
    }
    (excluded,) = webhook["namespaceSelector"]["matchExpressions"]
    assert set(excluded["values"]) == {"kube-system", "phalanx-system"}
    only_jobs = kopf.OperatorRegistry()
    register_webhooks(only_jobs, validator=lambda obj: [], frameworks=("batch/job",))
    assert "gate-queued-pods" not in {h.id for h in only_jobs._webhooks.get_all_handlers()}


def test_a_jobsets_job_is_left_to_the_jobset_even_with_a_queue_label() -> None:
    # A replicated job's template may carry the queue label; the JobSet is what is queued,
    # so its Jobs are neither suspended by the Job webhook nor given Workloads of their own.
    from phalanx.operator import jobs

    job = {
        "metadata": {
            "name": "train-workers-0",
            "labels": {"kueue.x-k8s.io/queue-name": "lq"},
            "ownerReferences": [
                {
                    "apiVersion": "jobset.x-k8s.io/v1alpha2",
                    "kind": "JobSet",
                    "name": "train",
                    "controller": True,
                }
            ],
        }
    }
    assert jobs.owned_by_jobset(job)
    assert jobs.JOB.queue_name(job) is None
    plain = {"metadata": {"name": "j", "labels": {"kueue.x-k8s.io/queue-name": "lq"}}}
    assert not jobs.owned_by_jobset(plain) and jobs.JOB.queue_name(plain) == "lq"
    job["metadata"]["ownerReferences"][0]["controller"] = False
    assert not jobs.owned_by_jobset(job), "only the controller owner counts"
