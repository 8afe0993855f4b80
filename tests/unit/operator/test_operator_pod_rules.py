"""Pod groups and single Pods: grouping, roles, Kueue's naming, the incomplete group, the
start patch and the end."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from phalanx.operator import integration, pods


def a_pod(
    name: str,
    *,
    group: str | None = "g",
    total: int | str = 3,
    gpus: str = "1",
    phase: str = "Pending",
    queue: str = "lq",
) -> dict[str, Any]:
    labels = {"kueue.x-k8s.io/queue-name": queue}
    annotations = {}
    if group is not None:
        labels[pods.GROUP_NAME_LABEL] = group
        annotations[pods.GROUP_TOTAL_COUNT_ANNOTATION] = str(total)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": gpus}}}],
        },
        "status": {"phase": phase},
    }
    defaults = pods.admission_defaults(pod)
    pod["metadata"]["labels"] = defaults["labels"]
    pod["metadata"]["annotations"] = defaults["annotations"]
    pod["spec"]["schedulingGates"] = defaults["schedulingGates"]
    return pod


GROUP = pods.Group("ns", "g", is_group=True)


def test_a_pod_without_a_queue_name_is_not_ours() -> None:
    pod = a_pod("p")
    del pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    assert pods.group_of(pod) is None
    assert pods.group_of(a_pod("p")) == GROUP
    assert pods.group_of(a_pod("p", group=None)) == pods.Group("ns", "p", is_group=False)
    of_a_job = a_pod("train-0")
    of_a_job["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u", "controller": True}
    ]
    assert pods.group_of(of_a_job) is None, "a Job's pod was taken for a pod group"


def test_the_webhook_gates_and_marks_a_queued_pod() -> None:
    pod = a_pod("p")
    assert pods.gated(pod)
    names = [g["name"] for g in pod["spec"]["schedulingGates"]]
    assert names == [pods.ADMISSION_GATE, "kueue.x-k8s.io/topology"]
    assert pod["metadata"]["labels"][pods.MANAGED_LABEL] == "true"
    assert len(pod["metadata"]["annotations"][pods.ROLE_HASH_ANNOTATION]) == 8
    again = pods.admission_defaults(pod)
    assert again["schedulingGates"] == pod["spec"]["schedulingGates"], "gates added twice"


def test_roles_follow_what_admission_needs_not_names_or_images() -> None:
    one, two = a_pod("a")["spec"], a_pod("b")["spec"]
    two["containers"][0]["image"] = "other"
    assert pods.role_hash(one) == pods.role_hash(two)
    bigger = copy.deepcopy(one)
    bigger["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "2"
    assert pods.role_hash(bigger) != pods.role_hash(one)
    tolerating = copy.deepcopy(one)
    tolerating["tolerations"] = [{"key": "x", "operator": "Exists"}]
    assert pods.role_hash(tolerating) != pods.role_hash(one)


def test_a_complete_group_has_one_pod_set_per_role_sorted() -> None:
    members = [a_pod("w0"), a_pod("w1"), a_pod("leader", gpus="0")]
    pod_sets = pods.group_pod_sets(GROUP, members)
    assert [ps["name"] for ps in pod_sets] == sorted(ps["name"] for ps in pod_sets)
    assert sorted(ps["count"] for ps in pod_sets) == [1, 2]
    counts = {ps["name"]: ps["count"] for ps in pod_sets}
    assert counts[pods.pod_set_of(members[0], GROUP)] == 2
    assert all(set(ps["template"]) == {"spec"} for ps in pod_sets)


def test_an_incomplete_group_gets_no_workload() -> None:
    with pytest.raises(pods.InvalidPodGroup, match="fewer runnable pods than expected"):
        pods.group_pod_sets(GROUP, [a_pod("w0"), a_pod("w1")])
    failed = a_pod("w2", phase="Failed")
    with pytest.raises(pods.InvalidPodGroup, match=r"\(2 of 3\)"):
        pods.group_pod_sets(GROUP, [a_pod("w0"), a_pod("w1"), failed])


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ([a_pod("a", total=2), a_pod("b", total=3)], "differs between the group's pods"),
        ([a_pod("a", total="x")], "is not an integer"),
        ([a_pod("a", total=0)], "greater than zero"),
        ([a_pod("a", total=2), a_pod("b", total=2, queue="other")], "name different queues"),
    ],
)
def test_a_group_whose_pods_disagree_says_which_annotation(
    members: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(pods.InvalidPodGroup, match=message):
        pods.group_pod_sets(GROUP, members)


def test_workload_naming_is_kueues() -> None:
    members = [a_pod("a"), a_pod("b"), a_pod("c")]
    body = pods.workload_for_group(GROUP, members, priority=0, priority_ref=None)
    assert body["metadata"]["name"] == "g"
    assert body["metadata"]["annotations"] == {pods.IS_GROUP_WORKLOAD_ANNOTATION: "true"}
    owners = body["metadata"]["ownerReferences"]
    assert [o["name"] for o in owners] == ["a", "b", "c"]
    assert not any(o.get("controller") for o in owners)
    single = a_pod("solo", group=None)
    group = pods.Group("ns", "solo", is_group=False)
    body = pods.workload_for_group(group, [single], priority=3, priority_ref=None)
    assert body["metadata"]["name"] == integration.kueue_workload_name(
        prefix="pod", kind="Pod", group="", name="solo", uid="uid-solo"
    )
    assert body["metadata"]["name"].startswith("pod-solo-")
    assert body["spec"]["podSets"][0]["name"] == "main"
    assert body["metadata"]["ownerReferences"][0]["controller"] is True
    assert body["spec"]["queueName"] == "lq" and body["spec"]["priority"] == 3


def test_start_removes_the_admission_gate_and_injects_the_flavor() -> None:
    pod = a_pod("w0")
    pod["spec"]["nodeSelector"] = {"zone": "a"}
    injection = integration.FlavorInjection(
        pod_set=pods.pod_set_of(pod, GROUP),
        count=3,
        node_labels={"pool": "h100"},
        tolerations=[{"key": "pool", "operator": "Exists"}],
        topology_gated=False,
    )
    started = jsonpatch.apply_patch(
        pod, pods.start_patch(pod, workload_name="g", injection=injection)
    )
    assert not pods.gated(started)
    assert started["spec"]["schedulingGates"] == [], "the topology gate stayed without TAS"
    assert started["spec"]["nodeSelector"] == {"zone": "a", "pool": "h100"}
    assert started["spec"]["tolerations"] == [{"key": "pool", "operator": "Exists"}]
    assert started["metadata"]["labels"]["kueue.x-k8s.io/podset"] == injection.pod_set
    assert started["metadata"]["annotations"]["kueue.x-k8s.io/workload"] == "g"
    tas = integration.FlavorInjection(
        pod_set="x", count=3, node_labels={}, tolerations=[], topology_gated=True
    )
    gated_for_topology = jsonpatch.apply_patch(
        pod, pods.start_patch(pod, workload_name="g", injection=tas)
    )
    assert gated_for_topology["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/topology"}]


def test_a_group_ends_when_every_pod_is_terminal() -> None:
    done = [a_pod(f"w{i}", phase="Succeeded") for i in range(3)]
    assert pods.group_finish(GROUP, [*done[:2], a_pod("w2")], total=3) is None
    assert pods.group_finish(GROUP, done, total=3) == integration.Finish(
        True, "Succeeded", "Pods succeeded: 3/3."
    )
    failed = [*done[:2], a_pod("w2", phase="Failed")]
    assert pods.group_finish(GROUP, failed, total=3) == integration.Finish(
        False, "Failed", "Pods succeeded: 2/3."
    )
    assert pods.group_finish(GROUP, [], total=3) is None
    solo = pods.Group("ns", "solo", is_group=False)
    ended = pods.group_finish(solo, [a_pod("solo", group=None, phase="Failed")], total=1)
    assert ended is not None and not ended.succeeded


def test_an_evicted_groups_quota_waits_for_its_running_pods_to_go() -> None:
    from phalanx.operator.podsync import PodGroupController
    from phalanx.operator.state import ClusterState

    state = ClusterState()
    controller = PodGroupController(None, state, None, None)  # type: ignore[arg-type]
    members = [a_pod("a"), a_pod("b"), a_pod("c")]
    workload = pods.workload_for_group(GROUP, members, priority=0, priority_ref=None)
    running = jsonpatch.apply_patch(
        members[0],
        pods.start_patch(
            members[0],
            workload_name="g",
            injection=integration.FlavorInjection(
                pod_set="x", count=3, node_labels={}, tolerations=[], topology_gated=False
            ),
        ),
    )
    for pod in [running, *members[1:]]:
        state.apply("Pod", "ADDED", pod)
    assert not controller.stopped(workload), "released while a pod of the group runs"
    state.apply("Pod", "DELETED", running)
    assert controller.stopped(workload), "the gated pods never ran: nothing to wait for"
    job_owned = {"metadata": {"namespace": "ns", "name": "w", "ownerReferences": []}}
    assert controller.stopped(job_owned)
