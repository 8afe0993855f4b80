"""Flavor assignment: order, fungibility, taints and labels, resource groups, all-or-nothing.

From Kueue's docs: concepts/cluster_queue.md ("Flavors and borrowing semantics",
"FlavorFungibility", "Resource Groups") and concepts/resource_flavor.md (taints, labels).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from core_builders import (
    MAY_STOP,
    TRY_NEXT,
    Cluster,
    MakeClusterQueue,
    MakeFlavorQuotas,
    MakePodSet,
    MakeWorkload,
    admitted_names,
    flavor,
)

from phalanx.admission.decisions import FitMode, PendingReason
from phalanx.admission.model import (
    ClusterQueue,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    ResourceFlavor,
    Taint,
    Toleration,
)


@dataclass
class FlavorCase:
    name: str
    queue: ClusterQueue
    workload: MakeWorkload
    flavors: list[ResourceFlavor] = field(
        default_factory=lambda: [flavor("spot"), flavor("on-demand")]
    )
    others: list[ClusterQueue] = field(default_factory=list)
    running: list[tuple[str, MakeWorkload]] = field(default_factory=list)
    """(queue, workload) admitted before the case's workload is tried."""
    want: dict[str, str] | None = None
    """resource -> flavor of the first pod set, or None when it must stay pending."""
    want_reason: PendingReason | None = None


def two_flavors(spot: str = "4", on_demand: str = "4") -> MakeClusterQueue:
    return MakeClusterQueue("cq").resource_group(
        MakeFlavorQuotas("spot").resource("cpu", spot),
        MakeFlavorQuotas("on-demand").resource("cpu", on_demand),
    )


def wl(cpu: str, name: str = "w") -> MakeWorkload:
    return MakeWorkload(name).queue("cq").request("cpu", cpu)


