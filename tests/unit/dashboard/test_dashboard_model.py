"""The dashboard's page data from API objects: cohort sums, topology occupancy, pending order
and filtering, per-namespace visibility, coalesced updates and diffs."""

from __future__ import annotations

from typing import Any

from phalanx.dashboard.model import (
    Coalescer,
    Filter,
    Objects,
    build_view,
    cohort_tree,
    diff,
    pending_rows,
    topology_maps,
    workload_detail,
)
from phalanx.placement.encoding import encode_topology_assignment

EVERYONE = lambda _ns: True  # noqa: E731


def cq(name: str, cohort: str = "", *, gpus: int, used: int = 0, lending: int | None = None) -> Any:
    resource: dict[str, Any] = {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)}
    if lending is not None:
        resource["lendingLimit"] = str(lending)
    return {
        "metadata": {"name": name},
        "spec": {
            "cohortName": cohort,
            "resourceGroups": [{"flavors": [{"name": "gpu", "resources": [resource]}]}],
        },
        "status": {
            "pendingWorkloads": 1,
            "admittedWorkloads": 2,
            "flavorsReservation": [
                {
                    "name": "gpu",
                    "resources": [{"name": "nvidia.com/gpu", "total": str(used), "borrowed": "0"}],
                }
            ],
        },
    }


def workload(
    ns: str,
    name: str,
    *,
    queue: str = "lq",
    created: str = "2026-01-01T00:00:00Z",
    reason: str = "",
    admitted_on: list[tuple[str, int]] | None = None,
    gpus_per_pod: int = 8,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"namespace": ns, "name": name, "creationTimestamp": created},
        "spec": {
            "queueName": queue,
            "podSets": [
                {
                    "name": "main",
                    "count": sum(n for _, n in admitted_on or [("", 1)]),
                    "template": {
                        "spec": {
                            "containers": [
                                {"resources": {"requests": {"nvidia.com/gpu": str(gpus_per_pod)}}}
                            ]
                        }
                    },
                }
            ],
        },
        "status": {"conditions": []},
    }
    if reason:
        obj["status"]["conditions"].append(
            {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": reason}
        )
    if admitted_on is not None:
        at = "2026-01-01T00:01:00Z"
        obj["status"]["conditions"] += [
            {"type": "QuotaReserved", "status": "True", "lastTransitionTime": at},
            {"type": "Admitted", "status": "True", "lastTransitionTime": at},
        ]
        obj["status"]["admission"] = {
            "clusterQueue": "cq-a",
            "podSetAssignments": [
                {
                    "name": "main",
                    "count": sum(n for _, n in admitted_on),
                    "flavors": {"nvidia.com/gpu": "gpu"},
                    "topologyAssignment": encode_topology_assignment(
                        ["kubernetes.io/hostname"], [((host,), n) for host, n in admitted_on]
                    ),
                }
            ],
        }
    return obj


def node(name: str, block: str, rack: str, gpus: int = 8) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {"block": block, "rack": rack, "kubernetes.io/hostname": name},
        },
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}},
    }


def topology_objects() -> Objects:
    objects = Objects()
    objects.topologies["t"] = {
        "metadata": {"name": "t"},
        "spec": {
            "levels": [
                {"nodeLabel": "block"},
                {"nodeLabel": "rack"},
                {"nodeLabel": "kubernetes.io/hostname"},
            ]
        },
    }
    for i, (block, rack) in enumerate([("b0", "r0"), ("b0", "r0"), ("b0", "r1"), ("b1", "r2")]):
        objects.nodes[f"n{i}"] = node(f"n{i}", block, rack)
    return objects


