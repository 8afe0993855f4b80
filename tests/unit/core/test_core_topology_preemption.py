"""Preemption on a flavor with a Topology: victims are chosen only if the preemptor then fits
quota **and** placement (Kueue's TAS preemption what-if), so a gang that no domain can hold
evicts nobody, and a preemption never repeats for a gang that stays unplaceable."""

from __future__ import annotations

from core_builders import (
    ANY,
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
from phalanx.admission.model import ClusterQueue, LocalQueue, TopologyRequest
from phalanx.admission.scheduler import Scheduler
from phalanx.admission.topology_adapter import TopologyPlacement
from phalanx.placement import HOSTNAME_LABEL, FlavorTopologies, Node, PodSetPlacement

RACK = "example.com/rack"
GPU = "nvidia.com/gpu"


def tas(
    *queues: ClusterQueue, racks: int = 2, nodes: int = 2, gpus: int = 4
) -> tuple[Scheduler, FlavorTopologies]:
    """``racks`` x ``nodes`` hosts of ``gpus`` GPUs (node ``r<rack>-n<node>``), one TAS
    flavor ``gpu``, and a LocalQueue named like each ClusterQueue."""
    topologies = FlavorTopologies()
    topologies.set_flavor(name="gpu", levels=[RACK, HOSTNAME_LABEL])
    for r in range(racks):
        for n in range(nodes):
            name = f"r{r}-n{n}"
            topologies.upsert_node(
                Node(name, {RACK: f"rack-{r}", HOSTNAME_LABEL: name}, {GPU: gpus})
            )
    scheduler = Scheduler(placement=TopologyPlacement(topologies))
    scheduler.apply_resource_flavor(flavor("gpu", topology="racks"))
    for cq in queues:
        scheduler.apply_cluster_queue(cq)
        scheduler.apply_local_queue(LocalQueue("default", cq.name, cq.name))
    scheduler.set_namespace("default", {})
    return scheduler, topologies


def gang(
    name: str, queue: str, pods: int, *, priority: int = 0, host: str | None = None
) -> MakeWorkload:
    """``pods`` pods of 4 GPUs, all required in one rack; ``host`` pins them to a node."""
    pod_set = MakePodSet("workers", pods).request(GPU, 4).topology(TopologyRequest.required(RACK))
    if host is not None:
        pod_set.node_selector(HOSTNAME_LABEL, host)
    return MakeWorkload(name).queue(queue).priority(priority).pod_sets(pod_set)


def gpu_queue(name: str, nominal: int) -> MakeClusterQueue:
    return MakeClusterQueue(name).resource_group(MakeFlavorQuotas("gpu").resource(GPU, nominal))


def racks_of(placement: object) -> set[str]:
    assert isinstance(placement, PodSetPlacement)
    return {d.values[0] for d in placement.domains}


def test_no_reclaim_for_a_gang_no_rack_can_hold() -> None:
    # make demo's a-too-wide: team-a may reclaim team-b's borrowed GPUs, but its gang needs
    # 3 hosts in one rack and racks have 2, so evicting team-b would be for nothing.
    scheduler, _ = tas(
        gpu_queue("team-a", 12).cohort("co").preemption(reclaim=ANY).obj(),
        gpu_queue("team-b", 4).cohort("co").obj(),
    )
    scheduler.add_workload(gang("b-borrows", "team-b", 2).obj())
    assert admitted_names(scheduler.run_cycle(1)) == ["b-borrows"]
    scheduler.add_workload(gang("a-too-wide", "team-a", 3).obj())
    for now in range(2, 6):
        result = scheduler.run_cycle(now)
        assert victim_names(result) == []
        assert result.admitted == ()
    explanation = scheduler.explain("default/a-too-wide")
    assert explanation is not None
    assert explanation.reason == PendingReason.TOPOLOGY_PLACEMENT_FAILED
    assert "no preemption can make room" in explanation.message
    assert "rack" in explanation.message
    assert scheduler.admission_of("default/b-borrows") is not None


def test_victims_are_chosen_where_the_gang_then_fits() -> None:
    # Four 1-host workloads fill two racks. By quota alone the two low-priority ones are the
    # victims, but they sit in different racks: freeing them gives no rack two free hosts.
    # The topology-aware search evicts one low and one mid workload of the same rack.
    scheduler, _ = tas(gpu_queue("cq", 16).preemption(within=LOWER).obj())
    scheduler.add_workload(gang("low-r0", "cq", 1, priority=0, host="r0-n0").obj())
    scheduler.add_workload(gang("low-r1", "cq", 1, priority=0, host="r1-n0").obj())
    scheduler.add_workload(gang("mid-r0", "cq", 1, priority=5, host="r0-n1").obj())
    scheduler.add_workload(gang("mid-r1", "cq", 1, priority=5, host="r1-n1").obj())
    assert len(scheduler.run_cycle(1).admitted) == 4
    scheduler.add_workload(gang("high", "cq", 2, priority=9).obj())
    result = scheduler.run_cycle(2)
    assert victim_names(result) == ["low-r1", "mid-r1"]
    for victim in ("default/low-r1", "default/mid-r1"):
        scheduler.workload_evicted(victim, now=3)
    done = scheduler.run_cycle(3)
    assert admitted_names(done) == ["high"]
    assert racks_of(done.admitted[0].admission.pod_sets[0].topology_assignment) == {"rack-1"}


def test_preemption_in_the_rack_the_gang_needs() -> None:
    # The simplest positive case: the victim holds exactly the rack the preemptor needs.
    scheduler, _ = tas(gpu_queue("cq", 8).preemption(within=LOWER).obj(), racks=1)
    scheduler.add_workload(gang("low", "cq", 2, priority=0).obj())
    assert admitted_names(scheduler.run_cycle(1)) == ["low"]
    scheduler.add_workload(gang("high", "cq", 2, priority=9).obj())
    assert victim_names(scheduler.run_cycle(2)) == ["low"]
    scheduler.workload_evicted("default/low", now=3)
    assert admitted_names(scheduler.run_cycle(3)) == ["high"]


def test_a_claim_that_cannot_be_placed_does_not_preempt_again() -> None:
    # high preempts both hosts' workloads; before they are gone a foreign pod takes one of
    # the hosts. high then cannot be placed; mid comes back, and high must not evict it
    # again (it still would not fit) however often the queue is woken.
    scheduler, topologies = tas(gpu_queue("cq", 8).preemption(within=LOWER).obj(), racks=1)
    scheduler.add_workload(gang("low", "cq", 1, priority=0).obj())
    scheduler.add_workload(gang("mid", "cq", 1, priority=5).obj())
    assert len(scheduler.run_cycle(1).admitted) == 2
    scheduler.add_workload(gang("high", "cq", 2, priority=9).obj())
    assert victim_names(scheduler.run_cycle(2)) == ["low", "mid"]
    topologies.add_pod(uid="intruder", node="r0-n0", requests={GPU: 4})
    scheduler.capacity_changed()
    scheduler.workload_evicted("default/low", now=3)
    scheduler.workload_evicted("default/mid", now=3)
    failed = scheduler.run_cycle(3)
    assert "high" not in admitted_names(failed)
    assert admitted_names(failed) == ["mid"]  # the one host left
    for now in range(4, 8):
        scheduler.capacity_changed()
        again = scheduler.run_cycle(now)
        assert victim_names(again) == [] and again.admitted == ()
    explanation = scheduler.explain("default/high")
    assert explanation is not None
    assert explanation.reason == PendingReason.TOPOLOGY_PLACEMENT_FAILED
    # Once the host is free again, evicting mid does make room: preemption resumes.
    topologies.remove_pod("intruder")
    scheduler.capacity_changed()
    assert victim_names(scheduler.run_cycle(8)) == ["mid"]
