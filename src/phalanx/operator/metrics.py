"""Prometheus metrics under Kueue's names and labels, so Kueue dashboards work unchanged.

Kueue's own metric set is large; these are the ones an operator dashboard is built on, plus
two of Phalanx's (cycle duration and API writes, the costs Phalanx is designed to keep low).
Each :class:`Metrics` has its own registry so tests and several operators in one process do
not collide. Served by :mod:`phalanx.operator.serving` (HTTPS, each scrape's token checked).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["Metrics"]


def _kueue_buckets(count: int = 14) -> list[float]:
    """Kueue's ``generateExponentialBuckets``: 1, then 2.5 doubling."""
    return [1.0] + [2.5 * 2**i for i in range(count - 1)]


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        # What queue_state last set per ClusterQueue: the same levels again set nothing (each
        # labels() lookup costs; with 1,000 ClusterQueues a status pass mostly repeats them).
        self._queue_levels: dict[str, tuple[object, ...]] = {}
        r = self.registry
        self.pending_workloads = Gauge(
            "kueue_pending_workloads",
            "The number of pending workloads, per 'cluster_queue' and 'status'.",
            ["cluster_queue", "status"],
            registry=r,
        )
        self.quota_reserved_workloads_total = Counter(
            "kueue_quota_reserved_workloads",
            "The total number of quota reserved workloads per 'cluster_queue'",
            ["cluster_queue"],
            registry=r,
        )
        self.admitted_workloads_total = Counter(
            "kueue_admitted_workloads",
            "The total number of admitted workloads per 'cluster_queue'",
            ["cluster_queue"],
            registry=r,
        )
        self.admission_wait_time = Histogram(
            "kueue_admission_wait_time_seconds",
            "The time between a workload was created or requeued until admission, "
            "per 'cluster_queue'",
            ["cluster_queue"],
            buckets=_kueue_buckets(),
            registry=r,
        )
        self.quota_reserved_wait_time = Histogram(
            "kueue_quota_reserved_wait_time_seconds",
            "The time between a workload was created or requeued until it got quota "
            "reservation, per 'cluster_queue'",
            ["cluster_queue"],
            buckets=_kueue_buckets(),
            registry=r,
        )
        self.evicted_workloads_total = Counter(
            "kueue_evicted_workloads",
            "The number of evicted workloads per 'cluster_queue' and 'reason'",
            ["cluster_queue", "reason"],
            registry=r,
        )
        self.preempted_workloads_total = Counter(
            "kueue_preempted_workloads",
            "The number of preempted workloads per 'preempting_cluster_queue' and 'reason'",
            ["preempting_cluster_queue", "reason"],
            registry=r,
        )
        self.reserving_active_workloads = Gauge(
            "kueue_reserving_active_workloads",
            "The number of Workloads that are reserving quota, per 'cluster_queue'",
            ["cluster_queue"],
            registry=r,
        )
        self.admitted_active_workloads = Gauge(
            "kueue_admitted_active_workloads",
            "The number of admitted Workloads that are active, per 'cluster_queue'",
            ["cluster_queue"],
            registry=r,
        )
        self.cluster_queue_status = Gauge(
            "kueue_cluster_queue_status",
            "Reports 'cluster_queue' with its 'status' ('pending', 'active' or 'terminating')",
            ["cluster_queue", "status"],
            registry=r,
        )
        self.cluster_queue_resource_usage = Gauge(
            "kueue_cluster_queue_resource_usage",
            "Reports the cluster_queue's total resource usage within all the flavors",
            ["cohort", "cluster_queue", "flavor", "resource"],
            registry=r,
        )
        self.cluster_queue_resource_reservation = Gauge(
            "kueue_cluster_queue_resource_reservation",
            "Reports the cluster_queue's total resource reservation within all the flavors",
            ["cohort", "cluster_queue", "flavor", "resource"],
            registry=r,
        )
        self.cluster_queue_nominal_quota = Gauge(
            "kueue_cluster_queue_nominal_quota",
            "Reports the cluster_queue's nominal quota within all the flavors",
            ["cohort", "cluster_queue", "flavor", "resource"],
            registry=r,
        )
        self.pending_by_reason = Gauge(
            "phalanx_pending_workloads",
            "Pending workloads per 'cluster_queue' and the 'reason' of their explanation "
            "(empty cluster_queue: the workload reaches none)",
            ["cluster_queue", "reason"],
            registry=r,
        )
        self.budget_used = Gauge(
            "phalanx_budget_used_resource_hours",
            "Resource-hours a usage budget's 'scope' used of its 'resource' in the current"
            " window, running workloads up to now",
            ["scope", "resource"],
            registry=r,
        )
        self.budget_limit = Gauge(
            "phalanx_budget_limit_resource_hours",
            "A usage budget's limit in resource-hours per window, per 'scope' and 'resource'",
            ["scope", "resource"],
            registry=r,
        )
        self.cycle_duration = Histogram(
            "phalanx_scheduling_cycle_duration_seconds",
            "Wall time of one scheduling cycle of the core (decisions only, no API writes)",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.api_writes_total = Counter(
            "phalanx_api_writes",
            "API writes made by the operator, per 'kind', 'verb' and 'result'",
            ["kind", "verb", "result"],
            registry=r,
        )

        self.events_skipped_total = Counter(
            "phalanx_events_skipped",
            "Routine Events not written because of the routine Events rate limit, per 'reason'",
            ["reason"],
            registry=r,
        )

    # Helpers used by the operator, so label order lives in one place.

    def admitted(self, cluster_queue: str, *, wait_seconds: float) -> None:
        self.quota_reserved_workloads_total.labels(cluster_queue).inc()
        self.admitted_workloads_total.labels(cluster_queue).inc()
        self.admission_wait_time.labels(cluster_queue).observe(wait_seconds)
        self.quota_reserved_wait_time.labels(cluster_queue).observe(wait_seconds)

    def evicted(self, cluster_queue: str, *, reason: str) -> None:
        self.evicted_workloads_total.labels(cluster_queue, reason).inc()

    def preempted(self, preempting_cluster_queue: str, *, reason: str) -> None:
        self.preempted_workloads_total.labels(preempting_cluster_queue, reason).inc()

    def api_write(self, kind: str, verb: str, *, ok: bool) -> None:
        self.api_writes_total.labels(kind, verb, "success" if ok else "error").inc()

    def queue_state(
        self,
        cluster_queue: str,
        *,
        cohort: str,
        active: bool,
        pending_active: int,
        pending_inadmissible: int,
        reserving: int,
        admitted: int,
        usage: Mapping[tuple[str, str], float],
        nominal: Mapping[tuple[str, str], float],
    ) -> None:
        """Everything per ClusterQueue that is a level rather than an event; levels equal to
        the ones last set for ``cluster_queue`` are not set again."""
        levels = (
            cohort,
            active,
            pending_active,
            pending_inadmissible,
            reserving,
            admitted,
            dict(usage),
            dict(nominal),
        )
        if self._queue_levels.get(cluster_queue) == levels:
            return
        self._queue_levels[cluster_queue] = levels
        self.pending_workloads.labels(cluster_queue, "active").set(pending_active)
        self.pending_workloads.labels(cluster_queue, "inadmissible").set(pending_inadmissible)
        self.reserving_active_workloads.labels(cluster_queue).set(reserving)
        self.admitted_active_workloads.labels(cluster_queue).set(admitted)
        for status in ("pending", "active", "terminating"):
            wanted = "active" if active else "pending"
            self.cluster_queue_status.labels(cluster_queue, status).set(
                1 if status == wanted else 0
            )
        for (flavor, resource), value in usage.items():
            self.cluster_queue_resource_usage.labels(cohort, cluster_queue, flavor, resource).set(
                value
            )
            self.cluster_queue_resource_reservation.labels(
                cohort, cluster_queue, flavor, resource
            ).set(value)
        for (flavor, resource), value in nominal.items():
            self.cluster_queue_nominal_quota.labels(cohort, cluster_queue, flavor, resource).set(
                value
            )

    def forget_queue(self, cluster_queue: str) -> None:
        self._queue_levels.pop(cluster_queue, None)
        for status in ("active", "inadmissible"):
            _remove(self.pending_workloads, cluster_queue, status)
        for status in ("pending", "active", "terminating"):
            _remove(self.cluster_queue_status, cluster_queue, status)
        _remove(self.reserving_active_workloads, cluster_queue)
        _remove(self.admitted_active_workloads, cluster_queue)


def _remove(metric: Gauge, *labels: str) -> None:
    with contextlib.suppress(KeyError):
        metric.remove(*labels)
