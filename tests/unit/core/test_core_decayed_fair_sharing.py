"""Decayed fair sharing (Phalanx's ``decayedFairSharing``): with fair sharing on, the order
between ClusterQueues of a cohort uses each one's decayed usage (a Cohort's: the sum of its
ClusterQueues') instead of what it holds now; quota checks stay on what is held now.

team-a and team-b share cohort ``org``: 1 GPU of nominal quota each, so a 2-GPU workload
borrows 1 and only one of them fits at a time.
"""

from __future__ import annotations

import pytest
from core_builders import (
    MakeClusterQueue,
    MakeCohort,
    MakeFlavorQuotas,
    MakeWorkload,
    admitted_names,
    flavor,
)

from phalanx.admission import fair_usage as afs
from phalanx.admission.model import LocalQueue
from phalanx.admission.scheduler import Scheduler, SchedulerConfig
from phalanx.quotas.fairshare import dominant_resource_share
from phalanx.quotas.resources import ResourceQuota
from phalanx.quotas.tree import ResourceTree

HOUR = 3_600_000
GPU = "nvidia.com/gpu"
DECAY = afs.AdmissionFairSharing(usage_half_life_ms=HOUR, usage_sampling_interval_ms=HOUR)


def _scheduler(*, fair_sharing: bool = True, decayed: bool = True, gpus: int = 1) -> Scheduler:
    s = Scheduler(
        config=SchedulerConfig(
            fair_sharing=fair_sharing, decayed_fair_sharing=DECAY if decayed else None
        )
    )
    s.apply_resource_flavor(flavor("default"))
    for team in ("team-a", "team-b"):
        s.apply_cluster_queue(
            MakeClusterQueue(team)
            .cohort("org")
            .resource_group(MakeFlavorQuotas("default").resource(GPU, gpus))
            .obj()
        )
        s.apply_local_queue(LocalQueue("default", team, team))
    s.set_namespace("default", {})
    return s


def _submit(s: Scheduler, team: str, count: int = 1, *, start: int, gpus: int = 2) -> None:
    for i in range(count):
        s.add_workload(
            MakeWorkload(f"{team}-{i}").queue(team).request(GPU, gpus).created(start + i).obj()
        )


@pytest.mark.parametrize(
    ("fair_sharing", "decayed", "first"),
    [
        (True, True, "team-b-0"),
        (True, False, "team-a-0"),
        (False, True, "team-a-0"),
    ],
    ids=["decayed", "instantaneous-drs", "fair-sharing-off"],
)
def test_heavy_decayed_usage_goes_last(fair_sharing: bool, decayed: bool, first: str) -> None:
    """Neither holds anything now, and team-a's workload is older: plain DRS ties and FIFO
    picks team-a; on decayed usage team-a (4 GPUs lately, nominal 1) goes after team-b. The
    configuration does nothing without fair sharing."""
    s = _scheduler(fair_sharing=fair_sharing, decayed=decayed)
    s.restore_cluster_queue_usage("team-a", {GPU: 4.0}, 0)
    _submit(s, "team-a", start=0)
    _submit(s, "team-b", start=10)
    assert admitted_names(s.run_cycle(1)) == [first]
    assert not s.books.problems(s.entries.values())


def test_the_waiting_head_says_decayed_usage_put_the_other_first() -> None:
    s = _scheduler()
    s.restore_cluster_queue_usage("team-a", {GPU: 4.0}, 0)
    _submit(s, "team-a", start=0)
    _submit(s, "team-b", start=10)
    result = s.run_cycle(1)
    assert admitted_names(result) == ["team-b-0"]
    # 4 GPUs x 1h / ln 2 = 5.77 GPU-hours; the fair amount is the quota, 1 GPU x 1h / ln 2;
    # team-b paid its entry penalty when admitted: 2 GPUs x alpha(1h, 1h) = 1 GPU -> 1.44.
    explanation = result.pending["default/team-a-0"]
    assert explanation.fair_sharing == (
        "decayed fair sharing: ClusterQueue team-a used 5.8 nvidia.com/gpu-hours (decayed,"
        " half-life 1h) vs a fair 1.4 (its quota held throughout); ClusterQueue team-b went"
        " first, having used 1.4"
    )
    assert explanation.fair_sharing in explanation.message


def test_instantaneous_drs_says_nothing_about_decayed_usage() -> None:
    s = _scheduler(decayed=False)
    _submit(s, "team-b", start=0)
    _submit(s, "team-a", start=10)
    result = s.run_cycle(1)
    assert admitted_names(result) == ["team-b-0"]
    assert result.pending["default/team-a-0"].fair_sharing == ""


def test_low_decayed_usage_never_admits_past_quota() -> None:
    """team-b has used nothing lately, but team-a holds the cohort's 2 GPUs now: team-b
    waits for quota (no preemption configured), whatever the decayed figures say."""
    s = _scheduler()
    _submit(s, "team-a", start=0)
    assert admitted_names(s.run_cycle(1)) == ["team-a-0"]
    s.restore_cluster_queue_usage("team-a", {GPU: 40.0}, 1)
    _submit(s, "team-b", start=10)
    assert admitted_names(s.run_cycle(2)) == []
    assert not s.books.problems(s.entries.values())


