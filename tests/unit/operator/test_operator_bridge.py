"""CoreBridge: cached API objects to the real scheduling core, without a cluster."""

from __future__ import annotations

from typing import Any

from phalanx.admission.decisions import PendingReason
from phalanx.admission.records import Phase
from phalanx.admission.scheduler import Scheduler
from phalanx.operator.bridge import CoreBridge
from phalanx.operator.oracle import TopologyOracle
from phalanx.operator.state import ClusterState

NOW = 1_767_225_600_000


def _cq(gpus: int, *, rv: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": "cq", "uid": "cq-1", "generation": gpus, "resourceVersion": str(rv)},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": "h100",
                            "resources": [{"name": "nvidia.com/gpu", "nominalQuota": str(gpus)}],
                        }
                    ],
                }
            ],
        },
    }


def _wl(
    name: str, *, rv: int, gpus: int = 8, status: dict[str, Any] | None = None
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "generation": 1,
            "resourceVersion": str(rv),
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            "queueName": "lq",
            "podSets": [
                {
                    "name": "main",
                    "count": 1,
                    "template": {
                        "spec": {
                            "containers": [
                                {"resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}
                            ]
                        }
                    },
                }
            ],
        },
    }
    if status:
        obj["status"] = status
    return obj


def _admitted_status(gpus: int = 8) -> dict[str, Any]:
    return {
        "conditions": [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": ""},
            {"type": "Admitted", "status": "True", "reason": "Admitted", "message": ""},
        ],
        "admission": {
            "clusterQueue": "cq",
            "podSetAssignments": [
                {
                    "name": "main",
                    "count": 1,
                    "flavors": {"nvidia.com/gpu": "h100"},
                    "resourceUsage": {"nvidia.com/gpu": str(gpus)},
                }
            ],
        },
    }


def _setup(*workloads: dict[str, Any]) -> tuple[ClusterState, CoreBridge, Scheduler]:
    state = ClusterState()
    scheduler = Scheduler(placement=TopologyOracle())
    bridge = CoreBridge(scheduler, TopologyOracle(), state)
    state.apply("Namespace", None, {"metadata": {"name": "ns", "resourceVersion": "1"}})
    state.apply(
        "ResourceFlavor",
        None,
        {"metadata": {"name": "h100", "generation": 1, "uid": "f"}, "spec": {}},
    )
    state.apply("ClusterQueue", None, _cq(16))
    state.apply(
        "LocalQueue",
        None,
        {
            "metadata": {"name": "lq", "namespace": "ns", "generation": 1, "uid": "l"},
            "spec": {"clusterQueue": "cq"},
        },
    )
    for wl in workloads:
        state.apply("Workload", None, wl)
    return state, bridge, scheduler


def test_restart_restores_admitted_workloads_and_queues_the_rest() -> None:
    state, bridge, scheduler = _setup(
        _wl("running", rv=10, status=_admitted_status()), _wl("waiting", rv=11, gpus=16)
    )
    result = bridge.sync(state.drain(), now_ms=NOW)
    assert result.restored == ["ns/running"]
    assert result.added == ["ns/waiting"]
    assert scheduler.phase("ns/running") == Phase.ADMITTED
    assert scheduler.cluster_queue_status("cq").usage == {("h100", "nvidia.com/gpu"): 8}
    cycle = scheduler.run_cycle(NOW)
    assert not cycle.admitted, "8 of 16 GPUs are restored as used: the 16-GPU one must wait"


def test_finished_by_someone_else_is_terminal_and_frees_quota() -> None:
    state, bridge, scheduler = _setup(_wl("running", rv=10, status=_admitted_status(16)))
    bridge.sync(state.drain(), now_ms=NOW)
    finished = _admitted_status(16)
    finished["conditions"].append(
        {"type": "Finished", "status": "True", "reason": "ByTest", "message": ""}
    )
    state.apply("Workload", "MODIFIED", _wl("running", rv=12, status=finished))
    result = bridge.sync(state.drain(), now_ms=NOW)
    assert result.finished == ["ns/running"]
    assert scheduler.phase("ns/running") is None
    assert scheduler.cluster_queue_status("cq").usage.get(("h100", "nvidia.com/gpu"), 0) == 0
    # Later versions of a finished Workload change nothing.
    state.apply("Workload", "MODIFIED", _wl("running", rv=13, status=finished))
    assert bridge.sync(state.drain(), now_ms=NOW).finished == []


