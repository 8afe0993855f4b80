"""The devcluster's GPU topology file: blocks x racks x hosts of identical KWOK nodes.

The file describes the physical shape Phalanx's placement works on (see docs/devcluster.md)::

    blocks: 2             # cloud.provider.com/topology-block = b0, b1, ...
    racksPerBlock: 2      # cloud.provider.com/topology-rack  = b0-r0, b0-r1, ...
    hostsPerRack: 4       # kubernetes.io/hostname           = <namePrefix>-b0-r0-h0, ...
    namePrefix: gpu       # optional, default "gpu"
    node:
      allocatable: {nvidia.com/gpu: "8", cpu: "96", memory: 1Ti, pods: "110"}
      labels: {}          # optional extra node labels
      taints: []          # optional [{key, value, effect}]

Every problem is reported at once, each naming its field path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from phalanx.quotas.quantity import QuantityError, format_quantity, parse_quantity

BLOCK_LABEL = "cloud.provider.com/topology-block"
RACK_LABEL = "cloud.provider.com/topology-rack"
HOSTNAME_LABEL = "kubernetes.io/hostname"
# Marks nodes this tool manages, so a changed topology can remove the nodes it no longer has.
MANAGED_LABEL = "phalanx.dev/devcluster-node"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"

REQUIRED_RESOURCES = ("nvidia.com/gpu", "cpu", "memory", "pods")
_RESERVED_LABELS = frozenset({BLOCK_LABEL, RACK_LABEL, HOSTNAME_LABEL, MANAGED_LABEL})
_TOP_KEYS = frozenset({"blocks", "racksPerBlock", "hostsPerRack", "namePrefix", "node"})
_NODE_KEYS = frozenset({"allocatable", "labels", "taints"})
_TAINT_KEYS = frozenset({"key", "value", "effect"})
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_MAX_NODES = 5000

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class TopologyError(ValueError):
    """An invalid topology file; ``errors`` holds one ``path: message`` line per problem."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source = source
        self.errors = tuple(errors)
        lines = "\n".join(f"  {e}" for e in errors)
        super().__init__(f"invalid topology {source}:\n{lines}")


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str = ""


@dataclass(frozen=True)
class Topology:
    blocks: int
    racks_per_block: int
    hosts_per_rack: int
    allocatable: dict[str, int]
    name_prefix: str = "gpu"
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()

    @property
    def node_count(self) -> int:
        return self.blocks * self.racks_per_block * self.hosts_per_rack


@dataclass(frozen=True)
class NodeSpec:
    """One KWOK node: its name and topology domain."""

    name: str
    block: str
    rack: str


def _label_key_error(key: str) -> str | None:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _LABEL_PREFIX.match(prefix)):
        return f"label key {key!r} has an invalid prefix (a DNS subdomain)"
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        return f"label key {key!r} is invalid (name part: <=63 alphanumerics, '-', '_', '.')"
    return None


def _positive_int(data: dict[str, Any], key: str, errors: list[str]) -> int:
    value = data.get(key)
    if value is None:
        errors.append(f"{key}: required (a positive integer)")
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        errors.append(f"{key}: must be a positive integer, got {value!r}")
        return 0
    return value


def _parse_labels(raw: Any, errors: list[str]) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        errors.append(f"node.labels: must be a mapping of label key to value, got {raw!r}")
        return {}
    labels: dict[str, str] = {}
    for key, value in raw.items():
        path = f"node.labels[{key!r}]"
        problem = _label_key_error(str(key))
        if problem:
            errors.append(f"{path}: {problem}")
        elif key in _RESERVED_LABELS:
            errors.append(f"{path}: is set from the topology; remove it from node.labels")
        elif not isinstance(value, str | int) or isinstance(value, bool):
            errors.append(f"{path}: value must be a string, got {value!r}")
        elif len(str(value)) > 63 or not _LABEL_VALUE.match(str(value)):
            errors.append(f"{path}: value {value!r} is not a valid label value")
        else:
            labels[str(key)] = str(value)
    return labels


