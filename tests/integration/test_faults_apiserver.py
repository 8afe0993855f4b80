"""Restart the API server in the middle of a 300-Job burst: the operator stays up, catches up,
and nothing is lost (same invariants as the SIGKILL test).

Seeded (``PHALANX_FAULTS_SEED``, default 7) so a failure can be replayed: the seed picks how
far into the burst the API server goes down (after 15-60 admissions, counted by the checker,
so the fault lands mid-burst however loaded the machine is) and for how long (5-10 s).

The checker's own watch is cut by the restart too; it lists again and judges that list as one
state of the API (see ``phalanx.bench.invariants``), so an overshoot it reports is
one the API showed. On a failure its trace (Workload versions with their resourceVersions)
is written beside the operator log.
"""

from __future__ import annotations

import os
import random
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
from faults_support import (
    JobBurst,
    faults_state_dir,
    invariant_watch,
    restart_apiserver,
    wait_admissions,
)

from phalanx.bench.proc import start_operator
from phalanx.devcluster import cluster as devcluster
from phalanx.devcluster.handle import ClusterHandle

pytestmark = [pytest.mark.integration, pytest.mark.faults]

SEED = int(os.environ.get("PHALANX_FAULTS_SEED", "7"))


def test_apiserver_restart_mid_burst_loses_nothing(
    fault_cluster: ClusterHandle,
    tmp_path: Path,
) -> None:
    rng = random.Random(SEED)
    after_admissions = rng.randint(15, 60)
    down_seconds = round(rng.uniform(5, 10), 1)
    burst = JobBurst(fault_cluster, "faults-apiserver", jobs=300)
    burst.setup()
    op = start_operator(kubeconfig=fault_cluster.kubeconfig, workdir=tmp_path)
    try:
        with invariant_watch(fault_cluster) as watch:
            op.wait_ready()
            creator = threading.Thread(target=burst.create, kwargs={"pause": 0.5}, daemon=True)
            creator.start()
            # Mid-burst: Jobs are being created, admitted and finished.
            admitted_before = wait_admissions(watch, after_admissions)
            back_in = restart_apiserver(faults_state_dir(), down_seconds=down_seconds)
            creator.join(timeout=300)
            assert not creator.is_alive(), "Job creation did not finish"
            took = burst.wait_complete(timeout=600)
            assert op.alive(), f"the operator did not survive the restart:\n{op.log_tail()}"
            report = burst.verify(watch, trace=tmp_path / "invariant-trace.txt")
            # Admissions made while the checker's watch was down are inferred from the
            # Finished Workload; the operator's own record must show each exactly once.
            inferred = sum(1 for h in watch.checker.history_by_key().values() if h.inferred)
            admitted = Counter(
                line.split("workload=", 1)[1].split()[0]
                for line in op.log.read_text(errors="replace").splitlines()
                if "event=admitted " in line
            )
            mine = {k: n for k, n in admitted.items() if k.startswith(f"{burst.namespace}/")}
            assert len(mine) == 300 and set(mine.values()) == {1}, (
                f"the operator logged {len(mine)} admitted Workloads,"
                f" {sum(1 for n in mine.values() if n != 1)} not exactly once"
            )
            status = devcluster.status(state_dir=faults_state_dir())
            assert status.healthy, status
            sys.stderr.write(
                f"\n[faults] seed {SEED}: API server down {down_seconds} s (healthy"
                f" {back_in:.1f}s after start) with {admitted_before} Workloads admitted;"
                f" all 300 Jobs complete {took:.0f}s after creation ended; peak usage"
                f" {report['peak_usage']}; the checker listed Workloads"
                f" {watch.checker.relists} times; {inferred} admissions fell in the watch gap"
                " (checked in the operator log)\n"
            )
            assert 0 < admitted_before < 300, "the restart did not fall mid-burst"
    finally:
        op.stop()
        sys.stderr.write(f"\n[faults] operator log: {op.log}\n")
        burst.teardown()
