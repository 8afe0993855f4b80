"""Admission fair sharing (Kueue's ``UsageBasedAdmissionFairSharing``): a ClusterQueue serves
its LocalQueues by weighted decayed usage, then priority, then FIFO; an admission charges
its LocalQueue the entry penalty; sampling decays usage towards what is held now.

From Kueue: ``pkg/util/admissionfairsharing`` (alpha, decay, penalty, usage),
``pkg/cache/queue/cluster_queue.go`` (``queueOrderingFunc``: usage before priority), the
LocalQueue controller (sampling every ``usageSamplingInterval``) and
site/content/en/docs/concepts/admission_fair_sharing.md.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from core_builders import MakeClusterQueue, MakeFlavorQuotas, MakeWorkload, admitted_names, flavor

from phalanx.admission import fair_usage as afs
from phalanx.admission.decisions import PendingReason
from phalanx.admission.model import LocalQueue
from phalanx.admission.scheduler import Scheduler, SchedulerConfig

HOUR = 3_600_000
GPU = "nvidia.com/gpu"


# -- the arithmetic, with values worked out by hand ---------------------------------------------


def test_alpha_and_decay_known_values() -> None:
    assert afs.alpha(HOUR, HOUR) == pytest.approx(0.5)
    assert afs.alpha(30 * 60_000, HOUR) == pytest.approx(1 - 2**-0.5)  # 0.29289...
    assert afs.alpha(HOUR, 0) == 0.0  # Kueue: a half-life of 0 never moves consumed
    assert afs.decayed({GPU: 4.0}, {}, HOUR, HOUR) == pytest.approx({GPU: 2.0})
    assert afs.decayed({}, {GPU: 2.0}, HOUR, HOUR) == pytest.approx({GPU: 1.0})
    # Two half-lives: 8 -> 2 with nothing held; 8 -> 2 + 4 x 0.75 = 5 with 4 held.
    assert afs.decayed({GPU: 8.0}, {GPU: 4.0}, 2 * HOUR, HOUR) == pytest.approx({GPU: 5.0})
    config = afs.AdmissionFairSharing(usage_half_life_ms=HOUR, usage_sampling_interval_ms=HOUR)
    assert afs.entry_penalty({GPU: 2.0, "cpu": 8.0}, config) == pytest.approx(
        {GPU: 1.0, "cpu": 4.0}
    )


def test_weighted_usage_as_kueue() -> None:
    consumed = {GPU: 2.0, "cpu": 8.0, "memory": 2.0**30}
    assert afs.weighted_usage(consumed, 2.0, {"cpu": 0.0, "memory": 0.0}) == 1.0
    assert afs.weighted_usage(consumed, 1.0, {"cpu": 0.5, "memory": 0.0}) == 6.0
    assert afs.weighted_usage(consumed, 0.0, {}) == math.inf
    assert afs.kueue_amount("cpu", 1500) == 1.5
    assert afs.kueue_amount(GPU, 3) == 3.0


def test_interval_integral_equals_kueue_sampling_of_constant_usage() -> None:
    """3 GPUs held over [1h, 5h), sampled every 6 minutes until 9h with Kueue's recurrence,
    equals the exact integral of the kernel; consumed x H / ln 2 is the decayed GPU-hours."""
    half_life, step = 2 * HOUR, HOUR // 10
    consumed: dict[str, float] = {}
    for t in range(step, 9 * HOUR + 1, step):
        held = {GPU: 3.0} if HOUR < t <= 5 * HOUR else {}
        consumed = afs.decayed(consumed, held, step, half_life)
    exact = afs.interval_consumed(3.0, HOUR, 5 * HOUR, 9 * HOUR, half_life)
    assert consumed[GPU] == pytest.approx(exact, rel=1e-9)
    assert exact == pytest.approx(3.0 * (0.5**2 - 0.5**4))
    # Held up to now for a long time: consumed tends to what is held (3), ~8.66 GPU-hours.
    assert afs.interval_consumed(3.0, 0, 100 * HOUR, 100 * HOUR, half_life) == pytest.approx(3.0)
    assert afs.resource_hours(1.0, HOUR) == pytest.approx(1 / math.log(2))
    assert afs.interval_consumed(3.0, 0, HOUR, HOUR, 0) == 0.0


# -- ordering in the scheduler ------------------------------------------------------------------


def _scheduler(
    *,
    gpus: int = 1,
    fair: bool = True,
    configured: bool = True,
    weights: dict[str, float] | None = None,
    lq_weights: tuple[float, float] = (1.0, 1.0),
) -> Scheduler:
    config = afs.AdmissionFairSharing(
        usage_half_life_ms=HOUR,
        usage_sampling_interval_ms=HOUR,
        resource_weights=weights or {},
    )
    s = Scheduler(config=SchedulerConfig(admission_fair_sharing=config if configured else None))
    s.apply_resource_flavor(flavor("default"))
    cq = (
        MakeClusterQueue("cq")
        .resource_group(MakeFlavorQuotas("default").resource(GPU, gpus).resource("cpu", 100))
        .obj()
    )
    s.apply_cluster_queue(dataclasses.replace(cq, usage_based_fair_sharing=fair))
    s.apply_local_queue(LocalQueue("default", "a", "cq", fair_weight=lq_weights[0]))
    s.apply_local_queue(LocalQueue("default", "b", "cq", fair_weight=lq_weights[1]))
    s.set_namespace("default", {})
    return s


def _submit(s: Scheduler, lq: str, count: int, *, start: int, priority: int = 0) -> None:
    for i in range(count):
        s.add_workload(
            MakeWorkload(f"{lq}{i}")
            .queue(lq)
            .request(GPU, 1)
            .request("cpu", 1)
            .priority(priority)
            .created(start + i)
            .obj()
        )


@pytest.mark.parametrize(
    ("fair", "configured", "first"),
    [(True, True, "b0"), (False, True, "a0"), (True, False, "a0")],
    ids=["usage-based", "cluster-queue-without-admission-scope", "not-configured"],
)
def test_lower_decayed_usage_goes_first(fair: bool, configured: bool, first: str) -> None:
    """a's workloads are older, but a used 4 GPUs lately: with the mode on, b goes first;
    without the ClusterQueue's admissionScope, or without the configuration, FIFO."""
    s = _scheduler(fair=fair, configured=configured)
    s.restore_local_queue_usage("default/a", {GPU: 4.0}, 0)
    _submit(s, "a", 2, start=0)
    _submit(s, "b", 2, start=10)
    assert admitted_names(s.run_cycle(1)) == [first]
    assert not s.books.problems(s.entries.values())