def _parse_taints(raw: Any, errors: list[str]) -> tuple[Taint, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        errors.append(f"node.taints: must be a list of {{key, value, effect}}, got {raw!r}")
        return ()
    taints: list[Taint] = []
    for index, item in enumerate(raw):
        path = f"node.taints[{index}]"
        if not isinstance(item, dict):
            errors.append(f"{path}: must be a mapping with key, value, effect")
            continue
        for unknown in sorted(set(item) - _TAINT_KEYS):
            errors.append(f"{path}.{unknown}: unknown field (allowed: key, value, effect)")
        key = item.get("key")
        effect = item.get("effect")
        value = item.get("value", "")
        if not isinstance(key, str) or _label_key_error(key):
            errors.append(f"{path}.key: required, a valid label key, got {key!r}")
        if effect not in _EFFECTS:
            errors.append(f"{path}.effect: must be one of {', '.join(_EFFECTS)}, got {effect!r}")
        if not isinstance(value, str) or not _LABEL_VALUE.match(value):
            errors.append(f"{path}.value: must be a valid label value, got {value!r}")
        if isinstance(key, str) and isinstance(effect, str) and isinstance(value, str):
            taints.append(Taint(key=key, effect=effect, value=value))
    return tuple(taints)


def _parse_allocatable(raw: Any, errors: list[str]) -> dict[str, int]:
    if not isinstance(raw, dict):
        errors.append("node.allocatable: required mapping with " + ", ".join(REQUIRED_RESOURCES))
        return {}
    amounts: dict[str, int] = {}
    for resource in REQUIRED_RESOURCES:
        if resource not in raw:
            errors.append(f"node.allocatable[{resource!r}]: required")
    for resource, text in raw.items():
        path = f"node.allocatable[{resource!r}]"
        if _label_key_error(str(resource)):
            errors.append(f"{path}: {resource!r} is not a valid resource name")
            continue
        try:
            amount = parse_quantity(str(text), resource=str(resource))
        except QuantityError as exc:
            errors.append(f"{path}: {exc}")
            continue
        if amount < 0:
            errors.append(f"{path}: must not be negative, got {text!r}")
            continue
        amounts[str(resource)] = amount
    return amounts


def parse_topology(data: Any, *, source: str = "<topology>") -> Topology:
    """Validate a loaded topology document; raise ``TopologyError`` listing every problem."""
    errors: list[str] = []
    if not isinstance(data, dict):
        raise TopologyError(source, ["(root): must be a mapping with blocks, racksPerBlock, ..."])
    for unknown in sorted(set(data) - _TOP_KEYS):
        errors.append(f"{unknown}: unknown field (allowed: {', '.join(sorted(_TOP_KEYS))})")
    blocks = _positive_int(data, "blocks", errors)
    racks = _positive_int(data, "racksPerBlock", errors)
    hosts = _positive_int(data, "hostsPerRack", errors)
    if blocks and racks and hosts and blocks * racks * hosts > _MAX_NODES:
        errors.append(f"blocks: {blocks * racks * hosts} nodes exceed the limit of {_MAX_NODES}")
    prefix = data.get("namePrefix", "gpu")
    if not isinstance(prefix, str) or not _DNS_LABEL.match(prefix) or len(prefix) > 40:
        errors.append(f"namePrefix: must be a DNS label of at most 40 characters, got {prefix!r}")
    node = data.get("node")
    if not isinstance(node, dict):
        errors.append("node: required mapping with allocatable (and optional labels, taints)")
        node = {}
    for unknown in sorted(set(node) - _NODE_KEYS):
        errors.append(f"node.{unknown}: unknown field (allowed: allocatable, labels, taints)")
    allocatable = _parse_allocatable(node.get("allocatable"), errors)
    labels = _parse_labels(node.get("labels"), errors)
    taints = _parse_taints(node.get("taints"), errors)
    if errors:
        raise TopologyError(source, errors)
    return Topology(
        blocks=blocks,
        racks_per_block=racks,
        hosts_per_rack=hosts,
        allocatable=allocatable,
        name_prefix=str(prefix),
        labels=labels,
        taints=taints,
    )


def load_topology(path: Path) -> Topology:
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise TopologyError(str(path), ["(file): not found"]) from exc
    except yaml.YAMLError as exc:
        raise TopologyError(str(path), [f"(file): not valid YAML: {exc}"]) from exc
    return parse_topology(data, source=str(path))


def node_specs(topology: Topology) -> list[NodeSpec]:
    """Every node in block, rack, host order."""
    specs: list[NodeSpec] = []
    for b in range(topology.blocks):
        block = f"b{b}"
        for r in range(topology.racks_per_block):
            rack = f"{block}-r{r}"
            for h in range(topology.hosts_per_rack):
                name = f"{topology.name_prefix}-{rack}-h{h}"
                specs.append(NodeSpec(name=name, block=block, rack=rack))
    return specs


def node_manifest(topology: Topology, spec: NodeSpec) -> dict[str, Any]:
    """The Node object KWOK will manage: labels, taints, and allocatable = capacity."""
    resources = {
        name: format_quantity(amount, resource=name)
        for name, amount in sorted(topology.allocatable.items())
    }
    labels = {
        **topology.labels,
        "type": "kwok",
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        BLOCK_LABEL: spec.block,
        RACK_LABEL: spec.rack,
        HOSTNAME_LABEL: spec.name,
        MANAGED_LABEL: "true",
    }
    manifest: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": labels,
            "annotations": {
                KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE,
                "node.alpha.kubernetes.io/ttl": "0",
            },
        },
        "spec": {
            "taints": [
                {"key": t.key, "value": t.value, "effect": t.effect} for t in topology.taints
            ]
        },
        "status": {"allocatable": resources, "capacity": dict(resources)},
    }
    return manifest
