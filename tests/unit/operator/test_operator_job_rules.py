"""Job -> Workload, and the patches that start and stop a Job."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from phalanx.operator import jobs


def make_job(
    name: str = "train",
    *,
    parallelism: int | None = 4,
    completions: int | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    pod_annotations: dict[str, str] | None = None,
    priority_class: str | None = None,
) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {
        "containers": [
            {"name": "c", "image": "x", "resources": {"requests": {"nvidia.com/gpu": "8"}}}
        ],
        "restartPolicy": "Never",
    }
    if priority_class:
        pod_spec["priorityClassName"] = priority_class
    spec: dict[str, Any] = {
        "template": {"metadata": {"annotations": pod_annotations or {}}, "spec": pod_spec},
        "suspend": True,
    }
    if parallelism is not None:
        spec["parallelism"] = parallelism
    if completions is not None:
        spec["completions"] = completions
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": "1234-abcd",
            "labels": {jobs.QUEUE_LABEL: "lq", **(labels or {})},
            "annotations": annotations or {},
        },
        "spec": spec,
    }


def apply_patch(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """Applies the JSON patch subset the operator emits ("add" on object members)."""
    out = copy.deepcopy(obj)
    for op in ops:
        assert op["op"] == "add"
        *parents, leaf = op["path"].strip("/").split("/")
        target = out
        for part in parents:
            target = target[part]
        target[leaf] = copy.deepcopy(op["value"])
    return out


def test_workload_name_is_kueues_shape_and_depends_on_the_uid() -> None:
    name = jobs.workload_name("train", "1234-abcd")
    assert re.fullmatch(r"job-train-[0-9a-f]{5}", name)
    assert name == jobs.workload_name("train", "1234-abcd")
    assert name != jobs.workload_name("train", "other-uid")
    long_name = jobs.workload_name("x" * 300, "u")
    assert len(long_name) == 253


def test_workload_for_job_copies_the_template_and_counts() -> None:
    job = make_job(parallelism=4, annotations={jobs.JOB_MIN_PARALLELISM_ANNOTATION: "2"})
    wl = jobs.workload_for_job(job, priority=jobs.PriorityResolution(value=0, ref=None))
    assert wl["metadata"]["name"] == jobs.workload_name("train", "1234-abcd")
    assert wl["metadata"]["namespace"] == "team-a"
    owner = wl["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "Job" and owner["uid"] == "1234-abcd" and owner["controller"]
    assert wl["metadata"]["labels"][jobs.JOB_UID_LABEL] == "1234-abcd"
    (pod_set,) = wl["spec"]["podSets"]
    assert pod_set["name"] == "main"
    assert pod_set["count"] == 4
    assert pod_set["minCount"] == 2
    assert pod_set["template"] == job["spec"]["template"]
    assert pod_set["template"] is not job["spec"]["template"]
    assert wl["spec"]["queueName"] == "lq"
    assert "priorityClassRef" not in wl["spec"]


@pytest.mark.parametrize(
    ("parallelism", "completions", "count"), [(None, None, 1), (4, 2, 2), (4, 10, 4), (3, None, 3)]
)
def test_pod_count_is_parallelism_capped_by_completions(
    parallelism: int | None, completions: int | None, count: int
) -> None:
    job = make_job(parallelism=parallelism, completions=completions)
    wl = jobs.workload_for_job(job, priority=jobs.PriorityResolution(value=0, ref=None))
    assert wl["spec"]["podSets"][0]["count"] == count


def test_topology_annotations_become_a_topology_request() -> None:
    job = make_job(
        pod_annotations={
            "kueue.x-k8s.io/podset-required-topology": "cloud.provider.com/topology-rack"
        }
    )
    wl = jobs.workload_for_job(job, priority=jobs.PriorityResolution(value=0, ref=None))
    request = wl["spec"]["podSets"][0]["topologyRequest"]
    assert request["required"] == "cloud.provider.com/topology-rack"


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        (
            {
                "kueue.x-k8s.io/podset-preferred-topology": "rack",
                "kueue.x-k8s.io/podset-slice-required-topology": "host",
                "kueue.x-k8s.io/podset-slice-size": "2",
            },
            {"preferred": "rack", "podSetSliceRequiredTopology": "host", "podSetSliceSize": 2},
        ),
        (  # Kueue's "balanced" workloads: slices only
            {
                "kueue.x-k8s.io/podset-slice-required-topology": "rack",
                "kueue.x-k8s.io/podset-slice-size": "4",
            },
            {"podSetSliceRequiredTopology": "rack", "podSetSliceSize": 4},
        ),
        (  # larger than the 4 pods: left on the template, for the core to explain
            {
                "kueue.x-k8s.io/podset-required-topology": "rack",
                "kueue.x-k8s.io/podset-slice-required-topology": "host",
                "kueue.x-k8s.io/podset-slice-size": "8",
            },
            {"required": "rack"},
        ),
        (
            {
                "kueue.x-k8s.io/podset-slice-required-topology": "rack",
                "kueue.x-k8s.io/podset-slice-size": "two",
            },
            None,
        ),
    ],
)
def test_slice_annotations_become_topology_request_fields(
    annotations: dict[str, str], expected: dict[str, Any] | None
) -> None:
    from phalanx.operator.validation import validate_object

    wl = jobs.workload_for_job(
        make_job(parallelism=4, pod_annotations=annotations),
        priority=jobs.PriorityResolution(value=0, ref=None),
    )
    pod_set = wl["spec"]["podSets"][0]
    request = pod_set.get("topologyRequest")
    if expected is None:
        assert request is None
    else:
        assert request == {**expected, "podIndexLabel": "batch.kubernetes.io/job-completion-index"}
    assert pod_set["template"]["metadata"]["annotations"] == annotations  # kept as in Kueue
    assert validate_object(wl) == []  # what the operator creates, the CRD accepts


def test_workload_priority_class_label_wins_over_pod_priority_class() -> None:
    job = make_job(labels={jobs.PRIORITY_CLASS_LABEL: "high"}, priority_class="low-pc")
    got = jobs.resolve_priority(
        job, workload_priority_classes={"high": 1000}, priority_classes={"low-pc": 5}
    )
    assert got.value == 1000
    assert got.ref == {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "high"}


def test_pod_priority_class_is_used_without_a_workload_priority_class() -> None:
    job = make_job(priority_class="low-pc")
    got = jobs.resolve_priority(job, workload_priority_classes={}, priority_classes={"low-pc": 5})
    assert got.value == 5
    assert got.ref is not None and got.ref["kind"] == "PriorityClass"


def test_an_unknown_pod_priority_class_falls_back_to_the_default() -> None:
    job = make_job(priority_class="nope-pc")
    got = jobs.resolve_priority(job, workload_priority_classes={}, priority_classes={})
    assert got == jobs.PriorityResolution(value=0, ref=None)


def test_an_unknown_workload_priority_class_is_an_error_naming_the_label() -> None:
    job = make_job(labels={jobs.PRIORITY_CLASS_LABEL: "nope"})
    with pytest.raises(jobs.WorkloadPriorityClassNotFound) as caught:
        jobs.resolve_priority(job, workload_priority_classes={"high": 9}, priority_classes={})
    assert caught.value.name == "nope"
    assert jobs.PRIORITY_CLASS_LABEL in str(caught.value)


@pytest.mark.parametrize(
    ("text", "parallelism", "expected"),
    [("2", 4, 2), ("3", 4, 3), ("x", 4, None), ("0", 4, None), ("4", 4, None), ("-1", 4, None)],
)
def test_min_parallelism_is_an_integer_above_zero_below_parallelism(
    text: str, parallelism: int, expected: int | None
) -> None:
    job = make_job(parallelism=parallelism, annotations={jobs.JOB_MIN_PARALLELISM_ANNOTATION: text})
    if expected is None:
        with pytest.raises(jobs.InvalidJob, match=jobs.JOB_MIN_PARALLELISM_ANNOTATION):
            jobs.workload_for_job(job, priority=jobs.PriorityResolution(0, None))
    else:
        assert jobs.min_parallelism(job) == expected


def _ran(**status: Any) -> dict[str, Any]:
    """A suspended 2-pod Job that has run before, with ``status``."""
    job = make_job(parallelism=2, completions=2)
    job["status"] = {"startTime": "2026-12-03T10:00:00Z", **status}
    return job


SUSPENDED = {"type": "Suspended", "status": "True"}


@pytest.mark.parametrize(
    ("status", "clearable"),
    [
        ({"conditions": [SUSPENDED]}, True),
        ({"conditions": [SUSPENDED], "succeeded": 1}, True),
        ({}, False),  # the Job controller has not acted on the suspension yet
        ({"conditions": [SUSPENDED], "active": 1}, False),
        ({"conditions": [SUSPENDED], "terminating": 1}, False),
        ({"conditions": [SUSPENDED], "uncountedTerminatedPods": {"succeeded": ["u"]}}, False),
        ({"conditions": [SUSPENDED], "succeeded": 2}, False),  # complete by its counts
        (
            {"conditions": [SUSPENDED, {"type": "SuccessCriteriaMet", "status": "True"}]},
            False,
        ),
        ({"conditions": [SUSPENDED, {"type": "FailureTarget", "status": "True"}]}, False),
    ],
)
def test_start_time_is_cleared_only_when_the_job_cannot_finish_without_running_again(
    status: dict[str, Any], clearable: bool
) -> None:
    assert jobs.start_time_clearable(_ran(**status)) is clearable


def test_a_job_without_completions_is_complete_after_one_success() -> None:
    job = _ran(conditions=[SUSPENDED], succeeded=1)
    del job["spec"]["completions"]
    assert not jobs.start_time_clearable(job)


def test_success_criteria_met_and_failure_target_mean_the_end_is_decided() -> None:
    assert not jobs.job_finishing(_ran(conditions=[SUSPENDED]))
    for kind in ("SuccessCriteriaMet", "FailureTarget", "Complete", "Failed"):
        assert jobs.job_finishing(_ran(conditions=[{"type": kind, "status": "True"}]))


def test_admission_then_restore_round_trips_the_template() -> None:
    job = make_job(parallelism=4)
    job["spec"]["template"]["spec"]["nodeSelector"] = {"own": "sel"}
    injection = jobs.FlavorInjection(
        pod_set="main",
        count=2,
        node_labels={"gpu": "h100"},
        tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        topology_gated=True,
    )
    started = apply_patch(
        job, jobs.admission_patch(job, workload_name_="wl-1", injection=injection)
    )
    spec = started["spec"]
    assert spec["suspend"] is False
    assert spec["parallelism"] == 2
    pod_spec = spec["template"]["spec"]
    assert pod_spec["nodeSelector"] == {"own": "sel", "gpu": "h100"}
    assert pod_spec["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod_spec["schedulingGates"] == [{"name": jobs.TOPOLOGY_GATE}]
    assert spec["template"]["metadata"]["annotations"][jobs.WORKLOAD_ANNOTATION] == "wl-1"

    original = job["spec"]["template"]
    stopped = apply_patch(
        started,
        jobs.restore_patch(started, original_template=original, original_parallelism=4),
    )
    assert stopped["spec"]["suspend"] is True
    assert stopped["spec"]["parallelism"] == 4
    restored = stopped["spec"]["template"]
    assert restored["spec"]["nodeSelector"] == {"own": "sel"}
    assert restored["spec"]["tolerations"] == []
    assert restored["spec"]["schedulingGates"] == []
    assert restored["metadata"] == original["metadata"]


def test_job_finish_reads_complete_and_failed_conditions() -> None:
    job = make_job()
    assert jobs.job_finish(job) is None
    job["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    assert jobs.job_finish(job) == jobs.JobFinish(True, "Succeeded", "Job finished successfully")
    job["status"] = {"conditions": [{"type": "Failed", "status": "True", "message": "x"}]}
    assert jobs.job_finish(job) == jobs.JobFinish(False, "Failed", "x")


def test_a_job_being_deleted_or_finished_gets_no_new_workload() -> None:
    job = make_job()
    assert jobs.needs_workload(job)
    job["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    assert not jobs.needs_workload(job)  # its Workload deleted with it in the foreground
    job = make_job()
    job["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not jobs.needs_workload(job)


def test_workload_for_job_carries_the_provisioning_request_annotations() -> None:
    """Kueue's provisioning/sample-job.yaml: provreq.kueue.x-k8s.io/ annotations of the Job
    become the Workload's, where the ProvisioningRequest check reads its parameters."""
    job = make_job(
        annotations={"provreq.kueue.x-k8s.io/maxRunDurationSeconds": "600", "other/key": "x"}
    )
    wl = jobs.workload_for_job(job, priority=jobs.PriorityResolution(value=0, ref=None))
    assert wl["metadata"]["annotations"] == {"provreq.kueue.x-k8s.io/maxRunDurationSeconds": "600"}
    plain = jobs.workload_for_job(make_job(), priority=jobs.PriorityResolution(value=0, ref=None))
    assert "annotations" not in plain["metadata"]
