"""kueue.x-k8s.io/v1beta1: Kueue's conversions both ways, and the CRDs' v1beta1 versions.

Every kind's example manifest survives v1beta2 -> v1beta1 -> v1beta2 unchanged; v1beta1
objects written the way Kueue's v1beta1 API has them convert to the v1beta2 objects Kueue's
conversion produces; each rename is checked in both directions; and the v1beta1 schema of the
generated CRDs declares every field a converted object carries (the API server would prune an
undeclared one silently).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from api_cases import load_raw

from phalanx.api import kind_info, parse_object
from phalanx.api.crds import generate_crd
from phalanx.api.v1beta1 import (
    V1BETA1_API_VERSION,
    WEBHOOK_CONVERTED_KINDS,
    ConversionError,
    convert_object,
    to_v1beta1,
    to_v1beta2,
)

V1BETA2 = "kueue.x-k8s.io/v1beta2"
KINDS = {
    "clusterqueue": "ClusterQueue",
    "localqueue": "LocalQueue",
    "cohort": "Cohort",
    "resourceflavor": "ResourceFlavor",
    "topology": "Topology",
    "workloadpriorityclass": "WorkloadPriorityClass",
    "workload": "Workload",
}


def _v1beta1_schema(kind: str) -> dict[str, Any]:
    crd = generate_crd(kind_info(kind))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta1"]
    return dict(version["schema"]["openAPIV3Schema"])


def _undeclared(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields of ``obj`` that ``schema`` does not declare (what the API server would prune)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(obj, dict) and "properties" in schema:
        found = []
        for key, value in obj.items():
            if key not in schema["properties"]:
                found.append(f"{path}.{key}")
            else:
                found += _undeclared(value, schema["properties"][key], f"{path}.{key}")
        return found
    if isinstance(obj, list) and "items" in schema:
        return [
            p
            for i, item in enumerate(obj)
            for p in _undeclared(item, schema["items"], f"{path}[{i}]")
        ]
    return []


# -- every kind: v1beta2 -> v1beta1 -> v1beta2 ---------------------------------------------------


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_kind_round_trips_through_v1beta1_unchanged(name: str) -> None:
    original = load_raw(name)
    down = to_v1beta1(original)
    assert down["apiVersion"] == V1BETA1_API_VERSION
    back = to_v1beta2(down)
    assert back == original
    assert original == load_raw(name), "the conversion changed its input"


@pytest.mark.parametrize("name", sorted(KINDS))
def test_the_v1beta1_schema_declares_every_field_of_a_converted_object(name: str) -> None:
    down = to_v1beta1(load_raw(name))
    assert _undeclared(down, _v1beta1_schema(KINDS[name])) == []


@pytest.mark.parametrize("name", sorted(KINDS))
def test_convert_object_goes_by_the_desired_api_version(name: str) -> None:
    original = load_raw(name)
    assert convert_object(original, to=V1BETA2) == original
    assert convert_object(original, to=V1BETA1_API_VERSION) == to_v1beta1(original)
    down = to_v1beta1(original)
    assert convert_object(down, to=V1BETA2) == original


def test_other_groups_and_versions_are_refused_naming_the_object() -> None:
    cq = load_raw("clusterqueue")
    with pytest.raises(ConversionError, match=r"ClusterQueue .*kueue.x-k8s.io/v1alpha1"):
        convert_object(cq, to="kueue.x-k8s.io/v1alpha1")
    with pytest.raises(ConversionError, match="'batch/v1'"):
        convert_object({**cq, "apiVersion": "batch/v1"}, to=V1BETA2)


# -- Kueue's v1beta1 shape -> v1beta2 ------------------------------------------------------------


def test_a_kueue_v1beta1_cluster_queue_converts_as_kueue_converts_it() -> None:
    v1 = {
        "apiVersion": V1BETA1_API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": "team-a"},
        "spec": {
            "cohort": "research",
            "namespaceSelector": {},
            "admissionChecks": ["prov-req"],
            "flavorFungibility": {"whenCanBorrow": "Borrow", "whenCanPreempt": "Preempt"},
            "resourceGroups": [
                {
                    "coveredResources": ["nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": "h100",
                            "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}],
                        }
                    ],
                }
            ],
        },
        "status": {
            "flavorsUsage": [
                {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": "4"}]}
            ],
            "pendingWorkloads": 1,
            "pendingWorkloadsStatus": {
                "clusterQueuePendingWorkload": [],
                "lastChangeTime": "2026-01-01T00:00:00Z",
            },
            "fairSharing": {
                "weightedShare": 3,
                "admissionFairSharingStatus": {"consumedResources": {}},
            },
        },
    }
    v2 = to_v1beta2(v1)
    assert v2["apiVersion"] == V1BETA2
    spec = v2["spec"]
    assert spec["cohortName"] == "research" and "cohort" not in spec
    assert spec["admissionChecksStrategy"] == {"admissionChecks": [{"name": "prov-req"}]}
    assert "admissionChecks" not in spec
    assert spec["flavorFungibility"] == {
        "whenCanBorrow": "MayStopSearch",
        "whenCanPreempt": "MayStopSearch",
    }
    # ClusterQueue usage keeps its name in both versions (it is LocalQueue's that changed).
    assert v2["status"]["flavorsUsage"] == v1["status"]["flavorsUsage"]
    assert "pendingWorkloadsStatus" not in v2["status"]
    assert v2["status"]["fairSharing"] == {"weightedShare": 3}


def test_v1beta1_admission_checks_replace_a_strategy_given_alongside_as_in_kueue() -> None:
    v1 = {
        "apiVersion": V1BETA1_API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": "q"},
        "spec": {
            "admissionChecks": ["a", "b"],
            "admissionChecksStrategy": {"admissionChecks": [{"name": "c", "onFlavors": ["x"]}]},
        },
    }
    assert to_v1beta2(v1)["spec"]["admissionChecksStrategy"] == {
        "admissionChecks": [{"name": "a"}, {"name": "b"}]
    }
    v1["spec"]["admissionChecks"] = []
    kept = to_v1beta2(v1)["spec"]
    assert kept["admissionChecksStrategy"]["admissionChecks"][0]["name"] == "c"
    assert "admissionChecks" not in kept


def test_cluster_queue_cohort_name_is_cohort_in_v1beta1() -> None:
    cq = load_raw("clusterqueue")
    assert cq["spec"]["cohortName"]
    down = to_v1beta1(cq)
    assert down["spec"]["cohort"] == cq["spec"]["cohortName"]
    assert "cohortName" not in down["spec"]


def test_concurrent_admission_policy_has_no_v1beta1_counterpart_and_is_dropped() -> None:
    cq = load_raw("clusterqueue")
    cq["spec"]["concurrentAdmissionPolicy"] = {"migration": {"mode": "Disabled"}}
    assert "concurrentAdmissionPolicy" not in to_v1beta1(cq)["spec"]


def test_a_kueue_v1beta1_local_queue_reports_flavor_usage_as_flavors_usage() -> None:
    usage = [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": "8"}]}]
    v1 = {
        "apiVersion": V1BETA1_API_VERSION,
        "kind": "LocalQueue",
        "metadata": {"name": "user-queue", "namespace": "team-a"},
        "spec": {"clusterQueue": "team-a"},
        "status": {
            "flavorUsage": usage,
            "flavorsReservation": usage,
            "flavors": [{"name": "h100", "resources": ["nvidia.com/gpu"]}],
            "admittedWorkloads": 1,
        },
    }
    v2 = to_v1beta2(v1)
    assert v2["status"] == {
        "flavorsUsage": usage,
        "flavorsReservation": usage,
        "admittedWorkloads": 1,
    }
    # and down again: Kueue's sample-queue-control.py reads status.flavorUsage through v1beta1.
    down = to_v1beta1(v2)
    assert down["status"]["flavorUsage"] == usage and "flavorsUsage" not in down["status"]


def test_a_kueue_v1beta1_cohort_drops_admission_fair_sharing_status() -> None:
    v1 = {
        "apiVersion": V1BETA1_API_VERSION,
        "kind": "Cohort",
        "metadata": {"name": "research"},
        "spec": {"parentName": "org"},
        "status": {
            "fairSharing": {
                "weightedShare": 7,
                "admissionFairSharingStatus": {"consumedResources": {}},
            }
        },
    }
    v2 = to_v1beta2(v1)
    assert v2["spec"] == {"parentName": "org"}
    assert v2["status"] == {"fairSharing": {"weightedShare": 7}}


def _v1beta1_workload(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": V1BETA1_API_VERSION,
        "kind": "Workload",
        "metadata": {"name": "job-train", "namespace": "team-a"},
        "spec": {
            "queueName": "user-queue",
            "priority": 100,
            "podSets": [{"name": "main", "count": 6, "template": {"spec": {"containers": []}}}],
            **spec,
        },
        "status": {
            "accumulatedPastExexcutionTimeSeconds": 42,
            "admission": {
                "clusterQueue": "team-a",
                "podSetAssignments": [
                    {
                        "name": "main",
                        "count": 6,
                        "topologyAssignment": {
                            "levels": ["cloud.provider.com/rack", "kubernetes.io/hostname"],
                            "domains": [
                                {"values": ["rack-1", "rack-1-node-1"], "count": 2},
                                {"values": ["rack-1", "rack-1-node-2"], "count": 2},
                                {"values": ["rack-1", "rack-1-node-3"], "count": 2},
                            ],
                        },
                    }
                ],
            },
        },
    }


@pytest.mark.parametrize(
    ("source", "group", "kind"),
    [
        ("kueue.x-k8s.io/workloadpriorityclass", "kueue.x-k8s.io", "WorkloadPriorityClass"),
        ("scheduling.k8s.io/priorityclass", "scheduling.k8s.io", "PriorityClass"),
    ],
)
def test_a_v1beta1_priority_class_source_and_name_become_priority_class_ref(
    source: str, group: str, kind: str
) -> None:
    v1 = _v1beta1_workload(priorityClassSource=source, priorityClassName="high")
    v2 = to_v1beta2(v1)
    assert v2["spec"]["priorityClassRef"] == {"group": group, "kind": kind, "name": "high"}
    assert "priorityClassSource" not in v2["spec"] and "priorityClassName" not in v2["spec"]
    down = to_v1beta1(v2)
    assert (down["spec"]["priorityClassSource"], down["spec"]["priorityClassName"]) == (
        source,
        "high",
    )
    assert "priorityClassRef" not in down["spec"]


def test_a_priority_class_name_without_a_source_is_dropped_as_in_kueue() -> None:
    v2 = to_v1beta2(_v1beta1_workload(priorityClassName="high"))
    assert "priorityClassRef" not in v2["spec"] and "priorityClassName" not in v2["spec"]


def test_a_v1beta1_workload_converts_to_a_valid_v1beta2_workload() -> None:
    v1 = _v1beta1_workload(
        priorityClassSource="kueue.x-k8s.io/workloadpriorityclass", priorityClassName="high"
    )
    v2 = to_v1beta2(v1)
    status = v2["status"]
    assert status["accumulatedPastExecutionTimeSeconds"] == 42
    assert "accumulatedPastExexcutionTimeSeconds" not in status
    topology = status["admission"]["podSetAssignments"][0]["topologyAssignment"]
    # Kueue's single compact slice: the rack is one value for all, hostnames share a prefix.
    assert topology == {
        "levels": ["cloud.provider.com/rack", "kubernetes.io/hostname"],
        "slices": [
            {
                "domainCount": 3,
                "valuesPerLevel": [
                    {"universal": "rack-1"},
                    {"individual": {"prefix": "rack-1-node-", "roots": ["1", "2", "3"]}},
                ],
                "podCounts": {"universal": 2},
            }
        ],
    }
    status.pop("accumulatedPastExecutionTimeSeconds")  # a status field Phalanx does not model yet
    parse_object(v2)  # valid v1beta2
    down = to_v1beta1({**v2, "status": {**v2["status"], "accumulatedPastExecutionTimeSeconds": 42}})
    assert down["status"] == v1["status"]


def test_a_topology_assignment_of_several_slices_comes_back_as_one_with_the_same_domains() -> None:
    wl = load_raw("workload")
    assignment = wl["status"]["admission"]["podSetAssignments"][1]["topologyAssignment"]
    domains = to_v1beta1(wl)["status"]["admission"]["podSetAssignments"][1]["topologyAssignment"]
    split = copy.deepcopy(wl)
    split_assignment = split["status"]["admission"]["podSetAssignments"][1]["topologyAssignment"]
    split_assignment["slices"] = [
        {
            "domainCount": 1,
            "valuesPerLevel": [{"universal": v["values"][0]}],
            "podCounts": {"universal": v["count"]},
        }
        for v in domains["domains"]
    ]
    assert len(split_assignment["slices"]) > 1
    down = to_v1beta1(split)
    assert down["status"]["admission"]["podSetAssignments"][1]["topologyAssignment"] == domains
    assert to_v1beta2(down) == wl
    assert assignment == wl["status"]["admission"]["podSetAssignments"][1]["topologyAssignment"]


def test_v1beta2_only_workload_fields_are_dropped_going_down() -> None:
    wl = load_raw("workload")
    wl["spec"]["preemptionGates"] = [{"name": "gate"}]
    wl["status"]["preemptionGates"] = [{"name": "gate", "state": "Open"}]
    wl["spec"]["podSets"][1]["topologyRequest"]["podsetSliceRequiredTopologyConstraints"] = []
    down = to_v1beta1(wl)
    assert "preemptionGates" not in down["spec"] and "preemptionGates" not in down["status"]
    assert (
        "podsetSliceRequiredTopologyConstraints"
        not in down["spec"]["podSets"][1]["topologyRequest"]
    )


def test_a_malformed_topology_assignment_is_a_conversion_error_naming_the_field() -> None:
    v1 = _v1beta1_workload()
    v1["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]["domains"][1] = {
        "count": 2
    }
    with pytest.raises(
        ConversionError, match=r"Workload team-a/job-train: .*podSetAssignments\[0\]"
    ):
        to_v1beta2(v1)
    wl = load_raw("workload")
    wl["status"]["admission"]["podSetAssignments"][1]["topologyAssignment"]["slices"][0][
        "domainCount"
    ] = 99
    with pytest.raises(ConversionError, match=r"podSetAssignments\[1\]\.topologyAssignment"):
        to_v1beta1(wl)


# -- the CRDs' v1beta1 versions -------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(KINDS.values()))
def test_v1beta1_is_served_deprecated_and_not_stored(kind: str) -> None:
    crd = generate_crd(kind_info(kind))
    versions = {v["name"]: v for v in crd["spec"]["versions"]}
    assert set(versions) == {"v1beta1", "v1beta2"}
    assert versions["v1beta2"]["storage"] is True and versions["v1beta1"]["storage"] is False
    assert versions["v1beta1"]["served"] is True and versions["v1beta1"]["deprecated"] is True
    assert (
        versions["v1beta1"]["deprecationWarning"]
        == "This version is deprecated. Use v1beta2 instead."
    )
    assert versions["v1beta1"].get("subresources") == versions["v1beta2"].get("subresources")
    conversion = crd["spec"]["conversion"]
    if kind in WEBHOOK_CONVERTED_KINDS:
        assert conversion["strategy"] == "Webhook"
        assert conversion["webhook"]["conversionReviewVersions"] == ["v1"]
        assert conversion["webhook"]["clientConfig"]["service"]["path"] == "/convert"
    else:
        assert conversion == {"strategy": "None"}


@pytest.mark.parametrize("kind", sorted(KINDS.values()))
def test_with_v1beta1_off_it_stays_listed_and_converting_but_is_not_served(kind: str) -> None:
    # Catches the option ignored (still served), and v1beta1 dropped from the list: objects
    # stored as v1beta1 need it listed, and the conversion to read them.
    served = generate_crd(kind_info(kind))
    off = generate_crd(kind_info(kind), serve_v1beta1=False)
    versions = {v["name"]: v for v in off["spec"]["versions"]}
    assert versions["v1beta1"]["served"] is False and versions["v1beta2"]["served"] is True
    assert off["spec"]["conversion"] == served["spec"]["conversion"]
    same = {**versions["v1beta1"], "served": True}
    assert [versions["v1beta2"], same] == served["spec"]["versions"]


def test_the_webhook_converts_exactly_the_kinds_whose_fields_differ_and_cohort_as_in_kueue() -> (
    None
):
    differs = {
        KINDS[name]
        for name in KINDS
        if to_v1beta1(load_raw(name))["spec" if name != "workloadpriorityclass" else "value"]
        != load_raw(name).get("spec" if name != "workloadpriorityclass" else "value")
        or to_v1beta1(load_raw(name)).get("status") != load_raw(name).get("status")
    }
    assert differs == {"ClusterQueue", "LocalQueue", "Workload"}
    assert differs | {"Cohort"} == WEBHOOK_CONVERTED_KINDS


def test_the_v1beta1_schemas_use_v1beta1_names_and_rules() -> None:
    cq = _v1beta1_schema("ClusterQueue")["properties"]["spec"]
    assert "cohort" in cq["properties"] and "cohortName" not in cq["properties"]
    assert "concurrentAdmissionPolicy" not in cq["properties"]
    rules = [r["rule"] for r in cq["x-kubernetes-validations"]]
    assert not any("cohortName" in r or "concurrentAdmissionPolicy" in r for r in rules), rules
    assert any("has(self.cohort)" in r for r in rules)
    assert not any("admissionChecks" in r for r in rules), rules  # implemented, not refused
    fungibility = cq["properties"]["flavorFungibility"]["properties"]
    assert "Borrow" in fungibility["whenCanBorrow"]["enum"]
    assert "Preempt" in fungibility["whenCanPreempt"]["enum"]
    lq = _v1beta1_schema("LocalQueue")["properties"]["status"]["properties"]
    assert "flavorUsage" in lq and "flavorsUsage" not in lq
    wl = _v1beta1_schema("Workload")["properties"]["spec"]
    assert {"priorityClassSource", "priorityClassName"} <= set(wl["properties"])
    assert "priorityClassRef" not in wl["properties"]
    assert "!has(self.priorityClassName) || has(self.priority)" in [
        r["rule"] for r in wl["x-kubernetes-validations"]
    ]
    crd = generate_crd(kind_info("ClusterQueue"))
    v1 = next(v for v in crd["spec"]["versions"] if v["name"] == "v1beta1")
    assert v1["additionalPrinterColumns"][0]["jsonPath"] == ".spec.cohort"