def test_cohort_tree_sums_its_queues_and_child_cohorts() -> None:
    objects = Objects()
    objects.cohorts["child"] = {"metadata": {"name": "child"}, "spec": {"parentName": "root"}}
    objects.cluster_queues["a"] = cq("a", "child", gpus=16, used=8, lending=4)
    objects.cluster_queues["b"] = cq("b", "root", gpus=8, used=8)
    objects.cluster_queues["c"] = cq("c", gpus=4)
    tree = cohort_tree(objects)
    assert [n["name"] for n in tree] == ["root", "c"]
    root = tree[0]
    assert root["rows"][0]["nominal"] == "24"
    assert root["rows"][0]["usage"] == "16"
    child = root["children"][0]
    assert (child["kind"], child["name"]) == ("Cohort", "child")
    assert child["children"][0]["rows"][0]["lendingLimit"] == "4"
    # a lends its unused 8 only up to its lendingLimit of 4
    assert child["children"][0]["rows"][0]["lendable"] == "4"
    assert child["rows"][0]["percent"] == 50


def test_cohort_cycle_is_shown_once_not_followed() -> None:
    objects = Objects()
    objects.cohorts["x"] = {"metadata": {"name": "x"}, "spec": {"parentName": "y"}}
    objects.cohorts["y"] = {"metadata": {"name": "y"}, "spec": {"parentName": "x"}}
    objects.cluster_queues["a"] = cq("a", "x", gpus=1)
    tree = cohort_tree(objects)
    assert [n["name"] for n in tree] == ["x"]
    # x > y, and y's parent x is not followed again; a is in x
    assert [c["name"] for c in tree[0]["children"]] == ["y", "a"]
    assert tree[0]["children"][0]["children"] == []


def test_topology_occupancy_gangs_and_free_fragments() -> None:
    objects = topology_objects()
    objects.workloads["ns/gang"] = workload("ns", "gang", admitted_on=[("n0", 1), ("n1", 1)])
    objects.workloads["secret/small"] = workload(
        "secret", "small", admitted_on=[("n2", 1)], gpus_per_pod=2
    )
    (tmap,) = topology_maps(objects, lambda ns: ns == "ns")
    b0, b1 = tmap["groups"]
    assert (b0["name"], b0["capacity"], b0["used"], b0["free"]) == ("b0", 24, 18, 6)
    r0, r1 = b0["groups"]
    assert [n["used"] for n in r0["nodes"]] == [8, 8]
    assert r0["nodes"][0]["gangs"] == ["ns/gang"]
    # another namespace's gang occupies the node but is not named
    assert r1["nodes"][0]["gangs"] == ["(hidden)"]
    assert r1["fragments"] == [6]
    assert b1["fragments"] == [8] and b1["used"] == 0


def test_topology_takes_the_nodes_of_its_flavors_only() -> None:
    objects = topology_objects()
    objects.nodes["n3"]["metadata"]["labels"]["pool"] = "p"
    objects.flavors["f"] = {
        "metadata": {"name": "f"},
        "spec": {"topologyName": "t", "nodeLabels": {"pool": "p"}},
    }
    (tmap,) = topology_maps(objects, EVERYONE)
    assert [g["name"] for g in tmap["groups"]] == ["b1"]


def test_finished_workloads_free_their_nodes() -> None:
    objects = topology_objects()
    done = workload("ns", "done", admitted_on=[("n0", 1)])
    done["status"]["conditions"].append({"type": "Finished", "status": "True"})
    objects.workloads["ns/done"] = done
    (tmap,) = topology_maps(objects, EVERYONE)
    assert tmap["groups"][0]["used"] == 0


def test_pending_in_position_order_filtered_and_per_namespace() -> None:
    objects = Objects()
    objects.local_queues["a/lq"] = {
        "metadata": {"namespace": "a", "name": "lq"},
        "spec": {"clusterQueue": "cq-a"},
    }
    objects.workloads["a/late"] = workload("a", "late", reason="insufficient quota")
    objects.workloads["a/first"] = workload("a", "first", reason="waiting for rack")
    objects.workloads["a/unknown"] = workload("a", "unknown", created="2025-01-01T00:00:00Z")
    objects.workloads["b/other"] = workload("b", "other")
    positions = {"a/first": 0, "a/late": 1}
    rows, matched = pending_rows(objects, positions, lambda ns: ns == "a")
    assert [r["name"] for r in rows] == ["first", "late", "unknown"]
    assert matched == 3
    assert rows[0]["clusterQueue"] == "cq-a"
    assert rows[1]["reason"] == "insufficient quota"
    rows, matched = pending_rows(objects, positions, EVERYONE, where=Filter(text="RACK"))
    assert [r["name"] for r in rows] == ["first"]
    rows, matched = pending_rows(objects, positions, EVERYONE, limit=2)
    assert len(rows) == 2 and matched == 4


