"""A bursty team and a quiet one, replayed through the core in virtual time
(``phalanx simulate fair-sharing``), in two set-ups:

- :class:`TwoTeams`: both in one ClusterQueue, with and without Kueue's admission fair
  sharing (between LocalQueues);
- :class:`CohortTeams`: each team its own ClusterQueue in one cohort, fair sharing on, with
  dominant resource shares on what each holds now (Kueue's) or on decayed usage (Phalanx's
  ``decayedFairSharing``).

The bursty team submits a burst of long multi-GPU jobs once a day; the quiet team submits a
small job every few hours. With the ClusterQueue's plain ordering (priority, then FIFO) the
quiet team's jobs queue behind the whole burst; with ``UsageBasedAdmissionFairSharing`` the
quiet team's lower decayed usage puts its head first whenever GPUs free up. DRS fair sharing
(``fairSharing.enable``) is on in both runs; it orders ClusterQueues of a cohort and has
nothing to decide here, which is the point: between LocalQueues of one ClusterQueue only
admission fair sharing helps.

In the cohort set-up each team has half the GPUs as nominal quota. The bursty team's daily
burst holds every GPU when the quiet team's batch arrives; as GPUs free up, plain DRS sees two
teams that hold nothing beyond their quota and serves them alike, so each takes half and the
quiet batch drains in four rounds. On decayed usage the bursty team, whose usage of the last
days is above its quota, goes after the quiet team, which borrows the bursty team's half too:
from the second day on its batch drains in three rounds, then two (the first day, with no
history yet, is the same in both runs).

Pure: events (arrivals, finishes, sampling ticks) in a heap, one cycle per instant, usage
sampled every ``usageSamplingInterval`` as the operator does.
"""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from phalanx.admission.fair_usage import AdmissionFairSharing
from phalanx.admission.model import (
    ClusterQueue,
    FlavorQuotas,
    LocalQueue,
    PodSet,
    ResourceFlavor,
    ResourceGroup,
    Workload,
)
from phalanx.admission.scheduler import Scheduler, SchedulerConfig
from phalanx.quotas.resources import ResourceQuota

__all__ = ["CohortTeams", "TeamResult", "TwoTeams", "simulate", "simulate_cohort"]

GPU = "nvidia.com/gpu"
HOUR = 3_600_000
NAMESPACE = "research"


@dataclass(frozen=True, slots=True)
class TwoTeams:
    """The scenario; every default is what docs/scheduling.md reports."""

    days: int = 7
    gpus: int = 8
    burst_jobs: int = 20
    """Jobs the bursty team submits at the start of each day..."""
    burst_gpus: int = 2
    burst_hours: float = 4.0
    quiet_every_hours: float = 3.0
    """...and the quiet team one job this often, from 01:00."""
    quiet_gpus: int = 1
    quiet_hours: float = 2.0
    half_life_ms: int = 6 * HOUR
    sampling_ms: int = 5 * 60_000


@dataclass(frozen=True, slots=True)
class CohortTeams:
    """The cohort scenario; every default is what docs/scheduling.md reports."""

    days: int = 7
    gpus: int = 8
    """The cohort's GPUs, half of them each team's nominal quota."""
    burst_jobs: int = 16
    """Jobs the bursty team submits at the start of each day..."""
    burst_gpus: int = 2
    burst_hours: float = 4.0
    quiet_jobs: int = 16
    """...and the quiet team this many at ``quiet_at_hours`` each day."""
    quiet_at_hours: float = 1.0
    quiet_gpus: int = 1
    quiet_hours: float = 2.0
    half_life_ms: int = 24 * HOUR
    sampling_ms: int = 5 * 60_000


@dataclass
class TeamResult:
    team: str
    jobs: int = 0
    gpu_hours: float = 0.0
    waits_h: list[float] = field(default_factory=list)

    @property
    def mean_wait_h(self) -> float:
        return statistics.fmean(self.waits_h) if self.waits_h else 0.0

    def percentile_h(self, q: float) -> float:
        if len(self.waits_h) < 2:
            return self.waits_h[0] if self.waits_h else 0.0
        return statistics.quantiles(self.waits_h, n=100, method="inclusive")[round(q * 100) - 1]

    def as_dict(self) -> dict[str, object]:
        return {
            "team": self.team,
            "jobs": self.jobs,
            "gpu_hours": round(self.gpu_hours, 1),
            "mean_wait_h": round(self.mean_wait_h, 2),
            "p50_wait_h": round(self.percentile_h(0.5), 2),
            "p95_wait_h": round(self.percentile_h(0.95), 2),
            "max_wait_h": round(max(self.waits_h, default=0.0), 2),
        }


def _arrivals(s: TwoTeams) -> list[tuple[int, str, int, int]]:
    """(time, team, gpus, runtime) of every job, in time order."""
    jobs: list[tuple[int, str, int, int]] = []
    for day in range(s.days):
        start = day * 24 * HOUR
        jobs += [(start, "bursty", s.burst_gpus, int(s.burst_hours * HOUR))] * s.burst_jobs
    t = float(HOUR)
    while t < s.days * 24 * HOUR:
        jobs.append((int(t), "quiet", s.quiet_gpus, int(s.quiet_hours * HOUR)))
        t += s.quiet_every_hours * HOUR
    return sorted(jobs, key=lambda j: j[0])