def test_usage_comes_before_priority() -> None:
    s = _scheduler()
    s.restore_local_queue_usage("default/a", {GPU: 4.0}, 0)
    _submit(s, "a", 1, start=0, priority=100)
    _submit(s, "b", 1, start=10, priority=0)
    assert admitted_names(s.run_cycle(1)) == ["b0"]


@pytest.mark.parametrize(
    ("lq_weights", "first"), [((1.0, 1.0), "b0"), ((4.0, 1.0), "a0"), ((0.0, 1.0), "b0")]
)
def test_local_queue_weight_divides_usage(lq_weights: tuple[float, float], first: str) -> None:
    """a consumed 4, b 2: weight 4 on a makes a's usage 1 < 2; weight 0 is always last."""
    s = _scheduler(lq_weights=lq_weights)
    s.restore_local_queue_usage("default/a", {GPU: 4.0}, 0)
    s.restore_local_queue_usage("default/b", {GPU: 2.0}, 0)
    _submit(s, "a", 1, start=0)
    _submit(s, "b", 1, start=10)
    assert admitted_names(s.run_cycle(1)) == [first]


@pytest.mark.parametrize(
    ("weights", "first"), [({}, "b0"), ({"cpu": 0.0}, "a0")], ids=["cpu-counts", "cpu-weight-0"]
)
def test_resource_weights(weights: dict[str, float], first: str) -> None:
    """a: 1 GPU and 100 cores consumed, b: 3 GPUs. Counting CPU, a's usage is 101 > 3;
    with resourceWeights cpu: 0 it is 1 < 3."""
    s = _scheduler(weights=weights)
    s.restore_local_queue_usage("default/a", {GPU: 1.0, "cpu": 100.0}, 0)
    s.restore_local_queue_usage("default/b", {GPU: 3.0}, 0)
    _submit(s, "a", 1, start=0)
    _submit(s, "b", 1, start=10)
    assert admitted_names(s.run_cycle(1)) == [first]


def test_entry_penalty_alternates_local_queues_within_one_cycle() -> None:
    """Both queues start at 0 and a's four workloads are older. Each admission charges its
    LocalQueue alpha(sampling) x 1 GPU at once, so the next head comes from the other queue:
    a, b, a, b. Without the penalty a would take all four in this cycle."""
    s = _scheduler(gpus=4)
    _submit(s, "a", 4, start=0)
    _submit(s, "b", 4, start=10)
    assert admitted_names(s.run_cycle(1)) == ["a0", "b0", "a1", "b1"]
    a = s.fair_usage.get("default/a") if s.fair_usage else None
    assert a is not None
    # Two admissions at one instant: the second decays nothing (elapsed 0), each adds 0.5
    # GPU (alpha(1h, 1h) = 0.5) and 0.5 core.
    assert a.consumed == pytest.approx({GPU: 1.0, "cpu": 1.0})
    assert not s.books.problems(s.entries.values())


def test_without_the_mode_one_queue_takes_everything() -> None:
    s = _scheduler(gpus=4, fair=False)
    _submit(s, "a", 4, start=0)
    _submit(s, "b", 4, start=10)
    assert admitted_names(s.run_cycle(1)) == ["a0", "a1", "a2", "a3"]


