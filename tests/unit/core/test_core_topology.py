"""On a flavor with a Topology, admission needs quota and a placement of the whole gang
(DESIGN improvement 4), through ``phalanx.placement`` behind the PlacementOracle hook."""

from __future__ import annotations

from core_builders import (
    LOWER,
    MakeClusterQueue,
    MakeFlavorQuotas,
    MakePodSet,
    MakeWorkload,
    admitted_names,
    flavor,
    victim_names,
)

from phalanx.admission.decisions import PendingReason
from phalanx.admission.model import LocalQueue, TopologyRequest
from phalanx.admission.scheduler import Scheduler
from phalanx.admission.topology_adapter import TopologyPlacement
from phalanx.placement import HOSTNAME_LABEL, FlavorTopologies, Node, PodSetPlacement

RACK = "example.com/rack"


def cluster(*, racks: int = 2, nodes: int = 2, gpus: int = 4) -> Scheduler:
    topologies = FlavorTopologies()
    topologies.set_flavor(name="gpu", levels=[RACK, HOSTNAME_LABEL])
    for r in range(racks):
        for n in range(nodes):
            name = f"r{r}-n{n}"
            topologies.upsert_node(
                Node(name, {RACK: f"rack-{r}", HOSTNAME_LABEL: name}, {"nvidia.com/gpu": gpus})
            )
    scheduler = Scheduler(placement=TopologyPlacement(topologies))
    scheduler.apply_resource_flavor(flavor("gpu", topology="racks"))
    scheduler.apply_cluster_queue(
        MakeClusterQueue("cq")
        .resource_group(MakeFlavorQuotas("gpu").resource("nvidia.com/gpu", 64))
        .preemption(within=LOWER)
        .obj()
    )
    scheduler.apply_local_queue(LocalQueue("default", "cq", "cq"))
    scheduler.set_namespace("default", {})
    return scheduler


def add_host(scheduler: Scheduler, name: str, rack: str = "rack-0") -> None:
    placement = scheduler.placement
    assert isinstance(placement, TopologyPlacement)
    placement.topologies.upsert_node(
        Node(name, {RACK: rack, HOSTNAME_LABEL: name}, {"nvidia.com/gpu": 4})
    )


def gang(name: str, pods: int, *, priority: int = 0, required: bool = True) -> MakeWorkload:
    topology = TopologyRequest.required(RACK) if required else TopologyRequest.preferred(RACK)
    return (
        MakeWorkload(name)
        .queue("cq")
        .priority(priority)
        .pod_sets(MakePodSet("workers", pods).request("nvidia.com/gpu", 1 * 4).topology(topology))
    )


def test_gang_admitted_with_a_placement_in_one_rack() -> None:
    scheduler = cluster()
    scheduler.add_workload(gang("train", 2).obj())
    result = scheduler.run_cycle(1)
    assert admitted_names(result) == ["train"]
    placement = result.admitted[0].admission.pod_sets[0].topology_assignment
    assert isinstance(placement, PodSetPlacement)
    assert placement.fit_level == RACK
    assert len({d.values[0] for d in placement.domains}) == 1


def test_quota_fits_but_no_rack_holds_the_gang() -> None:
    scheduler = cluster()
    scheduler.add_workload(gang("wide", 3).obj())  # 3 nodes' worth, racks have 2
    result = scheduler.run_cycle(1)
    assert result.admitted == ()
    explanation = scheduler.explain("default/wide")
    assert explanation is not None
    assert explanation.reason == PendingReason.TOPOLOGY_PLACEMENT_FAILED
    assert "rack" in explanation.message
    assert scheduler.tree.cluster_queue("cq").usage == {}


def test_preferred_spreads_when_no_single_rack_fits() -> None:
    scheduler = cluster()
    scheduler.add_workload(gang("wide", 3, required=False).obj())
    assert admitted_names(scheduler.run_cycle(1)) == ["wide"]


def test_finishing_releases_the_placement() -> None:
    scheduler = cluster(racks=1)
    scheduler.add_workload(gang("first", 2).obj())
    assert admitted_names(scheduler.run_cycle(1)) == ["first"]
    scheduler.add_workload(gang("second", 2).obj())
    assert scheduler.run_cycle(2).admitted == ()
    scheduler.finish_workload("default/first")
    assert admitted_names(scheduler.run_cycle(3)) == ["second"]