def test_view_hides_cluster_sections_and_other_namespaces() -> None:
    objects = Objects()
    objects.cluster_queues["a"] = cq("a", gpus=1)
    objects.local_queues["x/lq"] = {"metadata": {"namespace": "x", "name": "lq"}, "spec": {}}
    objects.workloads["x/w"] = workload("x", "w")
    view = build_view(objects, positions={}, can_read=lambda ns: ns == "y", cluster_scoped=False)
    assert view["cohorts"] is None and view["clusterQueues"] is None and view["topology"] is None
    assert view["localQueues"] == [] and view["pending"]["matched"] == 0
    assert view["counts"]["pending"] == 0
    view = build_view(objects, positions={}, can_read=EVERYONE, cluster_scoped=True)
    assert view["counts"]["pending"] == 1 and view["clusterQueues"][0]["name"] == "a"


def test_stop_policy_and_fair_sharing_are_shown() -> None:
    objects = Objects()
    objects.cluster_queues["a"] = cq("a", gpus=1)
    objects.cluster_queues["a"]["spec"]["stopPolicy"] = "HoldAndDrain"
    objects.cluster_queues["a"]["status"]["fairSharing"] = {"weightedShare": 250}
    objects.local_queues["x/lq"] = {
        "metadata": {"namespace": "x", "name": "lq"},
        "spec": {"clusterQueue": "a", "stopPolicy": "Hold"},
        "status": {
            "fairSharing": {
                "admissionFairSharingStatus": {
                    "consumedResources": {"nvidia.com/gpu": "12", "cpu": "3"}
                }
            }
        },
    }
    view = build_view(objects, positions={}, can_read=EVERYONE, cluster_scoped=True)
    assert view["clusterQueues"][0]["stop"] == "HoldAndDrain"
    assert view["clusterQueues"][0]["weightedShare"] == 250
    assert view["localQueues"][0]["stop"] == "Hold"
    assert view["localQueues"][0]["consumed"] == "cpu=3, nvidia.com/gpu=12"


def test_diff_sends_only_changed_sections() -> None:
    before = {"counts": {"pending": 1}, "pending": {"rows": []}}
    after = {"counts": {"pending": 2}, "pending": {"rows": []}}
    assert diff(None, after) == after
    assert diff(before, after) == {"counts": {"pending": 2}}
    assert diff(after, after) == {}


def test_coalescer_pushes_once_per_interval_whatever_the_burst() -> None:
    coalescer = Coalescer(interval=1.0)
    assert coalescer.due(0.0)  # the first view
    pushes = 0
    for i in range(15_000):
        coalescer.touch()
        if coalescer.due(i / 15_000 * 3.0):  # 15,000 events over 3 seconds
            pushes += 1
    assert pushes == 2  # at 1 s and 2 s; the first was at 0 s
    assert coalescer.due(3.0)  # the changes after 2 s, once the interval is over
    assert not coalescer.due(3.5)  # nothing new
    coalescer.touch()
    assert coalescer.due(10.0)
    assert not coalescer.due(10.1)


def test_workload_timeline_and_where() -> None:
    w = workload("ns", "gang", admitted_on=[("n0", 2)])
    w["status"]["conditions"].append(
        {
            "type": "Evicted",
            "status": "True",
            "reason": "Preempted",
            "message": "Preempted to accommodate a workload (UID: u1) due to prioritization",
            "lastTransitionTime": "2026-01-01T00:05:00Z",
        }
    )
    detail = workload_detail(w, position=None, local_queues={})
    events = [e["event"] for e in detail["timeline"]]
    assert events == ["created", "quota reserved", "admitted", "evicted"]
    assert "cq-a: main x2 on gpu (n0 x2)" in detail["timeline"][2]["detail"]
    assert "UID: u1" in detail["timeline"][3]["detail"]
