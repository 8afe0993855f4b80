"""``phalanx simulate fair-sharing``: the quiet team's wait drops with admission fair sharing
(the figures docs/scheduling.md reports come from the default scenario)."""

from __future__ import annotations

import json

import pytest

from phalanx.bench.fair_sim import CohortTeams, TwoTeams, simulate, simulate_cohort
from phalanx.cli.main import main


def test_the_quiet_team_waits_far_less_with_admission_fair_sharing() -> None:
    scenario = TwoTeams()
    plain = simulate(scenario, admission_fair_sharing=False)
    fair = simulate(scenario, admission_fair_sharing=True)
    # Everything runs either way; only the order differs.
    for team in ("bursty", "quiet"):
        assert plain[team].jobs == fair[team].jobs
        assert plain[team].gpu_hours == fair[team].gpu_hours
    # The figures in docs/scheduling.md.
    assert plain["quiet"].as_dict()["mean_wait_h"] == 8.75
    assert fair["quiet"].as_dict()["mean_wait_h"] == 0.75
    assert fair["quiet"].percentile_h(0.95) == 3.0
    assert plain["quiet"].percentile_h(0.95) == 19.0
    assert fair["bursty"].mean_wait_h > plain["bursty"].mean_wait_h


def test_the_command_prints_both_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "fair-sharing", "--days", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"plain", "admission-fair-sharing"}
    quiet = {k: next(r for r in v if r["team"] == "quiet") for k, v in out.items()}
    assert quiet["admission-fair-sharing"]["mean_wait_h"] < quiet["plain"]["mean_wait_h"]
    assert main(["simulate", "fair-sharing", "--half-life", "a week"]) == 2


def test_the_quiet_cluster_queue_waits_less_with_decayed_fair_sharing() -> None:
    """Two ClusterQueues in a cohort: fair sharing on decayed usage puts the bursty team,
    whose recent usage is above its quota, after the quiet one."""
    scenario = CohortTeams()
    now = simulate_cohort(scenario, decayed=False)
    decayed = simulate_cohort(scenario, decayed=True)
    for team in ("bursty", "quiet"):
        assert now[team].jobs == decayed[team].jobs
        assert now[team].gpu_hours == decayed[team].gpu_hours
    # The figures in docs/scheduling.md.
    assert now["quiet"].as_dict()["mean_wait_h"] == 6.0
    assert decayed["quiet"].as_dict()["mean_wait_h"] == 4.64
    assert (now["quiet"].percentile_h(0.95), decayed["quiet"].percentile_h(0.95)) == (9.0, 7.0)
    assert (now["bursty"].mean_wait_h, round(decayed["bursty"].mean_wait_h, 2)) == (8.5, 8.88)


def test_the_cohort_mode_of_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "fair-sharing", "--cohort", "--days", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"drs-now", "drs-decayed"}
    quiet = {k: next(r for r in v if r["team"] == "quiet") for k, v in out.items()}
    assert quiet["drs-decayed"]["mean_wait_h"] < quiet["drs-now"]["mean_wait_h"]
