"""The JobSet integration (Kueue's ``jobset.x-k8s.io/jobset``): one pod set per replicated job,
Kueue's Workload naming, the start patch with each pod set's flavors on its replicated job, the
restore, the end, the webhook's checks; and the JobSet controller's flow against a scripted API
(Workload, start, PodsReady, eviction: suspend then restore, finish, a disabled integration)."""

from __future__ import annotations

import asyncio
import copy
import hashlib
from typing import Any

import jsonpatch
import pytest
from kind_harness import KindHarness

from phalanx.operator import integration, jobs
from phalanx.operator import jobset as js
from phalanx.operator.job_validation import validate_jobset
from phalanx.operator.kube import JOBSETS

NS = "team-a"


def rjob(name: str, *, replicas: int = 1, parallelism: int | None = None, **extra: Any):
    job_spec: dict[str, Any] = {
        "template": {
            "metadata": extra.pop("template_metadata", {}),
            "spec": {
                "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
                **extra,
            },
        }
    }
    if parallelism is not None:
        job_spec["parallelism"] = parallelism
        job_spec["completions"] = parallelism
    return {"name": name, "replicas": replicas, "template": {"spec": job_spec}}


def a_jobset(*rjobs: dict[str, Any], suspend: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": "trainer",
            "namespace": NS,
            "uid": "js-uid-1",
            "labels": {"kueue.x-k8s.io/queue-name": "lq"},
        },
        "spec": {
            "suspend": suspend,
            "replicatedJobs": list(rjobs)
            or [rjob("driver"), rjob("workers", replicas=2, parallelism=4)],
        },
    }


# -- rules ----------------------------------------------------------------------------------------


