"""Restart the API server in the middle of a 300-Job burst: the operator stays up, catches up,
and nothing is lost (same invariants as the SIGKILL test)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
from faults_support import (
    JobBurst,
    faults_state_dir,
    invariant_watch,
    restart_apiserver,
)

from phalanx.devcluster import cluster as devcluster
from phalanx.devcluster.handle import ClusterHandle
from phalanx.operator.bench_proc import start_operator

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def test_apiserver_restart_mid_burst_loses_nothing(
    fault_cluster: ClusterHandle,
    tmp_path: Path,
) -> None:
    burst = JobBurst(fault_cluster, "faults-apiserver", jobs=300)
    burst.setup()
    op = start_operator(kubeconfig=fault_cluster.kubeconfig, workdir=tmp_path)
    try:
        with invariant_watch(fault_cluster) as watch:
            op.wait_ready()
            creator = threading.Thread(target=burst.create, kwargs={"pause": 0.5}, daemon=True)
            creator.start()
            time.sleep(12)  # mid-burst: Jobs are being created, admitted and finished
            admitted_before = sum(
                1 for h in watch.checker.history_by_key().values() if h.admissions
            )
            back_in = restart_apiserver(faults_state_dir(), down_seconds=8)
            creator.join(timeout=300)
            assert not creator.is_alive(), "Job creation did not finish"
            took = burst.wait_complete(timeout=600)
            assert op.alive(), f"the operator did not survive the restart:\n{op.log_tail()}"
            report = burst.verify(watch)
            status = devcluster.status(state_dir=faults_state_dir())
            assert status.healthy, status
            sys.stderr.write(
                f"\n[faults] API server down 8 s (healthy {back_in:.1f}s after start) with"
                f" {admitted_before} Workloads admitted; all 300 Jobs complete {took:.0f}s"
                f" after creation ended; peak usage {report['peak_usage']}\n"
            )
            assert 0 < admitted_before < 300, "the restart did not fall mid-burst"
    finally:
        op.stop()
        sys.stderr.write(f"\n[faults] operator log: {op.log}\n")
        burst.teardown()
