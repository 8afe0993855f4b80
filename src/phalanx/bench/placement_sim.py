"""Event-driven virtual-time simulation of a GPU cluster, for comparing placement choices.

The simulator owns the queue policy and all metrics; a placer only answers "start this job now:
on which nodes?" and "this job finished". Both placers therefore see the same arrival stream,
the same FIFO-with-backfill policy (Kueue's BestEffortFIFO: at every event, walk the queue in
arrival order and start each job that fits), the same gang rule (all pods or none), and differ
only in the nodes they choose.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from phalanx.bench.placement_workload import GPU, GPUS_PER_NODE, Cluster, Job
from phalanx.placement.model import GangRequest, PodSetRequest
from phalanx.placement.topology import FlavorTopology

__all__ = ["FirstFitPlacer", "PhalanxPlacer", "Placer", "SimResult", "simulate"]

NodeCounts = tuple[tuple[str, int], ...]


class Placer(Protocol):
    name: str

    def start(self, job: Job) -> NodeCounts | None: ...

    def finish(self, job: Job) -> None: ...


class PhalanxPlacer:
    """phalanx.placement: best-fit domain, fewest children, topology requests honoured."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        levels: Sequence[str],
        name: str = "phalanx",
        balanced: bool = False,
    ) -> None:
        self.name = name
        self.balanced = balanced
        self.topology = FlavorTopology(name="bench", levels=levels)
        for node in cluster.nodes:
            self.topology.upsert_node(node)

    def start(self, job: Job) -> NodeCounts | None:
        pod_set = PodSetRequest("main", job.pods, job.requests(), job.topology)
        gang = GangRequest(job.key, (pod_set,))
        result = self.topology.reserve(gang, explain=False, balanced=self.balanced)
        if result.placement is None:
            return None
        return tuple((d.node, d.count) for d in result.placement.pod_sets[0].domains)

    def finish(self, job: Job) -> None:
        self.topology.release(job.key)


