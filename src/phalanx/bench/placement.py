"""``phalanx bench placement``: how fast placement decides, and how good its choices are.

(a) Speed: a 4,096-node topology (8 blocks x 16 racks x 32 hosts x 8 GPUs) under a stream of
gangs of 1-64 nodes and smaller pods, with arrivals and completions; every ``reserve`` call is
timed with ``time.perf_counter`` (explanations on, as admission runs it).
(b) Quality: one arrival stream simulated in virtual time through Phalanx's placement and
through topology-blind first-fit, with the same queue policy (see bench_sim).

Pure and deterministic apart from the timings: everything random comes from ``random.Random``
seeded by the caller.
"""

from __future__ import annotations

import dataclasses
import heapq
import random
import time
from dataclasses import dataclass
from typing import Any

from phalanx.bench.placement_sim import FirstFitPlacer, PhalanxPlacer, SimResult, simulate
from phalanx.bench.placement_workload import LEVELS, RACK_LABEL, Cluster, make_cluster, make_jobs
from phalanx.placement.model import GangRequest, PodSetRequest, TopologyRequest
from phalanx.placement.topology import FlavorTopology

__all__ = ["BenchReport", "SpeedResult", "format_report", "run_placement_bench", "speed_bench"]


@dataclass(frozen=True, slots=True)
class SpeedResult:
    nodes: int
    calls: int
    placed: int
    failed: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    p99_placed_ms: float
    p99_failed_ms: float
    mean_utilisation: float


@dataclass(frozen=True, slots=True)
class BenchReport:
    seed: int
    cluster: str
    speed: SpeedResult
    jobs: int
    load: float
    warmup_s: float
    quality: tuple[SimResult, ...]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))
    return sorted_values[index]


def speed_bench(
    rng: random.Random, cluster: Cluster, *, calls: int, balanced: bool = False
) -> SpeedResult:
    """Time ``calls`` reserve calls while jobs arrive and complete; a job that does not fit is
    dropped (no queue), so the cluster stays near full and failures are timed too."""
    topo = FlavorTopology(name="bench", levels=LEVELS)
    for node in cluster.nodes:
        topo.upsert_node(node)
    jobs = make_jobs(rng, count=calls, total_gpus=cluster.total_gpus, load=1.1)
    running: list[tuple[float, str, int]] = []
    used = 0
    util_sum = 0.0
    placed_times: list[float] = []
    failed_times: list[float] = []
    for job in jobs:
        while running and running[0][0] <= job.arrival:
            _, key, gpus = heapq.heappop(running)
            topo.release(key)
            used -= gpus
        request = job.topology
        # A third of the gangs that can fit a rack insist on it, to time REQUIRED misses too.
        if job.pods > 1 and job.pods <= 32 and rng.random() < 0.33:
            request = TopologyRequest.required(RACK_LABEL)
        gang = GangRequest(job.key, (PodSetRequest("main", job.pods, job.requests(), request),))
        start = time.perf_counter()
        result = topo.reserve(gang, balanced=balanced)
        elapsed = (time.perf_counter() - start) * 1000.0
        if result.ok:
            placed_times.append(elapsed)
            heapq.heappush(running, (job.arrival + job.runtime, job.key, job.gpus))
            used += job.gpus
        else:
            failed_times.append(elapsed)
        util_sum += used / cluster.total_gpus
    every = sorted(placed_times + failed_times)
    placed_times.sort()
    failed_times.sort()
    return SpeedResult(
        nodes=len(cluster.nodes),
        calls=len(every),
        placed=len(placed_times),
        failed=len(failed_times),
        p50_ms=_percentile(every, 0.50),
        p99_ms=_percentile(every, 0.99),
        max_ms=every[-1] if every else 0.0,
        p99_placed_ms=_percentile(placed_times, 0.99),
        p99_failed_ms=_percentile(failed_times, 0.99),
        mean_utilisation=util_sum / max(1, len(every)),
    )


