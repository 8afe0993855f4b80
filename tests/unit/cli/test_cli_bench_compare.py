"""``phalanx bench compare``: Kueue's runner output and bench e2e's result read into the same
figures, the ratios computed from them, and the CLI's bad input refused with a clear error.

The sample (bench_compare_sample/) is a real run of tests/integration/compare_small: Kueue
v0.19.2's summary.yaml, wlStates.csv, minimalkueue.stats.yaml and the first lines of
minimalkueue's log, and bench e2e's JSON."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from phalanx.bench.kueue_compare import (
    KueueOutputError,
    Side,
    client_limits,
    compare,
    parse_kueue_output,
    phalanx_side,
    render,
    stopped_early,
)
from phalanx.cli.main import main

SAMPLE = Path(__file__).parent / "bench_compare_sample"


@pytest.fixture
def kueue_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "kueue"
    shutil.copytree(SAMPLE, folder)
    return folder


def _phalanx() -> Side:
    return phalanx_side(json.loads((SAMPLE / "phalanx-e2e.json").read_text()))


def test_kueue_figures_come_from_its_summary_stats_and_workload_rows(kueue_dir: Path) -> None:
    kueue = parse_kueue_output(kueue_dir, apiserver_cpu_s=1.66, etcd_cpu_s=0.23)
    assert (kueue.workloads, kueue.admitted) == (40, 40)
    assert kueue.admissions == 40 + 11  # first admissions plus re-admissions after evictions
    assert kueue.wall_ms == 7368
    assert kueue.class_avg_admission_ms == {"large": 309, "small": 1789}
    assert kueue.controller_cpu_s == pytest.approx((263 + 134) / 1000)
    assert kueue.apiserver_cpu_s == 1.66
    assert kueue.extra["cq_event_span_ms"] == 4866
    assert (kueue.extra["client_qps"], kueue.extra["client_burst"]) == (50.0, 100)


def test_phalanx_figures_are_bench_e2e_from_first_sight() -> None:
    ours = _phalanx()
    assert (ours.workloads, ours.admitted, ours.admissions) == (40, 40, 40)
    assert ours.wall_ms == 2015
    assert ours.class_avg_admission_ms == {"large": 265, "small": 1057}
    assert (ours.apiserver_cpu_s, ours.controller_cpu_s) == (1.02, 0.25)


def test_the_ratios_are_phalanx_over_kueue_from_both_sides_figures(kueue_dir: Path) -> None:
    kueue = parse_kueue_output(kueue_dir, apiserver_cpu_s=1.66, etcd_cpu_s=0.23)
    comparison = compare("compare_small", kueue, _phalanx())
    ratios = comparison.to_json()["ratios"]
    assert ratios["wall"] == round(2015 / 7368, 3)
    assert ratios["time to admission small (avg)"] == round(1057 / 1789, 3)
    assert ratios["time to admission large (avg)"] == round(265 / 309, 3)
    assert ratios["API-server CPU per admission"] == round((1.02 / 40) / (1.66 / 51), 3)
    assert ratios["controller CPU per admission"] == round((0.25 / 40) / (0.397 / 51), 3)
    assert comparison.problems() == []
    text = render(comparison)
    assert "PASS: both sides admitted every workload" in text
    assert "limited to 50 QPS (burst 100)" in text and "as minimalkueue logged" in text


def test_a_ratio_is_unknown_without_both_figures(kueue_dir: Path) -> None:
    kueue = parse_kueue_output(kueue_dir)  # no API-server CPU measured
    ratios = compare("s", kueue, _phalanx()).to_json()["ratios"]
    assert ratios["API-server CPU per admission"] is None
    assert "n/a" in render(compare("s", kueue, _phalanx()))


def test_a_workload_kueue_never_admitted_fails_the_comparison(kueue_dir: Path) -> None:
    rows = (kueue_dir / "wlStates.csv").read_text().splitlines()
    fields = rows[1].split(",")
    fields[4:6] = ["0", "0"]  # ms to admitted, ms to finish
    rows[1] = ",".join(fields)
    (kueue_dir / "wlStates.csv").write_text("\n".join(rows) + "\n")
    comparison = compare("s", parse_kueue_output(kueue_dir), _phalanx())
    assert comparison.problems() == ["Kueue admitted 39/40 workloads"]
    assert render(comparison).splitlines()[-2:] == ["FAIL", "  - Kueue admitted 39/40 workloads"]


def test_without_minimalkueues_log_the_note_says_the_limit_was_not_read(kueue_dir: Path) -> None:
    (kueue_dir / "minimalkueue.err.log").unlink()
    assert client_limits(kueue_dir / "minimalkueue.err.log") is None
    note = compare("s", parse_kueue_output(kueue_dir), _phalanx()).note()
    assert "limited to 50 QPS" in note and "not found in its log" in note


def test_a_missing_summary_names_the_file(kueue_dir: Path) -> None:
    (kueue_dir / "summary.yaml").unlink()
    with pytest.raises(KueueOutputError, match=r"summary\.yaml is missing: Kueue's runner did"):
        parse_kueue_output(kueue_dir)


def test_malformed_stats_name_the_file_and_key(kueue_dir: Path) -> None:
    (kueue_dir / "minimalkueue.stats.yaml").write_text("wallMs: soon\nuserMs: 1\nsysMs: 1\n")
    with pytest.raises(KueueOutputError, match=r"stats\.yaml: 'wallMs' should be an integer"):
        parse_kueue_output(kueue_dir)


def test_a_missing_config_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope" / "generator.yaml"
    assert main(["bench", "compare", "--config", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(missing) in err


def test_a_non_positive_timeout_is_refused_naming_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "compare", "--config", "g.yaml", "--timeout", "0"])
    assert exit_info.value.code == 2
    assert "argument --timeout: '0': give a number of seconds above 0" in capsys.readouterr().err


def test_the_config_flag_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "compare"])
    assert exit_info.value.code == 2
    assert "the following arguments are required: --config" in capsys.readouterr().err


def test_a_run_with_a_workload_never_admitted_stopped_early_and_a_full_one_did_not(
    kueue_dir: Path,
) -> None:
    """The runner's exit 0 with a Workload never admitted is its recorder stopping early,
    which ``bench compare`` answers by running Kueue's side again."""
    assert not stopped_early(parse_kueue_output(kueue_dir))
    rows = (kueue_dir / "wlStates.csv").read_text().splitlines()
    fields = rows[1].split(",")
    fields[4:6] = ["0", "0"]  # ms to admitted, ms to finish
    rows[1] = ",".join(fields)
    (kueue_dir / "wlStates.csv").write_text("\n".join(rows) + "\n")
    assert stopped_early(parse_kueue_output(kueue_dir))


