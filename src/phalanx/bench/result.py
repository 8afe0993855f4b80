"""The result of ``phalanx bench e2e``: the bench-core fields, real wall time, the operator's
API writes, CPU and resident memory, and Phalanx's end-to-end acceptance checks.

Time to admission (per class, p50, p99) counts from each Workload's *scheduled* creation;
the same figures from its actual creation are kept as ``*_admission_from_create_ms``, and
how late creation ran as ``creation_lag_*``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from phalanx.bench.core_replay import BenchResult, ClassResult
from phalanx.bench.proc import metric_sum

__all__ = [
    "WALL_OVER_IDEAL",
    "WRITES_PER_ADMISSION",
    "E2EResult",
    "e2e_problems",
    "write_counts",
]

# Phalanx's acceptance on top of Kueue's rangespec (issue 6/6).
WALL_OVER_IDEAL = 2.0
WRITES_PER_ADMISSION = 2.0


@dataclass(frozen=True)
class E2EResult:
    scenario: str
    workloads: int
    finished: int
    admissions: int
    evictions: int
    real_wall_ms: int
    ideal_ms: int
    classes: dict[str, ClassResult]
    """Average time to admission from the scheduled creation: checked against Kueue's
    thresholds."""
    cq_classes: dict[str, float]
    p50_time_to_admission_ms: int
    p99_time_to_admission_ms: int
    """From the scheduled creation."""
    avg_admission_from_create_ms: dict[str, int]
    p50_admission_from_create_ms: int
    p99_admission_from_create_ms: int
    """From the actual creation (first sight), as Kueue's recorder: informational only."""
    api_writes: int | None
    api_writes_per_admission: float | None
    api_writes_by_verb: dict[str, int]
    operator_cpu_s: float | None
    store_cpu_s: float | None
    """Of ``operator_cpu_s``, what the usage history store cost (its own CPU metric); None
    when the operator ran without a store or was not scraped."""
    cycles: int | None
    bench_cpu_s: float
    control_plane_cpu_s: dict[str, float]
    creation_lag_p50_ms: int
    creation_lag_p99_ms: int
    creation_lag_max_ms: int
    """Actual minus scheduled creation time, per created Workload."""
    operator_rss_peak_mib: float | None
    operator_rss_end_mib: float | None
    """The operator's resident memory: ``VmHWM`` (peak) and ``VmRSS`` when the last Workload
    finished, sampled from /proc; None if its pid is unknown."""
    operator_rss_samples: int
    operator_rss_max_gap_s: float
    """The longest time between two memory samples (sampled every 0.5 s)."""
    create_errors: int
    finish_writes: int
    invariant_problems: tuple[str, ...]
    setup_s: float
    operator_log: str | None
    release_latency_p50_ms: int = 0
    release_latency_p99_ms: int = 0
    releases_measured: int = 0
    """From a Workload's ``Finished`` seen to the next admission seen in its cohort of a
    Workload waiting by then (``WorkloadTracker.release_latencies_ms``)."""
    tas_nodes: int = 0
    """Nodes the run created for a TAS scenario (0 otherwise)."""
    tas_assignments_checked: int = 0
    """Reservations of TAS Workloads whose topologyAssignment the run judged."""
    timeline: str | None = None
    """``workloads.csv``: each Workload's times, in ms from ``timeline_origin_unix_ms``."""
    timeline_origin_unix_ms: int = 0
    stopped_components: tuple[str, ...] = ()
    """Control-plane components stopped before the measured run (``--bare``: all but etcd
    and kube-apiserver, as in Kueue's envtest); empty when the whole plane ran."""
    v1beta1_served: bool | None = None
    """Whether the CRDs the run installed serve v1beta1 (None: it installed none)."""

    def as_bench_result(self) -> BenchResult:
        """The bench-core view, wall time being real: what Kueue's rangespec checks."""
        return BenchResult(
            scenario=self.scenario,
            workloads=self.workloads,
            admissions=self.admissions,
            evictions=self.evictions,
            virtual_wall_ms=self.real_wall_ms,
            ideal_ms=self.ideal_ms,
            classes=self.classes,
            cq_classes=self.cq_classes,
            core_cpu_s=self.operator_cpu_s or 0.0,
            decisions=self.admissions,
            cycles=self.cycles or 0,
            attempts=0,
            invariant_violations=self.invariant_problems,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "workloads": self.workloads,
            "finished": self.finished,
            "admissions": self.admissions,
            "evictions": self.evictions,
            "real_wall_ms": self.real_wall_ms,
            "ideal_ms": self.ideal_ms,
            "wall_over_ideal": round(self.real_wall_ms / max(self.ideal_ms, 1), 3),
            "classes": {
                name: {
                    "count": c.count,
                    "avg_time_to_admission_ms": c.avg_time_to_admission_ms,
                    "avg_admission_from_create_ms": self.avg_admission_from_create_ms.get(name, 0),
                    "evictions": c.evictions,
                }
                for name, c in sorted(self.classes.items())
            },
            "cq_classes": {
                name: {"avg_usage_pct": round(pct, 2)}
                for name, pct in sorted(self.cq_classes.items())
            },
            "p50_time_to_admission_ms": self.p50_time_to_admission_ms,
            "p99_time_to_admission_ms": self.p99_time_to_admission_ms,
            "p50_admission_from_create_ms": self.p50_admission_from_create_ms,
            "p99_admission_from_create_ms": self.p99_admission_from_create_ms,
            "creation_lag_ms": {
                "max": self.creation_lag_max_ms,
                "p50": self.creation_lag_p50_ms,
                "p99": self.creation_lag_p99_ms,
            },
            "operator_rss_mib": None
            if self.operator_rss_peak_mib is None
            else {
                "peak": round(self.operator_rss_peak_mib, 1),
                "end": None
                if self.operator_rss_end_mib is None
                else round(self.operator_rss_end_mib, 1),
                "samples": self.operator_rss_samples,
                "max_sample_gap_s": round(self.operator_rss_max_gap_s, 2),
            },
            "release_latency_ms": {
                "p50": self.release_latency_p50_ms,
                "p99": self.release_latency_p99_ms,
                "count": self.releases_measured,
                "mean_cycle_interval": None
                if not self.cycles
                else round(self.real_wall_ms / self.cycles, 1),
            },
            "api_writes": self.api_writes,
            "api_writes_per_admission": (
                None
                if self.api_writes_per_admission is None
                else round(self.api_writes_per_admission, 3)
            ),
            "api_writes_by_verb": dict(sorted(self.api_writes_by_verb.items())),
            "operator_cpu_s": None
            if self.operator_cpu_s is None
            else round(self.operator_cpu_s, 2),
            "store_cpu_s": None if self.store_cpu_s is None else round(self.store_cpu_s, 2),
            "store_cpu_share": (
                None
                if self.store_cpu_s is None or not self.operator_cpu_s
                else round(self.store_cpu_s / self.operator_cpu_s, 4)
            ),
            "cycles": self.cycles,
            "bench_cpu_s": round(self.bench_cpu_s, 2),
            "control_plane_cpu_s": {
                k: round(v, 2) for k, v in sorted(self.control_plane_cpu_s.items())
            },
            "create_errors": self.create_errors,
            "finish_writes": self.finish_writes,
            "invariant_problems": list(self.invariant_problems),
            "setup_s": round(self.setup_s, 1),
            "stopped_components": list(self.stopped_components),
            "v1beta1_served": self.v1beta1_served,
            "operator_log": self.operator_log,
            "timeline": self.timeline,
            "timeline_origin_unix_ms": self.timeline_origin_unix_ms,
            "tas": None
            if not self.tas_nodes
            else {"nodes": self.tas_nodes, "assignments_checked": self.tas_assignments_checked},
        }


