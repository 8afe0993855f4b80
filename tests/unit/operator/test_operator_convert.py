"""phalanx.api.convert: API dicts to the core's dataclasses and back."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.admission import model as core
from phalanx.api import convert
from phalanx.placement import TopologyMode

GiB = 2**30


def test_pod_requests_follow_the_kube_scheduler_rules() -> None:
    pod_spec = {
        "initContainers": [
            {"name": "big-init", "resources": {"requests": {"cpu": "4"}}},
            {
                "name": "sidecar",
                "restartPolicy": "Always",
                "resources": {"requests": {"cpu": "500m"}},
            },
        ],
        "containers": [
            {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
            {"name": "b", "resources": {"limits": {"cpu": "2", "nvidia.com/gpu": "8"}}},
        ],
        "overhead": {"cpu": "100m"},
    }
    # containers 1 + 2 + sidecar 0.5 = 3.5 < init 4 -> 4, plus overhead 0.1
    assert convert.pod_requests(pod_spec) == {"cpu": 4100, "memory": GiB, "nvidia.com/gpu": 8}


def test_bad_quantities_name_the_field() -> None:
    pod_spec = {"containers": [{"name": "a", "resources": {"requests": {"cpu": "lots"}}}]}
    with pytest.raises(convert.ConversionError, match=r"spec\.containers\[0\]\.resources"):
        convert.pod_requests(pod_spec)
    fine = {"name": "a", "resources": {"requests": {"cpu": "1"}}}
    bad_limit = {"name": "b", "resources": {"limits": {"memory": "x"}, "requests": {"cpu": "1"}}}
    workload = {
        "metadata": {"namespace": "ns", "name": "w"},
        "spec": {
            "podSets": [
                {"name": "ok", "template": {"spec": {"containers": [fine]}}},
                {"name": "two", "template": {"spec": {"containers": [fine, bad_limit]}}},
            ]
        },
    }
    with pytest.raises(convert.ConversionError) as error:
        convert.workload(workload)
    assert str(error.value).startswith(
        "spec.podSets[1].template.spec.containers[1].resources.requests[memory]: "
    )
    init = {"initContainers": [{"name": "i", "resources": {"requests": {"cpu": "-"}}}]}
    with pytest.raises(convert.ConversionError, match=r"^spec\.initContainers\[0\]\.resources"):
        convert.pod_requests(init)


def test_a_request_overrides_its_limit_and_a_limit_alone_counts() -> None:
    container = {"resources": {"limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"cpu": "1"}}}
    assert convert.pod_requests({"containers": [container]}) == {"cpu": 1000, "memory": GiB}


def test_creation_times_are_milliseconds_since_the_epoch() -> None:
    assert convert.timestamp_ms(None) == 0 and convert.timestamp_ms("") == 0
    assert convert.timestamp_ms("1970-01-01T00:00:01Z") == 1000
    # Asked again (cached): the same answer, and a different time is not confused with it.
    assert convert.timestamp_ms("1970-01-01T00:00:01Z") == 1000
    assert convert.timestamp_ms("2026-01-02T03:04:05Z") == 1767323045000


def _workload(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "w",
            "namespace": "team-a",
            "creationTimestamp": "2026-01-02T03:04:05Z",
        },
        "spec": {
            "queueName": "lq",
            "podSets": [
                {
                    "name": "main",
                    "count": 8,
                    "minCount": 4,
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "c", "resources": {"requests": {"nvidia.com/gpu": "8"}}}
                            ],
                            "nodeSelector": {"pool": "a"},
                            "tolerations": [{"key": "gpu", "operator": "Exists"}],
                        }
                    },
                    "topologyRequest": {"required": "rack"},
                }
            ],
            **spec,
        },
    }


def test_workload_conversion() -> None:
    wl = convert.workload(
        _workload(
            priority=100,
            priorityClassRef={
                "group": "kueue.x-k8s.io",
                "kind": "WorkloadPriorityClass",
                "name": "hi",
            },
            active=False,
        )
    )
    assert wl.key == "team-a/w"
    assert wl.queue_name == "lq"
    assert wl.priority == 100 and wl.priority_class == "hi"
    assert wl.active is False
    assert wl.creation_time == 1767323045000
    (ps,) = wl.pod_sets
    assert (ps.count, ps.min_count, ps.requests) == (8, 4, {"nvidia.com/gpu": 8})
    assert ps.node_selector == {"pool": "a"}
    assert ps.tolerations == (core.Toleration(key="gpu", operator="Exists"),)
    assert ps.topology is not None and ps.topology.mode is TopologyMode.REQUIRED
    assert ps.topology.level == "rack"


def test_topology_falls_back_to_template_annotations() -> None:
    obj = _workload()
    pod_set = obj["spec"]["podSets"][0]
    del pod_set["topologyRequest"]
    pod_set["template"]["metadata"] = {
        "annotations": {"kueue.x-k8s.io/podset-preferred-topology": "block"}
    }
    ps = convert.workload(obj).pod_sets[0]
    assert ps.topology is not None and ps.topology.mode is TopologyMode.PREFERRED


@pytest.mark.parametrize(
    ("request_fields", "mode", "level"),
    [
        ({"podSetSliceRequiredTopology": "host", "podSetSliceSize": 2}, "Unconstrained", None),
        (
            {"required": "rack", "podSetSliceRequiredTopology": "host", "podSetSliceSize": 2},
            "Required",
            "rack",
        ),
    ],
)
def test_slice_fields_of_the_topology_request(
    request_fields: dict[str, Any], mode: str, level: str | None
) -> None:
    obj = _workload()
    obj["spec"]["podSets"][0]["topologyRequest"] = request_fields
    topology = convert.workload(obj).pod_sets[0].topology
    assert topology is not None
    assert (topology.mode, topology.level) == (TopologyMode(mode), level)
    assert (topology.slice_level, topology.slice_size) == ("host", 2)


def test_cluster_queue_conversion() -> None:
    cq = convert.cluster_queue(
        {
            "metadata": {"name": "team-a"},
            "spec": {
                "cohortName": "org",
                "namespaceSelector": {},
                "queueingStrategy": "StrictFIFO",
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": "h100",
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "100"},
                                    {
                                        "name": "nvidia.com/gpu",
                                        "nominalQuota": 64,
                                        "borrowingLimit": "16",
                                        "lendingLimit": "8",
                                    },
                                ],
                            }
                        ],
                    }
                ],
                "preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"},
                "fairSharing": {"weight": "0.5"},
            },
        }
    )
    assert cq.cohort == "org"
    assert cq.queueing_strategy is core.QueueingStrategy.STRICT_FIFO
    assert cq.namespace_selector == core.LabelSelector()
    assert cq.quotas()[("h100", "cpu")] == core.ResourceQuota(nominal=100_000)
    assert cq.quotas()[("h100", "nvidia.com/gpu")] == core.ResourceQuota(64, 16, 8)
    assert cq.preemption.reclaim_within_cohort is core.PreemptionPolicy.ANY
    assert cq.fair_weight == 500


def test_cluster_queue_without_namespace_selector_matches_nothing() -> None:
    cq = convert.cluster_queue({"metadata": {"name": "q"}, "spec": {}})
    assert cq.namespace_selector is None


def test_admission_round_trip() -> None:
    status = {
        "clusterQueue": "team-a",
        "podSetAssignments": [
            {
                "name": "main",
                "flavors": {"nvidia.com/gpu": "h100"},
                "resourceUsage": {"nvidia.com/gpu": "64", "cpu": "1500m"},
                "count": 8,
                "topologyAssignment": {"levels": ["kubernetes.io/hostname"], "slices": []},
            }
        ],
    }
    admission = convert.admission_from_status(status)
    assert admission.usage() == {("h100", "nvidia.com/gpu"): 64}
    assert admission.pod_sets[0].resource_usage == {"nvidia.com/gpu": 64, "cpu": 1500}
    assert convert.admission_to_status(admission) == status


def test_node_and_pod_usage() -> None:
    node = convert.node(
        {
            "metadata": {"name": "n1", "labels": {"rack": "r1"}},
            "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]},
            "status": {
                "allocatable": {"cpu": "96", "nvidia.com/gpu": "8", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )
    assert node.allocatable == {"cpu": 96_000, "nvidia.com/gpu": 8, "pods": 110}
    assert node.ready and not node.unschedulable
    assert node.taints[0].key == "gpu"
    pod = {
        "metadata": {"uid": "u1"},
        "spec": {"nodeName": "n1", "containers": [{"resources": {"requests": {"cpu": "1"}}}]},
        "status": {"phase": "Running"},
    }
    assert convert.pod_usage(pod) == ("u1", "n1", {"cpu": 1000})
    pod["status"]["phase"] = "Succeeded"
    assert convert.pod_usage(pod) is None


def test_topology_assignment_is_written_in_kueue_wire_form_and_read_back() -> None:
    from phalanx.api.loader import check_object
    from phalanx.placement import (
        FlavorTopology,
        GangRequest,
        Node,
        PodSetRequest,
        decode_topology_assignment,
    )
    from phalanx.placement import TopologyRequest as PlacementRequest

    host = "kubernetes.io/hostname"
    topology = FlavorTopology(name="gpu", levels=["rack", host])
    for h in (0, 1, 3):
        name = f"gpu-b0-r0-h{h}"
        topology.upsert_node(Node(name, {"rack": "r0", host: name}, {"nvidia.com/gpu": 8}))
    placed = topology.place(
        GangRequest(
            "ns/w",
            (PodSetRequest("main", 3, {"nvidia.com/gpu": 8}, PlacementRequest.required("rack")),),
        )
    )
    assert placed.placement is not None
    admission = core.Admission(
        cluster_queue="cq",
        pod_sets=(
            core.PodSetAssignment(
                name="main",
                count=3,
                flavors={"nvidia.com/gpu": "gpu"},
                resource_usage={"nvidia.com/gpu": 24},
                topology_assignment=placed.placement.pod_sets[0],
            ),
        ),
    )
    status = convert.admission_to_status(admission)
    wire = status["podSetAssignments"][0]["topologyAssignment"]
    assert wire == {
        "levels": [host],
        "slices": [
            {
                "domainCount": 3,
                "valuesPerLevel": [
                    {"individual": {"prefix": "gpu-b0-r0-h", "roots": ["0", "1", "3"]}}
                ],
                "podCounts": {"universal": 1},
            }
        ],
    }
    workload = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "w", "namespace": "ns"},
        "spec": {
            "queueName": "lq",
            "podSets": [{"name": "main", "count": 3, "template": {"spec": {"containers": []}}}],
        },
        "status": {"admission": status},
    }
    obj, errors = check_object(workload)  # the CRD's schema and rules
    assert obj is not None and errors == []
    dumped = obj.model_dump(by_alias=True, exclude_none=True)
    assert dumped["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"] == wire
    restored = convert.admission_from_status(status)
    assert decode_topology_assignment(restored.pod_sets[0].topology_assignment) == (
        (host,),
        tuple(((f"gpu-b0-r0-h{h}",), 1) for h in (0, 1, 3)),
    )