def test_sampling_decays_towards_what_is_held() -> None:
    s = _scheduler(gpus=1)
    _submit(s, "b", 1, start=0)
    assert admitted_names(s.run_cycle(0)) == ["b0"]
    assert s.admitted_usage("default/b") == {GPU: 1.0, "cpu": 1.0}
    sampled = s.sample_fair_usage(HOUR)
    # b: penalty 0.5 at 0, then one half-life holding 1 GPU: 0.5 x 0.5 + 1 x 0.5 = 0.75.
    assert sampled["default/b"].consumed[GPU] == pytest.approx(0.75)
    assert sampled["default/b"].last_update == HOUR
    # a had nothing: it starts empty at the sample.
    assert sampled["default/a"].consumed == {}
    s.finish_workload("default/b0")
    assert s.admitted_usage("default/b") == {}
    again = s.sample_fair_usage(2 * HOUR)
    assert again["default/b"].consumed[GPU] == pytest.approx(0.375)
    assert not s.books.problems(s.entries.values())


def test_turning_the_mode_off_restores_fifo() -> None:
    s = _scheduler()
    s.restore_local_queue_usage("default/a", {GPU: 4.0}, 0)
    _submit(s, "a", 1, start=0)
    _submit(s, "b", 1, start=10)
    assert [e.key for e in s.queues["cq"].queue.entries()] == ["default/b0", "default/a0"]
    cq = s.queues["cq"].spec
    s.apply_cluster_queue(dataclasses.replace(cq, usage_based_fair_sharing=False))
    assert [e.key for e in s.queues["cq"].queue.entries()] == ["default/a0", "default/b0"]
    assert admitted_names(s.run_cycle(1)) == ["a0"]


def test_explanation_names_the_queue_that_went_first_with_the_numbers() -> None:
    s = _scheduler()
    s.restore_local_queue_usage("default/a", {GPU: 4.0}, 0)
    _submit(s, "a", 1, start=0)
    _submit(s, "b", 1, start=10)
    result = s.run_cycle(0)
    assert admitted_names(result) == ["b0"]
    why = result.pending["default/a0"]
    assert why.reason == PendingReason.WAITING_FOR_QUOTA
    # a: 4 GPUs consumed = 4 x 1h / ln 2 = 5.8 GPU-hours; b was at 0 when it went first;
    # fair: (4 + b's penalty 0.5) / 2 weights = 2.25 -> 3.2 GPU-hours (CPU weighs too, but
    # neither queue has consumed CPU except b's penalty: the unit is then mixed).
    assert why.fair_sharing == (
        "admission fair sharing: LocalQueue default/a waited behind default/b, whose decayed"
        " usage is lower: 5.8 vs 0.0 weighted resource-hours (half-life 1h; a fair share by"
        " weight is 3.6)"
    )
    assert why.message.endswith(why.fair_sharing)
    assert why.fair_sharing in why.details()


def test_explanation_unit_is_the_one_resource_that_counts() -> None:
    s = _scheduler(weights={"cpu": 0.0})
    s.restore_local_queue_usage("default/a", {GPU: 4.0}, 0)
    _submit(s, "a", 1, start=0)
    _submit(s, "b", 1, start=10)
    why = s.run_cycle(0).pending["default/a0"]
    assert "5.8 vs 0.0 nvidia.com/gpu-hours" in why.fair_sharing
    assert "a fair share by weight is 3.2" in why.fair_sharing


def test_no_fair_sharing_note_without_the_mode() -> None:
    s = _scheduler(fair=False)
    _submit(s, "a", 1, start=0)
    _submit(s, "b", 1, start=10)
    result = s.run_cycle(0)
    assert result.pending["default/b0"].fair_sharing == ""


def test_the_fair_local_queue_list_follows_every_queue_change() -> None:
    """The list is kept between passes (not sorted every pass); each change that can alter
    it must be seen: a new LocalQueue, one moved to another ClusterQueue, the mode turned off
    and on, a LocalQueue or a ClusterQueue deleted."""
    s = _scheduler()
    assert s.fair_sharing_local_queues() == ["default/a", "default/b"]
    s.apply_local_queue(LocalQueue("default", "c", "cq"))
    assert s.fair_sharing_local_queues() == ["default/a", "default/b", "default/c"]
    plain = MakeClusterQueue("plain").resource_group(MakeFlavorQuotas("default")).obj()
    s.apply_cluster_queue(plain)
    s.apply_local_queue(LocalQueue("default", "c", "plain"))
    assert s.fair_sharing_local_queues() == ["default/a", "default/b"]
    cq = s.queues["cq"].spec
    s.apply_cluster_queue(dataclasses.replace(cq, usage_based_fair_sharing=False))
    assert s.fair_sharing_local_queues() == []
    s.apply_cluster_queue(dataclasses.replace(cq, usage_based_fair_sharing=True))
    assert s.fair_sharing_local_queues() == ["default/a", "default/b"]
    s.delete_local_queue("default", "a")
    assert s.fair_sharing_local_queues() == ["default/b"]
    s.delete_cluster_queue("cq")
    assert s.fair_sharing_local_queues() == []
