"""Create, update and remove the KWOK nodes of a topology through the API server.

Nodes carry ``phalanx.dev/devcluster-node=true``; a sync makes that set of nodes exactly the
topology's, so editing the topology file and running ``up`` again reshapes the cluster without
touching nodes anyone else created.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from phalanx.devcluster.http import ApiError, Endpoint
from phalanx.devcluster.topology import MANAGED_LABEL, Topology, node_manifest, node_specs

_NOT_READY_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})


@dataclass(frozen=True)
class NodeSync:
    created: int
    updated: int
    deleted: int


@dataclass(frozen=True)
class NodeCount:
    total: int
    ready: int


def _list_managed(api: Endpoint) -> dict[str, dict[str, Any]]:
    body = api.json("GET", f"/api/v1/nodes?labelSelector={MANAGED_LABEL}%3Dtrue")
    return {item["metadata"]["name"]: item for item in body.get("items", [])}


def sync_nodes(api: Endpoint, topology: Topology) -> NodeSync:
    existing = _list_managed(api)
    created = updated = 0
    wanted: set[str] = set()
    for spec in node_specs(topology):
        manifest = node_manifest(topology, spec)
        wanted.add(spec.name)
        current = existing.get(spec.name)
        if current is None:
            try:
                api.json("POST", "/api/v1/nodes", body=manifest)
                created += 1
            except ApiError as exc:
                if exc.status != 409:
                    raise
            continue
        labels = current["metadata"].get("labels", {})
        want_labels = manifest["metadata"]["labels"]
        want_taints = manifest["spec"]["taints"]
        user_taints = [
            t
            for t in current.get("spec", {}).get("taints", [])
            if t["key"] not in _NOT_READY_TAINTS
        ]
        if any(labels.get(k) != v for k, v in want_labels.items()) or user_taints != want_taints:
            # Keep the lifecycle controller's not-ready taints; replace only the topology's.
            system = [t for t in current.get("spec", {}).get("taints", []) if t not in user_taints]
            patch = {
                "metadata": {"labels": want_labels},
                "spec": {"taints": system + want_taints},
            }
            api.json(
                "PATCH",
                f"/api/v1/nodes/{spec.name}",
                body=patch,
                content_type="application/merge-patch+json",
            )
            updated += 1
        if current.get("status", {}).get("allocatable") != manifest["status"]["allocatable"]:
            api.json(
                "PATCH",
                f"/api/v1/nodes/{spec.name}/status",
                body={"status": manifest["status"]},
                content_type="application/merge-patch+json",
            )
            updated += 1
    deleted = 0
    for name in sorted(set(existing) - wanted):
        api.json("DELETE", f"/api/v1/nodes/{name}")
        deleted += 1
    return NodeSync(created=created, updated=updated, deleted=deleted)


def _is_ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions", [])
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    taints = node.get("spec", {}).get("taints", [])
    return ready and not any(t.get("key") in _NOT_READY_TAINTS for t in taints)


def count_nodes(api: Endpoint) -> NodeCount:
    """All nodes, and those Ready without a not-ready/unreachable taint (schedulable)."""
    items = api.json("GET", "/api/v1/nodes").get("items", [])
    return NodeCount(total=len(items), ready=sum(1 for n in items if _is_ready(n)))


def wait_nodes_ready(api: Endpoint, *, expected: int, timeout: float) -> NodeCount:
    deadline = time.monotonic() + timeout
    count = count_nodes(api)
    while count.ready < expected and time.monotonic() < deadline:
        time.sleep(0.5)
        count = count_nodes(api)
    return count