def test_heavy_decayed_usage_alone_still_admits() -> None:
    """Decayed usage only orders: with nobody else waiting, team-a borrows as before."""
    s = _scheduler()
    s.restore_cluster_queue_usage("team-a", {GPU: 40.0}, 0)
    _submit(s, "team-a", start=0)
    assert admitted_names(s.run_cycle(1)) == ["team-a-0"]


def test_admission_charges_the_entry_penalty_and_sampling_decays() -> None:
    s = _scheduler()
    _submit(s, "team-b", start=0)
    assert admitted_names(s.run_cycle(0)) == ["team-b-0"]
    ledger = s.decayed_usage
    assert ledger is not None
    b = ledger.get("team-b")
    assert b is not None and b.consumed == pytest.approx({GPU: 1.0})
    assert s.cluster_queue_current("team-b") == {GPU: 2.0}
    sampled = s.sample_decayed_usage(HOUR)
    # 1 GPU decays to 0.5 over one half-life, and holding 2 adds 2 x 0.5.
    assert sampled["team-b"].consumed[GPU] == pytest.approx(1.5)
    assert sampled["team-a"].consumed == {}
    assert s.sample_decayed_usage(HOUR + 1, every=HOUR) == {}
    s.delete_cluster_queue("team-a")
    assert ledger.get("team-a") is None


def test_a_cohort_counts_the_sum_of_its_cluster_queues() -> None:
    """Hierarchical cohorts: org holds x (team-a, team-c) and team-b. x's decayed usage is
    team-a's plus team-c's, so team-b goes before team-c although team-c used nothing."""
    s = _scheduler()
    s.apply_cohort(MakeCohort("x").parent("org").obj())
    for team in ("team-a", "team-c"):
        s.apply_cluster_queue(
            MakeClusterQueue(team)
            .cohort("x")
            .resource_group(MakeFlavorQuotas("default").resource(GPU, 1))
            .obj()
        )
        s.apply_local_queue(LocalQueue("default", team, team))
    s.restore_cluster_queue_usage("team-a", {GPU: 3.0}, 0)
    s.restore_cluster_queue_usage("team-c", {GPU: 0.5}, 0)
    cohort = s.tree.cohort("x")
    assert cohort is not None and s.decayed_of(cohort) == {GPU: 3500}  # thousandths of a GPU
    _submit(s, "team-c", start=0, gpus=3)
    _submit(s, "team-b", start=10, gpus=3)
    result = s.run_cycle(1)
    assert admitted_names(result) == ["team-b-0"]
    assert "Cohort x used" in result.pending["default/team-c-0"].fair_sharing


def test_decayed_share_sums_flavors_per_resource() -> None:
    """Two GPU flavors of 1 each: 3 GPUs of decayed usage borrow 1, whatever the flavor;
    the share is that over what the parent could lend (4)."""
    tree = ResourceTree()
    for name in ("a", "b"):
        tree.set_cluster_queue(
            name,
            cohort="org",
            quotas={("f1", GPU): ResourceQuota(1), ("f2", GPU): ResourceQuota(1)},
            fair_weight=1000,
        )
    node = tree.cluster_queue("a")
    assert dominant_resource_share(node, decayed={GPU: 2000}).value == 0
    share = dominant_resource_share(node, decayed={GPU: 3000})
    assert (share.dominant_resource, share.weighted_share) == (GPU, 250)
    both = dominant_resource_share(node, {("f2", GPU): 1}, decayed={GPU: 2000})
    assert both.weighted_share == 250
    # Fractions count: 0.1 GPU above quota is 0.1 / 4 = 25 per mille.
    assert dominant_resource_share(node, decayed={GPU: 2100}).weighted_share == 25


def test_what_is_held_now_is_the_floor() -> None:
    """No history on either side and team-a's four 1-GPU workloads are older. On decayed
    usage alone (0 for both, the penalties tiny) team-a would take the cohort's 4 GPUs in
    this cycle; with what each holds now as the floor, each team stops at its nominal 2
    first, as with plain DRS."""
    s = Scheduler(
        config=SchedulerConfig(
            fair_sharing=True,
            decayed_fair_sharing=afs.AdmissionFairSharing(
                usage_half_life_ms=168 * HOUR, usage_sampling_interval_ms=300_000
            ),
        )
    )
    s.apply_resource_flavor(flavor("default"))
    for team in ("team-a", "team-b"):
        s.apply_cluster_queue(
            MakeClusterQueue(team)
            .cohort("org")
            .resource_group(MakeFlavorQuotas("default").resource(GPU, 2))
            .obj()
        )
        s.apply_local_queue(LocalQueue("default", team, team))
    s.set_namespace("default", {})
    _submit(s, "team-a", 4, start=0, gpus=1)
    _submit(s, "team-b", 4, start=10, gpus=1)
    admitted = admitted_names(s.run_cycle(1))
    assert sorted(admitted) == ["team-a-0", "team-a-1", "team-b-0", "team-b-1"]
