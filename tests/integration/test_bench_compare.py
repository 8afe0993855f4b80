"""``phalanx bench compare`` end to end on a tiny scenario (compare_small/generator.yaml: 1
cohort x 2 ClusterQueues x 20 Workloads): Kueue v0.19.2's runner really runs minimalkueue on an
envtest control plane of the local control plane's binaries (built from the Go module proxy on
first use, like the addons; ``make test`` starts that build in the background), then bench e2e
runs the same scenario on the test cluster; both sides admit every Workload and the ratios are
the quotients of the figures each side reported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bench_tas import write_tiny_tas

from phalanx.devcluster.handle import ClusterHandle

pytestmark = pytest.mark.integration

PHALANX = Path(sys.executable).with_name("phalanx")
SCENARIO = Path(__file__).parent / "compare_small" / "generator.yaml"
WORKLOADS = 40


def test_both_sides_admit_every_workload_and_the_ratios_follow_their_figures(
    cluster: ClusterHandle, tmp_path: Path
) -> None:
    run = subprocess.run(
        [
            str(PHALANX),
            "bench",
            "compare",
            "--config",
            str(SCENARIO),
            "--state-dir",
            str(cluster.state_dir),
            "--workdir",
            str(tmp_path),
            "--timeout",
            "300",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=1800,  # a cold build of the harness compiles controller-runtime and envtest
        check=False,
    )
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"
    result = json.loads(run.stdout)
    kueue, ours = result["kueue"], result["phalanx"]
    for side in (kueue, ours):
        assert (side["workloads"], side["admitted"], side["finished"]) == (WORKLOADS,) * 3, side
        assert side["admissions"] >= WORKLOADS
        assert set(side["avg_time_to_admission_ms"]) == {"small", "large"}
        assert side["apiserver_cpu_s"] > 0 and side["controller_cpu_s"] > 0, side
    assert result["problems"] == []
    # Kueue's side comes from its runner's own files, not from us.
    assert (tmp_path / "kueue" / "summary.yaml").is_file()
    assert (tmp_path / "kueue" / "minimalkueue.stats.yaml").is_file()
    ratios = result["ratios"]
    assert ratios["wall"] == round(ours["wall_ms"] / kueue["wall_ms"], 3)
    for name in ("small", "large"):
        assert ratios[f"time to admission {name} (avg)"] == round(
            ours["avg_time_to_admission_ms"][name] / kueue["avg_time_to_admission_ms"][name], 3
        )
    for key, label in (
        ("apiserver_cpu_s", "API-server CPU per admission"),
        ("controller_cpu_s", "controller CPU per admission"),
    ):
        expected = (ours[key] / ours["admissions"]) / (kueue[key] / kueue["admissions"])
        # The JSON rounds CPU seconds to 0.01 s: allow for it in the quotient.
        assert ratios[label] == pytest.approx(expected, rel=0.1)
    assert (kueue["client_qps"], kueue["client_burst"]) == (50.0, 100)
    assert "limited to 50 QPS (burst 100)" in result["note"]


def test_a_tas_scenario_runs_on_both_sides_with_kueues_tas_controllers(
    cluster: ClusterHandle, tmp_path: Path
) -> None:
    """The tiny TAS scenario: Kueue's side starts minimalkueue with its TAS controllers (as
    its run-tas-performance-scheduler target), ours creates the scenario's KWOK nodes and
    Topology; both admit every Workload."""
    config = write_tiny_tas(tmp_path / "scenario")
    run = subprocess.run(
        [
            str(PHALANX),
            "bench",
            "compare",
            "--config",
            str(config),
            "--state-dir",
            str(cluster.state_dir),
            "--workdir",
            str(tmp_path / "run"),
            "--timeout",
            "300",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"
    result = json.loads(run.stdout)
    for side in (result["kueue"], result["phalanx"]):
        assert side["admitted"] == side["workloads"] == side["finished"] > 0, side
    kueue_log = (tmp_path / "run" / "kueue" / "minimalkueue.err.log").read_text()
    assert "Start minimalkueue with TAS support" in kueue_log
    ours = json.loads((tmp_path / "run" / "phalanx-e2e.json").read_text())
    assert ours["tas"]["nodes"] == 8 and ours["invariant_problems"] == []