def test_a_gang_blocked_only_by_placement_waits_for_capacity() -> None:
    scheduler = cluster(racks=1)
    scheduler.add_workload(gang("low", 2, priority=0).obj())
    scheduler.run_cycle(1)
    scheduler.add_workload(gang("high", 2, priority=9).obj())
    # Quota fits (64 GPUs) but the only rack is full: placement, not quota, blocks it, and
    # preemption only frees quota (see docs/scheduling.md), so it waits.
    blocked = scheduler.run_cycle(2)
    assert blocked.admitted == () and victim_names(blocked) == []
    assert blocked.pending["default/high"].reason == PendingReason.TOPOLOGY_PLACEMENT_FAILED
    scheduler.finish_workload("default/low")
    assert admitted_names(scheduler.run_cycle(3)) == ["high"]


def test_preemption_for_quota_then_placement_on_admission() -> None:
    scheduler = cluster(racks=1)
    scheduler.apply_cluster_queue(
        MakeClusterQueue("cq")
        .resource_group(MakeFlavorQuotas("gpu").resource("nvidia.com/gpu", 8))
        .preemption(within=LOWER)
        .obj()
    )
    scheduler.add_workload(gang("low", 2, priority=0).obj())
    scheduler.run_cycle(1)
    scheduler.add_workload(gang("high", 2, priority=9).obj())
    result = scheduler.run_cycle(2)
    assert victim_names(result) == ["low"]
    scheduler.workload_evicted("default/low", now=2)
    done = scheduler.run_cycle(3)
    assert admitted_names(done) == ["high"]
    assert isinstance(done.admitted[0].admission.pod_sets[0].topology_assignment, PodSetPlacement)


def test_a_queue_whose_flavor_topology_is_unknown_is_inactive() -> None:
    scheduler = cluster()
    scheduler.apply_resource_flavor(flavor("other", topology="nowhere"))
    scheduler.apply_cluster_queue(
        MakeClusterQueue("cq2").resource_group(MakeFlavorQuotas("other").resource("cpu", 4)).obj()
    )
    assert "TopologyNotFound" in scheduler.cluster_queue_status("cq2").reason


def test_capacity_changed_retries_only_placement_failures() -> None:
    scheduler = cluster(racks=1)
    scheduler.apply_cluster_queue(
        MakeClusterQueue("cq")
        .resource_group(MakeFlavorQuotas("gpu").resource("nvidia.com/gpu", 12))
        .obj()
    )
    scheduler.add_workload(gang("first", 1).obj())
    assert admitted_names(scheduler.run_cycle(1)) == ["first"]
    scheduler.add_workload(gang("needs-rack", 2).obj())  # quota fits, one host left
    scheduler.add_workload(gang("needs-quota", 3, required=False).obj())  # 12 > 8 left
    parked = scheduler.run_cycle(2)
    assert parked.admitted == ()
    assert parked.pending["default/needs-rack"].reason == PendingReason.TOPOLOGY_PLACEMENT_FAILED
    assert parked.pending["default/needs-quota"].reason == PendingReason.WAITING_FOR_QUOTA
    assert scheduler.run_cycle(3).attempts == 0  # parked: nothing is retried
    add_host(scheduler, "r0-n9")
    assert scheduler.run_cycle(4).attempts == 0  # the core is not told: still parked
    scheduler.capacity_changed()
    result = scheduler.run_cycle(5)
    assert admitted_names(result) == ["needs-rack"]
    assert result.attempts == 1  # the quota-bound workload was not woken by capacity


def test_capacity_changed_unblocks_a_strict_fifo_head_waiting_for_placement() -> None:
    scheduler = cluster(racks=1)
    scheduler.apply_cluster_queue(
        MakeClusterQueue("cq")
        .resource_group(MakeFlavorQuotas("gpu").resource("nvidia.com/gpu", 64))
        .strict_fifo()
        .obj()
    )
    scheduler.add_workload(gang("first", 1).obj())
    scheduler.run_cycle(1)
    scheduler.add_workload(gang("head", 2).obj())
    assert scheduler.run_cycle(2).admitted == ()
    add_host(scheduler, "r0-n9")
    scheduler.capacity_changed()
    assert admitted_names(scheduler.run_cycle(3)) == ["head"]