def e2e_problems(result: E2EResult) -> list[str]:
    """Phalanx's own end-to-end acceptance, beside Kueue's rangespec thresholds."""
    problems = list(result.invariant_problems)
    if result.finished < result.workloads:
        problems.append(f"only {result.finished}/{result.workloads} workloads finished")
    if result.create_errors:
        problems.append(f"{result.create_errors} workload creations failed")
    if result.real_wall_ms > WALL_OVER_IDEAL * result.ideal_ms:
        problems.append(
            f"real wall {result.real_wall_ms} ms > {WALL_OVER_IDEAL} x ideal {result.ideal_ms} ms"
        )
    per = result.api_writes_per_admission
    if per is not None and per > WRITES_PER_ADMISSION:
        problems.append(f"{per:.2f} API writes per admission > {WRITES_PER_ADMISSION}")
    return problems


def store_cpu(before: str | None, after: str | None) -> float | None:
    """The store's CPU seconds between two scrapes; None if it did not run (no metric)."""
    if before is None or after is None or _STORE_CPU not in after:
        return None
    return metric_sum(after, _STORE_CPU) - metric_sum(before, _STORE_CPU)


_STORE_CPU = "phalanx_store_cpu_seconds_total"


def write_counts(
    before: str | None, after: str | None
) -> tuple[int | None, dict[str, int], int | None]:
    """Operator API writes (all kinds, verbs, results) and cycles between two scrapes."""
    if before is None or after is None:
        return None, {}, None
    old, new = _writes_by_kind_verb(before), _writes_by_kind_verb(after)
    by_verb = {k: int(v - old.get(k, 0.0)) for k, v in new.items() if v - old.get(k, 0.0)}
    cycles = int(
        metric_sum(after, "phalanx_scheduling_cycle_duration_seconds_count")
        - metric_sum(before, "phalanx_scheduling_cycle_duration_seconds_count")
    )
    return sum(by_verb.values()), by_verb, cycles


def _writes_by_kind_verb(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "phalanx_api_writes_total":
                key = f"{sample.labels.get('kind')}/{sample.labels.get('verb')}"
                out[key] = out.get(key, 0.0) + sample.value
    return out
