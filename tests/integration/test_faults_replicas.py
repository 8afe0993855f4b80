"""Two operator replicas with leader election: only the leader schedules; SIGKILL it during a
300-Job burst and the other takes over within the lease duration, with the same invariants
as the single-operator SIGKILL test.

Needs ``phalanx operator --leader-elect`` (flags as in /work/notes/leader-api.md).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest
from faults_support import (
    JobBurst,
    ServiceProxy,
    invariant_watch,
)

from phalanx.bench.proc import (
    OperatorProcess,
    free_port,
    metric_sum,
    scrape,
    start_operator,
)
from phalanx.devcluster.handle import ClusterHandle

pytestmark = [pytest.mark.integration, pytest.mark.faults]

LD, RD, RP = 6, 4, 1
LEASE_NS = "kube-system"
LEASE = "phalanx-faults-replicas"


def _replica(
    cluster: ClusterHandle, workdir: Path, identity: str, service: ServiceProxy
) -> OperatorProcess:
    # Every replica serves the webhooks behind one "Service" (as in a cluster), with one
    # shared certificate folder (workdir/webhook-certs).
    port = free_port()
    service.backends.append(port)
    return start_operator(
        kubeconfig=cluster.kubeconfig,
        workdir=workdir,
        name=identity,
        webhook_port=port,
        extra=(
            f"--webhook-url={service.url}",
            "--leader-elect",
            f"--leader-elect-namespace={LEASE_NS}",
            f"--leader-elect-lease-name={LEASE}",
            f"--leader-elect-identity={identity}",
            f"--leader-elect-lease-duration={LD}",
            f"--leader-elect-renew-deadline={RD}",
            f"--leader-elect-retry-period={RP}",
        ),
    )


def _holder(cluster: ClusterHandle) -> str | None:
    proc = cluster.kubectl("get", "lease", LEASE, "-n", LEASE_NS, "-o", "json", timeout=10)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout).get("spec", {}).get("holderIdentity")


def _workload_writes(op: OperatorProcess) -> float:
    text = scrape(op.metrics_url)
    return metric_sum(text, "phalanx_api_writes_total", {"kind": "Workload"}) + metric_sum(
        text, "phalanx_api_writes_total", {"kind": "ClusterQueue"}
    )


def _wait_holder(cluster: ClusterHandle, wanted: set[str], timeout: float) -> tuple[str, float]:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        holder = _holder(cluster)
        if holder in wanted:
            return holder, time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"no holder in {wanted} after {timeout}s (holder: {_holder(cluster)})")


def test_leader_killed_mid_burst_fails_over_within_the_lease_duration(
    fault_cluster: ClusterHandle,
    tmp_path: Path,
) -> None:
    fault_cluster.kubectl("delete", "lease", LEASE, "-n", LEASE_NS, "--ignore-not-found")
    burst = JobBurst(fault_cluster, "faults-replicas", jobs=300)
    burst.setup()
    service = ServiceProxy()
    # The first replica makes the shared webhook certificate; the second reuses it.
    replicas = {"replica-a": _replica(fault_cluster, tmp_path, "replica-a", service)}
    replicas["replica-a"].wait_ready()  # leading, webhook certificate made
    replicas["replica-b"] = _replica(fault_cluster, tmp_path, "replica-b", service)
    failovers: list[float] = []
    try:
        with invariant_watch(fault_cluster) as watch:
            leader, _ = _wait_holder(fault_cluster, set(replicas), timeout=LD + 30)
            replicas[leader].wait_ready()
            creator = threading.Thread(target=burst.create, kwargs={"pause": 0.5}, daemon=True)
            creator.start()
            for round_ in range(2):
                time.sleep(10)
                standby = next(n for n in replicas if n != leader)
                # Only the leader schedules: the standby has written nothing.
                assert _workload_writes(replicas[standby]) == 0, "the standby wrote"
                assert replicas[leader].alive(), replicas[leader].log_tail()
                killed_at = time.monotonic()
                replicas[leader].kill()
                new, took = _wait_holder(fault_cluster, {standby}, timeout=LD + 10)
                failovers.append(took)
                assert took <= LD + 1.0, f"failover took {took:.1f}s > lease duration {LD}s"
                assert time.monotonic() - killed_at < LD + 10
                # The killed one comes back, under a new identity, as the standby.
                del replicas[leader]
                revived = f"{leader.split('.')[0]}.{round_ + 1}"
                replicas[revived] = _replica(fault_cluster, tmp_path, revived, service)
                leader = new
            creator.join(timeout=300)
            assert not creator.is_alive(), "Job creation did not finish"
            burst.wait_complete(timeout=600)
            report = burst.verify(watch)
            sys.stderr.write(
                f"\n[faults] failovers after SIGKILL of the leader: {failovers} s"
                f" (lease {LD}s); peak usage {report['peak_usage']}\n"
            )
    finally:
        for op in replicas.values():
            op.stop()
        service.close()
        sys.stderr.write(f"\n[faults] replica logs in {tmp_path}\n")
        burst.teardown()
        fault_cluster.kubectl("delete", "lease", LEASE, "-n", LEASE_NS, "--ignore-not-found")