def simulate(scenario: TwoTeams, *, admission_fair_sharing: bool) -> dict[str, TeamResult]:
    """Run the scenario; each team's jobs, GPU-hours and waits (admission - arrival)."""
    afs = AdmissionFairSharing(
        usage_half_life_ms=scenario.half_life_ms,
        usage_sampling_interval_ms=scenario.sampling_ms,
    )
    s = Scheduler(
        config=SchedulerConfig(
            fair_sharing=True, admission_fair_sharing=afs if admission_fair_sharing else None
        )
    )
    s.apply_resource_flavor(ResourceFlavor("gpu"))
    group = ResourceGroup((GPU,), (FlavorQuotas("gpu", {GPU: ResourceQuota(scenario.gpus)}),))
    s.apply_cluster_queue(
        ClusterQueue("shared", resource_groups=(group,), usage_based_fair_sharing=True)
    )
    for team in ("bursty", "quiet"):
        s.apply_local_queue(LocalQueue(NAMESPACE, team, "shared"))
    s.set_namespace(NAMESPACE, {})

    def sample(now: int) -> None:
        s.sample_fair_usage(now, every=scenario.sampling_ms)

    end = scenario.days * 24 * HOUR
    return _replay(s, _arrivals(scenario), sample, sampling_ms=scenario.sampling_ms, end=end)


def _cohort_arrivals(s: CohortTeams) -> list[tuple[int, str, int, int]]:
    """(time, team, gpus, runtime) of every job, in time order."""
    jobs: list[tuple[int, str, int, int]] = []
    for day in range(s.days):
        start = day * 24 * HOUR
        jobs += [(start, "bursty", s.burst_gpus, int(s.burst_hours * HOUR))] * s.burst_jobs
        quiet_at = start + int(s.quiet_at_hours * HOUR)
        jobs += [(quiet_at, "quiet", s.quiet_gpus, int(s.quiet_hours * HOUR))] * s.quiet_jobs
    return sorted(jobs, key=lambda j: j[0])


def simulate_cohort(scenario: CohortTeams, *, decayed: bool) -> dict[str, TeamResult]:
    """Run the cohort scenario with DRS on what is held now, or (``decayed``) on decayed
    usage; each team's jobs, GPU-hours and waits (admission - arrival)."""
    decay = AdmissionFairSharing(
        usage_half_life_ms=scenario.half_life_ms,
        usage_sampling_interval_ms=scenario.sampling_ms,
    )
    s = Scheduler(
        config=SchedulerConfig(fair_sharing=True, decayed_fair_sharing=decay if decayed else None)
    )
    s.apply_resource_flavor(ResourceFlavor("gpu"))
    nominal = ResourceQuota(scenario.gpus // 2)
    group = ResourceGroup((GPU,), (FlavorQuotas("gpu", {GPU: nominal}),))
    for team in ("bursty", "quiet"):
        s.apply_cluster_queue(ClusterQueue(team, resource_groups=(group,), cohort="research"))
        s.apply_local_queue(LocalQueue(NAMESPACE, team, team))
    s.set_namespace(NAMESPACE, {})

    def sample(now: int) -> None:
        s.sample_decayed_usage(now, every=scenario.sampling_ms)

    end = scenario.days * 24 * HOUR
    arrivals = _cohort_arrivals(scenario)
    return _replay(s, arrivals, sample, sampling_ms=scenario.sampling_ms, end=end)


def _replay(
    s: Scheduler,
    arrivals: list[tuple[int, str, int, int]],
    sample: Callable[[int], None],
    *,
    sampling_ms: int,
    end: int,
) -> dict[str, TeamResult]:
    """Replay ``arrivals`` (team = LocalQueue name) through ``s``, sampling every
    ``sampling_ms`` until ``end``; each team's jobs, GPU-hours and waits."""
    results = {team: TeamResult(team) for team in ("bursty", "quiet")}
    created: dict[str, tuple[str, int, int, int]] = {}
    # (time, kind, seq, payload): kind 0 finish, 1 arrival, 2 sample (finishes free GPUs first).
    events: list[tuple[int, int, int, str]] = []
    seq = 0
    for at, team, gpus, runtime in arrivals:
        seq += 1
        name = f"{team}-{seq}"
        created[f"{NAMESPACE}/{name}"] = (team, at, gpus, runtime)
        heapq.heappush(events, (at, 1, seq, name))
    for tick in range(0, end, sampling_ms):
        seq += 1
        heapq.heappush(events, (tick, 2, seq, ""))
    while events:
        now = events[0][0]
        while events and events[0][0] == now:
            _, kind, _, payload = heapq.heappop(events)
            if kind == 0:
                s.finish_workload(payload)
            elif kind == 1:
                team, at, gpus, _ = created[f"{NAMESPACE}/{payload}"]
                pod = PodSet("main", 1, {GPU: gpus})
                s.add_workload(Workload(NAMESPACE, payload, team, (pod,), creation_time=at))
            else:
                sample(now)
        for admit in s.run_cycle(now).admitted:
            team, at, gpus, runtime = created[admit.workload]
            result = results[team]
            result.jobs += 1
            result.gpu_hours += gpus * runtime / HOUR
            result.waits_h.append((now - at) / HOUR)
            seq += 1
            heapq.heappush(events, (now + runtime, 0, seq, admit.workload))
    return results
