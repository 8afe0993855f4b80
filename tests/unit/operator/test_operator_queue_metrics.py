"""The per-ClusterQueue levels in /metrics: what queue_state is given is what is exported,
whether or not it was given before."""

from __future__ import annotations

from typing import Any

from phalanx.operator.metrics import Metrics


def _levels(**changes: Any) -> dict[str, Any]:
    levels: dict[str, Any] = {
        "cohort": "all",
        "active": True,
        "pending_active": 3,
        "pending_inadmissible": 0,
        "reserving": 2,
        "admitted": 2,
        "usage": {("rf", "cpu"): 4.0},
        "nominal": {("rf", "cpu"): 20.0},
    }
    return {**levels, **changes}


def _value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_each_change_of_a_level_is_exported_and_repeats_change_nothing() -> None:
    metrics = Metrics()
    metrics.queue_state("cq-a", **_levels())
    metrics.queue_state("cq-a", **_levels())
    assert _value(metrics, "kueue_pending_workloads", cluster_queue="cq-a", status="active") == 3
    usage = {"cohort": "all", "cluster_queue": "cq-a", "flavor": "rf", "resource": "cpu"}
    assert _value(metrics, "kueue_cluster_queue_resource_usage", **usage) == 4.0
    # One level changes at a time (a repeat skipped by mistake would keep the old value).
    metrics.queue_state("cq-a", **_levels(pending_active=1))
    assert _value(metrics, "kueue_pending_workloads", cluster_queue="cq-a", status="active") == 1
    metrics.queue_state("cq-a", **_levels(pending_active=1, usage={("rf", "cpu"): 9.0}))
    assert _value(metrics, "kueue_cluster_queue_resource_usage", **usage) == 9.0
    metrics.queue_state(
        "cq-a", **_levels(pending_active=1, usage={("rf", "cpu"): 9.0}, active=False)
    )
    status = {"cluster_queue": "cq-a", "status": "pending"}
    assert _value(metrics, "kueue_cluster_queue_status", **status) == 1
    # Another queue's levels are its own, even when equal.
    metrics.queue_state("cq-b", **_levels())
    assert _value(metrics, "kueue_pending_workloads", cluster_queue="cq-b", status="active") == 3


def test_a_forgotten_queue_is_exported_again_with_the_same_levels() -> None:
    metrics = Metrics()
    metrics.queue_state("cq-a", **_levels())
    metrics.forget_queue("cq-a")
    assert _value(metrics, "kueue_pending_workloads", cluster_queue="cq-a", status="active") is None
    metrics.queue_state("cq-a", **_levels())
    assert _value(metrics, "kueue_pending_workloads", cluster_queue="cq-a", status="active") == 3