CASES = [
    FlavorCase(
        "first flavor in ClusterQueue order when it fits",
        queue=two_flavors().obj(),
        workload=wl("3"),
        want={"cpu": "spot"},
    ),
    FlavorCase(
        "next flavor when the first does not fit",
        queue=two_flavors(spot="2").obj(),
        workload=wl("3"),
        want={"cpu": "on-demand"},
    ),
    FlavorCase(
        "nothing fits: pending, waiting for quota",
        queue=two_flavors().obj(),
        workload=wl("3"),
        running=[("cq", wl("2", "a")), ("cq", wl("2", "b")), ("cq", wl("2", "c"))],
        want=None,
        want_reason=PendingReason.WAITING_FOR_QUOTA,
    ),
    FlavorCase(
        "larger than any flavor can ever hold: exceeds max quota",
        queue=two_flavors().obj(),
        workload=wl("5"),
        want=None,
        want_reason=PendingReason.EXCEEDS_MAX_QUOTA,
    ),
    FlavorCase(
        "resource the ClusterQueue does not cover: no matching flavor",
        queue=two_flavors().obj(),
        workload=wl("1").request("nvidia.com/gpu", 1),
        want=None,
        want_reason=PendingReason.NO_MATCHING_FLAVOR,
    ),
    FlavorCase(
        "whenCanBorrow MayStopSearch: borrows in the first flavor",
        queue=two_flavors(spot="2").cohort("c").fungibility(borrow=MAY_STOP).obj(),
        others=[
            MakeClusterQueue("lender")
            .cohort("c")
            .resource_group(MakeFlavorQuotas("spot").resource("cpu", "4"))
            .obj()
        ],
        workload=wl("3"),
        want={"cpu": "spot"},
    ),
    FlavorCase(
        "whenCanBorrow TryNextFlavor: prefers a flavor that fits without borrowing",
        queue=two_flavors(spot="2").cohort("c").fungibility(borrow=TRY_NEXT).obj(),
        others=[
            MakeClusterQueue("lender")
            .cohort("c")
            .resource_group(MakeFlavorQuotas("spot").resource("cpu", "4"))
            .obj()
        ],
        workload=wl("3"),
        want={"cpu": "on-demand"},
    ),
    FlavorCase(
        "whenCanBorrow TryNextFlavor still borrows when no flavor fits without it",
        queue=two_flavors(spot="2", on_demand="1").cohort("c").fungibility(borrow=TRY_NEXT).obj(),
        others=[
            MakeClusterQueue("lender")
            .cohort("c")
            .resource_group(MakeFlavorQuotas("spot").resource("cpu", "4"))
            .obj()
        ],
        workload=wl("3"),
        want={"cpu": "spot"},
    ),
    FlavorCase(
        "untolerated NoSchedule taint skips the flavor",
        queue=two_flavors().obj(),
        flavors=[flavor("spot", taints=[Taint("spot", "true", "NoSchedule")]), flavor("on-demand")],
        workload=wl("1"),
        want={"cpu": "on-demand"},
    ),
    FlavorCase(
        "a pod toleration admits to the tainted flavor",
        queue=two_flavors().obj(),
        flavors=[flavor("spot", taints=[Taint("spot", "true", "NoSchedule")]), flavor("on-demand")],
        workload=MakeWorkload("w")
        .queue("cq")
        .pod_sets(MakePodSet().request("cpu", "1").toleration(Toleration("spot", "Equal", "true"))),
        want={"cpu": "spot"},
    ),
    FlavorCase(
        "the flavor's own tolerations count",
        queue=two_flavors().obj(),
        flavors=[
            flavor(
                "spot",
                taints=[Taint("spot", "true", "NoExecute")],
                tolerations=[Toleration("spot", "Exists")],
            ),
            flavor("on-demand"),
        ],
        workload=wl("1"),
        want={"cpu": "spot"},
    ),
    FlavorCase(
        "PreferNoSchedule taints do not block",
        queue=two_flavors().obj(),
        flavors=[
            flavor("spot", taints=[Taint("spot", "true", "PreferNoSchedule")]),
            flavor("on-demand"),
        ],
        workload=wl("1"),
        want={"cpu": "spot"},
    ),
    FlavorCase(
        "node selector on a key the flavor defines must match",
        queue=two_flavors().obj(),
        flavors=[
            flavor("spot", labels={"instance": "spot"}),
            flavor("on-demand", labels={"instance": "on-demand"}),
        ],
        workload=MakeWorkload("w")
        .queue("cq")
        .pod_sets(MakePodSet().request("cpu", "1").node_selector("instance", "on-demand")),
        want={"cpu": "on-demand"},
    ),
    FlavorCase(
        "node selector keys the flavor does not define are ignored",
        queue=two_flavors().obj(),
        flavors=[flavor("spot", labels={"instance": "spot"}), flavor("on-demand")],
        workload=MakeWorkload("w")
        .queue("cq")
        .pod_sets(MakePodSet().request("cpu", "1").node_selector("zone", "a")),
        want={"cpu": "spot"},
    ),
    FlavorCase(
        "required node affinity NotIn excludes a flavor",
        queue=two_flavors().obj(),
        flavors=[
            flavor("spot", labels={"instance": "spot"}),
            flavor("on-demand", labels={"instance": "on-demand"}),
        ],
        workload=MakeWorkload("w")
        .queue("cq")
        .pod_sets(
            MakePodSet()
            .request("cpu", "1")
            .affinity(NodeSelectorTerm((NodeSelectorRequirement("instance", "NotIn", ("spot",)),)))
        ),
        want={"cpu": "on-demand"},
    ),
    FlavorCase(
        "no flavor matches the labels: no matching flavor",
        queue=two_flavors().obj(),
        flavors=[
            flavor("spot", labels={"instance": "spot"}),
            flavor("on-demand", labels={"instance": "on-demand"}),
        ],
        workload=MakeWorkload("w")
        .queue("cq")
        .pod_sets(MakePodSet().request("cpu", "1").node_selector("instance", "arm")),
        want=None,
        want_reason=PendingReason.NO_MATCHING_FLAVOR,
    ),
    FlavorCase(
        "resources of one group share a flavor",
        queue=MakeClusterQueue("cq")
        .resource_group(
            MakeFlavorQuotas("spot").resource("cpu", "4").resource("memory", "1Gi"),
            MakeFlavorQuotas("on-demand").resource("cpu", "4").resource("memory", "8Gi"),
        )
        .obj(),
        workload=wl("2").request("memory", "2Gi"),
        want={"cpu": "on-demand", "memory": "on-demand"},
    ),
    FlavorCase(
        "separate groups choose flavors independently",
        queue=MakeClusterQueue("cq")
        .resource_group(
            MakeFlavorQuotas("spot").resource("cpu", "4"),
            MakeFlavorQuotas("on-demand").resource("cpu", "4"),
        )
        .resource_group(
            MakeFlavorQuotas("a100").resource("nvidia.com/gpu", 0),
            MakeFlavorQuotas("h100").resource("nvidia.com/gpu", 8),
        )
        .obj(),
        flavors=[flavor("spot"), flavor("on-demand"), flavor("a100"), flavor("h100")],
        workload=wl("2").request("nvidia.com/gpu", 4),
        want={"cpu": "spot", "nvidia.com/gpu": "h100"},
    ),
    FlavorCase(
        "the pods resource counts pods when the ClusterQueue covers it",
        queue=MakeClusterQueue("cq")
        .resource_group(MakeFlavorQuotas("spot").resource("cpu", "10").resource("pods", 2))
        .obj(),
        flavors=[flavor("spot")],
        workload=MakeWorkload("w").queue("cq").pod_sets(MakePodSet("main", 3).request("cpu", "1")),
        want=None,
        want_reason=PendingReason.EXCEEDS_MAX_QUOTA,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_flavor_assignment(case: FlavorCase) -> None:
    cluster = Cluster(flavors=case.flavors, queues=[case.queue, *case.others])
    for queue, running in case.running:
        cluster.admit_all(running.queue(queue))
    cluster.submit(case.workload)
    result = cluster.cycle()
    key = case.workload.obj().key
    admitted = {a.workload: a.admission for a in result.admitted}
    if case.want is None:
        assert key not in admitted
        explanation = cluster.scheduler.explain(key)
        assert explanation is not None
        assert explanation.reason == case.want_reason, explanation.message
        assert explanation.message
    else:
        assert key in admitted, result.pending.get(key)
        assert dict(admitted[key].pod_sets[0].flavors) == case.want


def test_all_pod_sets_fit_or_none_is_admitted() -> None:
    queue = MakeClusterQueue("cq").resource_group(MakeFlavorQuotas("default").resource("cpu", "4"))
    cluster = Cluster(queues=[queue.obj()])
    job = (
        MakeWorkload("gang")
        .queue("cq")
        .pod_sets(MakePodSet("driver", 1).request("cpu", "1"))
        .pod_sets(MakePodSet("workers", 4).request("cpu", "1"))
    )
    result = cluster.submit(job).cycle()
    assert result.admitted == ()
    assert cluster.usage("cq") == 0
    explanation = cluster.scheduler.explain("default/gang")
    assert explanation is not None
    assert [ps.name for ps in explanation.pod_sets] == ["driver", "workers"]
    worker = explanation.pod_sets[1].attempts[0]
    assert worker.mode == FitMode.NO_FIT
    # The workers' request includes what the driver already took from the flavor.
    assert worker.resources[0].requested == 5000


def test_two_pod_sets_share_the_flavor_quota() -> None:
    queue = MakeClusterQueue("cq").resource_group(MakeFlavorQuotas("default").resource("cpu", "5"))
    cluster = Cluster(queues=[queue.obj()])
    job = (
        MakeWorkload("gang")
        .queue("cq")
        .pod_sets(MakePodSet("driver", 1).request("cpu", "1"))
        .pod_sets(MakePodSet("workers", 4).request("cpu", "1"))
    )
    result = cluster.admit_all(job)
    counts = {ps.name: ps.count for ps in result.admitted[0].admission.pod_sets}
    assert counts == {"driver": 1, "workers": 4}
    assert cluster.usage("cq") == 5000


@pytest.mark.parametrize(
    ("count", "min_count", "free", "want"),
    [
        (8, 2, "5", 5),  # largest count that fits
        (8, 2, "8", 8),  # all fits: no reduction
        (8, 6, "5", None),  # even minCount does not fit
        (8, None, "5", None),  # no minCount: all or nothing
        (3, 1, "1", 1),
    ],
)
def test_partial_admission_min_count(
    count: int, min_count: int | None, free: str, want: int | None
) -> None:
    queue = MakeClusterQueue("cq").resource_group(MakeFlavorQuotas("default").resource("cpu", free))
    cluster = Cluster(queues=[queue.obj()])
    pod_set = MakePodSet("workers", count).request("cpu", "1")
    if min_count is not None:
        pod_set.min_count(min_count)
    result = cluster.submit(MakeWorkload("job").queue("cq").pod_sets(pod_set)).cycle()
    if want is None:
        assert result.admitted == ()
    else:
        assert admitted_names(result) == ["job"]
        assert result.admitted[0].admission.pod_sets[0].count == want
        assert cluster.usage("cq") == want * 1000


def test_missing_flavor_makes_the_queue_inactive_until_it_appears() -> None:
    queue = MakeClusterQueue("cq").resource_group(MakeFlavorQuotas("gpu").resource("cpu", "4"))
    cluster = Cluster(flavors=[], queues=[queue.obj()])
    result = cluster.submit(wl("1")).cycle()
    assert result.admitted == ()
    explanation = cluster.scheduler.explain("default/w")
    assert explanation is not None and explanation.reason == PendingReason.CLUSTER_QUEUE_INACTIVE
    assert "FlavorNotFound" in explanation.message
    cluster.scheduler.apply_resource_flavor(flavor("gpu"))
    assert admitted_names(cluster.cycle()) == ["w"]
