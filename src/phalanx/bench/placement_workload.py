"""The bench's GPU cluster and job stream, generated from a seeded PRNG.

Cluster: blocks x racks x hosts GPU nodes, 8 GPUs each. Hostnames are opaque ("gpu-node-0417")
and assigned to rack positions by a seeded shuffle, as in clouds where a node's name says nothing
about where it sits; a topology-blind scheduler therefore sees racks only by chance.

Jobs: a mix modelled on shared training clusters: many single-pod jobs of 1-8 GPUs, a long tail
of multi-node gangs of 8-GPU pods (2-64 nodes), log-uniform runtimes (5 min - 4 h), Poisson
arrivals at a rate that offers a chosen fraction of the cluster's GPU capacity.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from phalanx.placement.model import HOSTNAME_LABEL, Node, TopologyRequest

__all__ = [
    "BLOCK_LABEL",
    "GPU",
    "LEVELS",
    "RACK_LABEL",
    "Cluster",
    "Job",
    "make_cluster",
    "make_jobs",
]

BLOCK_LABEL = "cloud.provider.com/topology-block"
RACK_LABEL = "cloud.provider.com/topology-rack"
LEVELS = (BLOCK_LABEL, RACK_LABEL, HOSTNAME_LABEL)
GPU = "nvidia.com/gpu"
GPUS_PER_NODE = 8
CPU_PER_GPU = 12_000  # milli-cores
MEMORY_PER_GPU = 128 * 2**30

# (weight, pods, GPUs per pod): single pods of every size, then gangs of whole nodes.
_MIX: tuple[tuple[float, int, int], ...] = (
    (0.12, 1, 1),
    (0.10, 1, 2),
    (0.08, 1, 4),
    (0.05, 4, 2),
    (0.15, 1, 8),
    (0.12, 2, 8),
    (0.10, 4, 8),
    (0.12, 8, 8),
    (0.09, 16, 8),
    (0.05, 32, 8),
    (0.02, 64, 8),
)
_MIN_RUNTIME = 300.0
_MAX_RUNTIME = 4 * 3600.0


@dataclass(frozen=True, slots=True)
class Cluster:
    nodes: tuple[Node, ...]
    rack_of: dict[str, tuple[str, str]]  # node -> (block, rack)
    total_gpus: int


@dataclass(frozen=True, slots=True)
class Job:
    key: str
    arrival: float  # seconds of virtual time
    runtime: float
    pods: int
    gpus_per_pod: int
    topology: TopologyRequest

    @property
    def gpus(self) -> int:
        return self.pods * self.gpus_per_pod

    def requests(self) -> dict[str, int]:
        g = self.gpus_per_pod
        return {GPU: g, "cpu": g * CPU_PER_GPU, "memory": g * MEMORY_PER_GPU}


def make_cluster(
    rng: random.Random, *, blocks: int = 8, racks: int = 16, hosts: int = 32
) -> Cluster:
    total = blocks * racks * hosts
    names = [f"gpu-node-{i:04d}" for i in range(total)]
    rng.shuffle(names)
    allocatable = {
        GPU: GPUS_PER_NODE,
        "cpu": GPUS_PER_NODE * CPU_PER_GPU + 8_000,
        "memory": GPUS_PER_NODE * MEMORY_PER_GPU + 64 * 2**30,
        "pods": 110,
    }
    nodes: list[Node] = []
    rack_of: dict[str, tuple[str, str]] = {}
    i = 0
    for b in range(blocks):
        for r in range(racks):
            for _ in range(hosts):
                name = names[i]
                i += 1
                block, rack = f"block-{b}", f"block-{b}-rack-{r:02d}"
                labels = {BLOCK_LABEL: block, RACK_LABEL: rack, HOSTNAME_LABEL: name}
                nodes.append(Node(name, labels, dict(allocatable)))
                rack_of[name] = (block, rack)
    return Cluster(tuple(nodes), rack_of, total * GPUS_PER_NODE)


def make_jobs(rng: random.Random, *, count: int, total_gpus: int, load: float) -> tuple[Job, ...]:
    """``count`` jobs whose mean offered GPU demand is ``load`` x ``total_gpus``."""
    weights = [w for w, _, _ in _MIX]
    mean_gpus = sum(w * p * g for w, p, g in _MIX) / sum(weights)
    # mean of a log-uniform runtime on [a, b] is (b - a) / ln(b / a)
    mean_runtime = (_MAX_RUNTIME - _MIN_RUNTIME) / math.log(_MAX_RUNTIME / _MIN_RUNTIME)
    rate = load * total_gpus / (mean_gpus * mean_runtime)
    jobs: list[Job] = []
    now = 0.0
    log_lo, log_hi = math.log(_MIN_RUNTIME), math.log(_MAX_RUNTIME)
    for i in range(count):
        now += rng.expovariate(rate)
        _, pods, gpus = rng.choices(_MIX, weights=weights)[0]
        runtime = math.exp(rng.uniform(log_lo, log_hi))
        # Gangs ask for one rack and accept falling back; single pods need no constraint.
        topology = (
            TopologyRequest.preferred(RACK_LABEL) if pods > 1 else TopologyRequest.unconstrained()
        )
        jobs.append(Job(f"job-{i:05d}", now, runtime, pods, gpus, topology))
    return tuple(jobs)
