"""The generated CRDs are what the API server will accept and what docs/api.md promises."""

from __future__ import annotations

import re
from typing import Any

import celpy
import pytest
import yaml

from phalanx.api.crds import generate_crd, generate_crds
from phalanx.api.kinds import KINDS
from phalanx.api.rulebook import RULES
from phalanx.api.schema import ALLOWED_KEYS

CRDS = {info.kind: generate_crd(info) for info in KINDS}


def schema_of(kind: str) -> dict[str, Any]:
    version = CRDS[kind]["spec"]["versions"][0]
    assert version["name"] == "v1beta2" and version["served"] and version["storage"]
    return version["schema"]["openAPIV3Schema"]


def nodes(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, schema)]
    for name, sub in schema.get("properties", {}).items():
        found += nodes(sub, f"{path}.{name}")
    if "items" in schema:
        found += nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        found += nodes(schema["additionalProperties"], f"{path}{{}}")
    return found


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_api_crd_schema_is_structural(kind):
    for path, node in nodes(schema_of(kind)):
        assert set(node) <= ALLOWED_KEYS, path
        assert "$ref" not in node, path
        assert isinstance(node.get("additionalProperties", {}), dict), path
        if node.get("x-kubernetes-int-or-string"):
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
            assert "type" not in node, path
        elif node.get("x-kubernetes-preserve-unknown-fields"):
            assert node.get("type") == "object", path
        else:
            assert "anyOf" not in node, path
            assert node.get("type") in {"object", "array", "string", "integer", "boolean"}, path
        if node.get("type") == "array":
            assert "items" in node, path
        for key in node.get("required", ()):
            assert key in node["properties"], f"{path} requires missing {key}"


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_api_crd_map_lists_have_required_or_defaulted_keys(kind):
    for path, node in nodes(schema_of(kind)):
        if node.get("x-kubernetes-list-type") == "map":
            item = node["items"]
            for key in node["x-kubernetes-list-map-keys"]:
                assert key in item.get("required", ()) or "default" in item["properties"][key], path
        if node.get("x-kubernetes-list-type") == "set":
            assert node["items"]["type"] in {"string", "integer"}, path


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_api_crd_lists_and_strings_seen_by_cel_are_bounded(kind):
    # The API server prices each rule by the largest list and string it may walk, and
    # refuses a CRD over budget: every list and string a rule names needs maxItems and
    # maxLength (or an enum).
    for path, node in nodes(schema_of(kind)):
        for validation in node.get("x-kubernetes-validations", ()):
            # has() and size() of a plain field cost O(1): they read no content.
            walked = re.sub(r"(has|size)\([\w.]+\)", "", validation["rule"])
            named = set(re.findall(r"\.([A-Za-z]+)", walked))
            for sub_path, sub in nodes(node, path):
                if re.sub(r"\[\]$", "", sub_path).rsplit(".", 1)[-1] not in named:
                    continue
                if sub.get("type") == "array":
                    assert "maxItems" in sub, f"{sub_path} in {validation['rule']}"
                if sub.get("type") == "string":
                    assert "maxLength" in sub or "enum" in sub, (
                        f"{sub_path} in {validation['rule']}"
                    )


def test_api_every_cel_rule_is_in_a_crd_once_and_compiles():
    placed: list[tuple[str, str]] = []
    for kind in CRDS:
        for _path, node in nodes(schema_of(kind)):
            placed += [(v["rule"], v["message"]) for v in node.get("x-kubernetes-validations", ())]
    expected = {(r.cel, r.message) for r in RULES if r.cel}
    assert set(placed) == expected
    env = celpy.Environment()
    for rule, _message in placed:
        env.compile(rule)


def test_api_rule_field_paths_exist():
    for kind in CRDS:
        for path, node in nodes(schema_of(kind)):
            for rule in node.get("x-kubernetes-validations", ()):
                if "fieldPath" not in rule:
                    continue
                target = node
                for field in rule["fieldPath"].lstrip(".").split("."):
                    where = f"{kind}{path}: {rule['fieldPath']}"
                    assert field in target.get("properties", {}), where
                    target = target["properties"][field]


def _json_path_exists(schema: dict[str, Any], json_path: str) -> bool:
    node = schema
    for part in re.findall(r"\.([A-Za-z]+)(\[\?\(@\.type=='\w+'\)\])?", json_path):
        name, selector = part
        if name == "creationTimestamp" and node is schema["properties"]["metadata"]:
            return True  # metadata's schema is the API server's own
        properties = node.get("properties", {})
        if name not in properties:
            return False
        node = properties[name]
        if selector:
            if node.get("type") != "array" or "type" not in node["items"].get("properties", {}):
                return False
            node = node["items"]
    return True


