"""All TAS flavors of a cluster: one FlavorTopology each, fed by one stream of node/pod events.

The operator sees nodes and pods once, not per flavor; this fans them out, and lets a flavor be
redefined (its Topology or nodeLabels edited) without losing the nodes, pods and reservations
it already knows about.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from phalanx.placement.model import GangRequest, Node, Toleration
from phalanx.placement.result import PlacementResult
from phalanx.placement.topology import FlavorTopology

__all__ = ["FlavorTopologies"]


class FlavorTopologies:
    def __init__(self) -> None:
        self._flavors: dict[str, FlavorTopology] = {}
        self._nodes: dict[str, Node] = {}
        self._pods: dict[str, tuple[str, dict[str, int], str | None]] = {}

    def set_flavor(
        self,
        *,
        name: str,
        levels: Sequence[str],
        node_labels: Mapping[str, str] | None = None,
        tolerations: Sequence[Toleration] = (),
    ) -> FlavorTopology:
        """Create or redefine a flavor; raises TopologyError for bad levels (nothing changes)."""
        topo = FlavorTopology(
            name=name, levels=levels, node_labels=node_labels, tolerations=tolerations
        )
        for node in self._nodes.values():
            topo.upsert_node(node)
        for uid, (node_name, requests, gang) in self._pods.items():
            topo.add_pod(uid=uid, node=node_name, requests=requests, gang=gang)
        old = self._flavors.get(name)
        if old is not None:
            for reservation in old.reservations().values():
                topo.restore(reservation)
        self._flavors[name] = topo
        return topo

    def remove_flavor(self, name: str) -> None:
        self._flavors.pop(name, None)

    def has_topology(self, flavor: str) -> bool:
        return flavor in self._flavors

    def get(self, flavor: str) -> FlavorTopology | None:
        return self._flavors.get(flavor)

    def flavors(self) -> tuple[str, ...]:
        return tuple(sorted(self._flavors))

    def upsert_node(self, node: Node) -> None:
        self._nodes[node.name] = node
        for topo in self._flavors.values():
            topo.upsert_node(node)

    def remove_node(self, name: str) -> None:
        self._nodes.pop(name, None)
        for topo in self._flavors.values():
            topo.remove_node(name)

    def add_pod(
        self, *, uid: str, node: str, requests: Mapping[str, int], gang: str | None = None
    ) -> None:
        self._pods[uid] = (node, dict(requests), gang)
        for topo in self._flavors.values():
            topo.add_pod(uid=uid, node=node, requests=requests, gang=gang)

    def remove_pod(self, uid: str) -> None:
        self._pods.pop(uid, None)
        for topo in self._flavors.values():
            topo.remove_pod(uid)

    def place(self, *, flavor: str, gang: GangRequest, explain: bool = True) -> PlacementResult:
        return self._flavor(flavor).place(gang, explain=explain)

    def reserve(self, *, flavor: str, gang: GangRequest, explain: bool = True) -> PlacementResult:
        return self._flavor(flavor).reserve(gang, explain=explain)

    def release(self, *, flavor: str, key: str) -> None:
        topo = self._flavors.get(flavor)
        if topo is not None:
            topo.release(key)

    def _flavor(self, flavor: str) -> FlavorTopology:
        topo = self._flavors.get(flavor)
        if topo is None:
            raise KeyError(f"flavor {flavor!r} has no Topology known to placement")
        return topo