def test_reservation_removed_by_another_writer_releases_the_workload() -> None:
    state, bridge, scheduler = _setup(_wl("running", rv=10, status=_admitted_status()))
    bridge.sync(state.drain(), now_ms=NOW)
    released = {
        "conditions": [
            {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": ""},
            {"type": "Evicted", "status": "True", "reason": "Preempted", "message": ""},
        ]
    }
    state.apply("Workload", "MODIFIED", _wl("running", rv=11, status=released))
    result = bridge.sync(state.drain(), now_ms=NOW)
    assert result.evicted_elsewhere == ["ns/running"]
    assert scheduler.phase("ns/running") == Phase.PENDING


def test_an_in_flight_admission_is_not_mistaken_for_an_eviction() -> None:
    state, bridge, scheduler = _setup(_wl("new", rv=10))
    bridge.sync(state.drain(), now_ms=NOW)
    assert [a.workload for a in scheduler.run_cycle(NOW).admitted] == ["ns/new"]
    bridge.in_flight_admissions.add("ns/new")
    # An older pending-message echo arrives while the admission write is in flight.
    pending = {
        "conditions": [
            {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": ""}
        ]
    }
    state.apply("Workload", "MODIFIED", _wl("new", rv=11, status=pending))
    assert bridge.sync(state.drain(), now_ms=NOW).evicted_elsewhere == []
    assert scheduler.phase("ns/new") == Phase.ADMITTED


def test_status_only_changes_of_a_cluster_queue_do_not_reach_the_core() -> None:
    state, bridge, scheduler = _setup()
    bridge.sync(state.drain(), now_ms=NOW)
    cq_state = scheduler.queues["cq"]
    with_status = {**_cq(16), "status": {"pendingWorkloads": 3}}
    with_status["metadata"] = {**with_status["metadata"], "resourceVersion": "99"}
    state.apply("ClusterQueue", "MODIFIED", with_status)
    bridge.sync(state.drain(), now_ms=NOW)
    assert scheduler.queues["cq"] is cq_state
    state.apply("ClusterQueue", "MODIFIED", _cq(32, rv=100))
    bridge.sync(state.drain(), now_ms=NOW)
    assert scheduler.cluster_queue_status("cq").active
    assert scheduler.queues["cq"].node.nominal(("h100", "nvidia.com/gpu")) == 32


def _gpu_node(name: str, gpus: int, rv: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "resourceVersion": str(rv),
            "labels": {"example.com/rack": "rack-0", "kubernetes.io/hostname": name},
        },
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_a_new_node_retries_a_workload_parked_for_topology_placement() -> None:
    state = ClusterState()
    oracle = TopologyOracle()
    scheduler = Scheduler(placement=oracle)
    bridge = CoreBridge(scheduler, oracle, state)
    state.apply("Namespace", None, {"metadata": {"name": "ns", "resourceVersion": "1"}})
    state.apply(
        "Topology",
        None,
        {
            "metadata": {"name": "racks", "generation": 1, "uid": "t"},
            "spec": {
                "levels": [
                    {"nodeLabel": "example.com/rack"},
                    {"nodeLabel": "kubernetes.io/hostname"},
                ]
            },
        },
    )
    state.apply(
        "ResourceFlavor",
        None,
        {
            "metadata": {"name": "h100", "generation": 1, "uid": "f"},
            "spec": {"topologyName": "racks"},
        },
    )
    state.apply("ClusterQueue", None, _cq(16))
    state.apply(
        "LocalQueue",
        None,
        {
            "metadata": {"name": "lq", "namespace": "ns", "generation": 1, "uid": "l"},
            "spec": {"clusterQueue": "cq"},
        },
    )
    state.apply("Node", None, _gpu_node("small", 4, rv=2))
    state.apply("Workload", None, _wl("gang", rv=10))  # one pod of 8 GPUs
    bridge.sync(state.drain(), now_ms=NOW)
    parked = scheduler.run_cycle(NOW)
    assert parked.admitted == ()
    assert parked.pending["ns/gang"].reason == PendingReason.TOPOLOGY_PLACEMENT_FAILED
    state.apply("Node", None, _gpu_node("big", 8, rv=3))
    bridge.sync(state.drain(), now_ms=NOW + 1)
    assert [a.workload for a in scheduler.run_cycle(NOW + 1).admitted] == ["ns/gang"]
