"""The topology of a TAS scenario: its nodes, Topology and the check of what was placed.

Kueue's generator (``test/performance/scheduler/runner/generator/topology_generator.go``)
builds, for each combination of level indexes, a node ``node-b0-r2-n15`` (the first letter of
each level's name and its index) labelled ``{level.nodeLabel}: {level.name}-{index}`` at
every level, ``tas-node-group: tas`` (the flavor's node label), Kueue's cleanup label, and
the last level's capacity as allocatable (cpu 96 and memory 256Gi unless given, 110 pods).
One deviation: Kueue's last level labels ``kubernetes.io/hostname`` with ``node-15``, the
same value in every rack; here it is the node's own name, as the label means, because a
``topologyAssignment`` whose lowest level is the hostname names its nodes by that value
alone.

:class:`AssignmentChecker` judges each admitted TAS Workload's ``topologyAssignment``
against the nodes the bench created: every pod placed, the required level (and each slice's
level) one domain, and no node holding more CPU or pods than it has.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from phalanx.devcluster.topology import KWOK_ANNOTATION, KWOK_ANNOTATION_VALUE
from phalanx.placement import HOSTNAME_LABEL, TopologyMode, TopologyRequest
from phalanx.placement.encoding import decode_topology_assignment
from phalanx.quotas.quantity import format_quantity, parse_quantity

__all__ = [
    "FLAVOR_LABEL_VALUE",
    "AssignmentChecker",
    "Demand",
    "PlannedNode",
    "TopologyLevel",
    "TopologySpec",
    "node_object",
    "plan_nodes",
    "topology_object",
    "topology_request_object",
]

FLAVOR_LABEL_VALUE = "tas"
"""Kueue's generator labels the TAS nodes, and selects them in the flavor, with this value."""
PODS_PER_NODE = 110
DEFAULT_CAPACITY = {"cpu": "96", "memory": "256Gi"}
API = "kueue.x-k8s.io/v1beta2"


@dataclass(frozen=True, slots=True)
class TopologyLevel:
    name: str
    count: int
    node_label: str
    capacity: Mapping[str, int] = field(default_factory=dict)
    """Base units per resource (milli-CPU, bytes); only the last level's is used."""


@dataclass(frozen=True, slots=True)
class TopologySpec:
    """The ``topology:`` and ``resourceFlavor:`` blocks of a TAS scenario."""

    name: str
    levels: tuple[TopologyLevel, ...]
    flavor: str
    flavor_node_label: str

    @property
    def node_count(self) -> int:
        count = 1
        for level in self.levels:
            count *= level.count
        return count


@dataclass(frozen=True, slots=True)
class PlannedNode:
    name: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, int]
    """Base units per resource."""


def plan_nodes(spec: TopologySpec) -> list[PlannedNode]:
    """Every node of ``spec``, in Kueue's generator order (block, then rack, then node)."""
    capacity = {
        res: parse_quantity(amount, resource=res) for res, amount in DEFAULT_CAPACITY.items()
    }
    capacity.update(spec.levels[-1].capacity)
    capacity.setdefault("pods", PODS_PER_NODE)
    nodes = []
    for path in itertools.product(*(range(level.count) for level in spec.levels)):
        name = "node-" + "-".join(
            f"{level.name[0]}{index}" for level, index in zip(spec.levels, path, strict=True)
        )
        labels = {
            level.node_label: f"{level.name}-{index}"
            for level, index in zip(spec.levels, path, strict=True)
        }
        labels[HOSTNAME_LABEL] = name
        labels[spec.flavor_node_label] = FLAVOR_LABEL_VALUE
        nodes.append(PlannedNode(name=name, labels=labels, allocatable=dict(capacity)))
    return nodes


def node_object(node: PlannedNode, *, extra_labels: Mapping[str, str]) -> dict[str, Any]:
    """The Node as KWOK manages it (its annotation), allocatable = capacity."""
    resources = {
        res: format_quantity(amount, resource=res)
        for res, amount in sorted(node.allocatable.items())
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": {**extra_labels, **node.labels, "type": "kwok"},
            "annotations": {
                KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE,
                "node.alpha.kubernetes.io/ttl": "0",
            },
        },
        "spec": {},
        "status": {"allocatable": resources, "capacity": dict(resources)},
    }


