"""Fluent builders for placement tests (Kueue's MakeWorkload(...).Request(...) style)."""

from __future__ import annotations

from phalanx.placement import (
    HOSTNAME_LABEL,
    FlavorTopology,
    GangRequest,
    Node,
    PodSetRequest,
    Taint,
    Toleration,
    TopologyRequest,
)

BLOCK = "cloud.provider.com/topology-block"
RACK = "cloud.provider.com/topology-rack"
HOST = HOSTNAME_LABEL
LEVELS = (BLOCK, RACK, HOST)
GPU = "nvidia.com/gpu"


def node_name(block: int, rack: int, host: int) -> str:
    return f"n-b{block}-r{rack}-h{host}"


def make_node(
    block: int,
    rack: int,
    host: int,
    *,
    gpus: int = 8,
    cpu: int = 96_000,
    taints: tuple[Taint, ...] = (),
    ready: bool = True,
    unschedulable: bool = False,
    extra_labels: dict[str, str] | None = None,
) -> Node:
    name = node_name(block, rack, host)
    labels = {BLOCK: f"b{block}", RACK: f"r{rack}", HOST: name, **(extra_labels or {})}
    return Node(
        name,
        labels,
        {GPU: gpus, "cpu": cpu, "pods": 110},
        taints=taints,
        ready=ready,
        unschedulable=unschedulable,
    )


def make_topology(
    blocks: int = 2, racks: int = 2, hosts: int = 4, *, gpus: int = 8, name: str = "gpu"
) -> FlavorTopology:
    topo = FlavorTopology(name=name, levels=LEVELS)
    for b in range(blocks):
        for r in range(racks):
            for h in range(hosts):
                topo.upsert_node(make_node(b, r, h, gpus=gpus))
    return topo


class GangBuilder:
    def __init__(self, key: str) -> None:
        self.key = key
        self.pod_sets: list[PodSetRequest] = []

    def pod_set(
        self,
        count: int,
        *,
        gpus: int = 8,
        name: str | None = None,
        topology: TopologyRequest | None = None,
        tolerations: tuple[Toleration, ...] = (),
        node_selector: dict[str, str] | None = None,
    ) -> GangBuilder:
        self.pod_sets.append(
            PodSetRequest(
                name or f"ps{len(self.pod_sets)}",
                count,
                {GPU: gpus},
                topology or TopologyRequest(),
                tolerations,
                node_selector or {},
            )
        )
        return self

    def required(self, count: int, level: str = RACK, **kw: object) -> GangBuilder:
        return self.pod_set(count, topology=TopologyRequest.required(level), **kw)  # type: ignore[arg-type]

    def preferred(self, count: int, level: str = RACK, **kw: object) -> GangBuilder:
        return self.pod_set(count, topology=TopologyRequest.preferred(level), **kw)  # type: ignore[arg-type]

    def obj(self) -> GangRequest:
        return GangRequest(self.key, tuple(self.pod_sets))


def gang(key: str = "ns/job") -> GangBuilder:
    return GangBuilder(key)


def fill(topo: FlavorTopology, node: str, gpus: int, uid: str | None = None) -> None:
    """Occupy ``gpus`` on ``node`` with a pod Phalanx did not admit."""
    topo.add_pod(uid=uid or f"filler-{node}-{gpus}", node=node, requests={GPU: gpus})
