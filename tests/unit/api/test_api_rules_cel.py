"""Each rule's CEL (what the API server enforces) and its Python check (what phalanx validate
enforces) agree, on every node of a corpus of valid and invalid objects.

CEL is evaluated with cel-python on the node as the API server sees it after defaulting
(defaults filled in, unset optional fields absent).
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import celpy
import pytest
from api_cases import group, load_raw, manifest_files, minimal_cq, minimal_workload
from test_api_invalid_inputs import CASES

from phalanx.api import check_object, load_manifests
from phalanx.api.rulebook import RULES
from phalanx.api.rules import Rule, walk_models
from phalanx.api.unimplemented import UNIMPLEMENTED_FIELDS

ENV = celpy.Environment()


def cel(rule: Rule[Any], self_value: Any, old: Any = None) -> bool:
    assert rule.cel is not None
    program = ENV.program(ENV.compile(rule.cel))
    activation = {"self": celpy.json_to_cel(self_value)}
    if old is not None:
        activation["oldSelf"] = celpy.json_to_cel(old)
    return bool(program.evaluate(activation))


def _cohort(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Cohort",
        "metadata": {"name": "c"},
        "spec": spec,
    }


def _flavor(*tolerations: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "f"},
        "spec": {"tolerations": list(tolerations)},
    }


def _node_labels(labels: dict[str, str]) -> dict[str, Any]:
    raw = _flavor()
    raw["spec"] = {"nodeLabels": labels}
    return raw


def _taints(*taints: tuple[str, str, str]) -> dict[str, Any]:
    raw = _flavor()
    raw["spec"] = {"nodeTaints": [{"key": k, "value": v, "effect": e} for k, v, e in taints]}
    return raw


def _named_lq(name: str) -> dict[str, Any]:
    raw = load_raw("localqueue")
    raw["metadata"]["name"] = name
    return raw


def _assigned(slice_: dict[str, Any], levels: int = 1) -> dict[str, Any]:
    raw = load_raw("workload")
    ta = raw["status"]["admission"]["podSetAssignments"][1]["topologyAssignment"]
    ta["levels"] = [f"l{i}" for i in range(levels)]
    ta["slices"] = [slice_]
    return raw


# Objects that break the rules CASES leaves alone (or satisfy them in other ways).
EXTRA: list[dict[str, Any]] = [
    _cohort(resourceGroups=[group(["cpu"], "a", borrowingLimit=1)]),
    _cohort(resourceGroups=[group(["cpu"], "a", lendingLimit=1)]),
    _cohort(parentName="p", resourceGroups=[group(["cpu"], "a", borrowingLimit=1, lendingLimit=1)]),
    _cohort(resourceGroups=[group(["cpu"], "a"), group(["gpu"], "a")]),
    _cohort(resourceGroups=[group(["cpu"], "a"), group(["cpu"], "b")]),
    minimal_cq(cohortName="c", resourceGroups=[group(["cpu"], "a", lendingLimit=1)]),
    _flavor({"operator": "Exists"}, {"key": "k", "operator": "Exists", "value": "v"}),
    _flavor({"value": "v"}, {"key": "k", "effect": "NoExecute", "tolerationSeconds": 1}),
    _flavor({"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}),
    minimal_workload(
        priority=1,
        priorityClassRef={"group": "kueue.x-k8s.io", "kind": "PriorityClass", "name": "p"},
    ),
    minimal_workload(
        priority=1,
        priorityClassRef={"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": "p"},
    ),
    minimal_workload({"template": {}, "topologyRequest": {"unconstrained": True, "required": "r"}}),
    minimal_workload(
        {"template": {}, "topologyRequest": {"unconstrained": False, "required": "r"}}
    ),
    minimal_workload(
        {
            "template": {},
            "count": 4,
            "topologyRequest": {"podSetSliceRequiredTopology": "rack", "podSetSliceSize": 2},
        }
    ),
    minimal_workload({"template": {}, "topologyRequest": {"podSetSliceSize": 1}}),
    _assigned(
        {
            "domainCount": 2,
            "valuesPerLevel": [{"individual": {"roots": ["a", "b"]}}],
            "podCounts": {"individual": [1]},
        }
    ),
    _assigned(
        {
            "domainCount": 2,
            "valuesPerLevel": [{"individual": {"roots": ["a"]}}],
            "podCounts": {"universal": 1},
        }
    ),
    _assigned({"domainCount": 1, "valuesPerLevel": [{"universal": "a"}], "podCounts": {}}),
    _assigned(
        {
            "domainCount": 1,
            "valuesPerLevel": [{"universal": "a"}],
            "podCounts": {"universal": 1, "individual": [1]},
        }
    ),
    _assigned(
        {
            "domainCount": 1,
            "valuesPerLevel": [{"universal": "a", "individual": {"roots": ["a"]}}],
            "podCounts": {"universal": 1},
        }
    ),
    _assigned({"domainCount": 1, "valuesPerLevel": [{}], "podCounts": {"universal": 1}}),
    _assigned(
        {"domainCount": 1, "valuesPerLevel": [{"universal": "a"}], "podCounts": {"universal": 1}},
        levels=2,
    ),
    minimal_cq(
        namespaceSelector={
            "matchExpressions": [{"key": "k", "operator": "Exists", "values": ["x"]}]
        }
    ),
    minimal_cq(resourceGroups=[group(["gpü/☃"], "a")]),
    minimal_cq(resourceGroups=[group([f"{'p' * 254}/gpu"], "a")]),
    _cohort(resourceGroups=[group(["example.com/-gpu"], "a")]),
    _cohort(parentName="c"),
    _cohort(parentName="root"),
    _node_labels({"bad key!": "v", "ok": "bad value!"}),
    _node_labels({f"{'x' * 64}": "v", "a.b/c": "x" * 63}),
    _node_labels({"cloud.example.com/pool": "", "pool": "a-b_c.d"}),
    _taints(("k", "v", "NoSchedule"), ("k", "w", "NoSchedule")),
    _taints(("k", "v", "NoSchedule"), ("k", "v", "NoExecute"), ("a/b", "-v", "NoExecute")),
    _taints((f"a/{'x' * 64}", "v", "NoSchedule")),
    _flavor({"key": f"{'k' * 64}", "operator": "Exists"}, {"key": "k", "value": "v!"}),
    _named_lq("q" * 63),
    _named_lq("q" * 64),
    minimal_cq(
        namespaceSelector={"matchExpressions": [{"key": "k", "operator": "NotIn", "values": ["x"]}]}
    ),
]


def corpus() -> list[Any]:
    objects = [obj for path in manifest_files() for obj in load_manifests(path.read_text())]
    for raw in [case[1]() for case in CASES] + EXTRA:
        obj, _ = check_object(raw)  # invalid by a cross-field rule: still a model
        if obj is not None:
            objects.append(obj)
    return objects


def _node_rules() -> list[Rule[Any]]:
    return [
        r
        for r in RULES
        if r.cel and r.check and not r.is_transition and not r.name.startswith("unimplemented-")
    ]


def test_api_cel_and_python_agree_on_every_node_of_the_corpus():
    outcomes: dict[str, set[bool]] = defaultdict(set)
    rules_by_model: dict[type, list[Rule[Any]]] = defaultdict(list)
    for rule in _node_rules():
        rules_by_model[rule.model].append(rule)
    for obj in corpus():
        for path, node in walk_models(obj):
            for rule in rules_by_model.get(type(node), ()):
                assert rule.check is not None
                python_ok = not list(rule.check(node))
                as_served = node.model_dump(mode="json", by_alias=True, exclude_none=True)
                if rule.field is not None:
                    # A rule on a field runs on the field's value, and only when it is set.
                    if rule.field not in as_served:
                        continue
                    as_served = as_served[rule.field]
                assert cel(rule, as_served) == python_ok, (
                    f"{rule.name} disagrees at {obj.kind}/{obj.name} {path}"
                )
                outcomes[rule.name].add(python_ok)
    # Every rule was seen both holding and broken, so the agreement above means something.
    for rule in _node_rules():
        assert outcomes[rule.name] == {True, False}, f"{rule.name} seen only {outcomes[rule.name]}"


def _set_at(raw: Any, path: str, key: str, value: Any) -> None:
    node = raw
    for part in re.findall(r"[^.\[\]]+", path):
        node = node[int(part)] if part.isdigit() else node[part]
    node[key] = value


@pytest.mark.parametrize(
    "entry", UNIMPLEMENTED_FIELDS, ids=lambda e: f"{e.model.__name__}.{e.field}"
)
def test_api_unimplemented_field_is_rejected_offline_and_by_cel(entry):
    value = {"object": {}, "string": "x", "integer": 1, "array": [{}]}[entry.json_type]
    for path_file in manifest_files():
        for index, obj in enumerate(load_manifests(path_file.read_text())):
            for path, node in walk_models(obj):
                if type(node) is not entry.model:
                    continue
                raw = load_raw(path_file.stem, index)
                _set_at(raw, path, entry.field, value)
                model, errors = check_object(raw)
                assert model is None
                assert [(e.path, e.message) for e in errors] == [
                    (f"{path}.{entry.field}", entry.message)
                ]
                rule = next(
                    r
                    for r in RULES
                    if r.model is entry.model and r.cel == f"!has(self.{entry.field})"
                )
                served = node.model_dump(mode="json", by_alias=True, exclude_none=True)
                assert cel(rule, served) is True
                assert cel(rule, {**served, entry.field: value}) is False
                assert rule.message == entry.message
                return
    pytest.fail(f"no example manifest has a {entry.model.__name__} to put {entry.field} in")


def test_api_transition_rules_reject_a_change_and_accept_none():
    transitions = [r for r in RULES if r.is_transition]
    assert {r.name for r in transitions} == {
        "AdmissionCheck-controller-name-immutable",
        "LocalQueue-cluster-queue-immutable",
        "ResourceFlavor-topology-immutable",
        "Topology-levels-immutable",
    }
    ac_rule = next(r for r in transitions if r.name.startswith("AdmissionCheck"))
    assert cel(
        ac_rule, "kueue.x-k8s.io/provisioning-request", old="kueue.x-k8s.io/provisioning-request"
    )
    assert cel(ac_rule, "example.com/other", old="kueue.x-k8s.io/provisioning-request") is False
    lq_rule = next(r for r in transitions if r.name.startswith("LocalQueue"))
    assert cel(lq_rule, "team-a", old="team-a") is True
    assert cel(lq_rule, "team-b", old="team-a") is False
    topo_rule = next(r for r in transitions if r.name.startswith("Topology"))
    levels = load_raw("topology")["spec"]["levels"]
    assert cel(topo_rule, levels, old=levels) is True
    assert cel(topo_rule, levels[1:], old=levels) is False
    rf_rule = next(r for r in transitions if r.name.startswith("ResourceFlavor"))
    assert cel(rf_rule, {"topologyName": "t"}, old={"topologyName": "t"}) is True
    assert cel(rf_rule, {"topologyName": "t"}, old={}) is True
    assert cel(rf_rule, {}, old={}) is True
    assert cel(rf_rule, {"topologyName": "u"}, old={"topologyName": "t"}) is False
    assert cel(rf_rule, {}, old={"topologyName": "t"}) is False


def test_api_every_rule_has_a_check_or_is_a_transition_and_names_are_unique():
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    for rule in RULES:
        assert rule.cel is not None or rule.why_no_cel
        assert rule.check is not None or rule.is_transition
        # Messages read as the tail of "field: ..." on both sides.
        assert rule.message and not rule.message.endswith("."), rule.name