def topology_object(spec: TopologySpec, *, labels: Mapping[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "Topology",
        "metadata": {"name": spec.name, "labels": dict(labels)},
        "spec": {"levels": [{"nodeLabel": level.node_label} for level in spec.levels]},
    }


def topology_request_object(request: TopologyRequest) -> dict[str, Any]:
    """A pod set's ``topologyRequest`` as Kueue's generator writes it: ``required`` or
    ``preferred`` at the level; "balanced" is ``podSetSliceRequiredTopology`` with
    ``podSetSliceSize`` alone."""
    out: dict[str, Any] = {}
    if request.mode is TopologyMode.REQUIRED:
        out["required"] = request.level
    elif request.mode is TopologyMode.PREFERRED:
        out["preferred"] = request.level
    if request.slice_level is not None:
        out["podSetSliceRequiredTopology"] = request.slice_level
    if request.slice_size is not None:
        out["podSetSliceSize"] = request.slice_size
    return out


@dataclass(frozen=True, slots=True)
class Demand:
    """What one Workload asks of the topology (its single pod set ``main``)."""

    pods: int
    cpu: int
    """Per pod, milli-CPU."""
    request: TopologyRequest


class AssignmentChecker:
    """Fed with the Workload watch (``on_workload``, ``on_workload_list``); thread safe.

    A Workload counts on its nodes from the first version seen reserved until one seen
    not reserved (finished, evicted, deleted), as the API ordered them; the operator admits
    only after it saw the capacity freed, so at no event may a node hold more than it has.
    """

    def __init__(self, nodes: Sequence[PlannedNode], demands: Mapping[str, Demand]) -> None:
        self._lock = threading.Lock()
        self._nodes = {n.labels[HOSTNAME_LABEL]: n for n in nodes}
        self._demands = dict(demands)
        self._held: dict[str, dict[str, int]] = {}  # workload key -> node -> pods
        self._used: dict[str, dict[str, int]] = {}  # node -> {"pods": n, "cpu": milli-CPU}
        self.problems: list[str] = []
        self.checked = 0
        """Reservations whose assignment was judged."""

    def on_workload(self, event_type: str, obj: Mapping[str, Any]) -> None:
        with self._lock:
            key, admission = _reserved(obj)
            if event_type == "DELETED" or admission is None:
                self._release(key)
            elif key not in self._held:
                self._reserve(key, admission)

    def on_workload_list(self, objects: Sequence[Mapping[str, Any]]) -> None:
        """A relist replaces the view: only what it shows reserved holds nodes."""
        with self._lock:
            listed = [_reserved(obj) for obj in objects]
            reserved = {key for key, admission in listed if admission is not None}
            for key in set(self._held) - reserved:
                self._release(key)
            for key, admission in listed:
                if admission is not None and key not in self._held:
                    self._reserve(key, admission)

    def _release(self, key: str) -> None:
        cpu = self._demands[key].cpu if key in self._demands else 0
        for node, pods in self._held.pop(key, {}).items():
            used = self._used[node]
            used["pods"] -= pods
            used["cpu"] -= pods * cpu

    def _reserve(self, key: str, admission: Mapping[str, Any]) -> None:
        demand = self._demands.get(key)
        if demand is None:
            return
        self.checked += 1
        psa = next(
            (p for p in admission.get("podSetAssignments") or () if p.get("name") == "main"),
            None,
        )
        raw = (psa or {}).get("topologyAssignment")
        if not raw:
            self.problems.append(f"tas {key}: admitted without a topologyAssignment")
            return
        try:
            levels, domains = decode_topology_assignment(raw)
        except (ValueError, KeyError, TypeError) as error:
            self.problems.append(f"tas {key}: unreadable topologyAssignment: {error}")
            return
        if levels[-1] != HOSTNAME_LABEL:
            self.problems.append(
                f"tas {key}: topologyAssignment levels {list(levels)} do not end at"
                f" {HOSTNAME_LABEL}, the lowest level of the scenario's Topology"
            )
            return
        pods_on: list[str] = []  # pod index -> node
        for values, count in domains:
            node = self._nodes.get(values[-1])
            if node is None:
                self.problems.append(f"tas {key}: assigned to {values[-1]!r}, not a scenario node")
                return
            pods_on.extend([node.name] * count)
        if len(pods_on) != demand.pods:
            self.problems.append(
                f"tas {key}: topologyAssignment places {len(pods_on)} pods of {demand.pods}"
            )
        self._check_levels(key, demand.request, pods_on)
        held: dict[str, int] = {}
        for name in pods_on:
            held[name] = held.get(name, 0) + 1
        self._held[key] = held
        for name, pods in held.items():
            used = self._used.setdefault(name, {"pods": 0, "cpu": 0})
            used["pods"] += pods
            used["cpu"] += pods * demand.cpu
            allocatable = self._nodes[name].allocatable
            for res, amount in used.items():
                if res in allocatable and amount > allocatable[res]:
                    self.problems.append(
                        f"tas {key}: node {name} holds {res} {amount} > allocatable"
                        f" {allocatable[res]}"
                    )

    def _check_levels(self, key: str, request: TopologyRequest, pods_on: list[str]) -> None:
        def domains(level: str, nodes: Sequence[str]) -> set[str]:
            return {self._nodes[n].labels.get(level, "") for n in nodes}

        if request.mode is TopologyMode.REQUIRED and request.level is not None:
            found = domains(request.level, pods_on)
            if len(found) > 1:
                self.problems.append(
                    f"tas {key}: required {request.level} but placed in {sorted(found)}"
                )
        if request.slice_level is not None and request.slice_size:
            size = request.slice_size
            for start in range(0, len(pods_on), size):
                found = domains(request.slice_level, pods_on[start : start + size])
                if len(found) > 1:
                    self.problems.append(
                        f"tas {key}: slice of pods {start}-{start + size - 1} must be in one"
                        f" {request.slice_level} but is in {sorted(found)}"
                    )

    def snapshot(self) -> tuple[int, list[str]]:
        with self._lock:
            return self.checked, list(self.problems)


def _reserved(obj: Mapping[str, Any]) -> tuple[str, Mapping[str, Any] | None]:
    """(namespace/name, its admission while it holds quota and has not finished, else None)."""
    metadata = obj.get("metadata") or {}
    key = f"{metadata.get('namespace')}/{metadata.get('name')}"
    status = obj.get("status") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or ()}
    admission = status.get("admission")
    if (
        conditions.get("QuotaReserved") == "True"
        and conditions.get("Finished") != "True"
        and isinstance(admission, dict)
        and admission
    ):
        return key, admission
    return key, None