def test_api_printer_columns_are_designs_and_point_into_the_schema():
    columns = {
        kind: [
            (c["name"], c["jsonPath"], c.get("priority", 0))
            for c in crd["spec"]["versions"][0].get("additionalPrinterColumns", ())
        ]
        for kind, crd in CRDS.items()
    }
    assert columns["ClusterQueue"] == [
        ("Cohort", ".spec.cohortName", 0),
        ("Strategy", ".spec.queueingStrategy", 1),
        ("Pending Workloads", ".status.pendingWorkloads", 0),
        ("Admitted Workloads", ".status.admittedWorkloads", 1),
    ]
    assert columns["LocalQueue"] == [
        ("ClusterQueue", ".spec.clusterQueue", 0),
        ("Pending Workloads", ".status.pendingWorkloads", 0),
        ("Admitted Workloads", ".status.admittedWorkloads", 0),
    ]
    assert [c[0] for c in columns["Workload"]] == [
        "Queue",
        "Reserved in",
        "Admitted",
        "Finished",
        "Age",
    ]
    assert columns["WorkloadPriorityClass"] == [("Value", ".value", 0)]
    for kind, cols in columns.items():
        for _name, json_path, _priority in cols:
            assert _json_path_exists(schema_of(kind), json_path), f"{kind}: {json_path}"


def test_api_crd_names_scopes_and_subresources():
    facts = {
        kind: (
            crd["metadata"]["name"],
            crd["spec"]["scope"],
            tuple(crd["spec"]["names"]["shortNames"]),
            "subresources" in crd["spec"]["versions"][0],
        )
        for kind, crd in CRDS.items()
    }
    assert facts == {
        "ClusterQueue": ("clusterqueues.kueue.x-k8s.io", "Cluster", ("cq",), True),
        "LocalQueue": ("localqueues.kueue.x-k8s.io", "Namespaced", ("queue", "queues", "lq"), True),
        "Workload": (
            "workloads.kueue.x-k8s.io",
            "Namespaced",
            ("kwl", "kueueworkload", "kueueworkloads"),
            True,
        ),
        "ResourceFlavor": (
            "resourceflavors.kueue.x-k8s.io",
            "Cluster",
            ("flavor", "flavors", "rf"),
            False,
        ),
        "Cohort": ("cohorts.kueue.x-k8s.io", "Cluster", ("co",), True),
        "AdmissionCheck": ("admissionchecks.kueue.x-k8s.io", "Cluster", ("ac",), True),
        "ProvisioningRequestConfig": (
            "provisioningrequestconfigs.kueue.x-k8s.io",
            "Cluster",
            ("prc",),
            False,
        ),
        "Topology": ("topologies.kueue.x-k8s.io", "Cluster", ("topo",), False),
        "WorkloadPriorityClass": (
            "workloadpriorityclasses.kueue.x-k8s.io",
            "Cluster",
            ("wpc",),
            False,
        ),
    }
    for crd in CRDS.values():
        assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
        assert crd["spec"]["group"] == "kueue.x-k8s.io"


def test_api_crd_details_kueue_clients_rely_on():
    cq = schema_of("ClusterQueue")["properties"]["spec"]["properties"]
    assert cq["queueingStrategy"]["default"] == "BestEffortFIFO"
    assert cq["queueingStrategy"]["enum"] == ["StrictFIFO", "BestEffortFIFO"]
    assert cq["stopPolicy"] == {
        **cq["stopPolicy"],
        "default": "None",
        "enum": ["None", "Hold", "HoldAndDrain"],
    }
    assert cq["resourceGroups"]["maxItems"] == 16
    quota = cq["resourceGroups"]["items"]["properties"]["flavors"]["items"]["properties"][
        "resources"
    ]["items"]
    assert quota["properties"]["nominalQuota"]["x-kubernetes-int-or-string"] is True
    assert quota["required"] == ["name", "nominalQuota"]
    template = schema_of("Workload")["properties"]["spec"]["properties"]["podSets"]["items"][
        "properties"
    ]["template"]
    assert template == {**template, "type": "object", "x-kubernetes-preserve-unknown-fields": True}
    assert schema_of("WorkloadPriorityClass")["required"] == ["value"]


def test_api_crd_files_are_single_documents_with_a_header():
    for name, text in generate_crds().items():
        assert name.startswith("kueue.x-k8s.io_") and name.endswith(".yaml")
        assert text.startswith("# Generated by `phalanx crds`")
        docs = [d for d in yaml.safe_load_all(text) if d]
        assert len(docs) == 1 and docs[0]["kind"] == "CustomResourceDefinition"
        assert "&id" not in text  # no YAML anchors