def run_placement_bench(
    *,
    seed: int = 1,
    quick: bool = False,
    load: float = 0.95,
    jobs: int | None = None,
    shape: tuple[int, int, int] = (8, 16, 32),
    balanced: bool = False,
) -> BenchReport:
    """Speed and quality on a ``shape`` = (blocks, racks per block, hosts per rack) cluster."""
    rng = random.Random(seed)
    blocks, racks, hosts = shape
    cluster = make_cluster(rng, blocks=blocks, racks=racks, hosts=hosts)
    calls = 1500 if quick else 5000
    speed = speed_bench(random.Random(seed + 1), cluster, calls=calls, balanced=balanced)
    jobs_count = jobs if jobs is not None else (2500 if quick else 6000)
    warmup = 2 * 3600.0 if quick else 4 * 3600.0
    stream = make_jobs(
        random.Random(seed + 2), count=jobs_count, total_gpus=cluster.total_gpus, load=load
    )
    # First-fit sees nodes in name order. Cloud hostnames say nothing about racks, so the main
    # baseline uses the opaque names; a second run sorts names by rack to show the best case a
    # topology-blind first-fit can get from a naming convention.
    by_rack = sorted(cluster.rack_of, key=lambda n: (cluster.rack_of[n], n))
    placers = (
        PhalanxPlacer(cluster, levels=LEVELS, balanced=balanced),
        FirstFitPlacer(cluster),
        _named(FirstFitPlacer(cluster, order=by_rack), "first-fit (rack-sorted names)"),
    )
    quality = tuple(simulate(cluster, stream, placer, warmup=warmup) for placer in placers)
    described = f"{blocks} blocks x {racks} racks x {hosts} hosts x 8 GPUs"
    return BenchReport(seed, described, speed, jobs_count, load, warmup, quality)


def _named(placer: FirstFitPlacer, name: str) -> FirstFitPlacer:
    placer.name = name
    return placer


def format_report(report: BenchReport) -> str:
    s = report.speed
    lines = [
        f"Placement speed: {s.nodes} nodes ({report.cluster}), {s.calls} reserve calls"
        f" ({s.placed} placed, {s.failed} no fit), mean GPU use {s.mean_utilisation:.0%}",
        f"  p50 {s.p50_ms:.3f} ms   p99 {s.p99_ms:.3f} ms   max {s.max_ms:.3f} ms"
        f"   (p99 placed {s.p99_placed_ms:.3f} ms, p99 no-fit {s.p99_failed_ms:.3f} ms)",
        "",
        f"Placement quality: {report.jobs} jobs, offered load {report.load:.0%}, same stream and"
        f" FIFO-backfill policy; time averages after {report.warmup_s / 3600:.0f} h warm-up",
    ]
    rows: list[tuple[str, str]] = [
        ("gangs within one rack", "single_rack_share"),
        ("gangs within one block", "single_block_share"),
        ("GPU utilisation (avg)", "utilisation"),
        ("free GPUs stranded on partly used nodes", "stranded_node_share"),
        ("free GPUs in partly used racks", "stranded_rack_share"),
        ("whole free racks (avg)", "whole_free_racks"),
        ("average wait", "avg_wait_s"),
        ("average wait, gangs >= 16 nodes", "avg_wait_large_s"),
    ]
    width = max(len(label) for label, _ in rows) + 2
    names = [r.placer for r in report.quality]
    cols = [max(10, len(n) + 2) for n in names]
    lines.append(" " * width + "".join(n.rjust(c) for n, c in zip(names, cols, strict=True)))
    for label, attr in rows:
        cells = []
        for result in report.quality:
            value = getattr(result, attr)
            if attr.endswith("_s"):
                cells.append(f"{value:.0f} s")
            elif attr == "whole_free_racks":
                cells.append(f"{value:.1f}")
            else:
                cells.append(f"{value:.1%}")
        lines.append(
            label.ljust(width) + "".join(v.rjust(c) for v, c in zip(cells, cols, strict=True))
        )
    lines.append(f"(gangs = jobs of 2+ pods: {report.quality[0].gangs} of {report.jobs})")
    return "\n".join(lines)