class FirstFitPlacer:
    """Topology-blind baseline: nodes in name order, each pod on the first node where it fits
    (identical pods one at a time = fill the first node that fits, then the next)."""

    def __init__(self, cluster: Cluster, *, order: Sequence[str] | None = None) -> None:
        self.name = "first-fit"
        names = list(order) if order is not None else sorted(n.name for n in cluster.nodes)
        by_name = {n.name: n for n in cluster.nodes}
        self._names = names
        self._resources = sorted({r for n in cluster.nodes for r in n.allocatable})
        self._free = {r: [by_name[n].allocatable.get(r, 0) for n in names] for r in self._resources}
        self._held: dict[str, list[tuple[int, int]]] = {}
        # Pods of g GPUs that fit, over all nodes (GPU only): an O(1) necessary condition that
        # spares the O(nodes) scan for jobs that cannot fit anyway (a long queue re-tries them).
        self._gpu_fits = {g: sum(f // g for f in self._free[GPU]) for g in (1, 2, 4, 8)}

    def start(self, job: Job) -> NodeCounts | None:
        if self._gpu_fits.get(job.gpus_per_pod, job.pods) < job.pods:
            return None
        requests = {r: q for r, q in job.requests().items() if q > 0}
        requests["pods"] = 1
        columns = [(self._free[r], q) for r, q in requests.items()]
        remaining = job.pods
        taken: list[tuple[int, int]] = []
        for i in range(len(self._names)):
            fit = min(column[i] // q for column, q in columns)
            if fit > 0:
                n = min(fit, remaining)
                taken.append((i, n))
                remaining -= n
                if remaining == 0:
                    break
        if remaining:
            return None
        for i, n in taken:
            self._count_gpu_fits(i, -1)
            for column, q in columns:
                column[i] -= q * n
            self._count_gpu_fits(i, 1)
        self._held[job.key] = taken
        return tuple((self._names[i], n) for i, n in taken)

    def finish(self, job: Job) -> None:
        requests = {r: q for r, q in job.requests().items() if q > 0}
        requests["pods"] = 1
        for i, n in self._held.pop(job.key):
            self._count_gpu_fits(i, -1)
            for r, q in requests.items():
                self._free[r][i] += q * n
            self._count_gpu_fits(i, 1)

    def _count_gpu_fits(self, i: int, sign: int) -> None:
        free = self._free[GPU][i]
        for g in self._gpu_fits:
            self._gpu_fits[g] += sign * (free // g)


@dataclass(frozen=True, slots=True)
class SimResult:
    placer: str
    jobs: int
    gangs: int  # jobs with more than one pod
    single_rack_share: float  # of gangs
    single_block_share: float  # of gangs
    utilisation: float  # time-average share of GPUs in use, over the arrival window
    stranded_node_share: float  # time-average share of free GPUs on partly used nodes
    stranded_rack_share: float  # time-average share of free GPUs in partly used racks
    whole_free_racks: float  # time-average number of completely free racks
    avg_wait_s: float
    avg_wait_large_s: float  # gangs of 16+ nodes
    makespan_s: float


class _Ledger:
    """Used GPUs per node and rack, with the stranded-capacity sums kept incrementally."""

    def __init__(self, cluster: Cluster) -> None:
        self.rack_of = {n: rack for n, (_, rack) in cluster.rack_of.items()}
        racks = sorted(set(self.rack_of.values()))
        self.rack_cap = dict.fromkeys(racks, 0)
        for rack in self.rack_of.values():
            self.rack_cap[rack] += GPUS_PER_NODE
        self.node_used = dict.fromkeys(self.rack_of, 0)
        self.rack_used = dict.fromkeys(racks, 0)
        self.used = 0
        self.stranded_nodes = 0  # free GPUs on nodes with 0 < used < capacity
        self.stranded_racks = 0  # free GPUs in racks with 0 < used < capacity
        self.free_racks = len(racks)

    def add(self, node: str, gpus: int) -> None:
        before = self.node_used[node]
        after = before + gpus
        self.stranded_nodes += _stranded(after, GPUS_PER_NODE) - _stranded(before, GPUS_PER_NODE)
        self.node_used[node] = after
        rack = self.rack_of[node]
        cap = self.rack_cap[rack]
        r_before = self.rack_used[rack]
        r_after = r_before + gpus
        self.stranded_racks += _stranded(r_after, cap) - _stranded(r_before, cap)
        self.free_racks += (r_after == 0) - (r_before == 0)
        self.rack_used[rack] = r_after
        self.used += gpus


def _stranded(used: int, capacity: int) -> int:
    return capacity - used if 0 < used < capacity else 0


def simulate(
    cluster: Cluster, jobs: Sequence[Job], placer: Placer, *, warmup: float = 0.0
) -> SimResult:
    """Run every job to completion; time averages cover [warmup, last arrival], the span in
    which the cluster is loaded in steady state."""
    ledger = _Ledger(cluster)
    window_end = jobs[-1].arrival if jobs else 0.0
    warmup = min(warmup, window_end)
    events: list[tuple[float, int, int, Job]] = []  # (time, order, kind 0=finish 1=arrive, job)
    for i, job in enumerate(jobs):
        heapq.heappush(events, (job.arrival, i, 1, job))
    seq = len(jobs)
    queue: list[Job] = []
    started: dict[str, tuple[float, NodeCounts]] = {}
    integrals = [0.0, 0.0, 0.0, 0.0]  # used, stranded nodes share, stranded racks share, free racks
    last = warmup
    now = 0.0
    while events:
        now = events[0][0]
        span = max(0.0, min(now, window_end) - last)
        if span > 0:
            free = cluster.total_gpus - ledger.used
            integrals[0] += ledger.used * span
            if free:
                integrals[1] += ledger.stranded_nodes / free * span
                integrals[2] += ledger.stranded_racks / free * span
            integrals[3] += ledger.free_racks * span
            last = min(now, window_end)
        while events and events[0][0] == now:
            _, _, kind, job = heapq.heappop(events)
            if kind == 1:
                queue.append(job)
                continue
            placer.finish(job)
            for node, pods in started[job.key][1]:
                ledger.add(node, -pods * job.gpus_per_pod)
        waiting: list[Job] = []
        for job in queue:
            free = cluster.total_gpus - ledger.used
            nodes = placer.start(job) if free >= job.gpus else None
            if nodes is None:
                waiting.append(job)
                continue
            started[job.key] = (now, nodes)
            for node, pods in nodes:
                ledger.add(node, pods * job.gpus_per_pod)
            seq += 1
            heapq.heappush(events, (now + job.runtime, seq, 0, job))
        queue = waiting
    return _summarise(placer.name, cluster, jobs, started, integrals, window_end - warmup, now)


def _summarise(
    name: str,
    cluster: Cluster,
    jobs: Sequence[Job],
    started: dict[str, tuple[float, NodeCounts]],
    integrals: list[float],
    window: float,
    makespan: float,
) -> SimResult:
    gangs = [j for j in jobs if j.pods > 1]
    one_rack = one_block = 0
    for job in gangs:
        nodes = [node for node, _ in started[job.key][1]]
        one_rack += len({cluster.rack_of[n][1] for n in nodes}) == 1
        one_block += len({cluster.rack_of[n][0] for n in nodes}) == 1
    waits = [started[j.key][0] - j.arrival for j in jobs]
    large = [started[j.key][0] - j.arrival for j in jobs if j.pods >= 16]
    window = window or 1.0
    return SimResult(
        placer=name,
        jobs=len(jobs),
        gangs=len(gangs),
        single_rack_share=one_rack / len(gangs) if gangs else 0.0,
        single_block_share=one_block / len(gangs) if gangs else 0.0,
        utilisation=integrals[0] / (cluster.total_gpus * window),
        stranded_node_share=integrals[1] / window,
        stranded_rack_share=integrals[2] / window,
        whole_free_racks=integrals[3] / window,
        avg_wait_s=sum(waits) / len(waits) if waits else 0.0,
        avg_wait_large_s=sum(large) / len(large) if large else 0.0,
        makespan_s=makespan,
    )
