"""Names that end up in labels, node selectors and pod requests are checked as Kubernetes
(and Kueue's webhooks) check them: resource names, nodeLabels, taints, tolerations, label
selectors, a LocalQueue's name; and a Cohort cannot be its own parent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from api_cases import group, load_raw, minimal_cq

from phalanx.api import check_object
from phalanx.api.label_rules import is_label_value, is_qualified_name
from phalanx.operator.validation import validate_object

Raw = dict[str, Any]


def _cohort(name: str = "c", **spec: Any) -> Raw:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Cohort",
        "metadata": {"name": name},
        "spec": spec,
    }


def _flavor(**spec: Any) -> Raw:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "f"},
        "spec": spec,
    }


def _local_queue(name: str) -> Raw:
    raw = load_raw("localqueue")
    raw["metadata"]["name"] = name
    return raw


def _resource_name_in_quota(name: str) -> Raw:
    raw = minimal_cq()
    raw["spec"]["resourceGroups"][0]["coveredResources"][1] = name
    raw["spec"]["resourceGroups"][0]["flavors"][0]["resources"][1]["name"] = name
    return raw


SNOWMAN = "gpü/☃"
LONG_PREFIX = f"{'p' * 254}/gpu"

# (id, manifest, field path of the error, words of its message)
CASES: list[tuple[str, Callable[[], Raw], str, str]] = [
    (
        "ClusterQueue covers a resource that is not a qualified name",
        lambda: _resource_name_in_quota(SNOWMAN),
        "spec.resourceGroups[0].coveredResources[1]",
        "a resource name must be a qualified name such as cpu or nvidia.com/gpu",
    ),
    (
        "ClusterQueue quota for a resource that is not a qualified name",
        lambda: _resource_name_in_quota(SNOWMAN),
        "spec.resourceGroups[0].flavors[0].resources[1].name",
        "use the name the pods request",
    ),
    (
        "resource name with a prefix over 253 characters",
        lambda: _resource_name_in_quota(LONG_PREFIX),
        "spec.resourceGroups[0].coveredResources[1]",
        "at most 253 characters",
    ),
    (
        "Cohort covers a resource that is not a qualified name",
        lambda: _cohort(resourceGroups=[group(["example.com/-gpu"], "a")]),
        "spec.resourceGroups[0].coveredResources[0]",
        "qualified name",
    ),
    (
        "Cohort is its own parent",
        lambda: _cohort("research", parentName="research"),
        "spec.parentName",
        "a Cohort cannot be its own parent",
    ),
    (
        "LocalQueue name longer than a label value",
        lambda: _local_queue("q" * 64),
        "metadata.name",
        "at most 63 characters: Jobs name their LocalQueue in the kueue.x-k8s.io/queue-name",
    ),
    (
        "nodeLabels key that is not a label key",
        lambda: _flavor(nodeLabels={"bad key!": "v"}),
        "spec.nodeLabels[bad key!]",
        "each nodeLabels key must be a label key",
    ),
    (
        "nodeLabels key with a name part over 63 characters",
        lambda: _flavor(nodeLabels={f"example.com/{'k' * 64}": "v"}),
        f"spec.nodeLabels[example.com/{'k' * 64}]",
        "each nodeLabels key must be a label key",
    ),
    (
        "nodeLabels value that is not a label value",
        lambda: _flavor(nodeLabels={"pool": "a b"}),
        "spec.nodeLabels[pool]",
        "each nodeLabels value must be a label value",
    ),
    (
        "nodeLabels value over 63 characters",
        lambda: _flavor(nodeLabels={"pool": "v" * 64}),
        "spec.nodeLabels.pool",
        "at most 63 characters",
    ),
    (
        "two taints with one key and effect",
        lambda: _flavor(
            nodeTaints=[
                {"key": "k", "value": "a", "effect": "NoSchedule"},
                {"key": "k", "value": "b", "effect": "NoSchedule"},
            ]
        ),
        "spec.nodeTaints[1]",
        "unique by key and effect",
    ),
    (
        "taint value that is not a label value",
        lambda: _flavor(nodeTaints=[{"key": "k", "value": "a b", "effect": "NoSchedule"}]),
        "spec.nodeTaints[0].value",
        "a taint value must be a label value",
    ),
    (
        "taint key with a name part over 63 characters",
        lambda: _flavor(nodeTaints=[{"key": f"a/{'k' * 64}", "effect": "NoSchedule"}]),
        "spec.nodeTaints[0].key",
        "a taint key must be a label key",
    ),
    (
        "toleration key with a name part over 63 characters",
        lambda: _flavor(tolerations=[{"key": "k" * 64, "operator": "Exists"}]),
        "spec.tolerations[0].key",
        "a toleration key must be a label key",
    ),
    (
        "toleration value that is not a label value",
        lambda: _flavor(tolerations=[{"key": "k", "value": "v!"}]),
        "spec.tolerations[0].value",
        "a toleration value must be a label value",
    ),
    (
        "namespaceSelector matchLabels key that is not a label key",
        lambda: minimal_cq(namespaceSelector={"matchLabels": {"team name": "a"}}),
        "spec.namespaceSelector.matchLabels[team name]",
        "a selector's label key must be a label key",
    ),
    (
        "namespaceSelector matchLabels value that is not a label value",
        lambda: minimal_cq(namespaceSelector={"matchLabels": {"team": "a/b"}}),
        "spec.namespaceSelector.matchLabels[team]",
        "a selector's value must be a label value",
    ),
    (
        "namespaceSelector matchExpressions value that is not a label value",
        lambda: minimal_cq(
            namespaceSelector={
                "matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b c"]}]
            }
        ),
        "spec.namespaceSelector.matchExpressions[0].values[1]",
        "a selector's value must be a label value",
    ),
]


@pytest.mark.parametrize(
    ("manifest", "path", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_api_label_rule_rejects_with_the_field_path(
    manifest: Callable[[], Raw], path: str, words: str
) -> None:
    _, errors = check_object(manifest())
    matching = [e for e in errors if e.path == path]
    assert matching, f"no error at {path}; got {[str(e) for e in errors]}"
    assert any(words in e.message for e in matching), [e.message for e in matching]


@pytest.mark.parametrize(
    ("manifest", "path", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_api_label_rule_is_what_the_validating_webhook_answers(
    manifest: Callable[[], Raw], path: str, words: str
) -> None:
    messages = validate_object(manifest())
    assert any(m.startswith(f"{path}: ") and words in m for m in messages), messages


VALID: list[tuple[str, Callable[[], Raw]]] = [
    ("qualified resource names", lambda: _resource_name_in_quota("example.com/gpu-1_x.Y")),
    ("LocalQueue name of 63 characters", lambda: _local_queue("q" * 63)),
    ("Cohort with another parent", lambda: _cohort("research", parentName="org")),
    (
        "nodeLabels with prefixed keys and empty values",
        lambda: _flavor(nodeLabels={"cloud.example.com/pool": "", "tier": "a-b_c.D", "x": "v"}),
    ),
    (
        "taints sharing a key with different effects",
        lambda: _flavor(
            nodeTaints=[
                {"key": "k", "value": "a", "effect": "NoSchedule"},
                {"key": "k", "value": "a", "effect": "NoExecute"},
            ]
        ),
    ),
    (
        "label selector with valid labels",
        lambda: minimal_cq(
            namespaceSelector={
                "matchLabels": {"example.com/team": "a"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["", "gold"]}],
            }
        ),
    ),
]


@pytest.mark.parametrize("manifest", [c[1] for c in VALID], ids=[c[0] for c in VALID])
def test_api_label_rules_accept_valid_names(manifest: Callable[[], Raw]) -> None:
    obj, errors = check_object(manifest())
    assert obj is not None and not errors, [str(e) for e in errors]


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("cpu", True),
        ("nvidia.com/gpu", True),
        ("x" * 63, True),
        (f"{'a' * 253}/{'x' * 63}", True),
        ("x" * 64, False),
        (f"{'a' * 254}/x", False),
        ("a/b/c", False),
        ("/gpu", False),
        ("gpu/", False),
        ("Example.com/gpu", False),
        ("_gpu", False),
        ("gpu-", False),
        (SNOWMAN, False),
        ("", False),
        ("gpu\n", False),
    ],
)
def test_api_qualified_name_as_kubernetes_defines_it(value: str, ok: bool) -> None:
    assert is_qualified_name(value) is ok


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("", True),
        ("a", True),
        ("A-b_c.9", True),
        ("v" * 63, True),
        ("v" * 64, False),
        ("-a", False),
        ("a.", False),
        ("a b", False),
        ("a/b", False),
        ("a\n", False),
    ],
)
def test_api_label_value_as_kubernetes_defines_it(value: str, ok: bool) -> None:
    assert is_label_value(value) is ok
