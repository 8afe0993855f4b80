"""The admission core's ``PlacementOracle``, backed by one ``FlavorTopology`` per TAS flavor.

The operator keeps these current from its informers: every Node, and every pod bound to a
node (a pod of a gang Phalanx placed carries the ``kueue.x-k8s.io/workload`` annotation, so
its usage is counted once, through the gang's reservation). When a ResourceFlavor or Topology
changes, the flavor's tree is rebuilt from the cached nodes and pods and its reservations
are carried over.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from phalanx.admission.model import ResourceFlavor
from phalanx.admission.topology_adapter import TopologyPlacement
from phalanx.api import convert
from phalanx.placement import (
    FlavorTopology,
    Node,
    TopologyError,
    decode_topology_assignment,
)

__all__ = ["TopologyOracle"]

logger = logging.getLogger(__name__)

WORKLOAD_ANNOTATION = "kueue.x-k8s.io/workload"
PodRecord = tuple[str, dict[str, int], str | None]  # node, requests, gang key


class TopologyOracle(TopologyPlacement):
    """The placement trees of the cluster's TAS flavors, fed by the operator; the admission
    core places, reserves and releases through ``TopologyPlacement``, shared with the bench."""

    def __init__(self, *, balanced_placement: bool = False) -> None:
        super().__init__(self, balanced_placement=balanced_placement)
        self.flavors: dict[str, FlavorTopology] = {}
        self.errors: dict[str, str] = {}
        """flavor -> why it has no placement tree (e.g. its Topology is missing or invalid)."""
        self._sources: dict[str, tuple[tuple[str, ...], ResourceFlavor]] = {}
        self._nodes: dict[str, Node] = {}
        self._pods: dict[str, PodRecord] = {}

    # -- configuration --------------------------------------------------------------------------

    def configure(
        self, flavors: Mapping[str, ResourceFlavor], topologies: Mapping[str, Sequence[str]]
    ) -> None:
        """(Re)build the trees of flavors whose Topology or node selection changed."""
        wanted: dict[str, tuple[tuple[str, ...], ResourceFlavor]] = {}
        self.errors.clear()
        for name, flavor in flavors.items():
            if flavor.topology_name is None:
                continue
            levels = topologies.get(flavor.topology_name)
            if levels is None:
                self.errors[name] = f"Topology {flavor.topology_name} does not exist"
                continue
            wanted[name] = (tuple(levels), flavor)
        for name in list(self.flavors):
            if name not in wanted:
                del self.flavors[name]
                self._sources.pop(name, None)
        for name, (levels, flavor) in wanted.items():
            current = self.flavors.get(name)
            if current is not None and self._sources.get(name) == (levels, flavor):
                continue
            try:
                tree = FlavorTopology(
                    name=name,
                    levels=levels,
                    node_labels=flavor.node_labels,
                    tolerations=flavor.tolerations,
                )
            except TopologyError as error:
                self.errors[name] = str(error)
                self.flavors.pop(name, None)
                continue
            self._sources[name] = (levels, flavor)
            for node in self._nodes.values():
                tree.upsert_node(node)
            for uid, (node_name, requests, gang) in self._pods.items():
                tree.add_pod(uid=uid, node=node_name, requests=requests, gang=gang)
            if current is not None:
                for reservation in current.reservations().values():
                    try:
                        tree.restore(reservation)
                    except ValueError as error:
                        logger.warning(
                            "event=reservation_dropped flavor=%s key=%s error=%r",
                            name,
                            reservation.key,
                            str(error),
                        )
            self.flavors[name] = tree

    # -- nodes and pods -------------------------------------------------------------------------

    def upsert_node(self, obj: Mapping[str, Any]) -> None:
        node = convert.node(obj)
        self._nodes[node.name] = node
        for tree in self.flavors.values():
            tree.upsert_node(node)

    def remove_node(self, name: str) -> None:
        if self._nodes.pop(name, None) is not None:
            for tree in self.flavors.values():
                tree.remove_node(name)

    def upsert_pod(self, obj: Mapping[str, Any]) -> None:
        usage = convert.pod_usage(obj)
        uid = obj["metadata"]["uid"]
        if usage is None:
            self.remove_pod(uid)
            return
        _, node, requests = usage
        annotations = obj["metadata"].get("annotations") or {}
        workload = annotations.get(WORKLOAD_ANNOTATION)
        gang = f"{obj['metadata']['namespace']}/{workload}" if workload else None
        record = (node, requests, gang)
        if self._pods.get(uid) == record:
            return
        self._pods[uid] = record
        for tree in self.flavors.values():
            tree.add_pod(uid=uid, node=node, requests=requests, gang=gang)

    def remove_pod(self, uid: str) -> None:
        if self._pods.pop(uid, None) is not None:
            for tree in self.flavors.values():
                tree.remove_pod(uid)

    # -- TopologyLookup (what ``TopologyPlacement`` asks) -----------------------------------------

    def has_topology(self, flavor: str) -> bool:
        return flavor in self.flavors

    def get(self, flavor: str) -> FlavorTopology | None:
        return self.flavors.get(flavor)

    # -- restart ----------------------------------------------------------------------------------

    def restore(
        self,
        *,
        key: str,
        flavor: str,
        pod_sets: Sequence[tuple[Mapping[str, int], Mapping[str, Any]]],
    ) -> None:
        """Re-hold an admitted workload's placement from its ``topologyAssignment``s:
        (per-pod requests, assignment as written in ``status.admission``) per pod set."""
        tree = self.flavors.get(flavor)
        if tree is None or tree.is_reserved(key):
            return
        decoded = []
        for requests, assignment in pod_sets:
            _, domains = decode_topology_assignment(assignment)
            decoded.append((requests, domains))
        try:
            tree.restore(tree.reservation_from_assignments(key, decoded))
        except ValueError as error:
            logger.warning(
                "event=restore_failed flavor=%s key=%s error=%r", flavor, key, str(error)
            )
