"""The dashboard's page data, built from the API objects by pure functions.

Everything the browser shows comes from :func:`build_view` (the live sections) and
:func:`workload_detail` (one Workload's page): plain dicts of ClusterQueues, LocalQueues,
Cohorts, Workloads, Nodes and Topologies as the API server returns them in, JSON-ready data
out. What a viewer may see is decided by the caller and passed in as ``can_read`` (a namespace
predicate) and ``cluster_scoped`` (whether it may list ClusterQueues); nothing here does I/O.

Updates are coalesced by :class:`Coalescer` (at most one push per interval, however many
events arrived) and sent as :func:`diff` of two views: only the sections that changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from phalanx.quotas.quantity import QuantityError, format_quantity, parse_quantity

__all__ = [
    "GPU",
    "PENDING_ROWS",
    "Coalescer",
    "Filter",
    "Objects",
    "build_view",
    "diff",
    "namespaces_of",
    "workload_detail",
    "workload_state",
]

GPU = "nvidia.com/gpu"
PENDING_ROWS = 500
"""At most this many pending rows are sent (after the viewer's filter); the total is sent too."""

Obj = Mapping[str, Any]


@dataclass
class Objects:
    """The watched objects, each kind keyed by ``namespace/name`` (or ``name``)."""

    cluster_queues: dict[str, Obj] = field(default_factory=dict)
    local_queues: dict[str, Obj] = field(default_factory=dict)
    cohorts: dict[str, Obj] = field(default_factory=dict)
    workloads: dict[str, Obj] = field(default_factory=dict)
    nodes: dict[str, Obj] = field(default_factory=dict)
    topologies: dict[str, Obj] = field(default_factory=dict)
    flavors: dict[str, Obj] = field(default_factory=dict)


@dataclass(frozen=True)
class Filter:
    """The pending list's search (substring of namespace/name, queue or reason) and queue."""

    text: str = ""
    cluster_queue: str = ""
    namespace: str = ""


# -- small readers ------------------------------------------------------------------------------


def _meta(obj: Obj) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _name(obj: Obj) -> str:
    return str(_meta(obj).get("name") or "")


def _namespace(obj: Obj) -> str:
    return str(_meta(obj).get("namespace") or "")


def _conditions(obj: Obj) -> list[Mapping[str, Any]]:
    return list((obj.get("status") or {}).get("conditions") or ())


def _condition(obj: Obj, kind: str) -> Mapping[str, Any] | None:
    return next((c for c in _conditions(obj) if c.get("type") == kind), None)


def _true(obj: Obj, kind: str) -> bool:
    found = _condition(obj, kind)
    return found is not None and found.get("status") == "True"


def _amount(value: Any, resource: str) -> int:
    try:
        return parse_quantity(value if isinstance(value, int) else str(value), resource=resource)
    except QuantityError:
        return 0


def _show(value: int, resource: str) -> str:
    return format_quantity(value, resource=resource)


def workload_state(workload: Obj) -> str:
    """PENDING, QUOTA_RESERVED, ADMITTED or FINISHED (as ``phalanx list workload`` says)."""
    if _true(workload, "Finished"):
        return "FINISHED"
    if _true(workload, "Admitted"):
        return "ADMITTED"
    if _true(workload, "QuotaReserved"):
        return "QUOTA_RESERVED"
    return "PENDING"


def _reason(workload: Obj) -> str:
    found = _condition(workload, "QuotaReserved")
    if found is not None and found.get("status") == "False":
        return str(found.get("message") or found.get("reason") or "")
    for kind in ("Evicted", "Requeued"):
        found = _condition(workload, kind)
        if found is not None and found.get("status") == "True":
            return str(found.get("message") or found.get("reason") or "")
    return ""


def _cluster_queue_of(workload: Obj, local_queues: Mapping[str, Obj]) -> str:
    admission = (workload.get("status") or {}).get("admission") or {}
    if admission.get("clusterQueue"):
        return str(admission["clusterQueue"])
    queue = str((workload.get("spec") or {}).get("queueName") or "")
    lq = local_queues.get(f"{_namespace(workload)}/{queue}")
    return str((lq.get("spec") or {}).get("clusterQueue") or "") if lq else ""


# -- quotas: the cohort tree -------------------------------------------------------------------

Cell = dict[str, int | None]
"""nominal, borrowingLimit, lendingLimit, usage, borrowed for one flavor and resource."""


def _quota_cells(cq: Obj) -> dict[tuple[str, str], Cell]:
    cells: dict[tuple[str, str], Cell] = {}
    for group in (cq.get("spec") or {}).get("resourceGroups") or ():
        for flavor in group.get("flavors") or ():
            for res in flavor.get("resources") or ():
                resource = str(res.get("name") or "")
                key = (str(flavor.get("name") or ""), resource)
                cells[key] = {
                    "nominal": _amount(res.get("nominalQuota", 0), resource),
                    "borrowingLimit": (
                        _amount(res["borrowingLimit"], resource)
                        if res.get("borrowingLimit") is not None
                        else None
                    ),
                    "lendingLimit": (
                        _amount(res["lendingLimit"], resource)
                        if res.get("lendingLimit") is not None
                        else None
                    ),
                    "usage": 0,
                    "borrowed": 0,
                }
    status = cq.get("status") or {}
    for flavor in status.get("flavorsReservation") or status.get("flavorsUsage") or ():
        for res in flavor.get("resources") or ():
            resource = str(res.get("name") or "")
            key = (str(flavor.get("name") or ""), resource)
            cell = cells.setdefault(
                key,
                {"nominal": 0, "borrowingLimit": None, "lendingLimit": None, "usage": 0},
            )
            cell["usage"] = _amount(res.get("total", 0), resource)
            cell["borrowed"] = _amount(res.get("borrowed", 0), resource)
    return cells


def _rows(cells: Mapping[tuple[str, str], Cell]) -> list[dict[str, Any]]:
    rows = []
    for (flavor, resource), cell in sorted(cells.items()):
        nominal = int(cell.get("nominal") or 0)
        usage = int(cell.get("usage") or 0)
        borrowed = int(cell.get("borrowed") or 0)
        lending = cell.get("lendingLimit")
        borrowing = cell.get("borrowingLimit")
        # What it lends: the part of its nominal quota it does not use, up to its lendingLimit.
        unused = max(0, nominal - usage)
        lent = unused if lending is None else min(unused, int(lending))
        rows.append(
            {
                "flavor": flavor,
                "resource": resource,
                "nominal": _show(nominal, resource),
                "usage": _show(usage, resource),
                "borrowed": _show(borrowed, resource),
                "lendable": _show(lent, resource),
                "borrowingLimit": "" if borrowing is None else _show(int(borrowing), resource),
                "lendingLimit": "" if lending is None else _show(int(lending), resource),
                "percent": round(100 * usage / nominal) if nominal else (100 if usage else 0),
            }
        )
    return rows


def _sum_cells(into: dict[tuple[str, str], Cell], cells: Mapping[tuple[str, str], Cell]) -> None:
    for key, cell in cells.items():
        total = into.setdefault(
            key, {"nominal": 0, "usage": 0, "borrowed": 0, "borrowingLimit": None}
        )
        for part in ("nominal", "usage", "borrowed"):
            total[part] = int(total.get(part) or 0) + int(cell.get(part) or 0)
        # A cohort lends what its members lend: the sum of their limits, none if any has none.
        limit, mine = total.get("lendingLimit", 0), cell.get("lendingLimit")
        total["lendingLimit"] = None if limit is None or mine is None else limit + mine


def cohort_tree(objects: Objects) -> list[dict[str, Any]]:
    """Root cohorts, each with its child cohorts and ClusterQueues, quotas summed upwards;
    ClusterQueues outside any cohort are roots of their own."""
    parents: dict[str, str] = {}
    for cohort in objects.cohorts.values():
        parent = str((cohort.get("spec") or {}).get("parentName") or "")
        if parent:
            parents[_name(cohort)] = parent
    members: dict[str, list[Obj]] = {}
    loose: list[Obj] = []
    for cq in objects.cluster_queues.values():
        member_of = str((cq.get("spec") or {}).get("cohortName") or "")
        if member_of:
            members.setdefault(member_of, []).append(cq)
            parents.setdefault(member_of, "")
        else:
            loose.append(cq)
    names = set(parents) | set(parents.values())
    names.discard("")
    children: dict[str, list[str]] = {}
    for name in names:
        parent = parents.get(name, "")
        if parent:
            children.setdefault(parent, []).append(name)

    def queue_node(cq: Obj) -> tuple[dict[str, Any], dict[tuple[str, str], Cell]]:
        cells = _quota_cells(cq)
        return {"kind": "ClusterQueue", "name": _name(cq), "rows": _rows(cells)}, cells

    def cohort_node(
        name: str, seen: frozenset[str]
    ) -> tuple[dict[str, Any], dict[tuple[str, str], Cell]]:
        total: dict[tuple[str, str], Cell] = {}
        nodes = []
        for child in sorted(children.get(name, ())):
            if child in seen:  # a cycle in parentName: shown once, not followed
                continue
            node, cells = cohort_node(child, seen | {child})
            nodes.append(node)
            _sum_cells(total, cells)
        for cq in sorted(members.get(name, ()), key=_name):
            node, cells = queue_node(cq)
            nodes.append(node)
            _sum_cells(total, cells)
        return {"kind": "Cohort", "name": name, "rows": _rows(total), "children": nodes}, total

    roots = sorted(n for n in names if not parents.get(n) or parents[n] not in names)
    tree = [cohort_node(name, frozenset({name}))[0] for name in roots]
    # A cycle in parentName has no root: each cohort on it not shown yet becomes one.
    shown: set[str] = set()
    for name in roots:
        shown |= _reached(name, children)
    for name in sorted(names):
        if name not in shown:
            tree.append(cohort_node(name, frozenset({name}))[0])
            shown |= _reached(name, children)
    tree += [queue_node(cq)[0] for cq in sorted(loose, key=_name)]
    return tree


def _reached(name: str, children: Mapping[str, list[str]]) -> set[str]:
    """``name`` and every cohort below it."""
    seen = {name}
    todo = [name]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


# -- queues ------------------------------------------------------------------------------------


def _stop(obj: Obj) -> str:
    policy = str((obj.get("spec") or {}).get("stopPolicy") or "None")
    return "" if policy == "None" else policy


def cluster_queue_rows(objects: Objects) -> list[dict[str, Any]]:
    out = []
    for cq in sorted(objects.cluster_queues.values(), key=_name):
        status = cq.get("status") or {}
        active = _condition(cq, "Active")
        out.append(
            {
                "name": _name(cq),
                "cohort": str((cq.get("spec") or {}).get("cohortName") or ""),
                "pending": int(status.get("pendingWorkloads") or 0),
                "admitted": int(status.get("admittedWorkloads") or 0),
                "reserving": int(status.get("reservingWorkloads") or 0),
                "stop": _stop(cq),
                "active": active is not None and active.get("status") == "True",
                # Fair sharing: the share of its quota it uses, weighted (Kueue's status).
                "weightedShare": (status.get("fairSharing") or {}).get("weightedShare"),
                "why": "" if active is None else str(active.get("message") or ""),
            }
        )
    return out


def local_queue_rows(objects: Objects, can_read: Callable[[str], bool]) -> list[dict[str, Any]]:
    out = []
    for lq in sorted(objects.local_queues.values(), key=lambda q: (_namespace(q), _name(q))):
        if not can_read(_namespace(lq)):
            continue
        status = lq.get("status") or {}
        out.append(
            {
                "namespace": _namespace(lq),
                "name": _name(lq),
                "clusterQueue": str((lq.get("spec") or {}).get("clusterQueue") or ""),
                "pending": int(status.get("pendingWorkloads") or 0),
                "admitted": int(status.get("admittedWorkloads") or 0),
                "stop": _stop(lq),
                # Admission fair sharing: its decayed usage, as the operator last wrote it.
                "consumed": _consumed(lq),
            }
        )
    return out


def _consumed(lq: Obj) -> str:
    fair = ((lq.get("status") or {}).get("fairSharing") or {}).get("admissionFairSharingStatus")
    resources = (fair or {}).get("consumedResources") or {}
    return ", ".join(f"{name}={value}" for name, value in sorted(resources.items()))


# -- workloads ---------------------------------------------------------------------------------


def pending_rows(
    objects: Objects,
    positions: Mapping[str, int],
    can_read: Callable[[str], bool],
    *,
    where: Filter = Filter(),
    limit: int = PENDING_ROWS,
) -> tuple[list[dict[str, Any]], int]:
    """The pending Workloads the viewer may read and the filter keeps, in queue order
    (ClusterQueue, then position; unknown positions last, oldest first); and how many matched.
    Each row carries its creation time: the browser shows the wait time ticking without a push
    every second."""
    needle = where.text.strip().lower()
    rows = []
    for key, workload in objects.workloads.items():
        namespace = _namespace(workload)
        if not can_read(namespace) or workload_state(workload) != "PENDING":
            continue
        if where.namespace and namespace != where.namespace:
            continue
        cq = _cluster_queue_of(workload, objects.local_queues)
        if where.cluster_queue and cq != where.cluster_queue:
            continue
        queue = str((workload.get("spec") or {}).get("queueName") or "")
        reason = _reason(workload)
        if needle and not any(needle in part.lower() for part in (key, queue, cq, reason)):
            continue
        rows.append(
            {
                "namespace": namespace,
                "name": _name(workload),
                "localQueue": queue,
                "clusterQueue": cq,
                "priority": int((workload.get("spec") or {}).get("priority") or 0),
                "position": positions.get(key),
                "created": str(_meta(workload).get("creationTimestamp") or ""),
                "reason": reason,
            }
        )
    rows.sort(
        key=lambda r: (
            r["clusterQueue"],
            r["position"] is None,
            r["position"] if r["position"] is not None else 0,
            r["created"],
            r["namespace"],
            r["name"],
        )
    )
    return rows[:limit], len(rows)


def counts(objects: Objects, can_read: Callable[[str], bool]) -> dict[str, int]:
    out = {"PENDING": 0, "QUOTA_RESERVED": 0, "ADMITTED": 0, "FINISHED": 0}
    for workload in objects.workloads.values():
        if can_read(_namespace(workload)):
            out[workload_state(workload)] += 1
    return {k.lower(): v for k, v in out.items()}


# -- topology ----------------------------------------------------------------------------------


def _pod_amount(pod_set: Obj, resource: str) -> int:
    spec = ((pod_set.get("template") or {}).get("spec")) or {}
    total = 0
    for container in spec.get("containers") or ():
        requests = (container.get("resources") or {}).get("requests") or {}
        limits = (container.get("resources") or {}).get("limits") or {}
        value = requests.get(resource, limits.get(resource))
        if value is not None:
            total += _amount(value, resource)
    return total


def _placements(workload: Obj, resource: str) -> list[tuple[tuple[str, ...], tuple[str, ...], int]]:
    """(levels, domain values, amount of ``resource``) per topology domain the admitted
    Workload's pods were placed in."""
    from phalanx.placement.encoding import decode_topology_assignment

    pod_sets = {
        str(ps.get("name") or ""): ps for ps in (workload.get("spec") or {}).get("podSets") or ()
    }
    admission = (workload.get("status") or {}).get("admission") or {}
    out = []
    for psa in admission.get("podSetAssignments") or ():
        assignment = psa.get("topologyAssignment")
        if not assignment:
            continue
        try:
            levels, domains = decode_topology_assignment(assignment)
        except (ValueError, KeyError, TypeError):
            continue
        per_pod = _pod_amount(pod_sets.get(str(psa.get("name") or ""), {}), resource)
        for values, pods in domains:
            out.append((levels, tuple(values), per_pod * int(pods)))
    return out


def topology_maps(
    objects: Objects, can_read: Callable[[str], bool], *, resource: str = GPU
) -> list[dict[str, Any]]:
    """Per Topology: its levels, and its nodes grouped by every level but the last (blocks >
    racks > nodes), each node with ``resource`` allocatable, used by admitted Workloads
    (from their topology assignments) and the gangs on it; free fragments per group."""
    occupying = [
        w for w in objects.workloads.values() if workload_state(w) in ("ADMITTED", "QUOTA_RESERVED")
    ]
    maps = []
    for topology in sorted(objects.topologies.values(), key=_name):
        levels = [
            str(level.get("nodeLabel") or "")
            for level in (topology.get("spec") or {}).get("levels") or ()
        ]
        if not levels:
            continue
        selectors = [
            dict((f.get("spec") or {}).get("nodeLabels") or {})
            for f in objects.flavors.values()
            if (f.get("spec") or {}).get("topologyName") == _name(topology)
        ]
        nodes: dict[tuple[str, ...], dict[str, Any]] = {}
        for node in objects.nodes.values():
            labels = _meta(node).get("labels") or {}
            # The nodes of the flavors that use this topology (all labelled nodes if none do).
            if selectors and not any(
                all(labels.get(k) == v for k, v in sel.items()) for sel in selectors
            ):
                continue
            values = tuple(
                str(labels.get(level) or (_name(node) if level == HOSTNAME else ""))
                for level in levels
            )
            if not all(values):
                continue
            allocatable = (node.get("status") or {}).get("allocatable") or {}
            nodes[values] = {
                "name": _name(node),
                "capacity": _amount(allocatable.get(resource, 0), resource),
                "used": 0,
                "gangs": [],
            }
        # An assignment names the lowest levels (only the hostname when it is the lowest, as
        # Kueue writes it) or, for a coarser placement, the highest ones: the first are
        # charged to the node, the others to the group and shown there.
        group_used: dict[tuple[str, ...], int] = {}
        suffixes: dict[int, dict[tuple[str, ...], dict[str, Any]]] = {}
        for workload in occupying:
            key = f"{_namespace(workload)}/{_name(workload)}"
            visible = can_read(_namespace(workload))
            for w_levels, values, amount in _placements(workload, resource):
                depth = len(w_levels)
                if depth and list(w_levels) == levels[-depth:]:
                    if depth not in suffixes:
                        suffixes[depth] = {v[-depth:]: n for v, n in nodes.items()}
                    node_entry = suffixes[depth].get(values)
                    if node_entry is None:
                        continue
                    node_entry["used"] += amount
                    gang = key if visible else "(hidden)"
                    if gang not in node_entry["gangs"]:
                        node_entry["gangs"].append(gang)
                elif list(w_levels) == levels[:depth]:
                    group_used[values] = group_used.get(values, 0) + amount
        maps.append(
            {
                "name": _name(topology),
                "levels": levels,
                "resource": resource,
                "groups": _group(nodes, depth=len(levels) - 1, group_used=group_used),
            }
        )
    return maps


HOSTNAME = "kubernetes.io/hostname"


def _group(
    nodes: Mapping[tuple[str, ...], dict[str, Any]],
    *,
    depth: int,
    group_used: Mapping[tuple[str, ...], int],
    prefix: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """Nested groups down to ``depth`` levels; the innermost hold the nodes."""
    level = len(prefix)
    keys = sorted({values[level] for values in nodes if values[:level] == prefix})
    out = []
    for value in keys:
        here = (*prefix, value)
        inside = {v: n for v, n in nodes.items() if v[: len(here)] == here}
        group: dict[str, Any] = {"name": value}
        if level + 1 >= depth:
            group["nodes"] = [dict(inside[v], free=0) for v in sorted(inside)]
            for entry in group["nodes"]:
                entry["free"] = max(0, entry["capacity"] - entry["used"])
        else:
            group["groups"] = _group(inside, depth=depth, group_used=group_used, prefix=here)
        capacity = sum(n["capacity"] for n in inside.values())
        used = sum(n["used"] for n in inside.values()) + sum(
            amount for values, amount in group_used.items() if values[: len(here)] == here
        )
        frees = [max(0, n["capacity"] - n["used"]) for n in inside.values()]
        group.update(
            capacity=capacity,
            used=min(used, capacity) if capacity else used,
            free=max(0, capacity - used),
            # Free fragments: the free units, node by node, largest first (a gang of whole
            # nodes needs whole free nodes, not the same sum scattered).
            fragments=sorted((f for f in frees if f), reverse=True),
        )
        out.append(group)
    return out


# -- the whole view -----------------------------------------------------------------------------


def build_view(
    objects: Objects,
    *,
    positions: Mapping[str, int],
    can_read: Callable[[str], bool],
    cluster_scoped: bool,
    where: Filter = Filter(),
    resource: str = GPU,
) -> dict[str, Any]:
    """The live sections for one viewer. Cluster-scoped sections (cohorts, ClusterQueues,
    topology) are ``None`` for a viewer who may not list ClusterQueues."""
    pending, matched = pending_rows(objects, positions, can_read, where=where)
    return {
        "counts": counts(objects, can_read),
        "cohorts": cohort_tree(objects) if cluster_scoped else None,
        "clusterQueues": cluster_queue_rows(objects) if cluster_scoped else None,
        "localQueues": local_queue_rows(objects, can_read),
        "pending": {"rows": pending, "matched": matched, "limit": PENDING_ROWS},
        "topology": topology_maps(objects, can_read, resource=resource) if cluster_scoped else None,
    }


def diff(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> dict[str, Any]:
    """The sections of ``after`` that differ from ``before`` (all of them without one)."""
    if before is None:
        return dict(after)
    return {k: v for k, v in after.items() if before.get(k) != v}


class Coalescer:
    """Turns any number of change notifications into at most one push per ``interval``.

    ``touch()`` records a change; ``due(now)`` says whether to push now (something
    changed and the last push is at least ``interval`` old), and a True answer counts as the
    push. A burst of 15,000 events within a second therefore costs one push, and a change is
    never held back longer than ``interval`` after the previous push."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self.dirty = True
        self.last: float | None = None

    def touch(self) -> None:
        self.dirty = True

    def due(self, now: float) -> bool:
        if not self.dirty or (self.last is not None and now - self.last < self.interval):
            return False
        self.dirty = False
        self.last = now
        return True


# -- one workload ------------------------------------------------------------------------------


_STEPS = {
    "QuotaReserved": "quota reserved",
    "Admitted": "admitted",
    "PodsReady": "pods ready",
    "Evicted": "evicted",
    "Preempted": "preempted",
    "Requeued": "requeued",
    "Finished": "finished",
    "Deactivated": "deactivated",
}


def workload_detail(
    workload: Obj, *, position: int | None, local_queues: Mapping[str, Obj]
) -> dict[str, Any]:
    """One Workload's page: what it asks for, where it was admitted, and its timeline from
    creation through the last transition of each condition (the API keeps one per type)."""
    metadata = _meta(workload)
    admission = (workload.get("status") or {}).get("admission") or {}
    timeline: list[dict[str, Any]] = [
        {"time": metadata.get("creationTimestamp") or "", "event": "created", "detail": ""}
    ]
    for c in _conditions(workload):
        kind = str(c.get("type") or "")
        if kind not in _STEPS:
            continue
        if c.get("status") != "True" and kind != "QuotaReserved":
            continue
        label = _STEPS[kind] if c.get("status") == "True" else "waiting for quota"
        detail = str(c.get("message") or c.get("reason") or "")
        if kind == "Admitted" and c.get("status") == "True" and admission:
            detail = f"{detail} ({where(admission)})".strip()
        timeline.append(
            {"time": c.get("lastTransitionTime") or "", "event": label, "detail": detail}
        )
    timeline.sort(key=lambda e: (e["time"] or "", e["event"] != "created"))
    pod_sets = [
        {"name": str(ps.get("name") or ""), "count": int(ps.get("count") or 0)}
        for ps in (workload.get("spec") or {}).get("podSets") or ()
    ]
    owners = list(metadata.get("ownerReferences") or ())
    return {
        "namespace": _namespace(workload),
        "name": _name(workload),
        "state": workload_state(workload),
        "localQueue": str((workload.get("spec") or {}).get("queueName") or ""),
        "clusterQueue": _cluster_queue_of(workload, local_queues),
        "priority": int((workload.get("spec") or {}).get("priority") or 0),
        "owner": (f"{owners[0].get('kind')}/{owners[0].get('name')}" if owners else ""),
        "position": position,
        "reason": _reason(workload),
        "podSets": pod_sets,
        "admission": where(admission) if admission else "",
        "timeline": timeline,
    }


def where(admission: Mapping[str, Any]) -> str:
    """``cq-a: main x4 on gpu-a (b0/b0-r1/node-3 x4)``: the ClusterQueue, each pod
    set's flavors and its topology domains."""
    from phalanx.placement.encoding import decode_topology_assignment

    parts = []
    for psa in admission.get("podSetAssignments") or ():
        flavors = sorted(set((psa.get("flavors") or {}).values()))
        text = f"{psa.get('name')} x{psa.get('count', '?')} on {','.join(flavors) or '-'}"
        assignment = psa.get("topologyAssignment")
        if assignment:
            try:
                _, domains = decode_topology_assignment(assignment)
            except (ValueError, KeyError, TypeError):
                domains = ()
            text += " (" + ", ".join(f"{'/'.join(v)} x{n}" for v, n in domains) + ")"
        parts.append(text)
    return f"{admission.get('clusterQueue', '')}: " + "; ".join(parts)


def namespaces_of(objects: Objects) -> set[str]:
    return {_namespace(o) for o in _chain(objects.workloads, objects.local_queues) if _namespace(o)}


def _chain(*maps: Mapping[str, Obj]) -> Iterable[Obj]:
    for m in maps:
        yield from m.values()