def test_the_report_says_when_kueues_side_ran_again(kueue_dir: Path) -> None:
    kueue = parse_kueue_output(kueue_dir)
    assert "Kueue's side ran" not in render(compare("s", kueue, _phalanx()))
    kueue.extra["runs"] = 2
    assert "  Kueue's side ran 2 times: its recorder stopped early before" in render(
        compare("s", kueue, _phalanx())
    )
    assert compare("s", kueue, _phalanx()).to_json()["kueue"]["runs"] == 2


def test_the_report_says_which_control_plane_phalanxs_side_ran_on(kueue_dir: Path) -> None:
    # Catches a --bare run reported as if the whole plane had run, and the reverse.
    kueue = parse_kueue_output(kueue_dir)
    whole = render(compare("s", kueue, _phalanx()))
    assert "ran on the whole local control plane" in whole and "alone" not in whole
    e2e = json.loads((SAMPLE / "phalanx-e2e.json").read_text())
    e2e["stopped_components"] = ["kwok", "kube-scheduler", "kube-controller-manager"]
    bare = compare("s", kueue, phalanx_side(e2e))
    text = render(bare)
    assert (
        "ran on etcd and kube-apiserver alone, as Kueue's envtest does (--bare: kwok,"
        " kube-scheduler, kube-controller-manager stopped after the set-up)"
    ) in text
    assert bare.to_json()["phalanx"]["stopped_components"] == e2e["stopped_components"]


def test_the_report_says_whether_phalanxs_crds_served_v1beta1(kueue_dir: Path) -> None:
    # Catches a run without v1beta1 reported as the default install, and the reverse.
    kueue = parse_kueue_output(kueue_dir)
    e2e = json.loads((SAMPLE / "phalanx-e2e.json").read_text())
    e2e["v1beta1_served"] = True
    served = render(compare("s", kueue, phalanx_side(e2e)))
    assert "served v1beta1 too, as installed by default" in served
    e2e["v1beta1_served"] = False
    off = compare("s", kueue, phalanx_side(e2e))
    assert "served v1beta2 alone (--v1beta1 off)" in render(off)
    assert off.to_json()["phalanx"]["v1beta1_served"] is False
