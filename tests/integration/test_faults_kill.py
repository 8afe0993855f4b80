"""SIGKILL the operator at random moments during a 300-Job burst.

Seeded (``PHALANX_FAULTS_SEED``, default 7) so a failure can be replayed. Jobs keep arriving
while the kills happen; a Job refused because the webhook is down (its operator was just
killed) is created again, as a client would. At the end every Job must be complete, its
Workload admitted exactly once and Finished, no admission may have pushed a ClusterQueue or
its cohort over quota at any moment, and no usage may be left anywhere.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from pathlib import Path

import pytest
from faults_support import JobBurst, invariant_watch

from phalanx.bench.proc import OperatorProcess, start_operator
from phalanx.devcluster.handle import ClusterHandle

pytestmark = [pytest.mark.integration, pytest.mark.faults]

SEED = int(os.environ.get("PHALANX_FAULTS_SEED", "7"))


def test_sigkill_during_a_burst_admits_each_job_exactly_once_without_overshoot_or_leak(
    fault_cluster: ClusterHandle,
    tmp_path: Path,
) -> None:
    rng = random.Random(SEED)
    burst = JobBurst(fault_cluster, "faults-kill", jobs=300)
    burst.setup()
    kills: list[dict[str, float]] = []
    op: OperatorProcess | None = None
    try:
        with invariant_watch(fault_cluster) as watch:
            op = start_operator(kubeconfig=fault_cluster.kubeconfig, workdir=tmp_path)
            op.wait_ready()
            started = time.monotonic()
            creator = threading.Thread(target=burst.create, kwargs={"pause": 0.5}, daemon=True)
            creator.start()
            # Seven kill moments over the first 60 s, at least 4 s apart; after each kill the
            # operator comes back 0-3 s later (sometimes before the next kill it is not even
            # ready: killed during its own start-up).
            moments = sorted(rng.uniform(3, 60) for _ in range(7))
            for i in range(1, len(moments)):
                moments[i] = max(moments[i], moments[i - 1] + 4)
            for moment in moments:
                time.sleep(max(0.0, started + moment - time.monotonic()))
                admitted_before = len(
                    [h for h in watch.checker.history_by_key().values() if h.admissions]
                )
                assert op.alive(), f"the operator died by itself:\n{op.log_tail()}"
                op.kill()
                down = rng.uniform(0, 3)
                kills.append(
                    {
                        "at_s": round(time.monotonic() - started, 2),
                        "down_s": round(down, 2),
                        "admitted_before": admitted_before,
                    }
                )
                time.sleep(down)
                op = start_operator(kubeconfig=fault_cluster.kubeconfig, workdir=tmp_path)
            creator.join(timeout=300)
            assert not creator.is_alive(), "Job creation did not finish"
            op.wait_ready()
            took = burst.wait_complete(timeout=600)
            report = burst.verify(watch)
            sys.stderr.write(
                f"\n[faults] seed {SEED}: {len(kills)} kills {kills}; all 300 Jobs complete"
                f" {took:.0f}s after creation ended; peak usage {report['peak_usage']}\n"
            )
            assert len(kills) >= 5
            assert sum(1 for k in kills if k["admitted_before"] < 300) >= 5, kills
    finally:
        if op is not None:
            op.stop()
        sys.stderr.write(f"\n[faults] operator log: {tmp_path / 'operator.log'}\n")
        burst.teardown()
