"""Invalid manifests: each is rejected, and the error names the field path and says why."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from api_cases import group, load_raw, minimal_cq, minimal_workload

from phalanx.api import (
    InvalidObjectError,
    ManifestError,
    check_object,
    load_manifests,
    parse_object,
)

Raw = dict[str, Any]


def _set(raw: Raw, path: str, value: Any) -> Raw:
    """Set a dotted path (list indices as numbers) in ``raw``; return ``raw``."""
    parts = path.split(".")
    node: Any = raw
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    last = parts[-1]
    if last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value
    return raw


def _cq_quota(**quota: Any) -> Raw:
    return _set(
        minimal_cq(),
        "spec.resourceGroups.0.flavors.0.resources.1",
        {"name": "nvidia.com/gpu", **quota},
    )


GPU = "spec.resourceGroups[0].flavors[0].resources[1]"

# (id, manifest, path the error must name, words the message must contain)
CASES: list[tuple[str, Callable[[], Raw], str, str]] = [
    (
        "unknown field",
        lambda: _set(minimal_cq(), "spec.cohort", "research"),
        "spec.cohort",
        "unknown field 'cohort'",
    ),
    (
        "unknown nested field",
        lambda: _cq_quota(nominalQuota=1, quota=2),
        f"{GPU}.quota",
        "unknown field",
    ),
    ("negative quota", lambda: _cq_quota(nominalQuota=-1), f"{GPU}.nominalQuota", "negative"),
    (
        "negative quota with suffix",
        lambda: _cq_quota(nominalQuota="-500m"),
        f"{GPU}.nominalQuota",
        "negative",
    ),
    (
        "bad quantity",
        lambda: _cq_quota(nominalQuota="8 GPUs"),
        f"{GPU}.nominalQuota",
        "not a quantity",
    ),
    (
        "float quantity",
        lambda: _cq_quota(nominalQuota=1.5),
        f"{GPU}.nominalQuota",
        "floating-point",
    ),
    (
        "borrowingLimit without cohort",
        lambda: _cq_quota(nominalQuota=1, borrowingLimit=2),
        f"{GPU}.borrowingLimit",
        "borrowingLimit requires spec.cohortName",
    ),
    (
        "lendingLimit without cohort",
        lambda: _cq_quota(nominalQuota=1, lendingLimit=1),
        f"{GPU}.lendingLimit",
        "lendingLimit requires spec.cohortName",
    ),
    (
        "lendingLimit above nominal",
        lambda: _set(_cq_quota(nominalQuota=1, lendingLimit=2), "spec.cohortName", "c"),
        f"{GPU}.lendingLimit",
        "must not exceed nominalQuota",
    ),
    (
        "duplicate flavor across groups",
        lambda: minimal_cq(resourceGroups=[group(["cpu"], "a"), group(["memory"], "b", "a")]),
        "spec.resourceGroups[1].flavors[1].name",
        "only one resource group",
    ),
    (
        "duplicate flavor in a group",
        lambda: minimal_cq(resourceGroups=[group(["cpu"], "a", "a")]),
        "spec.resourceGroups[0].flavors[1].name",
        "duplicate entry name='a'",
    ),
    (
        "duplicate resource in a flavor",
        lambda: _set(minimal_cq(), "spec.resourceGroups.0.flavors.0.resources.1.name", "cpu"),
        "spec.resourceGroups[0].flavors[0].resources[1].name",
        "duplicate entry name='cpu'",
    ),
    (
        "resource in two groups",
        lambda: minimal_cq(resourceGroups=[group(["cpu"], "a"), group(["cpu"], "b")]),
        "spec.resourceGroups[1].coveredResources[0]",
        "only one resource group",
    ),
    (
        "more than 16 resource groups",
        lambda: minimal_cq(resourceGroups=[group([f"r{i}"], f"f{i}") for i in range(17)]),
        "spec.resourceGroups",
        "at most 16 items",
    ),
    (
        "flavor resources differ from coveredResources",
        lambda: _set(minimal_cq(), "spec.resourceGroups.0.flavors.0.resources.1.name", "memory"),
        "spec.resourceGroups[0].flavors[0].resources",
        "exactly one quota for each of the group's coveredResources",
    ),
    (
        "flavor missing a covered resource",
        lambda: minimal_cq(
            resourceGroups=[
                {
                    "coveredResources": ["cpu", "memory"],
                    "flavors": [{"name": "a", "resources": [{"name": "cpu", "nominalQuota": 1}]}],
                }
            ]
        ),
        "spec.resourceGroups[0].flavors[0].resources",
        "coveredResources",
    ),
    (
        "bad enum value",
        lambda: _set(minimal_cq(), "spec.queueingStrategy", "FIFO"),
        "spec.queueingStrategy",
        "must be one of StrictFIFO, BestEffortFIFO",
    ),
    (
        "policy not allowed for this field",
        lambda: _set(
            minimal_cq(), "spec.preemption", {"reclaimWithinCohort": "LowerOrNewerEqualPriority"}
        ),
        "spec.preemption.reclaimWithinCohort",
        "must be one of Never, LowerPriority, Any",
    ),
    (
        "borrowWithinCohort without reclaim",
        lambda: _set(
            minimal_cq(), "spec.preemption", {"borrowWithinCohort": {"policy": "LowerPriority"}}
        ),
        "spec.preemption",
        "needs reclaimWithinCohort",
    ),
    (
        "unimplemented ClusterQueue field",
        lambda: _set(minimal_cq(), "spec.concurrentAdmissionPolicy", {}),
        "spec.concurrentAdmissionPolicy",
        "Phalanx does not implement",
    ),
    (
        "admission mode not Kueue's",
        lambda: _set(minimal_cq(), "spec.admissionScope", {"admissionMode": "UsageBased"}),
        "spec.admissionScope.admissionMode",
        "UsageBasedAdmissionFairSharing",
    ),
    (
        "admission scope without a mode",
        lambda: _set(minimal_cq(), "spec.admissionScope", {}),
        "spec.admissionScope.admissionMode",
        "",
    ),
    (
        "unimplemented nested field",
        lambda: _set(
            minimal_cq(), "spec.flavorFungibility", {"preference": "PreemptionOverBorrowing"}
        ),
        "spec.flavorFungibility.preference",
        "Phalanx does not implement",
    ),
    (
        "unimplemented Workload field",
        lambda: minimal_workload(maximumExecutionTimeSeconds=60),
        "spec.maximumExecutionTimeSeconds",
        "Phalanx does not implement",
    ),
    (
        "hostname not last in Topology",
        lambda: _set(
            load_raw("topology"),
            "spec.levels",
            [{"nodeLabel": "kubernetes.io/hostname"}, {"nodeLabel": "rack"}],
        ),
        "spec.levels[0].nodeLabel",
        "can only be the last",
    ),
    (
        "duplicate Topology level",
        lambda: _set(
            load_raw("topology"), "spec.levels", [{"nodeLabel": "rack"}, {"nodeLabel": "rack"}]
        ),
        "spec.levels[1].nodeLabel",
        "only once",
    ),
    (
        "empty Topology levels",
        lambda: _set(load_raw("topology"), "spec.levels", []),
        "spec.levels",
        "at least 1",
    ),
    (
        "Topology without spec",
        lambda: {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Topology",
            "metadata": {"name": "t"},
        },
        "spec",
        "required field is missing",
    ),
    ("no pod sets", lambda: minimal_workload(podSets=[]), "spec.podSets", "at least 1"),
    (
        "minCount above count",
        lambda: minimal_workload({"count": 2, "minCount": 3, "template": {}}),
        "spec.podSets[0].minCount",
        "must not exceed count",
    ),
    (
        "minCount zero",
        lambda: minimal_workload({"count": 2, "minCount": 0, "template": {}}),
        "spec.podSets[0].minCount",
        "must be >= 1",
    ),
    (
        "two partial pod sets",
        lambda: minimal_workload(
            {"name": "a", "count": 2, "minCount": 1, "template": {}},
            {"name": "b", "count": 2, "minCount": 1, "template": {}},
        ),
        "spec.podSets",
        "only one pod set can set minCount",
    ),
    (
        "duplicate pod set names",
        lambda: minimal_workload({"name": "w", "template": {}}, {"name": "w", "template": {}}),
        "spec.podSets[1].name",
        "duplicate entry name='w'",
    ),
    (
        "pod set without template",
        lambda: minimal_workload({"name": "w", "count": 1}),
        "spec.podSets[0].template",
        "required field is missing",
    ),
    (
        "pod set name not a DNS label",
        lambda: minimal_workload({"name": "Workers", "template": {}}),
        "spec.podSets[0].name",
        "RFC 1123 label",
    ),
    (
        "count is not an integer",
        lambda: minimal_workload({"count": "4", "template": {}}),
        "spec.podSets[0].count",
        "integer",
    ),
    (
        "two topology modes",
        lambda: minimal_workload(
            {"template": {}, "topologyRequest": {"required": "rack", "preferred": "block"}}
        ),
        "spec.podSets[0].topologyRequest",
        "at most one of required, preferred and unconstrained",
    ),
    (
        "priorityClassRef without priority",
        lambda: minimal_workload(
            priorityClassRef={
                "group": "kueue.x-k8s.io",
                "kind": "WorkloadPriorityClass",
                "name": "p",
            }
        ),
        "spec.priority",
        "priority must be set",
    ),
    (
        "priorityClassRef group and kind mismatch",
        lambda: minimal_workload(
            priority=1,
            priorityClassRef={
                "group": "scheduling.k8s.io",
                "kind": "WorkloadPriorityClass",
                "name": "p",
            },
        ),
        "spec.priorityClassRef.kind",
        "needs kind PriorityClass",
    ),
    (
        "topology flavor without node labels",
        lambda: {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "f"},
            "spec": {"topologyName": "default"},
        },
        "spec.nodeLabels",
        "at least one nodeLabel",
    ),
    (
        "toleration seconds without NoExecute",
        lambda: _set(load_raw("resourceflavor"), "spec.tolerations.1.effect", "NoSchedule"),
        "spec.tolerations[1]",
        "tolerationSeconds can only be set with effect NoExecute",
    ),
    (
        "bad taint effect",
        lambda: _set(load_raw("resourceflavor"), "spec.nodeTaints.0.effect", "Never"),
        "spec.nodeTaints[0].effect",
        "must be one of NoSchedule, PreferNoSchedule, NoExecute",
    ),
    (
        "selector In without values",
        lambda: _set(
            minimal_cq(),
            "spec.namespaceSelector",
            {"matchExpressions": [{"key": "team", "operator": "In"}]},
        ),
        "spec.namespaceSelector.matchExpressions[0].values",
        "non-empty for In and NotIn",
    ),
    (
        "missing name",
        lambda: {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Cohort", "metadata": {}},
        "metadata.name",
        "required field is missing",
    ),
    (
        "invalid DNS name",
        lambda: _set(minimal_cq(), "metadata.name", "Team_A"),
        "metadata.name",
        "RFC 1123 subdomain",
    ),
    (
        "invalid flavor reference",
        lambda: _set(minimal_cq(), "spec.resourceGroups.0.flavors.0.name", "H100"),
        "spec.resourceGroups[0].flavors[0].name",
        "not a valid name",
    ),
    (
        "wrong apiVersion (v1beta1)",
        lambda: _set(minimal_cq(), "apiVersion", "kueue.x-k8s.io/v1beta1"),
        "apiVersion",
        "Phalanx serves kueue.x-k8s.io/v1beta2 only",
    ),
    (
        "foreign apiVersion",
        lambda: _set(minimal_cq(), "apiVersion", "batch/v1"),
        "apiVersion",
        "not a Kueue object",
    ),
    (
        "unknown kind",
        lambda: _set(minimal_cq(), "kind", "MultiKueueCluster"),
        "kind",
        "not a kind Phalanx serves",
    ),
    (
        "missing kind",
        lambda: {"apiVersion": "kueue.x-k8s.io/v1beta2"},
        "kind",
        "required field is missing",
    ),
    (
        "bad timestamp",
        lambda: _set(
            load_raw("clusterqueue"), "status.conditions.0.lastTransitionTime", "yesterday"
        ),
        "status.conditions[0].lastTransitionTime",
        "RFC 3339",
    ),
    (
        "condition status not True/False/Unknown",
        lambda: _set(load_raw("clusterqueue"), "status.conditions.0.status", "Yes"),
        "status.conditions[0].status",
        "must be one of True, False, Unknown",
    ),
    (
        "assignments do not match pod sets",
        lambda: _set(
            load_raw("workload"),
            "status.admission.podSetAssignments",
            [{"name": "workers", "count": 8}],
        ),
        "status.admission.podSetAssignments",
        "one entry per pod set",
    ),
    (
        "slice with both count forms",
        lambda: _set(
            load_raw("workload"),
            "status.admission.podSetAssignments.1.topologyAssignment.slices.0.podCounts",
            {"universal": 1, "individual": [1] * 8},
        ),
        "status.admission.podSetAssignments[1].topologyAssignment.slices[0].podCounts",
        "exactly one of the fields in [universal individual] must be set",
    ),
    (
        "slice level without slice size",
        lambda: minimal_workload(
            {
                "template": {},
                "count": 4,
                "topologyRequest": {"required": "rack", "podSetSliceRequiredTopology": "host"},
            }
        ),
        "spec.podSets[0].topologyRequest",
        "must be set together",
    ),
    (
        "slice size above the pod set's count",
        lambda: minimal_workload(
            {
                "template": {},
                "count": 4,
                "topologyRequest": {"podSetSliceRequiredTopology": "rack", "podSetSliceSize": 8},
            }
        ),
        "spec.podSets[0].topologyRequest.podSetSliceSize",
        "must not be greater than the pod set's count",
    ),
    (
        "slice size zero",
        lambda: minimal_workload(
            {
                "template": {},
                "topologyRequest": {"podSetSliceRequiredTopology": "rack", "podSetSliceSize": 0},
            }
        ),
        "spec.podSets[0].topologyRequest.podSetSliceSize",
        "must be >= 1",
    ),
    (
        "priority value too large",
        lambda: _set(load_raw("workloadpriorityclass"), "value", 2**31),
        "value",
        "32-bit",
    ),
]


@pytest.mark.parametrize(
    ("manifest", "path", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_api_invalid_input_is_rejected_with_its_field_path(manifest, path, words):
    obj, errors = check_object(manifest())
    assert obj is None or errors, "the manifest should be invalid"
    matching = [e for e in errors if e.path == path]
    assert matching, f"no error at {path}; got {[str(e) for e in errors]}"
    assert any(words in e.message for e in matching), [e.message for e in matching]


def test_api_there_are_at_least_twenty_invalid_cases():
    assert len(CASES) >= 20


def test_api_parse_object_raises_with_every_error():
    raw = _cq_quota(nominalQuota=-1, bogus=1)
    with pytest.raises(InvalidObjectError) as info:
        parse_object(raw)
    paths = {e.path for e in info.value.errors}
    assert {f"{GPU}.nominalQuota", f"{GPU}.bogus"} <= paths


def test_api_load_manifests_reports_each_bad_document_by_kind_and_name():
    text = (
        "apiVersion: kueue.x-k8s.io/v1beta2\nkind: Cohort\nmetadata: {name: ok}\n---\n"
        "apiVersion: kueue.x-k8s.io/v1beta2\nkind: Cohort\nmetadata: {name: bad}\n"
        "spec: {parent: x}\n"
    )
    with pytest.raises(ManifestError) as info:
        load_manifests(text)
    assert str(info.value) == (
        "Cohort/bad: spec.parent: unknown field 'parent': Kueue v1beta2 has no such field here;"
        " check the spelling"
    )


def test_api_yaml_syntax_error_is_reported_with_its_line():
    with pytest.raises(ManifestError) as info:
        load_manifests("kind: Cohort\nmetadata: {name: [\n")
    assert "YAML syntax error at line" in str(info.value)


def test_api_a_valid_manifest_has_no_errors():
    for name in ("clusterqueue", "workload", "resourceflavor", "topology"):
        obj, errors = check_object(load_raw(name))
        assert obj is not None and errors == [], name
