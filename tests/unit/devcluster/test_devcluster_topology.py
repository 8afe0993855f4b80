"""Topology files: the shipped default, node manifests, and errors that name the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from phalanx.devcluster.topology import (
    BLOCK_LABEL,
    HOSTNAME_LABEL,
    RACK_LABEL,
    TopologyError,
    load_topology,
    node_manifest,
    node_specs,
    parse_topology,
)

SMALL = Path(__file__).resolve().parents[3] / "devcluster" / "topologies" / "small.yaml"

VALID: dict[str, Any] = {
    "blocks": 1,
    "racksPerBlock": 2,
    "hostsPerRack": 2,
    "node": {
        "allocatable": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti", "pods": "110"},
        "labels": {"pool": "a100"},
        "taints": [{"key": "gpu", "value": "true", "effect": "NoSchedule"}],
    },
}


def test_devcluster_small_topology_is_16_nodes_of_8_gpus() -> None:
    topo = load_topology(SMALL)
    specs = node_specs(topo)
    assert topo.node_count == len(specs) == 16
    assert len({s.rack for s in specs}) == 4 and len({s.block for s in specs}) == 2
    assert topo.allocatable["nvidia.com/gpu"] == 8
    manifest = node_manifest(topo, specs[-1])
    labels = manifest["metadata"]["labels"]
    assert manifest["metadata"]["name"] == "gpu-b1-r1-h3"
    assert labels[BLOCK_LABEL] == "b1"
    assert labels[RACK_LABEL] == "b1-r1"
    assert labels[HOSTNAME_LABEL] == "gpu-b1-r1-h3"
    assert manifest["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert manifest["status"]["allocatable"] == {
        "cpu": "96",
        "memory": "1Ti",
        "nvidia.com/gpu": "8",
        "pods": "110",
    }
    assert manifest["status"]["capacity"] == manifest["status"]["allocatable"]


def test_devcluster_extra_labels_and_taints_reach_the_node() -> None:
    topo = parse_topology(VALID)
    manifest = node_manifest(topo, node_specs(topo)[0])
    assert manifest["metadata"]["labels"]["pool"] == "a100"
    assert manifest["spec"]["taints"] == [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]
    assert [s.name for s in node_specs(topo)] == [
        "gpu-b0-r0-h0",
        "gpu-b0-r0-h1",
        "gpu-b0-r1-h0",
        "gpu-b0-r1-h1",
    ]


def _with(path: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(VALID)
    *parents, last = path.split(".")
    target = data
    for key in parents:
        target = target[key]
    if value is _DELETE:
        del target[last]
    else:
        target[last] = value
    return data


_DELETE = object()


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (_with("blocks", 0), "blocks: must be a positive integer"),
        (_with("racksPerBlock", "2"), "racksPerBlock: must be a positive integer"),
        (_with("hostsPerRack", _DELETE), "hostsPerRack: required"),
        (_with("racks", 3), "racks: unknown field"),
        (_with("namePrefix", "GPU_nodes"), "namePrefix: must be a DNS label"),
        (_with("node", _DELETE), "node: required mapping"),
        (_with("node.gpus", 8), "node.gpus: unknown field"),
        (_with("node.allocatable.cpu", "lots"), "node.allocatable['cpu']:"),
        (_with("node.allocatable.memory", _DELETE), "node.allocatable['memory']: required"),
        (
            _with("node.allocatable", {**VALID["node"]["allocatable"], "big gpu!": "1"}),
            "node.allocatable['big gpu!']: 'big gpu!' is not a valid resource name",
        ),
        (_with("node.labels", ["a"]), "node.labels: must be a mapping"),
        (_with("node.labels", {"bad key!": "x"}), "node.labels['bad key!']: label key"),
        (_with("node.labels", {"ok": "bad value!"}), "node.labels['ok']: value 'bad value!'"),
        (
            _with("node.labels", {RACK_LABEL: "r9"}),
            f"node.labels['{RACK_LABEL}']: is set from the topology",
        ),
        (_with("node.taints", {"key": "x"}), "node.taints: must be a list"),
        (
            _with("node.taints", [{"key": "x", "effect": "Sometimes"}]),
            "node.taints[0].effect: must be one of NoSchedule",
        ),
        (_with("node.taints", [{"effect": "NoSchedule"}]), "node.taints[0].key: required"),
        (
            _with("node.taints", [{"key": "x", "effect": "NoSchedule", "op": "y"}]),
            "node.taints[0].op: unknown field",
        ),
        (_with("blocks", 100) | {"racksPerBlock": 100}, "exceed the limit"),
    ],
)
def test_devcluster_invalid_topology_names_the_field(data: dict[str, Any], expected: str) -> None:
    with pytest.raises(TopologyError) as excinfo:
        parse_topology(data, source="t.yaml")
    assert any(expected in line for line in excinfo.value.errors), excinfo.value.errors
    assert "invalid topology t.yaml" in str(excinfo.value)


def test_devcluster_every_problem_is_reported_at_once() -> None:
    data = _with("blocks", -1)
    data["node"]["allocatable"]["cpu"] = "x"
    data["node"]["taints"] = [{"key": "k", "effect": "Never"}]
    with pytest.raises(TopologyError) as excinfo:
        parse_topology(data)
    assert len(excinfo.value.errors) == 3


def test_devcluster_topology_file_errors(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="not found"):
        load_topology(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("blocks: [1\n")
    with pytest.raises(TopologyError, match="not valid YAML"):
        load_topology(broken)
    doc = tmp_path / "list.yaml"
    doc.write_text(yaml.safe_dump([1, 2]))
    with pytest.raises(TopologyError, match=r"\(root\): must be a mapping"):
        load_topology(doc)


def test_devcluster_kind_config_has_the_same_topology_as_small_yaml() -> None:
    kind = yaml.safe_load((SMALL.parents[2] / "manifests" / "kind" / "cluster.yaml").read_text())
    workers = [n for n in kind["nodes"] if n["role"] == "worker"]
    specs = node_specs(load_topology(SMALL))
    assert len(workers) == len(specs)
    assert sorted((w["labels"][BLOCK_LABEL], w["labels"][RACK_LABEL]) for w in workers) == sorted(
        (s.block, s.rack) for s in specs
    )