def test_one_pod_set_per_replicated_job_counting_replicas_times_pods() -> None:
    obj = a_jobset(
        rjob("driver"),
        rjob("workers", replicas=3, parallelism=4),
        {
            "name": "capped",
            "replicas": 2,
            "template": {"spec": {"parallelism": 5, "completions": 2, "template": {"spec": {}}}},
        },
    )
    sets = js.pod_sets(obj)
    assert [(p["name"], p["count"]) for p in sets] == [
        ("driver", 1),
        ("workers", 12),
        ("capped", 4),  # parallelism capped by completions, times replicas
    ]
    assert sets[1]["template"] == obj["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]
    sets[1]["template"]["spec"]["nodeSelector"] = {"x": "y"}
    assert (
        "nodeSelector"
        not in obj["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]
    ), "the pod set's template is a copy"
    # replicas defaults to 1 as in the JobSet API
    bare = a_jobset({"name": "one", "template": {"spec": {"template": {"spec": {}}}}})
    assert js.pod_sets(bare)[0]["count"] == 1


def test_the_topology_annotations_of_a_replicated_job_become_its_topology_request() -> None:
    obj = a_jobset(
        rjob(
            "workers",
            replicas=2,
            parallelism=2,
            template_metadata={
                "annotations": {"kueue.x-k8s.io/podset-required-topology": "example.com/rack"}
            },
        )
    )
    (ps,) = js.pod_sets(obj)
    assert ps["topologyRequest"] == {
        "required": "example.com/rack",
        "podIndexLabel": "batch.kubernetes.io/job-completion-index",
    }


def test_a_jobset_that_cannot_be_a_workload_is_refused_with_the_field() -> None:
    with pytest.raises(js.InvalidJobSet, match=r"spec.replicatedJobs: empty"):
        js.pod_sets({"metadata": {}, "spec": {"replicatedJobs": []}})
    nine = a_jobset(*[rjob(f"r{i}") for i in range(9)])
    with pytest.raises(js.InvalidJobSet, match=r"9 replicated jobs.*at most 8 pod sets"):
        js.pod_sets(nine)


def test_workload_name_is_kueues() -> None:
    digest = hashlib.sha1(b"JobSet\njobset.x-k8s.io\ntrainer\njs-uid-1").hexdigest()[:5]
    assert js.workload_name("trainer", "js-uid-1") == f"jobset-trainer-{digest}"
    assert js.JOBSET.workload_name(a_jobset()) == f"jobset-trainer-{digest}"
    long = js.workload_name("x" * 300, "u")
    assert len(long) == 253 and long.startswith("jobset-xxx")


def test_the_workload_is_owned_by_the_jobset_with_its_pod_sets() -> None:
    obj = a_jobset()
    body = integration.workload_manifest(
        js.JOBSET, obj, pod_sets=js.pod_sets(obj), priority=0, priority_ref=None
    )
    assert body["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "name": "trainer",
            "uid": "js-uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert body["metadata"]["labels"] == {"kueue.x-k8s.io/job-uid": "js-uid-1"}
    assert [p["name"] for p in body["spec"]["podSets"]] == ["driver", "workers"]
    assert body["spec"]["queueName"] == "lq"


def test_priority_from_the_label_else_the_first_replicated_job_naming_a_class() -> None:
    obj = a_jobset(rjob("driver"), rjob("workers", priorityClassName="high"))
    got = js.resolve_priority(obj, workload_priority_classes={}, priority_classes={"high": 100})
    assert got.value == 100 and got.ref == {
        "group": "scheduling.k8s.io",
        "kind": "PriorityClass",
        "name": "high",
    }
    obj["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = "urgent"
    got = js.resolve_priority(
        obj, workload_priority_classes={"urgent": 7}, priority_classes={"high": 100}
    )
    assert got.value == 7
    with pytest.raises(jobs.WorkloadPriorityClassNotFound):
        js.resolve_priority(obj, workload_priority_classes={}, priority_classes={})


def _injections() -> dict[str, integration.FlavorInjection]:
    return {
        "driver": integration.FlavorInjection(
            pod_set="driver",
            count=1,
            node_labels={"pool": "cpu"},
            tolerations=[],
            topology_gated=False,
        ),
        "workers": integration.FlavorInjection(
            pod_set="workers",
            count=8,
            node_labels={"gpu": "h100"},
            tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            topology_gated=True,
        ),
    }


def test_start_injects_each_pod_sets_flavors_into_its_replicated_job_and_unsuspends() -> None:
    obj = a_jobset(rjob("driver", nodeSelector={"zone": "a"}), rjob("workers", replicas=2))
    patch = js.JOBSET.start_patch(obj, workload_name="wl-1", injections=_injections())
    started = jsonpatch.apply_patch(obj, patch)
    assert started["spec"]["suspend"] is False
    driver, workers = (r["template"]["spec"]["template"] for r in started["spec"]["replicatedJobs"])
    assert driver["spec"]["nodeSelector"] == {"zone": "a", "pool": "cpu"}
    assert driver["metadata"]["labels"] == {"kueue.x-k8s.io/podset": "driver"}
    assert driver["metadata"]["annotations"] == {"kueue.x-k8s.io/workload": "wl-1"}
    assert driver["spec"]["schedulingGates"] == []
    assert workers["spec"]["nodeSelector"] == {"gpu": "h100"}
    assert workers["spec"]["tolerations"] == [
        {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert workers["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/topology"}]
    assert js.JOBSET.injected(started) and not js.JOBSET.injected(obj)
    # Each replicated job is addressed by index behind a test of its name.
    assert {"op": "test", "path": "/spec/replicatedJobs/1/name", "value": "workers"} in patch


def test_a_jobset_starts_whole_or_not_at_all() -> None:
    obj = a_jobset()
    only_driver = {"driver": _injections()["driver"]}
    assert js.JOBSET.start_patch(obj, workload_name="wl", injections=only_driver) == []


def test_restore_suspends_and_puts_back_every_recorded_template() -> None:
    obj = a_jobset(rjob("driver", nodeSelector={"zone": "a"}), rjob("workers", replicas=2))
    recorded = js.pod_sets(obj)
    started = jsonpatch.apply_patch(
        obj, js.JOBSET.start_patch(obj, workload_name="wl", injections=_injections())
    )
    restored = jsonpatch.apply_patch(started, js.JOBSET.restore_patch(started, pod_sets=recorded))
    assert restored["spec"]["suspend"] is True
    # Exactly as submitted: no empty node selector, tolerations or gates left behind.
    assert restored["spec"]["replicatedJobs"] == obj["spec"]["replicatedJobs"]
    assert not js.JOBSET.injected(restored)


def test_finished_from_the_jobset_conditions() -> None:
    obj = a_jobset()
    assert js.JOBSET.finished(obj) is None
    obj["status"] = {"conditions": [{"type": "Completed", "status": "False"}]}
    assert js.JOBSET.finished(obj) is None
    obj["status"] = {
        "conditions": [{"type": "Completed", "status": "True", "message": "jobset completed"}]
    }
    assert js.JOBSET.finished(obj) == integration.Finish(True, "Succeeded", "jobset completed")
    obj["status"] = {"conditions": [{"type": "Failed", "status": "True", "message": "boom"}]}
    assert js.JOBSET.finished(obj) == integration.Finish(False, "Failed", "boom")
    assert not js.needs_workload(obj)


def test_a_child_job_runs_nothing_once_suspended_as_the_job_controller_saw_it_or_ended() -> None:
    def job(suspend: bool, active: int, *conds: tuple[str, str]) -> dict[str, Any]:
        return {
            "spec": {"suspend": suspend},
            "status": {
                "active": active,
                "conditions": [{"type": t, "status": v} for t, v in conds],
            },
        }

    assert js.child_job_stopped(job(True, 0, ("Suspended", "True")))
    assert not js.child_job_stopped(job(True, 0, ("Suspended", "False")))
    assert not js.child_job_stopped(job(True, 2, ("Suspended", "True")))
    assert not js.child_job_stopped(job(False, 0, ("Suspended", "True")))
    assert js.child_job_stopped(job(False, 0, ("Complete", "True")))


def test_pods_ready_counts_ready_or_succeeded_child_jobs_against_replicas() -> None:
    obj = a_jobset()  # 1 driver + 2 worker replicas
    obj["status"] = {
        "replicatedJobsStatus": [
            {"name": "driver", "ready": 1},
            {"name": "workers", "ready": 1},
        ]
    }
    assert not js.pods_ready(obj)
    obj["status"]["replicatedJobsStatus"][1]["succeeded"] = 1
    assert js.pods_ready(obj)


def test_the_webhook_checks_queue_name_replicated_jobs_and_topology_annotations() -> None:
    obj = a_jobset()
    assert validate_jobset(obj) == []
    bad = copy.deepcopy(obj)
    bad["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "Not_A_Queue"
    (error,) = validate_jobset(bad)
    assert error.startswith("metadata.labels[kueue.x-k8s.io/queue-name]")
    running = copy.deepcopy(obj)
    running["spec"]["suspend"] = False
    moved = copy.deepcopy(running)
    moved["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "other"
    (error,) = validate_jobset(moved, old=running)
    assert "cannot be changed or removed while the JobSet runs" in error
    nine = a_jobset(*[rjob(f"r{i}") for i in range(9)])
    assert any("at most 8 pod sets" in e for e in validate_jobset(nine))
    both = a_jobset(
        rjob("driver"),
        rjob(
            "workers",
            template_metadata={
                "annotations": {
                    "kueue.x-k8s.io/podset-required-topology": "rack",
                    "kueue.x-k8s.io/podset-preferred-topology": "rack",
                }
            },
        ),
    )
    (error,) = validate_jobset(both)
    assert error.startswith(
        "spec.replicatedJobs[1].template.spec.template.metadata.annotations: set at most one"
    )


# -- the controller against a scripted API --------------------------------------------------------


class Harness(KindHarness):
    def __init__(self, *, enabled: bool = True) -> None:
        super().__init__(
            framework=js.FRAMEWORK,
            plural="jobsets",
            state_kind="JobSet",
            obj=a_jobset(),
            assignments=[
                ("driver", 1, {"cpu": "cpu"}),
                ("workers", 8, {"nvidia.com/gpu": "h100"}),
            ],
            enabled=enabled,
        )

    def child_job(self, name: str, *, suspend: bool, active: int, suspended: bool) -> None:
        self.state.apply(
            "JobSetJob",
            "MODIFIED",
            {
                "metadata": {
                    "name": name,
                    "namespace": NS,
                    "resourceVersion": str(self.api.version + 1),
                    "labels": {js.JOBSET_NAME_LABEL: "trainer"},
                },
                "spec": {"suspend": suspend},
                "status": {
                    "active": active,
                    "conditions": [
                        {"type": "Suspended", "status": "True" if suspended else "False"}
                    ],
                },
            },
        )
        self.api.version += 1

    def pod(self, name: str, *, deleted: bool = False) -> None:
        pod = {
            "metadata": {
                "name": name,
                "namespace": NS,
                "labels": {js.JOBSET_NAME_LABEL: "trainer"},
            }
        }
        self.state.apply("Pod", "DELETED" if deleted else "ADDED", pod)


def test_a_queued_jobset_is_admitted_whole_preempted_restored_readmitted_and_finished() -> None:
    async def main() -> None:
        h = Harness()
        await h.reconcile()
        wl = h.api.workload()
        assert wl["metadata"]["name"] == js.workload_name("trainer", "js-uid-1")
        assert [(p["name"], p["count"]) for p in wl["spec"]["podSets"]] == [
            ("driver", 1),
            ("workers", 8),
        ]
        await h.reconcile()  # waits, suspended, until admitted
        assert h.obj()["spec"]["suspend"] is True and h.api.creates == 1
        h.admit()
        await h.reconcile()
        started = h.obj()
        assert started["spec"]["suspend"] is False
        driver, workers = (
            r["template"]["spec"]["template"]["spec"] for r in started["spec"]["replicatedJobs"]
        )
        assert driver["nodeSelector"] == {"pool": "cpu"}
        assert workers["nodeSelector"] == {"gpu": "h100"}
        # Running: PodsReady follows the JobSet's replicated job statuses.
        h.pod("trainer-workers-0-0-x")
        h.its_controller_writes(
            replicatedJobsStatus=[{"name": "driver", "ready": 1}, {"name": "workers", "ready": 2}]
        )
        await h.reconcile()
        conds = {c["type"]: c["status"] for c in h.api.workload()["status"]["conditions"]}
        assert conds["PodsReady"] == "True"
        # Preempted: suspended through spec.suspend, then the templates put back.
        h.evict()
        wl_now = h.api.workload()
        assert not h.ctl.stopped(wl_now), "a running JobSet is not stopped"
        await h.reconcile()
        assert h.obj()["spec"]["suspend"] is True
        assert js.JOBSET.injected(h.obj())
        await h.reconcile()
        restored = h.obj()
        assert not js.JOBSET.injected(restored)
        assert restored["spec"]["replicatedJobs"] == a_jobset()["spec"]["replicatedJobs"]
        # Released only once every child Job is suspended with no active pod, and no pod is
        # left, whatever the JobSet's own (possibly stale) Suspended condition says.
        h.its_controller_writes(conditions=[{"type": "Suspended", "status": "True"}])
        h.child_job("trainer-workers-0", suspend=False, active=1, suspended=False)
        assert not h.ctl.stopped(wl_now), "a child Job still runs"
        h.child_job("trainer-workers-0", suspend=True, active=1, suspended=False)
        assert not h.ctl.stopped(wl_now), "the Job controller has not acted yet"
        h.child_job("trainer-workers-0", suspend=True, active=0, suspended=True)
        assert not h.ctl.stopped(wl_now), "a pod is left"
        h.pod("trainer-workers-0-0-x", deleted=True)
        assert h.ctl.stopped(wl_now)
        # Re-admitted (the scheduling loop clears the eviction), started again, completes.
        wl = h.api.workload()
        wl["status"]["conditions"] = [
            c for c in wl["status"]["conditions"] if c["type"] != "Evicted"
        ]
        h.state.apply("Workload", "MODIFIED", h.api._bump(wl))
        h.admit()
        await h.reconcile()
        assert h.obj()["spec"]["suspend"] is False
        h.its_controller_writes(
            conditions=[{"type": "Completed", "status": "True", "message": "jobset completed"}]
        )
        await h.reconcile()
        finished = {c["type"]: c for c in h.api.workload()["status"]["conditions"]}
        assert finished["Finished"]["status"] == "True"
        assert finished["Finished"]["reason"] == "Succeeded"

    asyncio.run(main())


def test_a_jobset_created_unsuspended_is_suspended_before_its_workload() -> None:
    async def main() -> None:
        h = Harness()
        obj = h.obj()
        obj["spec"]["suspend"] = False
        h.state.apply("JobSet", "MODIFIED", h.api._bump(obj))
        await h.reconcile()
        assert h.obj()["spec"]["suspend"] is True
        assert h.api.creates == 1

    asyncio.run(main())


def test_a_disabled_jobset_integration_leaves_a_queued_jobset_alone_with_one_event() -> None:
    async def main() -> None:
        h = Harness(enabled=False)
        obj = h.obj()
        obj["spec"]["suspend"] = False
        h.state.apply("JobSet", "MODIFIED", h.api._bump(obj))
        await h.reconcile()
        await h.reconcile()
        assert h.obj()["spec"]["suspend"] is False
        assert not [k for (kind, k) in h.api.objects if kind == "workloads"]
        events = [o for (kind, _), o in h.api.objects.items() if kind == "events"]
        assert len(events) == 1
        assert events[0]["reason"] == "IntegrationNotEnabled"
        assert events[0]["involvedObject"]["kind"] == "JobSet"
        assert events[0]["involvedObject"]["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
        assert "'jobset.x-k8s.io/jobset' is not enabled" in events[0]["message"]

    asyncio.run(main())


def test_an_invalid_jobset_is_told_on_the_jobset() -> None:
    async def main() -> None:
        h = Harness()
        obj = h.obj()
        obj["spec"]["replicatedJobs"] = [rjob(f"r{i}") for i in range(9)]
        h.state.apply("JobSet", "MODIFIED", h.api._bump(obj))
        await h.reconcile()
        events = [o for (kind, _), o in h.api.objects.items() if kind == "events"]
        assert [e["reason"] for e in events] == ["InvalidJobSet"]
        assert "at most 8 pod sets" in events[0]["message"]

    asyncio.run(main())


def test_jobsets_resource() -> None:
    assert (JOBSETS.group, JOBSETS.version, JOBSETS.plural) == (
        "jobset.x-k8s.io",
        "v1alpha2",
        "jobsets",
    )
